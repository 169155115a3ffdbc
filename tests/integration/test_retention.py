"""Retention on every backend: the archiving pass, its guard, a crash at every step, verification
across the boundary, and ids that stay taken."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from app.composition import queue_for
from app.jobs.errors import JobArchived
from app.jobs.ids import qualify
from app.jobs.validation import EnqueueRequest, validate_enqueue
from app.jobs.vocab import job_stream
from app.retention import archive, verify
from app.retention.policy import Policy
from app.retention.sink import DirectorySink
from app.storage import store, tombstones
from app.storage.db import (
    archived_streams,
    db_now,
    deliveries,
    is_sqlite,
    jobs,
    objective_tasks,
    objectives,
    receipts,
    transaction,
)
from app.storage.queue import Archived, Queue
from tests.support.queue_ops import complete, lease

ORG = "org-a"
OTHER = "org-b"
LONG = 600_000
POLICY = Policy(days=30)


def req(job_id: str, org: str = ORG) -> EnqueueRequest:
    return validate_enqueue(
        "codex",
        {
            "jobId": job_id,
            "payload": {"kind": "factory.task.run", "authContext": {"userId": "u", "organizationId": org}},
        },
    )


def finished(queue: Queue, job_id: str, org: str = ORG) -> str:
    """A job enqueued, leased and completed; its storage key."""
    job = queue.enqueue(req(job_id, org)).job
    lease(queue, job.id, "w1", LONG)
    complete(queue, job.id, "w1", 1, {"ok": job_id})
    return job.id


def later(days: int) -> Callable[[Connection], datetime]:
    return lambda conn: db_now(conn) + timedelta(days=days)


def receipt_count(engine: Engine, key: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(receipts).where(receipts.c.stream == job_stream(key))
            ).scalar_one()
        )


def live_job(engine: Engine, key: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(jobs.c.id).where(jobs.c.id == key)).first() is not None


def heads(engine: Engine, keys: list[str]) -> dict[str, tuple[int, str]]:
    with engine.connect() as conn:
        out = {}
        for key in keys:
            head = store.head(conn, job_stream(key))
            assert head is not None
            out[key] = (head.seq, head.hash)
        return out


@pytest.fixture
def sink(tmp_path: Path) -> DirectorySink:
    return DirectorySink(tmp_path / "archive")


def test_old_terminal_jobs_leave_with_a_tombstone_and_the_rest_stay(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    done = [finished(queue, f"done-{i}") for i in range(3)]
    waiting = queue.enqueue(req("waiting")).job.id
    before = heads(engine, done)

    # Ended a day ago: inside the 30-day window, nothing moves.
    assert archive.run_pass(engine, sink, POLICY, page_size=2, clock=later(1)).streams == 0
    # Zero keeps everything, however old.
    assert archive.run_pass(engine, sink, Policy(days=0), page_size=2, clock=later(400)).streams == 0

    totals = archive.run_pass(engine, sink, POLICY, page_size=2, clock=later(31))
    assert (totals.streams, totals.jobs, totals.pages, len(totals.segments)) == (3, 3, 2, 2)
    assert totals.receipts == sum(seq for seq, _ in before.values())
    assert totals.bytes == sum(sink.size_bytes(n) for n in totals.segments)
    for key in done:
        assert receipt_count(engine, key) == 0
        assert not live_job(engine, key)
        with engine.connect() as conn:
            tomb = tombstones.find(conn, job_stream(key))
        assert tomb is not None
        assert (tomb.receipt_count, tomb.final_hash) == before[key]
        assert (tomb.status, tomb.organization_id, tomb.kind) == ("completed", ORG, "job")
        assert tomb.segment in totals.segments and tomb.pass_id == totals.pass_id
    # The queued job is untouched, and a second pass finds nothing more.
    assert receipt_count(engine, waiting) == 1 and live_job(engine, waiting)
    assert archive.run_pass(engine, sink, POLICY, page_size=2, clock=later(31)).streams == 0
    with engine.connect() as conn:
        assert store.verify(conn) == (1, None)
        report = verify.verify_archive(sink, conn)
    assert report.ok, report.problems
    assert (report.streams, report.tombstones, report.receipts) == (3, 3, totals.receipts)


def test_per_organisation_windows(engine: Engine, queue: Queue, sink: DirectorySink) -> None:
    a = finished(queue, "a1", ORG)
    b = finished(queue, "b1", OTHER)
    policy = Policy(days=30, by_organization={OTHER: 0})
    totals = archive.run_pass(engine, sink, policy, page_size=10, clock=later(365))
    assert totals.streams == 1
    assert not live_job(engine, a) and live_job(engine, b)
    # Only the overridden organisation, with a shorter window.
    c = finished(queue, "c1", OTHER)
    short = Policy(days=0, by_organization={OTHER: 5})
    assert archive.run_pass(engine, sink, short, page_size=10, clock=later(4)).streams == 0
    assert archive.run_pass(engine, sink, short, page_size=10, clock=later(6)).streams == 2
    assert not live_job(engine, b) and not live_job(engine, c)


def test_deliveries_and_the_jobs_row_go_with_the_stream(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    key = finished(queue, "with-delivery")
    with transaction(engine) as conn:
        now = db_now(conn)
        conn.execute(
            deliveries.insert().values(
                job_id=key,
                purpose="dispatch",
                observed="",
                generation=1,
                dispatch_key=key,
                task_id=key,
                state="settled",
                created_at=now,
                deadline_at=now,
                settled_at=now,
            )
        )
    archive.run_pass(engine, sink, POLICY, page_size=10, clock=later(31))
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(deliveries)).scalar_one() == 0
        assert verify.verify_tombstones(conn).ok


# -- the guard: no other path removes a receipt -------------------------------------------------------


def _refused(
    engine: Engine, statement: str, params: dict[str, Any] | None = None, *, guard: str | None = None
) -> str:
    with pytest.raises(DBAPIError) as err, transaction(engine) as conn:
        if guard is not None:
            tombstones.set_guard(conn, guard)
        conn.execute(text(statement), params or {})
    return str(err.value)


def test_a_plain_delete_update_or_truncate_of_receipts_is_refused(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    key = finished(queue, "guarded")
    other = finished(queue, "bystander")
    stream = job_stream(key)
    assert "append-only" in _refused(engine, "DELETE FROM receipts WHERE stream = :s", {"s": stream})
    assert "append-only" in _refused(
        engine, "UPDATE receipts SET type = 'x' WHERE stream = :s", {"s": stream}
    )
    if not is_sqlite(engine):
        assert "append-only" in _refused(engine, "TRUNCATE receipts")
    # The guard alone is not enough: the stream needs a tombstone naming that very pass.
    assert "append-only" in _refused(
        engine, "DELETE FROM receipts WHERE stream = :s", {"s": stream}, guard="p1"
    )
    totals = archive.run_pass(engine, sink, POLICY, page_size=1, clock=later(31), max_pages=1)
    archived_key, kept = (key, other) if not live_job(engine, key) else (other, key)
    assert totals.streams == 1 and live_job(engine, kept)
    # Another pass id, or a live stream under the real pass id: still refused.
    assert "append-only" in _refused(
        engine, "DELETE FROM receipts WHERE stream = :s", {"s": job_stream(kept)}, guard=totals.pass_id
    )
    assert receipt_count(engine, kept) == 2 + 1  # enqueued, leased, completed
    # The guard ends with its transaction: the next one deletes nothing.
    with transaction(engine) as conn:
        tombstones.set_guard(conn, totals.pass_id)
    assert "append-only" in _refused(
        engine, "DELETE FROM receipts WHERE stream = :s", {"s": job_stream(kept)}
    )
    assert receipt_count(engine, archived_key) == 0


# -- a crash at every step ------------------------------------------------------------------------------


class Crash(Exception):
    pass


def crash_at(step: str) -> Callable[[str], None]:
    def checkpoint(at: str) -> None:
        if at == step:
            raise Crash(step)

    return checkpoint


@pytest.mark.parametrize("step", archive.STEPS)
def test_a_pass_that_crashes_at_any_step_loses_and_duplicates_nothing(
    engine: Engine, queue: Queue, sink: DirectorySink, step: str
) -> None:
    keys = [finished(queue, f"job-{i}") for i in range(5)]
    expected = heads(engine, keys)
    with pytest.raises(Crash):
        archive.run_pass(engine, sink, POLICY, page_size=2, clock=later(31), checkpoint=crash_at(step))
    # Whatever the crash left, every stream is in exactly one place: live, or tombstoned and archived.
    for key in keys:
        with engine.connect() as conn:
            tomb = tombstones.find(conn, job_stream(key))
        assert (tomb is None) == live_job(engine, key)
        assert (tomb is None) == (receipt_count(engine, key) == expected[key][0])
    # The next pass resumes and finishes.
    archive.run_pass(engine, sink, POLICY, page_size=2, clock=later(31))
    with engine.connect() as conn:
        found = {t.stream: t for t in tombstones.iter_all(conn)}
        report = verify.verify_archive(sink, conn)
    assert set(found) == {job_stream(k) for k in keys}
    for key in keys:
        assert (found[job_stream(key)].receipt_count, found[job_stream(key)].final_hash) == expected[key]
        assert receipt_count(engine, key) == 0 and not live_job(engine, key)
    assert report.ok, report.problems
    # No segment left over, and every archived receipt exactly once.
    assert report.unreferenced == 0
    assert set(sink.names()) == {t.segment for t in found.values()}
    assert report.receipts == sum(seq for seq, _ in expected.values())


def test_a_stream_that_moves_after_it_was_read_is_read_again(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    keys = [finished(queue, f"m{i}") for i in range(2)]
    with engine.connect() as conn:
        first = store.read_stream(conn, job_stream(keys[0]))[0]
    moved: list[str] = []

    def append_meanwhile(step: str) -> None:
        if step == "segment_written" and not moved:
            # A receipt lands on the first stream between its segment and its removal (a duplicate
            # job.enqueued, which the fold takes as inert, so the job stays completed).
            moved.append(step)
            queue.mutate(keys[0], lambda job, now: [("job.enqueued", dict(first.body))])

    totals = archive.run_pass(
        engine, sink, POLICY, page_size=10, clock=later(31), checkpoint=append_meanwhile
    )
    assert moved and totals.streams == 2
    with engine.connect() as conn:
        tomb = tombstones.find(conn, job_stream(keys[0]))
        report = verify.verify_archive(sink, conn)
    assert tomb is not None and tomb.receipt_count == 4
    assert report.ok, report.problems
    assert report.unreferenced == 0 and sink.names() == totals.segments


# -- verification and replay across the boundary -------------------------------------------------------


def test_verify_finds_a_tampered_segment_and_a_missing_one(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    for i in range(3):
        finished(queue, f"v{i}")
    totals = archive.run_pass(engine, sink, POLICY, page_size=2, clock=later(31))
    first, second = totals.segments
    path = sink.root / f"{first}.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        lines = [json.loads(line) for line in fh]
    lines[-1]["body"] = {"result": "forged"}
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)
    (sink.root / f"{second}.jsonl.gz").unlink()
    with engine.connect() as conn:
        report = verify.verify_archive(sink, conn)
    assert not report.ok
    text_ = "\n".join(report.problems)
    assert "hash does not match" in text_
    assert f"segment {second} is named by tombstones but is not in the archive" in text_


def test_replay_reads_an_archived_stream(engine: Engine, queue: Queue, sink: DirectorySink) -> None:
    from app.jobs.reducer import Receipt, fold

    key = finished(queue, "replayed")
    with engine.connect() as conn:
        before = fold(r.to_receipt() for r in store.read_stream(conn, job_stream(key)))
    archive.run_pass(engine, sink, POLICY, page_size=10, clock=later(31))
    with engine.connect() as conn:
        lines = verify.read_stream(sink, job_stream(key), conn)
    after = fold(Receipt(r["stream"], r["seq"], r["type"], r["body"], r["at"]) for r in lines)
    assert after == before
    assert verify.read_stream(sink, job_stream(key)) == lines  # without the database too
    with pytest.raises(KeyError):
        verify.read_stream(sink, job_stream(qualify(ORG, "never")))


# -- ids stay taken ------------------------------------------------------------------------------------


def test_an_archived_id_stays_taken(engine: Engine, queue: Queue, sink: DirectorySink) -> None:
    key = finished(queue, "taken")
    archive.run_pass(engine, sink, POLICY, page_size=10, clock=later(31))
    with pytest.raises(JobArchived) as err:
        queue.enqueue(req("taken"))
    assert err.value.summary["id"] == "taken" and err.value.summary["archived"] is True
    assert err.value.summary["status"] == "completed"
    assert err.value.summary["archive"]["receiptCount"] == 3
    # In a batch: the archived item is answered from its tombstone, the others are written.
    results = queue.enqueue_many([req("taken"), req("fresh")])
    assert isinstance(results[0], Archived) and results[0].summary["id"] == "taken"
    assert not isinstance(results[1], Archived) and results[1].created
    # The system's own batch path refuses outright.
    with pytest.raises(JobArchived):
        queue.batch(lambda b: b.enqueue_new([(dataclasses.replace(req("taken"), key=key), None)]))
    assert receipt_count(engine, key) == 0 and not live_job(engine, key)
    # Another organisation's job of the same id is another job.
    assert queue.enqueue(req("taken", OTHER)).created
    assert queue.archived(ORG, "taken") is not None and queue.archived(OTHER, "taken") is None
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(archived_streams)).scalar_one() == 1


def launch(queue: Queue, deps: dict[str, list[str]], **extra: Any) -> str:
    from app.factory import service
    from app.factory.plan import validate_objective
    from tests.factory_support import plan

    body = {
        "title": "t",
        "goal": "g",
        "authContext": AUTH,
        "plan": plan(deps, extra.pop("agents", None)),
        **extra,
    }
    return service.launch(queue, validate_objective(body), launched_by=LAUNCHER).objective.id


AUTH = {"userId": "u1", "organizationId": ORG}
LAUNCHER = {"tokenId": "tok_test", "scopes": [], "system": False}


def objective_status(engine: Engine, key: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(objectives.c.status).where(objectives.c.id == key)).scalar_one_or_none()


def owned(engine: Engine, key: str) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(select(jobs.c.id).where(jobs.c.id.startswith(key + ":")))]


def test_an_objective_leaves_with_every_job_it_owns(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    from app.factory.vocab import objective_stream
    from tests.factory_support import drain

    key = launch(queue, {"A": [], "B": ["A"]}, objectiveId="obj-done")
    drain(queue)
    assert objective_status(engine, key) == "completed"
    jobs_of = owned(engine, key)
    assert len(jobs_of) >= 4  # control, two tasks, audit
    lone = finished(queue, "lone")
    totals = archive.run_pass(engine, sink, POLICY, page_size=3, clock=later(31))
    assert (totals.objectives, totals.jobs) == (1, len(jobs_of) + 1)
    assert objective_status(engine, key) is None and owned(engine, key) == []
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(objective_tasks)).scalar_one() == 0
        tomb = tombstones.find(conn, objective_stream(key))
        report = verify.verify_archive(sink, conn)
        live = verify.verify_tombstones(conn)
    assert tomb is not None and tomb.kind == "objective" and tomb.status == "completed"
    assert report.ok and live.ok, report.problems + live.problems
    assert report.streams == len(jobs_of) + 2 and not live_job(engine, lone)
    # The id stays taken: launching it again is refused with its summary.
    with pytest.raises(JobArchived) as err:
        launch(queue, {"A": []}, objectiveId="obj-done")
    assert err.value.summary["title"] == "t" and err.value.summary["archived"] is True


def test_an_active_objective_keeps_its_finished_task_jobs(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    from tests.factory_support import HOLD, drain

    key = launch(queue, {"A": [], "B": ["A"]}, agents={"B": HOLD})
    drain(queue, skip_agents=(HOLD,))
    assert objective_status(engine, key) not in ("completed", "failed", "canceled")
    with engine.connect() as conn:
        ended = conn.execute(
            select(func.count())
            .select_from(jobs)
            .where(jobs.c.id.startswith(key + ":"), jobs.c.status == "completed")
        ).scalar_one()
    assert ended >= 2  # the launch's control job and task A
    # A job naming the objective in its payload stays with it too.
    named = queue.enqueue(
        validate_enqueue(
            "codex",
            {
                "jobId": "names-obj",
                "payload": {
                    "kind": "factory.task.run",
                    "objectiveId": key.split("/", 1)[1],
                    "authContext": {"userId": "u", "organizationId": ORG},
                },
            },
        )
    ).job
    lease(queue, named.id, "w1", LONG)
    complete(queue, named.id, "w1", 1, {})
    lone = finished(queue, "lone")
    totals = archive.run_pass(engine, sink, POLICY, page_size=10, clock=later(365))
    assert (totals.streams, totals.objectives) == (1, 0)
    assert not live_job(engine, lone) and live_job(engine, named.id)
    assert len(owned(engine, key)) >= 3


def _planning_buffers(conn: Connection, sql: str) -> int:
    """Shared buffers PostgreSQL's planner touched planning ``sql`` (0 when it lists none)."""
    plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)).scalar_one()
    buffers = plan[0].get("Planning", {})
    return sum(int(buffers.get(k, 0)) for k in ("Shared Hit Blocks", "Shared Read Blocks"))


