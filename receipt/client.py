"""A typed Python client for Receipt's HTTP API.

    from receipt.client import Client
    client = Client("http://127.0.0.1:8080", token="rcpt_...")
    job = client.enqueue("codex", {"kind": "factory.task.run", "command": ["echo", "hi"]})["job"]
    for event in client.follow(job["id"]):      # live, resumes after a dropped connection
        print(event.seq, event.status, event.job["progress"])
    final = client.wait(job["id"], timeout=60)  # or just block until it is terminal

Every error the API answers with becomes a ``ReceiptError`` (or a subclass) carrying the API's
error ``code``, ``status`` and ``details``, so callers branch on codes, never on messages.

What the token already says is not asked for again: ``enqueue`` fills a payload without an
``authContext`` with the token's organisation (``GET /whoami``, asked once per client) and a
``userId``: the ``user=`` argument, else ``$RECEIPT_USER``, else ``token:<tokenId>`` (the value
the server itself records when it defaults an objective's ``authContext``). The login name
``$USER`` is not used: it is whatever account runs the script (``root`` in a container, ``runner``
in CI) and nothing vouches for it. An explicit ``authContext`` is sent untouched, and one naming
another organisation is refused by the server (403).

Refusals the server asks to be repeated are repeated (``receipt.retry``): a ``429`` always, a
``503`` when the request is safe to send twice, each after ``Retry-After`` plus jitter, at most
``RetryPolicy.max_tries`` tries and ``max_wait`` seconds of waiting; ``retry=None`` turns it off.
"""

from __future__ import annotations

import json as _json
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests

from receipt.retry import RETRYABLE_STATUSES, RetryPolicy, parse_retry_after

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRY = RetryPolicy()
# The one kind the server accepts without an authContext (a system-wide sweep with no organisation).
KINDS_WITHOUT_AUTH_CONTEXT = frozenset({"factory.objective.watchdog"})
USER_ENV = "RECEIPT_USER"

JsonObject = dict[str, Any]


class ReceiptError(Exception):
    """The API answered with an error: ``status``, the API's ``code``, its message and details."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class AuthError(ReceiptError):
    """401 or 403: the token is missing, invalid, revoked or lacks a scope."""


class NotFound(ReceiptError):
    """404: no such resource, or one that belongs to another organisation."""


class Conflict(ReceiptError):
    """409: the request conflicts with the resource's state (e.g. it is already terminal)."""


class InvalidRequest(ReceiptError):
    """400/413/422: the request was refused before anything was written; ``details`` names the field."""


class RateLimited(ReceiptError):
    """429: too many requests or streams; ``retry_after`` says when to try again (seconds)."""

    retry_after: float | None = None


class WaitTimeout(ReceiptError):
    """``follow``/``wait``/``follow_objective`` ran out of time before the job (or objective) ended."""

    def __init__(self, job_id: str, timeout: float) -> None:
        super().__init__(0, "timeout", f"{job_id} was not terminal within {timeout:g} s")
        self.job_id = job_id


@dataclass(frozen=True)
class RetryNotice:
    """A refused request about to be tried again: told to ``Client(on_retry=...)`` before the wait."""

    method: str
    path: str
    status: int
    code: str
    wait: float
    next_try: int
    max_tries: int


TERMINAL_STATUSES = frozenset({"completed", "failed", "canceled"})
# The server sends a heartbeat comment every 15 s: a minute of silence means a dead connection.
STREAM_READ_TIMEOUT_S = 60.0
RECONNECT_DELAY_S = 1.0
# Items per POST /jobs:batch (the server's default RECEIPT_BATCH_MAX).
BATCH_SIZE = 1000


@dataclass(frozen=True)
class JobEvent:
    """One event of a followed job: the receipt's ``seq`` and the job's state after it."""

    seq: int
    job: JsonObject

    @property
    def status(self) -> str:
        return str(self.job.get("status"))

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class ObjectiveEvent:
    """One event of a followed objective: its name, the objective's ``seq`` (None for a ``task``
    event, which moves no receipt), and the whole objective with the event applied."""

    event: str
    seq: int | None
    objective: JsonObject

    @property
    def status(self) -> str:
        return str(self.objective.get("status"))

    @property
    def finished(self) -> bool:
        """Ended, with its audit in: the server sends nothing more."""
        return self.status in TERMINAL_STATUSES and self.objective.get("audit") is not None


