"""An enqueue that takes no lock skips the read of its id and of the clock while the process's
reading of the database clock is fresh (``queue.DbClock``, ``CLOCK_REUSE_S``): one statement, which
inserts the row only if the id is new, not archived and not an older bare id of the organisation's.
Otherwise it conflicts and the next try reads, so every answer is the one a read would give."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.errors import JobArchived
from app.jobs.validation import EnqueueRequest, validate_enqueue
from app.jobs.vocab import job_stream
from app.retention import archive
from app.retention.policy import Policy
from app.retention.sink import DirectorySink
from app.storage import db, projection, store
from app.storage.db import parse_iso
from app.storage.queue import CLOCK_REUSE_S, DbClock, Queue
from tests.support.queue_ops import complete, lease
from tests.support.spies import counting

ORG = "org-unread"


def req(job_id: str | None) -> EnqueueRequest:
    body: dict[str, Any] = {
        "payload": {"kind": "factory.task.run", "authContext": {"userId": "u", "organizationId": ORG}}
    }
    if job_id is not None:
        body["jobId"] = job_id
    return validate_enqueue("codex", body)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often an enqueue reads its id (with the clock) or the clock alone."""
    seen = {"id": 0, "clock": 0}

    monkeypatch.setattr(projection, "load_for_enqueue", counting(seen, "id", projection.load_for_enqueue))
    monkeypatch.setattr("app.storage.queue.db_now", counting(seen, "clock", db.db_now))
    return seen


@pytest.fixture
def warm(pg_engine: Engine) -> Queue:
    """A queue whose clock reading is fresh: one enqueue read it."""
    queue = queue_for(pg_engine, ledger_in_background=True)
    queue.enqueue(req("warm-up"))
    return queue


def test_a_new_id_is_written_without_a_read_while_the_clock_reading_is_fresh(
    warm: Queue, reads: dict[str, int]
) -> None:
    first = warm.enqueue(req("one"))
    plain = warm.enqueue(req(None))  # a generated id reads nothing either
    assert first.created and plain.created
    assert reads == {"id": 0, "clock": 0}
    assert warm.get(first.job.id) == first.job and warm.get(plain.job.id) == plain.job
    with warm.engine.connect() as conn:
        assert store.verify(conn)[1] is None
        now = db.db_now(conn)
    # Stamped with the database clock as last read plus the time since: never ahead of it.
    at = parse_iso(first.job.created_at)
    assert at is not None and now - timedelta(seconds=CLOCK_REUSE_S + 5) < at <= now


def test_a_reposted_id_conflicts_and_answers_with_the_job_it_names(
    warm: Queue, reads: dict[str, int]
) -> None:
    first = warm.enqueue(req("again"))
    second = warm.enqueue(req("again"))
    assert first.created and not second.created
    assert second.job == first.job
    assert reads["id"] == 1  # the re-post's second try read it
    with warm.engine.connect() as conn:
        assert [r.type for r in store.read_stream(conn, job_stream(first.job.id))] == ["job.enqueued"]


def test_an_archived_id_is_refused_without_a_row_being_written(warm: Queue, tmp_path: Path) -> None:
    job = warm.enqueue(req("gone")).job
    lease(warm, job.id, "w1", 600_000)
    complete(warm, job.id, "w1", 1, {"ok": True})
    archive.run_pass(
        warm.engine,
        DirectorySink(tmp_path / "archive"),
        Policy(days=30),
        page_size=10,
        clock=lambda conn: db.db_now(conn) + timedelta(days=31),
    )
    warm.enqueue(req("fresh"))  # the clock reading is fresh again
    with pytest.raises(JobArchived):
        warm.enqueue(req("gone"))
    assert warm.get(job.id) is None


def test_an_older_bare_id_of_the_organisation_is_still_its_job(warm: Queue) -> None:
    # A row written before keys were qualified: its id is the client id itself.
    legacy = warm.enqueue(dataclasses.replace(req("bare-1"), key="bare-1")).job
    assert legacy.id == "bare-1"
    again = warm.enqueue(req("bare-1"))
    assert not again.created and again.job == legacy
    assert warm.get(f"{ORG}/bare-1") is None


def test_a_clock_reading_stands_in_only_while_fresh_and_never_runs_ahead() -> None:
    ticks = [100.0]  # the process's monotonic clock, moved by hand
    clock = DbClock(monotonic=lambda: ticks[0])
    assert clock.now() is None  # nothing read yet: the enqueue reads
    at = datetime(2030, 1, 1, tzinfo=UTC)
    clock.saw(at)
    assert clock.now() == at
    ticks[0] += 0.25  # the monotonic clock moves on: so does the estimate
    assert clock.now() == at + timedelta(seconds=0.25)
    assert clock.now(within_s=0.1) is None  # older than the bound: read again
    ticks[0] += CLOCK_REUSE_S  # past the default bound
    assert clock.now() is None
