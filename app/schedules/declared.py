"""Schedules declared in a file (``RECEIPT_SCHEDULES_FILE``), for deployments that keep them in git.

The file is TOML (``.toml``) or JSON: a list ``schedules`` whose entries are the create body of
``POST /schedules`` plus ``organizationId`` (there is no token to take it from)::

    [[schedules]]
    scheduleId = "nightly-report"
    organizationId = "acme"
    cron = "0 30 2 * * *"
    timeZone = "Europe/Paris"
    overlap = "skip"
    job = { agentId = "factory", payload = { kind = "factory.run", goal = "report" } }

``reconcile`` makes the database say what the file says, idempotently: a declared schedule that is
missing (or deleted) is created; one whose declaration or paused flag differs is updated, paused or
resumed; a schedule the file declared before and no longer does is deleted. A schedule the API
declared is never touched, even under an id the file also uses (the file's entry is then reported
as a conflict). The same file twice writes nothing the second time. The file's schedules post their
jobs with the rights of the system (the operator wrote the file).
"""

from __future__ import annotations

import json
import logging
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sqlalchemy import select

from app.jobs.errors import ValidationError
from app.jobs.ids import ORGANIZATION_ID_PATTERN, ORGANIZATION_ID_RULE
from app.jobs.privilege import Enqueuer
from app.schedules import service, storage
from app.schedules.reducer import Schedule
from app.schedules.spec import Declared, validate_create
from app.storage import loop_claims
from app.storage.db import schedules
from app.storage.queue import Queue

log = logging.getLogger("receipt.schedules")

FILE_USER: Final = "schedules-file"
# Who a file's schedules post as: the operator who wrote the file, with the system's rights.
FILE_ENQUEUER: Final = Enqueuer(token_id=None, scopes=(), system=True)


class ScheduleFileError(ValueError):
    """The schedules file cannot be read or declares something invalid (the message says where)."""


def load(path: str | Path) -> list[Declared]:
    """Every schedule the file declares, validated; ``ScheduleFileError`` naming the entry and field."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScheduleFileError(f"{file}: cannot be read ({exc.strerror or exc})") from None
    try:
        data: Any = tomllib.loads(text) if file.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        kind = "TOML" if file.suffix.lower() == ".toml" else "JSON"
        raise ScheduleFileError(f"{file}: not valid {kind} ({exc})") from None
    entries = data.get("schedules") if isinstance(data, Mapping) else None
    if not isinstance(entries, list):
        raise ScheduleFileError(f"{file}: must hold a list `schedules` of schedule declarations")
    out: list[Declared] = []
    seen: set[tuple[str, str]] = set()
    for n, entry in enumerate(entries, start=1):
        try:
            declared = _entry(entry)
        except ValidationError as exc:
            raise ScheduleFileError(f"{file}: schedule {n}: {exc.message}") from None
        ident = (declared.organization_id, declared.schedule_id)
        if ident in seen:
            raise ScheduleFileError(f"{file}: schedule {n}: {ident[1]!r} is declared twice in {ident[0]}")
        seen.add(ident)
        out.append(declared)
    return out


def _entry(entry: Any) -> Declared:
    if not isinstance(entry, Mapping):
        raise ValidationError("schedule", "must be a table (an object)")
    org = entry.get("organizationId")
    if not isinstance(org, str) or not ORGANIZATION_ID_PATTERN.fullmatch(org):
        raise ValidationError("organizationId", ORGANIZATION_ID_RULE)
    body = {k: v for k, v in entry.items() if k != "organizationId"}
    default_auth = {"userId": FILE_USER, "organizationId": org}
    declared = validate_create(body, default_auth=default_auth, source="file")
    if declared.organization_id != org:
        raise ValidationError(
            "job.payload.authContext.organizationId", f"must be the entry's organizationId ({org})"
        )
    return declared


@dataclass
class Reconciled:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.paused or self.resumed or self.deleted)

    def to_json(self) -> dict[str, list[str]]:
        return {
            "created": self.created,
            "updated": self.updated,
            "paused": self.paused,
            "resumed": self.resumed,
            "deleted": self.deleted,
            "unchanged": self.unchanged,
            "conflicts": self.conflicts,
        }


def _file_owned(queue: Queue) -> list[Schedule]:
    """Every live schedule the file declared (read once, at startup)."""
    with queue.engine.connect() as conn:
        rows = conn.execute(select(schedules.c.state).where(schedules.c.status != "deleted")).all()
    found = [Schedule.from_json(r.state) for r in rows]
    return [s for s in found if s.spec.source == "file"]


def reconcile(queue: Queue, declared: Sequence[Declared]) -> Reconciled:
    """Make the database hold what ``declared`` says (see the module doc)."""
    out = Reconciled()
    wanted: set[str] = set()
    for d in declared:
        key = storage.key_of(d.organization_id, d.schedule_id)
        assert key is not None
        wanted.add(key)
        with queue.engine.connect() as conn:
            loaded = storage.load(conn, key)
        current = loaded.schedule if loaded is not None and loaded.schedule.status != "deleted" else None
        if current is None:
            service.create(queue, d, enqueued_by=FILE_ENQUEUER)
            out.created.append(key)
            continue
        if current.spec.source != "file":
            log.warning("schedules file: %s was declared through the API; the file's entry is ignored", key)
            out.conflicts.append(key)
            continue
        changed = False
        if current.spec.to_json() != d.spec.to_json():
            service.update(queue, key, None, enqueued_by=FILE_ENQUEUER, replace_with=d.spec)
            out.updated.append(key)
            changed = True
        if d.paused and current.status == "active":
            service.pause(queue, key, "paused in the schedules file")
            out.paused.append(key)
            changed = True
        elif not d.paused and current.status == "paused":
            service.resume(queue, key)
            out.resumed.append(key)
            changed = True
        if not changed:
            out.unchanged.append(key)
    for s in _file_owned(queue):
        if s.id not in wanted:
            service.delete(queue, s.id, "removed from the schedules file")
            out.deleted.append(s.id)
    return out


def reconcile_file(queue: Queue, path: str | Path) -> Reconciled:
    """``load`` then ``reconcile``; logs what changed."""
    result = reconcile(queue, load(path))
    if result.changed or result.conflicts:
        log.info("schedules file %s reconciled: %s", path, {k: v for k, v in result.to_json().items() if v})
    return result


# The loop_runs row the startup reconcile claims, so processes starting together reconcile once.
RECONCILE_CLAIM: Final = "schedules-file"
RECONCILE_SPACING_MS: Final = 5000


def reconcile_once(queue: Queue, path: str | None) -> dict[str, Any]:
    """Reconcile the file at startup, unless another process's reconcile holds or just ran the claim."""
    if not path:
        return {"skipped": True}
    policy = loop_claims.Policy(
        ttl_ms=loop_claims.claim_ttl_ms(30_000), spacing_ms=RECONCILE_SPACING_MS, holds=True
    )
    outcome = loop_claims.run_claimed(
        queue.engine, RECONCILE_CLAIM, policy, lambda _keep: reconcile_file(queue, path).to_json()
    )
    return outcome.result
