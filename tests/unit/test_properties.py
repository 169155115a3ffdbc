"""Property-based tests (hypothesis) of the reducer and of the queue's projection == fold.

1. Random event sequences (the ten types, worker ids and attempts from small pools, starting with
   or without ``job.enqueued``): only ``InvariantError`` escapes, with exactly the spec's message;
   the three invariants hold step by step; folding is deterministic and resumable; every state
   round-trips through its JSON.
2. A stateful test that drives random Queue operations against SQLite and checks, after every
   step, that the projection equals the fold and that each operation took effect exactly when
   the rules say it should.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.errors import ConflictError, InvariantError, no_job_message
from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.reducer import Job, Receipt, fold, reduce
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import (
    COMMAND_TYPES,
    EVENT_TYPES,
    FAILURE_STATUSES,
    LANES,
    LEASED_STATUSES,
    SINGLETON_MODES,
    STATUSES,
    TERMINAL_STATUSES,
)
from app.storage.db import db_now, parse_iso
from tests.support.databases import assert_projection_equals_fold
from tests.support.examples import examples
from tests.support.queue_ops import complete, lease, settle_canceled

JOB_ID = "j1"
STREAM = f"jobs/{JOB_ID}"
WORKERS = ["w1", "w2", "w3"]
ATTEMPTS = [0, 1, 2, 3]
COMMAND_IDS = ["c1", "c2", "c3"]
# RECEIPT_TEST_PROP_N / RECEIPT_TEST_STATEFUL_N raise the example counts for a longer local soak.
SETTINGS = settings(
    max_examples=int(os.environ.get("RECEIPT_TEST_PROP_N") or examples(100)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# -- strategies ---------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-10, 10)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
workers = st.sampled_from([*WORKERS, None])
attempts = st.sampled_from([*ATTEMPTS, None])


def maybe(key: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``{key: value}`` or ``{}``: fields may be absent, as in a hand-written replay file."""
    return st.one_of(st.just({}), values.map(lambda v: {key: v}))


def merged(*parts: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(*parts).map(lambda ds: {k: v for d in ds for k, v in d.items()})


fence = merged(maybe("workerId", workers), maybe("attempt", attempts))
payloads = st.builds(
    lambda kind, org: {
        "kind": kind,
        **({"authContext": {"userId": "u", "organizationId": org}} if org else {}),
    },
    st.sampled_from(PAYLOAD_KINDS),
    st.sampled_from([None, "o1", "o2"]),
)
BODIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "job.enqueued": st.fixed_dictionaries(
        {
            "jobId": st.just(JOB_ID),
            "agentId": st.sampled_from(["codex", "factory", "x"]),
            "lane": st.sampled_from(LANES),
            "payload": payloads,
            "sessionKey": st.sampled_from([None, "s"]),
            "singletonMode": st.sampled_from(SINGLETON_MODES),
            "maxAttempts": st.sampled_from([1, 1, 2, 2, 3, 8]),
        }
    ),
    "job.leased": merged(fence, maybe("expiresAt", st.sampled_from(["2026-01-01T00:05:00.000000Z", None]))),
    "job.heartbeat": merged(fence, maybe("expiresAt", st.just("2026-01-01T00:09:00.000000Z"))),
    "job.progress": merged(fence, maybe("progress", json_values)),
    "job.completed": merged(fence, maybe("result", json_values)),
    "job.failed": merged(
        fence,
        maybe("error", json_values),
        maybe("retryable", st.booleans()),
        maybe("status", st.sampled_from(FAILURE_STATUSES)),
        maybe("result", st.dictionaries(st.sampled_from(["a", "b"]), json_scalars, max_size=2)),
    ),
    "job.canceled": merged(fence, maybe("reason", st.sampled_from([None, "stop", "singleton cancel"]))),
    "queue.command": merged(
        st.fixed_dictionaries(
            {"commandId": st.sampled_from(COMMAND_IDS), "type": st.sampled_from(COMMAND_TYPES)}
        ),
        maybe("payload", json_values),
        maybe("reason", st.sampled_from([None, "r"])),
        maybe("fromSessionKey", st.just("s")),
        maybe("fromEnqueue", st.just(True)),
    ),
    "queue.command.consumed": st.fixed_dictionaries({"commandId": st.sampled_from([*COMMAND_IDS, "c9"])}),
    "job.lease_expired": merged(fence, maybe("error", st.just("lease expired"))),
    "job.released": merged(fence, maybe("reason", st.just("shutdown"))),
    "job.replayed": st.fixed_dictionaries({"replayedAs": st.sampled_from(["o/r1", "o/r2"])}),
    "job.archived": st.fixed_dictionaries({"operationId": st.sampled_from(["op-1", "op-2"])}),
}
assert set(BODIES) == set(EVENT_TYPES)