def apply_objective_event(
    objective: JsonObject | None, event: str, data: Mapping[str, Any]
) -> JsonObject | None:
    """The objective after one event of ``GET /objectives/<id>/events``.

    ``objective`` is a snapshot (GET's shape) and replaces everything; ``delta`` (one per objective
    receipt) and ``task`` (a task's job started or was retried) carry only the tasks that changed,
    replaced by id (a task not seen before, from a replan, is appended), and ``delta`` the
    ``status``, ``phase``, ``audit`` and ``updatedAt`` that changed. Before a snapshot there is
    nothing to apply a change to: None.
    """
    if event == "objective":
        return {**data, "tasks": [dict(t) for t in data["tasks"]]}
    if objective is None:
        return None
    tasks = list(objective["tasks"])
    index = {t["id"]: n for n, t in enumerate(tasks)}
    for task in data.get("tasks", ()):
        if task["id"] in index:
            tasks[index[task["id"]]] = dict(task)
        else:
            index[task["id"]] = len(tasks)
            tasks.append(dict(task))
    out = {**objective, "tasks": tasks}
    for key in ("status", "phase", "audit", "updatedAt"):
        if key in data:
            out[key] = data[key]
    return out


@dataclass(frozen=True)
class SseFrame:
    """One Server-Sent Events frame (``id``/``event``/``data``); comments are dropped."""

    id: str | None
    event: str | None
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[SseFrame]:
    """Frames from an event stream's lines (the WHATWG rules this API uses: one data line each)."""
    fields: dict[str, str] = {}
    data: list[str] = []
    for line in lines:
        if line == "":
            if data or fields:
                yield SseFrame(fields.get("id"), fields.get("event"), "\n".join(data))
            fields, data = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name in ("id", "event", "retry"):
            fields[name] = value
    if data:
        yield SseFrame(fields.get("id"), fields.get("event"), "\n".join(data))


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Lines of a byte stream (LF or CRLF), decoded as UTF-8, as the chunks arrive."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
    if buffer:
        yield buffer.rstrip(b"\r").decode("utf-8", errors="replace")


