"""Durable, signed delivery callbacks: the outbox recorder for ``dispatched`` and the sender.

Spec step 6: a JSON POST on ``dispatched``, ``completed``, ``failed`` and ``canceled`` to
``RECEIPT_RESONATE_CALLBACK_URL`` and ``RECEIPT_EVENT_CALLBACK_URL``, 5 s timeout,
``Authorization: Bearer $RECEIPT_CALLBACK_TOKEN`` when set. They are durable: terminal
events are outbox rows written with their receipt (``app/storage/outbox.py``); ``dispatched`` has
no receipt and is recorded here just before the worker message is sent.

The sender is a recovery loop like the others (beat every ``RECEIPT_CALLBACK_SEND_INTERVAL_MS``,
plus the local ticker): it sends each due row at least once, signed with the Standard Webhooks
headers through the ``standardwebhooks`` library, never follows a redirect, and backs off per
row. A target that fails is not tried again in the same pass (its other rows wait), so a dead
target costs one connection attempt per pass, not one per pending event.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime
from typing import TYPE_CHECKING, Any

import requests
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import select
from sqlalchemy.engine import Connection
from standardwebhooks.webhooks import Webhook

from app import tracing
from app.config import Settings
from app.jobs.reducer import Job
from app.ops import metrics
from app.redaction import redactor
from app.storage import outbox
from app.storage.db import db_now, jobs, transaction

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

log = logging.getLogger("receipt.callbacks")

CALLBACK_TIMEOUT_S = 5.0
CALLBACK_EVENTS = outbox.CALLBACK_EVENTS


def webhook_for(secret: str | None) -> Webhook | None:
    """The signer for ``RECEIPT_CALLBACK_SECRET``: ``whsec_<base64>`` as the standard writes it,
    any other text as raw bytes (so an operator's plain secret works too)."""
    if not secret:
        return None
    if secret.startswith("whsec_"):
        return Webhook(secret)
    return Webhook(secret.encode())


class Callbacks:
    """Records ``dispatched`` events in the outbox of one deployment's callback targets."""

    def __init__(self, settings: Settings) -> None:
        self.targets = settings.callback_targets

    def dispatched(self, engine: Engine, job: Job, fence: str) -> str | None:
        """Record ``dispatched`` before the worker message leaves; returns its event id."""
        if not self.targets:
            return None
        with transaction(engine) as conn:
            ids = outbox.record(conn, self.targets, "dispatched", job, db_now(conn), key=fence)
        return ids[0] if ids else None

    def forget(self, engine: Engine, evt_id: str | None) -> None:
        """The message never left: there is nothing to announce."""
        if evt_id is None:
            return
        with transaction(engine) as conn:
            outbox.forget(conn, evt_id)


class Sender:
    """Posts outbox rows: signed, 5 s timeout, no redirects; marks each delivered or failed."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.webhook = webhook_for(settings.callback_secret)
        # An HTTP client's error quotes the URL it called, query string included: the text is
        # stored in the outbox row and logged, so the target's secrets are hidden first.
        self.hide = redactor(settings)
        if self.webhook is None and settings.callback_targets:
            log.warning("RECEIPT_CALLBACK_SECRET is unset: callbacks are sent unsigned")
        self.headers = {"Content-Type": "application/json"}
        if settings.callback_token:
            self.headers["Authorization"] = f"Bearer {settings.callback_token}"
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session

    def signed_headers(self, row: outbox.Row, now: datetime) -> dict[str, str]:
        headers = dict(self.headers)
        headers["webhook-id"] = row.event_id
        headers["webhook-timestamp"] = str(int(now.timestamp()))
        if self.webhook is not None:
            headers["webhook-signature"] = self.webhook.sign(row.event_id, now, row.body)
        return headers

    def send(self, row: outbox.Row, now: datetime, *, traced: bool = False) -> str | None:
        """One attempt; None on a 2xx answer, else what went wrong. ``traced``: the current span's
        context goes with it (``traceparent``)."""
        headers = self.signed_headers(row, now)
        if traced:
            tracing.inject(headers)
        try:
            response = self._session().post(
                row.target,
                data=row.body.encode(),
                headers=headers,
                timeout=CALLBACK_TIMEOUT_S,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            return self.hide(f"{type(exc).__name__}: {exc}")
        if 200 <= response.status_code < 300:
            return None
        if 300 <= response.status_code < 400:
            return f"answered {response.status_code} (redirects are not followed)"
        return f"answered {response.status_code}"


def trace_context_of_job(conn: Connection, job_id: str) -> Mapping[str, str] | None:
    """The job's stored trace context ({} when it recorded none), for its callbacks' spans."""
    row = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).first()
    return (Job.from_json(row.state).trace_context or {}) if row is not None else {}


def traced_send(sender: Sender, row: outbox.Row, now: datetime, stored: Mapping[str, str]) -> str | None:
    """One delivery as a span in the job's trace (``receipt.callback``); the POST carries the span's
    ``traceparent``, so a receiver that traces continues the job's trace."""
    attributes = {tracing.JOB_ID: row.job_id, "receipt.callback.event": row.event}
    with tracing.job_span(
        "receipt.callback", row.job_id, stored or None, attributes, kind=SpanKind.CLIENT
    ) as span:
        error = sender.send(row, now, traced=True)
        if error is not None:
            span.set_status(StatusCode.ERROR, error)
        return error


def send_due(engine: Engine, sender: Sender, keep: Any = None) -> dict[str, Any]:
    """One sender pass: every due line head, grouped by target, each target in its own thread."""
    s = sender.settings
    with engine.connect() as conn:
        rows = outbox.due(conn, db_now(conn))
    by_target: dict[str, list[outbox.Row]] = defaultdict(list)
    for row in rows:
        by_target[row.target].append(row)
    delivered: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()

    def drain(target_rows: list[outbox.Row]) -> None:
        for row in target_rows:
            with engine.connect() as conn:
                now = db_now(conn)
                stored = trace_context_of_job(conn, row.job_id) if tracing.on() else None
            error = sender.send(row, now) if stored is None else traced_send(sender, row, now, stored)
            with transaction(engine) as conn:
                now = db_now(conn)
                if error is None:
                    outbox.mark_delivered(conn, row.id, now)
                else:
                    state = outbox.mark_failed(
                        conn,
                        row,
                        error,
                        now,
                        base_ms=s.callback_retry_base_ms,
                        max_ms=s.callback_retry_max_ms,
                        give_up_ms=s.callback_give_up_ms,
                    )
                    level = logging.ERROR if state == "dead" else logging.WARNING
                    log.log(
                        level,
                        "callback %s %s for %s: %s (%s)",
                        row.event,
                        row.event_id,
                        row.job_id,
                        error,
                        state,
                    )
            if error is not None:
                metrics.registry_metrics().callback_failures.labels(row.event).inc()
            with lock:
                (delivered if error is None else failed).append(row.event_id)
            if error is not None:
                return  # this target is failing: its other rows wait for a later pass

    if by_target:
        with ThreadPoolExecutor(
            max_workers=min(8, len(by_target)), thread_name_prefix="receipt-callback"
        ) as pool:
            pending = {pool.submit(drain, target_rows) for target_rows in by_target.values()}
            while pending:
                done, pending = wait(pending, timeout=0.2)
                for future in done:
                    future.result()
                if keep is not None:
                    keep()
    return {"delivered": len(delivered), "failed": len(failed)}