# Every type, weighted so a stream lives long enough to reach the interesting states (a
# queued job.canceled ends it at once; one in ten would end most streams within a few events).
_WEIGHTS = {
    "job.enqueued": 1,
    "job.leased": 4,
    "job.heartbeat": 3,
    "job.progress": 2,
    "job.completed": 1,
    "job.failed": 3,
    "job.canceled": 1,
    "queue.command": 2,
    "queue.command.consumed": 2,
    "job.lease_expired": 3,
    "job.released": 2,
    "job.replayed": 1,
    "job.archived": 1,
}
WEIGHTED_TYPES = [t for t in EVENT_TYPES for _ in range(_WEIGHTS[t])]
FENCED = (
    "job.heartbeat",
    "job.progress",
    "job.completed",
    "job.failed",
    "job.canceled",
    "job.lease_expired",
    "job.released",
)


@st.composite
def event_lists(
    draw: st.DrawFn,
    bodies: dict[str, st.SearchStrategy[dict[str, Any]]] = BODIES,
    min_size: int = 8,
    max_size: int = 30,
) -> list[Receipt]:
    """A random stream: with or without a leading ``job.enqueued``, then any of the ten types.

    Half the time a body is *aimed* at the state folded so far (the active lease's worker and
    attempt, the next attempt number, a pending command id), so that rare but interesting
    transitions (a second lease, a matching heartbeat, a late settlement) occur often.
    """
    types = draw(st.lists(st.sampled_from(WEIGHTED_TYPES), min_size=min_size, max_size=max_size))
    if draw(st.integers(0, 4)) > 0:  # mostly with job.enqueued first: a stream without one dies early
        types = ["job.enqueued", *types]
    out = []
    state: Job | None = None
    for seq, type_ in enumerate(types, start=1):
        at = draw(st.sampled_from([None, f"2026-01-01T00:{seq // 60:02d}:{seq % 60:02d}.000000Z"]))
        body = dict(draw(bodies[type_]))
        if state is not None and draw(st.booleans()):
            if type_ in FENCED and state.lease is not None:
                body.update(workerId=state.lease.worker_id, attempt=state.lease.attempt)
            elif type_ == "job.leased":
                body["attempt"] = state.attempt + 1
            elif type_ == "queue.command.consumed" and state.commands:
                body["commandId"] = draw(st.sampled_from([c.id for c in state.commands]))
        receipt = Receipt(STREAM, seq, type_, body, at=at)
        out.append(receipt)
        try:
            state = reduce(state, receipt)
        except InvariantError:
            state = None
    return out


def _hostile_body(type_: str) -> st.SearchStrategy[dict[str, Any]]:
    """A well-formed body with some known fields overwritten by any JSON value (a hand-edited replay file)."""
    keys = [
        "jobId",
        "agentId",
        "lane",
        "payload",
        "sessionKey",
        "singletonMode",
        "maxAttempts",
        "workerId",
        "attempt",
        "expiresAt",
        "progress",
        "result",
        "error",
        "retryable",
        "status",
        "reason",
        "commandId",
        "type",
        "fromSessionKey",
        "fromEnqueue",
    ]
    overrides = st.dictionaries(st.sampled_from(keys), json_values, min_size=1, max_size=4)
    return st.tuples(BODIES[type_], overrides).map(lambda parts: {**parts[0], **parts[1]})


HOSTILE = {t: _hostile_body(t) for t in EVENT_TYPES}