@pytest.mark.own_database  # turns autovacuum off on two tables
def test_the_recovery_scans_plan_without_stepping_over_archived_index_entries(
    pg_engine: Engine, sink: DirectorySink
) -> None:
    """While a pass has deleted the oldest jobs and no vacuum has run, costing a merge join reads the
    join keys' index ends, dead entries first; the scans that leave in-flight jobs out plan
    without merge joins, and the setting ends with their transaction."""
    engine, queue = pg_engine, queue_for(pg_engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in ("jobs", "deliveries"):
            conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
    keys = [finished(queue, f"a-{i:04d}") for i in range(300)]
    with engine.begin() as conn:  # each with the settled delivery a dispatched job keeps
        now = db_now(conn)
        conn.execute(
            deliveries.insert(),
            [
                {
                    "job_id": k,
                    "purpose": "dispatch",
                    "observed": "",
                    "generation": 0,
                    "dispatch_key": k,
                    "task_id": k,
                    "state": "settled",
                    "created_at": now,
                    "deadline_at": now,
                }
                for k in keys
            ],
        )
    queue.enqueue(req("z-waiting"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE jobs"))
        conn.execute(text("ANALYZE deliveries"))
    assert archive.run_pass(engine, sink, POLICY, page_size=100, clock=later(31)).streams == 300

    scans: list[tuple[str, str]] = []  # each scan's SQL, and enable_mergejoin as it ran

    @event.listens_for(engine, "before_cursor_execute")
    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if "FROM jobs" in statement and "deliveries" in statement:
            show = cursor.connection.cursor()
            show.execute("SHOW enable_mergejoin")
            scans.append((cursor.mogrify(statement, params).decode(), show.fetchone()[0]))

    queue.due_retries(skip_in_flight=True, epoch="e")
    queue.queued_older_than(0, skip_in_flight=True, epoch="e")
    event.remove(engine, "before_cursor_execute", seen)
    assert [planned for _, planned in scans] == ["off", "off"]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW enable_mergejoin").scalar_one() == "on"  # SET LOCAL: ended
        due_retries = scans[0][0]
        costed = _planning_buffers(conn, due_retries)
        conn.execute(text("SET LOCAL enable_mergejoin = off"))
        assert costed > 2 * _planning_buffers(conn, due_retries)


def test_the_pass_rests_between_pages_for_its_duty_cycle(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    for i in range(5):
        finished(queue, f"paced-{i}")
    rests: list[float] = []
    totals = archive.run_pass(
        engine, sink, POLICY, page_size=2, clock=later(31), duty_percent=25, rest=rests.append
    )
    assert (totals.pages, totals.streams) == (3, 5)
    # After each page but before the first: three times its work at 25 %, never nothing.
    assert len(rests) == 3 and all(r > 0 for r in rests)
    assert (
        archive.run_pass(engine, sink, POLICY, page_size=2, clock=later(31), rest=rests.append).streams == 0
    )
    assert len(rests) == 3  # 100 %: no rest


def _sweep_could_start(engine: Engine) -> bool:
    """Whether a pass's sweep could take ``SEGMENTS_LOCK`` right now (PostgreSQL: the advisory lock,
    tried; SQLite: the database's write lock, tried without waiting)."""
    if is_sqlite(engine):
        import sqlite3

        raw = sqlite3.connect(str(engine.url.database), timeout=0, isolation_level=None)
        try:
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            raw.close()
    from app.storage.db import _advisory_key

    with engine.connect() as conn:
        got = conn.execute(
            text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _advisory_key(archive.SEGMENTS_LOCK)}
        ).scalar_one()
        conn.rollback()
    return bool(got)


def test_the_sweep_never_takes_a_chosen_pages_segment_before_its_commit(
    engine: Engine, queue: Queue, sink: DirectorySink
) -> None:
    """A bulk archive's segment is written before its tombstones commit: in between, a pass's sweep
    cannot start (``SEGMENTS_LOCK``); after, it finds the segment committed and keeps it."""
    keys = [finished(queue, f"chosen-{i}") for i in range(3)]
    could: list[bool] = []

    def try_sweeping(step: str) -> None:
        if step in ("segment_written", "tombstones_written"):
            could.append(_sweep_could_start(engine))

    assert _sweep_could_start(engine)
    moved = archive.archive_jobs(
        engine, sink, keys, pass_id="op-chosen", segment_prefix="op-", checkpoint=try_sweeping
    )
    assert could == [False, False]
    assert set(moved.archived) == set(keys) and moved.segment is not None
    assert archive.sweep(engine, sink) == 0 and sink.names() == [moved.segment]
    with engine.connect() as conn:
        report = verify.verify_archive(sink, conn)
    assert report.ok and report.streams == 3, report.problems