def rfc3339(value: datetime | str) -> str:
    """A time as the API takes it: RFC 3339 with its offset. A naive datetime is refused, since it
    names a different instant on every host."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("run_at must be timezone-aware (e.g. datetime.now(UTC) + timedelta(minutes=10))")
    return value.isoformat()


def _error_code(response: requests.Response) -> str:
    """The API's error code in a refusal's body ("http_error" when it has none)."""
    try:
        data = response.json()
    except ValueError:
        return "http_error"
    error = data.get("error") if isinstance(data, dict) else None
    return str(error.get("code", "http_error")) if isinstance(error, dict) else "http_error"


def _error_class(status: int) -> type[ReceiptError]:
    if status in (401, 403):
        return AuthError
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status == 429:
        return RateLimited
    if 400 <= status < 500:
        return InvalidRequest
    return ReceiptError


class Client:
    """One deployment, one token. Thread-safe as far as ``requests.Session`` is.

    ``retry``: how refused requests are repeated (``DEFAULT_RETRY``; None: never). ``user``: the
    ``userId`` of a filled-in ``authContext``. ``on_retry`` is told before each wait (the CLI
    prints it); ``sleep`` and ``rand`` are the waiting and the jitter's randomness, replaceable in
    tests.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        session: requests.Session | None = None,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        user: str | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        resolved = url or os.environ.get("RECEIPT_URL")
        if not resolved:
            raise ValueError("no Receipt URL: pass url= or set RECEIPT_URL")
        self.url = resolved.rstrip("/")
        self.token = token if token is not None else os.environ.get("RECEIPT_TOKEN")
        self.timeout = timeout
        self.session = session or requests.Session()
        self.retry = retry
        self.user = user or os.environ.get(USER_ENV) or None
        self.on_retry = on_retry
        self._sleep = sleep
        self._rand = rand
        self._whoami: JsonObject | None = None

    # -- transport -------------------------------------------------------------------------------

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        out = {"Accept": "application/json"}
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        if extra:
            out.update(extra)
        return out

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
    ) -> JsonObject:
        """One API call; the decoded JSON object, or a typed ``ReceiptError``.

        ``idempotent``: whether sending it twice does no harm (default: only a GET), which lets a
        ``503`` be repeated; a ``429`` is repeated either way (``receipt.retry``).
        """
        response = self.send(
            method,
            path,
            idempotent=method == "GET" if idempotent is None else idempotent,
            json=json,
            params={k: v for k, v in (params or {}).items() if v is not None},
            headers=self.headers(),
            timeout=self.timeout,
        )
        return self.decode(response)

    def send(
        self, method: str, path: str, *, idempotent: bool, deadline: float | None = None, **kwargs: Any
    ) -> requests.Response:
        """The response to ``method path`` once it is not a refusal worth repeating (or the policy
        gave up, or ``deadline``, a ``time.monotonic()`` value, would pass during the wait)."""
        tries, waited = 0, 0.0
        while True:
            response = self.session.request(method, self.url + path, allow_redirects=False, **kwargs)
            tries += 1
            status = response.status_code
            if self.retry is None or status not in RETRYABLE_STATUSES or (status == 503 and not idempotent):
                return response
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            if status == 503 and retry_after is None:
                return response  # a 503 without Retry-After did not ask to be repeated
            wait = self.retry.delay(tries=tries, waited=waited, retry_after=retry_after, rand=self._rand())
            if wait is None or (deadline is not None and time.monotonic() + wait >= deadline):
                return response
            if self.on_retry is not None:
                self.on_retry(
                    RetryNotice(
                        method, path, status, _error_code(response), wait, tries + 1, self.retry.max_tries
                    )
                )
            response.close()
            self._sleep(wait)
            waited += wait

    @staticmethod
    def decode(response: requests.Response) -> JsonObject:
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code >= 400:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            cls = _error_class(response.status_code)
            exc = cls(
                response.status_code,
                str(error.get("code", "http_error")),
                str(error.get("message", response.reason)),
                error.get("details"),
            )
            if isinstance(exc, RateLimited):
                exc.retry_after = parse_retry_after(response.headers.get("Retry-After"))
            raise exc
        if not isinstance(data, dict):
            raise ReceiptError(response.status_code, "invalid_response", "the API did not answer JSON")
        return data

    # -- who the token is ------------------------------------------------------------------------

    def whoami(self) -> JsonObject:
        """GET /whoami: the token's ``organizationId``, ``tokenId``, ``system`` and ``scopes``.

        Asked once per client and kept: a client holds one token, and what it stands for does not
        change (a revoked token fails every later call with 401 anyway).
        """
        if self._whoami is None:
            self._whoami = self.request("GET", "/whoami")
        return self._whoami

    def with_auth_context(self, payload: Mapping[str, Any]) -> JsonObject:
        """``payload`` with an ``authContext`` from the token when it has none (see the module doc).

        Left as given: a payload that has one (even partial or null: it is the caller's), the kind
        that takes none, and a caller with no organisation (``RECEIPT_AUTH=disabled`` without a
        token), whose missing ``authContext`` the server then names.
        """
        out = dict(payload)
        if "authContext" in out or out.get("kind") in KINDS_WITHOUT_AUTH_CONTEXT:
            return out
        me = self.whoami()
        organization = me.get("organizationId")
        if not organization:
            return out
        out["authContext"] = {
            "userId": self.user or f"token:{me.get('tokenId')}",
            "organizationId": organization,
        }
        return out

    # -- jobs ------------------------------------------------------------------------------------

    def enqueue(
        self,
        agent_id: str,
        payload: Mapping[str, Any],
        *,
        run_at: datetime | str | None = None,
        delay_ms: int | None = None,
        **fields: Any,
    ) -> JsonObject:
        """POST /agents/<agentId>/jobs; ``fields`` are the body's other keys (jobId, lane, ...).

        A payload without ``authContext`` gets the token's (``with_auth_context``). With a
        ``jobId`` the post is idempotent, so a ``503`` is repeated too. ``run_at`` (an aware
        datetime, or RFC 3339 text) or ``delay_ms`` make it a delayed job: queued, and not
        delivered before that time (a past time runs at once).
        """
        body = {"payload": self.with_auth_context(payload), **fields}
        if run_at is not None:
            body["runAt"] = rfc3339(run_at)
        if delay_ms is not None:
            body["delayMs"] = delay_ms
        return self.request(
            "POST", f"/agents/{agent_id}/jobs", json=body, idempotent=fields.get("jobId") is not None
        )

    def enqueue_many(
        self, items: Iterable[Mapping[str, Any]], *, batch_size: int = BATCH_SIZE
    ) -> list[JsonObject]:
        """POST /jobs:batch, ``batch_size`` items a request: each item is a single enqueue's body plus
        its ``agentId``; a payload without ``authContext`` gets the token's. Returns one entry per
        item, in order (``{index, created, steered, job}``, ``index`` counted across the batches).

        Each request is one transaction on the server, all or none; a refused request raises and
        the batches before it stay written. A batch whose every item has a ``jobId`` is idempotent,
        so a ``503`` is repeated too.
        """
        out: list[JsonObject] = []
        batch: list[dict[str, Any]] = []

        def send() -> None:
            idempotent = all(i.get("jobId") is not None for i in batch)
            answered = self.request("POST", "/jobs:batch", json={"items": batch}, idempotent=idempotent)
            offset = len(out)
            out.extend([{**entry, "index": entry["index"] + offset} for entry in answered["jobs"]])
            batch.clear()

        for entry in items:
            batch.append({**entry, "payload": self.with_auth_context(entry.get("payload") or {})})
            if len(batch) == batch_size:
                send()
        if batch:
            send()
        return out

    def get(self, job_id: str) -> JsonObject:
        """The job (``{"job": {...}}`` unwrapped)."""
        job: JsonObject = self.request("GET", f"/jobs/{job_id}")["job"]
        return job

    def list(self, **filters: Any) -> JsonObject:
        """GET /jobs with filters (status, agentId, lane, limit, cursor, ...): the page as sent."""
        return self.request("GET", "/jobs", params=filters)

    def cancel(self, job_id: str, reason: str | None = None) -> JsonObject:
        return self.request("POST", f"/jobs/{job_id}/cancel", json={"reason": reason} if reason else {})

    def replay(self, job_id: str, **fields: Any) -> JsonObject:
        """POST /jobs/<jobId>/replay (``fields``: jobId, replayKey, payload, tags): ``{job, created,
        replayOf}``. Idempotent (the replay's id is chosen or derived), so a ``503`` is repeated too."""
        return self.request("POST", f"/jobs/{job_id}/replay", json=fields, idempotent=True)

    def bulk(self, *, organization_id: str | None = None, **body: Any) -> JsonObject:
        """POST /jobs:bulk (action, filter, dryRun, idempotencyKey, cursor, limit, reason): the answer.
        A run carries its idempotency key, so a ``503`` is repeated too. ``organization_id``: the
        organisation it acts in (a system token must name one)."""
        params = {"organizationId": organization_id}
        return self.request("POST", "/jobs:bulk", json=body, params=params, idempotent=True)

    def operation(self, operation_id: str, *, organization_id: str | None = None) -> JsonObject:
        """GET /operations/<operationId>: a bulk operation's progress, ``{operation}``."""
        params = {"organizationId": organization_id}
        return self.request("GET", f"/operations/{operation_id}", params=params)

    def dead_letters(self, *, organization_id: str | None = None, **filters: Any) -> JsonObject:
        """GET /dead-letters with filters (agentId, kind, ...): ``{groups, total}`` (a system token
        names the organisation with ``organization_id``)."""
        return self.request("GET", "/dead-letters", params={**filters, "organizationId": organization_id})

    def commands(self, job_id: str, body: Mapping[str, Any]) -> JsonObject:
        """POST /jobs/<jobId>/commands (steer, follow_up, abort)."""
        return self.request("POST", f"/jobs/{job_id}/commands", json=dict(body))

    def follow(
        self,
        job_id: str,
        *,
        after: int = 0,
        reconnect_delay: float = RECONNECT_DELAY_S,
        max_reconnects: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[JobEvent]:
        """The job's state after each change, live, until it is terminal (GET /jobs/<id>/events).

        A dropped connection, or a stream the server ended (it closes each after
        ``RECEIPT_SSE_MAX_SECONDS``), is resumed with ``Last-Event-ID`` after ``reconnect_delay``,
        so no state is skipped or repeated. ``max_reconnects`` consecutive failures (``None``:
        no limit) re-raise the last network error; ``timeout`` bounds the whole follow
        (``WaitTimeout``). API errors (404, 401, ...) raise at once as ``ReceiptError``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last = after
        failures = 0
        while True:
            try:
                quiet = True
                for event in self._event_stream(job_id, last, deadline):
                    failures, quiet = 0, False
                    last = event.seq
                    yield event
                    if event.terminal:
                        return
                if quiet and self.get(job_id).get("status") in TERMINAL_STATUSES:
                    return  # terminal before ``after``: the server has nothing more to send
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError):
                failures += 1
                if max_reconnects is not None and failures > max_reconnects:
                    raise
            if deadline is not None and time.monotonic() + reconnect_delay >= deadline:
                raise WaitTimeout(job_id, timeout or 0.0)
            time.sleep(reconnect_delay)

    def wait(self, job_id: str, *, timeout: float | None = None) -> JsonObject:
        """Block until the job is terminal and return it (``WaitTimeout`` after ``timeout`` s)."""
        job = self.get(job_id)
        if job.get("status") in TERMINAL_STATUSES:
            return job
        for event in self.follow(job_id, after=int(job.get("seq", 0)), timeout=timeout):
            if event.terminal:
                return event.job
        return self.get(job_id)  # the stream ended on a terminal event already delivered

    def _event_stream(self, job_id: str, after: int, deadline: float | None) -> Iterator[JobEvent]:
        for frame in self._frames(f"/jobs/{job_id}/events", after, deadline, job_id):
            if frame.event == "job" and frame.id is not None:
                yield JobEvent(int(frame.id), _json.loads(frame.data))

    # -- objectives ------------------------------------------------------------------------------

    def launch_objective(self, body: Mapping[str, Any]) -> JsonObject:
        """POST /objectives with ``{title, goal, plan, objectiveId?, failurePolicy?, authContext?}``:
        the response as sent (``{"objective": ..., "async": {...}}``)."""
        return self.request(
            "POST", "/objectives", json=dict(body), idempotent=body.get("objectiveId") is not None
        )

    def objective(self, objective_id: str) -> JsonObject:
        """The objective (``{"objective": {...}}`` unwrapped), every task with its status and result."""
        obj: JsonObject = self.request("GET", f"/objectives/{objective_id}")["objective"]
        return obj

    def objectives(self, **filters: Any) -> JsonObject:
        """GET /objectives with filters (status, limit, cursor, organizationId): the page as sent."""
        return self.request("GET", "/objectives", params=filters)

    def replan_objective(
        self, objective_id: str, tasks: Sequence[Mapping[str, Any]], reason: str | None = None
    ) -> JsonObject:
        """POST /objectives/<id>/plan: phase n+1 with ``tasks``; the objective (unwrapped).
        A terminal objective raises ``Conflict``; a bad plan ``BadRequest`` naming the field."""
        body: dict[str, Any] = {"tasks": [dict(t) for t in tasks]}
        if reason:
            body["reason"] = reason
        obj: JsonObject = self.request("POST", f"/objectives/{objective_id}/plan", json=body)["objective"]
        return obj

    def cancel_objective(self, objective_id: str, reason: str | None = None) -> JsonObject:
        """POST /objectives/<id>/cancel; the objective (unwrapped). A terminal one raises ``Conflict``."""
        body = {"reason": reason} if reason else {}
        obj: JsonObject = self.request("POST", f"/objectives/{objective_id}/cancel", json=body)["objective"]
        return obj

    def follow_objective(
        self,
        objective_id: str,
        *,
        reconnect_delay: float = RECONNECT_DELAY_S,
        max_reconnects: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[ObjectiveEvent]:
        """The objective after each event, live, until it ended and its audit is in
        (GET /objectives/<id>/events: a snapshot first, then small deltas applied here).

        Reconnects like ``follow``: with ``Last-Event-ID``, after which the server sends a fresh
        snapshot, so nothing is missed. ``timeout`` bounds the whole follow (``WaitTimeout``).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        state: JsonObject | None = None
        last = 0
        failures = 0
        while True:
            try:
                quiet = True
                frames = self._frames(f"/objectives/{objective_id}/events", last, deadline, objective_id)
                for frame in frames:
                    if frame.event not in ("objective", "delta", "task"):
                        continue
                    state = apply_objective_event(state, frame.event, _json.loads(frame.data))
                    if state is None:
                        continue
                    seq = int(frame.id) if frame.id is not None else None
                    last = seq if seq is not None else last
                    failures, quiet = 0, False
                    event = ObjectiveEvent(frame.event, seq, state)
                    yield event
                    if event.finished:
                        return
                if quiet and self.objective(objective_id).get("status") in TERMINAL_STATUSES:
                    return  # the server had nothing more to send: it ended before ``last``
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError):
                failures += 1
                if max_reconnects is not None and failures > max_reconnects:
                    raise
            if deadline is not None and time.monotonic() + reconnect_delay >= deadline:
                raise WaitTimeout(objective_id, timeout or 0.0)
            time.sleep(reconnect_delay)

    # -- schedules -------------------------------------------------------------------------------

    def create_schedule(self, body: Mapping[str, Any]) -> JsonObject:
        """POST /schedules: ``{scheduleId, cron | intervalMs, timeZone?, job: {agentId, payload, ...},
        overlap?, catchupWindowMs?, jitterMs?, startAt?, endAt?, paused?}``; the schedule (unwrapped).
        A template payload without ``authContext`` gets the token's (``with_auth_context``). The id
        makes it idempotent: an existing one is returned unchanged."""
        out = dict(body)
        job = out.get("job")
        if isinstance(job, Mapping) and isinstance(job.get("payload"), Mapping):
            out["job"] = {**job, "payload": self.with_auth_context(job["payload"])}
        schedule: JsonObject = self.request("POST", "/schedules", json=out, idempotent=True)["schedule"]
        return schedule

    def schedules(self, **filters: Any) -> JsonObject:
        """GET /schedules with filters (status, limit, cursor, organizationId): the page as sent."""
        return self.request("GET", "/schedules", params=filters)

    def schedule(self, schedule_id: str) -> JsonObject:
        """One schedule (unwrapped): its declaration, nextFireAt, lastOutcome and counts."""
        schedule: JsonObject = self.request("GET", f"/schedules/{schedule_id}")["schedule"]
        return schedule

    def update_schedule(self, schedule_id: str, **changes: Any) -> JsonObject:
        """PATCH /schedules/<id> with the fields to change (None clears one); the schedule."""
        body = dict(changes)
        job = body.get("job")
        if isinstance(job, Mapping) and isinstance(job.get("payload"), Mapping):
            body["job"] = {**job, "payload": self.with_auth_context(job["payload"])}
        schedule: JsonObject = self.request("PATCH", f"/schedules/{schedule_id}", json=body, idempotent=True)[
            "schedule"
        ]
        return schedule

    def pause_schedule(self, schedule_id: str, reason: str | None = None) -> JsonObject:
        body = {"reason": reason} if reason else {}
        schedule: JsonObject = self.request(
            "POST", f"/schedules/{schedule_id}/pause", json=body, idempotent=True
        )["schedule"]
        return schedule

    def resume_schedule(self, schedule_id: str) -> JsonObject:
        schedule: JsonObject = self.request(
            "POST", f"/schedules/{schedule_id}/resume", json={}, idempotent=True
        )["schedule"]
        return schedule

    def delete_schedule(self, schedule_id: str) -> JsonObject:
        schedule: JsonObject = self.request("DELETE", f"/schedules/{schedule_id}", idempotent=True)[
            "schedule"
        ]
        return schedule

    def trigger_schedule(self, schedule_id: str, overlap: str | None = None) -> JsonObject:
        """Fire a tick now: ``{"outcome": "fired" | "skipped", "job": ..., "schedule": ...}``."""
        body = {"overlap": overlap} if overlap else {}
        return self.request("POST", f"/schedules/{schedule_id}/trigger", json=body)

    def backfill_schedule(
        self, schedule_id: str, start_at: datetime | str, end_at: datetime | str
    ) -> JsonObject:
        """Fire every tick of ``[start_at, end_at]`` once: ``{"created": [...], "existing": [...]}``.
        Safe to repeat (the ticks' ids make a repeat a no-op)."""
        body = {"startAt": rfc3339(start_at), "endAt": rfc3339(end_at)}
        return self.request("POST", f"/schedules/{schedule_id}/backfill", json=body, idempotent=True)

    def schedule_fires(self, schedule_id: str, **params: Any) -> JsonObject:
        """GET /schedules/<id>/fires (limit, before): tick receipts newest first, with their jobs."""
        return self.request("GET", f"/schedules/{schedule_id}/fires", params=params)

    def _frames(self, path: str, after: int, deadline: float | None, subject: str) -> Iterator[SseFrame]:
        """The frames of one event-stream request (resuming after ``after``) until it ends."""
        headers = self.headers({"Accept": "text/event-stream"})
        if after:
            headers["Last-Event-ID"] = str(after)
        read_timeout = STREAM_READ_TIMEOUT_S
        if deadline is not None:
            read_timeout = max(0.1, min(read_timeout, deadline - time.monotonic()))
        with self.send(
            "GET",
            path,
            idempotent=True,
            deadline=deadline,
            headers=headers,
            stream=True,
            timeout=(self.timeout, read_timeout),
        ) as response:
            if response.status_code >= 400:
                self.decode(response)  # raises the typed error
            # chunk_size=None hands over each chunk as it arrives (a fixed size would wait to fill).
            for frame in parse_sse(_lines(response.iter_content(chunk_size=None))):
                yield frame
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(subject, 0.0)