def walk(events: list[Receipt]) -> list[tuple[Job | None, Receipt, Job | None]]:
    """Fold step by step, returning (before, receipt, after) until an InvariantError (re-raised)."""
    steps = []
    state: Job | None = None
    for r in events:
        new = reduce(state, r)
        steps.append((state, r, new))
        state = new
    return steps


def fold_or_error(events: list[Receipt], state: Job | None = None) -> Job | str | None:
    try:
        return fold(events, state)
    except InvariantError as exc:
        return f"InvariantError: {exc}"


# -- reducer properties ---------------------------------------------------------------------------


def _only_invariant_error_escapes(events: list[Receipt]) -> None:
    state: Job | None = None
    for r in events:
        try:
            state = reduce(state, r)
        except InvariantError as exc:
            # Only for a job that does not exist, and with exactly the spec's message.
            assert state is None and r.type not in ("job.enqueued", "job.failed", "job.lease_expired")
            assert str(exc) == no_job_message(JOB_ID) == f"Invariant: no job for {JOB_ID}"
            return


@SETTINGS
@given(event_lists())
def test_only_the_invariant_error_escapes(events: list[Receipt]) -> None:
    _only_invariant_error_escapes(events)


@SETTINGS
@given(event_lists(HOSTILE, min_size=1, max_size=8))
def test_only_the_invariant_error_escapes_even_for_malformed_bodies(events: list[Receipt]) -> None:
    _only_invariant_error_escapes(events)
    for state in _states(events):
        assert Job.from_json(json.loads(json.dumps(state.to_json()))) == state


def _states(events: list[Receipt]) -> list[Job]:
    out: list[Job] = []
    state: Job | None = None
    for r in events:
        try:
            state = reduce(state, r)
        except InvariantError:
            break
        if state is not None:
            out.append(state)
    return out


@SETTINGS
@given(event_lists())
def test_the_three_invariants_hold_step_by_step(events: list[Receipt]) -> None:
    try:
        steps = walk(events)
    except InvariantError:
        steps = walk(events[: len(_states_prefix(events))])
    for before, r, after in steps:
        body = r.body
        if before is None:
            if r.type == "job.enqueued":
                assert (
                    after is not None
                    and after.status == "queued"
                    and after.attempt == 0
                    and after.lease is None
                )
            else:  # invariant 3's exceptions: ignored, not fatal
                assert r.type in ("job.failed", "job.lease_expired") and after is None
            continue
        assert after is not None
        inert = replace(before, seq=r.seq)
        assert after.seq == r.seq
        # Identity never changes after job.enqueued (a duplicate enqueue is inert).
        for name in (
            "id",
            "agent_id",
            "lane",
            "payload",
            "session_key",
            "singleton_mode",
            "max_attempts",
            "organization_id",
            "created_at",
        ):
            assert getattr(after, name) == getattr(before, name)
        if r.type == "job.enqueued":
            assert after == inert
        # Terminal states are absorbing; job.replayed only records the job that replays it.
        if before.status in TERMINAL_STATUSES and r.type == "job.replayed":
            assert replace(after, replayed_as=before.replayed_as, updated_at=before.updated_at) == inert
            assert set(after.replayed_as) - set(before.replayed_as) <= {body.get("replayedAs")}
        elif before.status in TERMINAL_STATUSES and r.type == "job.archived":
            # It only records the bulk archive moving the job out.
            assert replace(after, archived_by=before.archived_by, updated_at=before.updated_at) == inert
            assert after.archived_by in (before.archived_by, body.get("operationId"))
        elif before.status in TERMINAL_STATUSES:
            assert after == inert
        # Invariant 1: job.leased only from queued, and leased is only reached by job.leased.
        if r.type == "job.leased" and before.status != "queued":
            assert after == inert
        if after.status == "leased" and before.status != "leased":
            assert r.type == "job.leased" and before.status == "queued"
            assert after.attempt == before.attempt + 1
        # Invariant 2: heartbeat promotes only for the active lease; a superseded attempt is inert.
        holds = before.holds_lease(body.get("workerId"), body.get("attempt"))
        if r.type == "job.heartbeat" and not holds:
            assert after == inert
        if after.status == "running" and before.status != "running":
            assert r.type == "job.heartbeat" and before.status == "leased" and holds
        if (
            r.type in ("job.progress", "job.completed", "job.failed")
            and before.status in LEASED_STATUSES
            and not holds
        ):
            assert after == inert
        if r.type == "job.completed" and holds:
            assert after.status == "completed" and after.result == body.get("result")
        # Retryable failures requeue with the status kept out of the result; final ones carry it.
        if r.type == "job.failed" and after != inert:
            if after.status == "queued":
                assert body.get("retryable") and before.charged_attempts < before.max_attempts
                assert after.result == before.result
            else:
                assert after.status == "failed" and after.result["status"] == body.get("status", "failed")
        if r.type == "job.lease_expired" and after != inert:
            assert before.status in LEASED_STATUSES and holds
            assert after.status == ("queued" if before.charged_attempts < before.max_attempts else "failed")
        # A release by the holder requeues uncharged, whatever the budget; anyone else's is inert.
        if r.type == "job.released":
            if holds:
                assert after.status == "queued" and after.released == before.released + 1
                assert after.charged_attempts == before.charged_attempts - 1
            else:
                assert after == inert
        # State-wide consistency.
        assert after.status in STATUSES
        assert (after.lease is not None) == (after.status in LEASED_STATUSES)
        if after.lease is not None:
            assert after.lease.attempt == after.attempt
        # The budget counts charged attempts: a released one was handed back, not used up.
        assert after.charged_attempts <= after.max_attempts and 0 <= after.released <= after.attempt
        if after.status == "queued":
            assert after.charged_attempts < after.max_attempts  # a queued job always has one left
        assert after.attempt >= before.attempt and (after.abort_requested or not before.abort_requested)
        assert [c.id for c in after.commands[: len(before.commands)]] == [c.id for c in before.commands]
        assert all(
            a.consumed or not b.consumed for a, b in zip(after.commands, before.commands, strict=False)
        )


def _states_prefix(events: list[Receipt]) -> list[Receipt]:
    """The longest prefix that folds without an InvariantError."""
    state: Job | None = None
    for i, r in enumerate(events):
        try:
            state = reduce(state, r)
        except InvariantError:
            return events[:i]
    return events


@SETTINGS
@given(event_lists(), st.integers(0, 30))
def test_replay_is_deterministic_and_resumable(events: list[Receipt], split: int) -> None:
    whole = fold_or_error(events)
    assert fold_or_error(events) == whole
    split = min(split, len(events))
    prefix = fold_or_error(events[:split])
    if isinstance(prefix, str):  # the error already happens in the prefix
        assert whole == prefix
    else:
        assert fold_or_error(events[split:], prefix) == whole


@SETTINGS
@given(event_lists())
def test_the_fast_evolve_folds_exactly_as_dataclasses_replace(events: list[Receipt]) -> None:
    # The reducer copies a state's fields instead of calling dataclasses.replace (reducer._evolve):
    # every step of a random stream must equal the fold with replace itself.
    import dataclasses
    from unittest import mock

    from app.jobs import reducer

    fast = _states(events)
    with mock.patch.object(reducer, "_evolve", dataclasses.replace):
        slow = _states(events)
    assert fast == slow
    for state in fast:
        assert dataclasses.replace(state) == state == reducer._evolve(state)
    with pytest.raises(TypeError):
        reducer._evolve(fast[-1] if fast else Receipt("s", 1, "job.noop", {}), no_such_field=1)


@SETTINGS
@given(event_lists())
def test_every_state_round_trips_through_json(events: list[Receipt]) -> None:
    for state in _states(events):
        assert Job.from_json(state.to_json()) == state
        assert Job.from_json(json.loads(json.dumps(state.to_json()))) == state


# -- stateful: random queue operations against SQLite ------------------------------------------------

# Operations with weights: hypothesis picks among *rules* with swarm testing (whole rules are
# switched off per example), so one weighted ``operate`` rule keeps every example busy with
# leases and worker settlements instead of mostly cancels.
OPERATIONS = {
    "lease": 4,
    "worker": 7,
    "system_fail": 1,
    "cancel": 1,
    "command": 2,
    "consume": 2,
    "expire": 2,
    "expire_all": 1,
}
WEIGHTED_OPERATIONS = [op for op, n in OPERATIONS.items() for _ in range(n)]


class QueueMachine(RuleBasedStateMachine):
    """Random Queue operations; after every step the projection equals the fold for every job.

    Each operation also checks that it took effect exactly when the rules say it should.
    """

    engine: Engine  # set by the test

    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.q = queue_for(self.engine)
        self.prefix = uuid.uuid4().hex[:10]  # unique job ids per example: one database for all
        self.ids: set[str] = set()

    def _get(self, job_id: str) -> Job:
        job = self.q.get(job_id)
        assert job is not None
        return job

    @initialize(target=jobs, max_attempts=st.integers(1, 3))
    def first_job(self, max_attempts: int) -> str:
        return self._enqueue(None, "s1", "allow", "o1", max_attempts)

    @precondition(lambda self: len(self.ids) < 6)  # few jobs, many operations on each
    @rule(
        target=jobs,
        explicit=st.sampled_from([None, 0, 1]),
        session=st.sampled_from([None, "s1", "s2"]),
        mode=st.sampled_from(SINGLETON_MODES),
        org=st.sampled_from(["o1", "o2"]),
        max_attempts=st.integers(0, 3),
    )
    def enqueue(
        self, explicit: int | None, session: str | None, mode: str, org: str, max_attempts: int
    ) -> str:
        return self._enqueue(explicit, session, mode, org, max_attempts)

    def _enqueue(
        self, explicit: int | None, session: str | None, mode: str, org: str, max_attempts: int
    ) -> str:
        body: dict[str, Any] = {
            "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": org}},
            "maxAttempts": max_attempts,
        }
        if explicit is not None:
            body["jobId"] = f"{self.prefix}-{explicit}"
        if session is not None:
            body["sessionKey"] = f"{self.prefix}-{session}"
            body["singletonMode"] = mode
        existing = self.q.get(body["jobId"]) if explicit is not None else None
        result = self.q.enqueue(validate_enqueue("codex", body))
        if existing is not None:
            assert not result.created and result.job == existing  # idempotent, unchanged
        self.ids.add(result.job.id)
        self.ids.update(result.canceled + result.aborted)
        return result.job.id

    @rule(job=jobs, op=st.sampled_from(WEIGHTED_OPERATIONS), data=st.data())
    def operate(self, job: str, op: str, data: st.DataObject) -> None:
        before = self._get(job)
        getattr(self, f"_{op}")(job, before, data)

    def _lease(self, job: str, before: Job, data: st.DataObject) -> None:
        # Every draw happens whatever the state: 1 ms leases expire on the real clock, so state can
        # differ when hypothesis replays an example, and state-dependent draws would make the
        # strategy itself flaky (FlakyStrategyDefinition).
        worker = data.draw(st.sampled_from(WORKERS))
        lease_ms = data.draw(st.sampled_from([1, 60_000, 60_000]))
        promote = data.draw(st.booleans())
        out = lease(self.q, job, worker, lease_ms)
        assert out.applied == (before.status == "queued")  # invariant 1
        if out.applied:
            assert out.job.status == "leased" and out.job.attempt == before.attempt + 1
            if promote:  # the worker's first heartbeat promotes leased → running
                beat = self.q.heartbeat(job, worker, out.job.attempt, lease_ms)
                assert beat.applied and beat.job.status == "running"

    def _worker(self, job: str, before: Job, data: st.DataObject) -> None:
        holder = data.draw(st.integers(0, 2)) > 0
        other = data.draw(st.sampled_from(WORKERS)), data.draw(st.sampled_from(ATTEMPTS))
        if before.lease is not None and holder:
            w, a = before.lease.worker_id, before.lease.attempt  # mostly the current lease holder
        else:
            w, a = other
        op = data.draw(
            st.sampled_from(
                [
                    "heartbeat",
                    "heartbeat",
                    "progress",
                    "complete",
                    "fail_retryable",
                    "fail_final",
                    "settle_canceled",
                ]
            )
        )
        if op == "heartbeat":
            out = self.q.heartbeat(job, w, a, 60_000)
        elif op == "progress":
            out = self.q.progress(job, w, a, {"step": a})
        elif op == "complete":
            out = complete(self.q, job, w, a, {"by": w})
        elif op == "settle_canceled":
            out = settle_canceled(self.q, job, w, a, "stopped")
        else:
            out = self.q.fail(job, w, a, "boom", retryable=op == "fail_retryable", status="execution_timeout")
        assert out.applied == before.holds_lease(w, a)  # invariant 2: superseded attempts are inert
        if not out.applied:
            assert out.job == before
        elif op == "heartbeat":
            assert out.job.status == "running"
        elif op == "fail_retryable":
            assert out.job.status == ("queued" if before.attempt < before.max_attempts else "failed")

    def _system_fail(self, job: str, before: Job, data: st.DataObject) -> None:
        retryable = data.draw(st.booleans())
        out = self.q.fail(job, None, None, "delivery exhausted", retryable=retryable)
        assert out.applied == (before.status == "queued")
        if out.applied:
            assert out.job.status == (
                "queued" if retryable and before.attempt < before.max_attempts else "failed"
            )

    def _cancel(self, job: str, before: Job, data: st.DataObject) -> None:
        if before.terminal:
            with pytest.raises(ConflictError):
                self.q.cancel(job, "user")
            return
        out = self.q.cancel(job, "user")
        if before.status == "queued":
            assert out.job.status == "canceled"
        else:  # in flight: only the worker can stop it
            assert out.job.status == before.status and out.job.abort_requested

    def _command(self, job: str, before: Job, data: st.DataObject) -> None:
        ctype = data.draw(st.sampled_from(COMMAND_TYPES))
        if before.terminal:
            with pytest.raises(ConflictError):
                self.q.command(job, ctype, payload={"t": ctype})
            return
        out = self.q.command(job, ctype, payload={"t": ctype})
        assert out.applied and len(out.job.pending_commands) == len(before.pending_commands) + 1

    def _consume(self, job: str, before: Job, data: st.DataObject) -> None:
        choices = [c.id for c in before.commands] + ["cmd_missing"]
        command_id = choices[data.draw(st.integers(0, 15)) % len(choices)]
        out = self.q.consume_command(job, command_id)
        pending = any(c.id == command_id and not c.consumed for c in before.commands)
        assert out.applied == (pending and not before.terminal)  # terminal states are absorbing

    def _expire(self, job: str, before: Job, data: st.DataObject) -> None:
        deadline = parse_iso(before.lease.expires_at) if before.lease else None
        if deadline is not None:
            # A 1 ms lease: wait (bounded) on the database clock until it has passed.
            give_up = time.monotonic() + 2
            while True:
                with self.engine.connect() as conn:
                    now = db_now(conn)
                if now > deadline or (deadline - now).total_seconds() > 1 or time.monotonic() > give_up:
                    break
                time.sleep(0.001)
        out = self.q.expire_lease(job)
        with self.engine.connect() as conn:
            now = db_now(conn)
        if out.applied:
            assert before.status in LEASED_STATUSES and deadline is not None and deadline < now
            assert out.job.status in ("queued", "failed") and out.job.lease is None
        else:
            assert before.status not in LEASED_STATUSES or (
                deadline is not None and (deadline - now).total_seconds() > 1
            )

    def _expire_all(self, job: str, before: Job, data: st.DataObject) -> None:
        for expired in self.q.expire_leases():
            assert expired.status in ("queued", "failed") and expired.lease is None

    @invariant()
    def projection_equals_fold(self) -> None:
        for job_id in self.ids:
            assert_projection_equals_fold(self.engine, job_id)


def test_queue_operations_keep_projection_equal_to_fold(sqlite_engine: Engine) -> None:
    QueueMachine.engine = sqlite_engine
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=int(os.environ.get("RECEIPT_TEST_STATEFUL_N") or examples(40)),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
