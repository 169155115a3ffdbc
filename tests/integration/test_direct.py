"""Hot statements on the driver's cursor (app/storage/direct.py), against real PostgreSQL.

The direct path must be indistinguishable from SQLAlchemy's: the same values back, the same
exception types, the same handling of a dropped connection, and every statement still visible to
a listener. SQLite never takes it (its behaviour is covered by every dual-backend test).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import bindparam, event, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from app.composition import queue_for
from app.jobs.errors import AppendConflict
from app.jobs.ids import qualify
from app.jobs.validation import validate_enqueue
from app.storage import delivery, projection, store
from app.storage.db import (
    autocommit_connection,
    db_now,
    deliveries,
    is_storage_outage,
    jobs,
    receipts,
    transaction,
)
from app.storage.direct import Direct
from tests.support.databases import assert_projection_equals_fold
from tests.support.queue_ops import close_queues

_READ = Direct(
    select(receipts.c.id, receipts.c.body, receipts.c.at, receipts.c.hash).where(
        receipts.c.stream == bindparam("stream")
    )
)


def test_sqlite_never_takes_the_direct_path(sqlite_engine: Engine) -> None:
    with sqlite_engine.connect() as conn:
        assert not Direct.available(conn)


def test_rows_are_the_values_sqlalchemy_returns(pg_engine: Engine) -> None:
    with transaction(pg_engine) as conn:
        assert Direct.available(conn)
        store.append(conn, "s/direct", 0, "t.one", {"n": 1, "nested": {"a": [1, 2]}, "big": 2**70})
        direct = [tuple(r) for r in _READ.rows(conn, {"stream": "s/direct"})]
        through_sqlalchemy = [tuple(r) for r in conn.execute(_READ.statement, {"stream": "s/direct"})]
    assert direct == through_sqlalchemy
    [(_, body, at, _)] = direct
    assert body == {"n": 1, "nested": {"a": [1, 2]}, "big": 2**70}  # JSON decoded, integers exact
    assert isinstance(at, datetime) and at.tzinfo is not None


def test_a_multi_row_append_keeps_order_ids_and_the_chain(pg_engine: Engine) -> None:
    events = [(f"t.{i}", {"i": i}) for i in range(5)]
    with transaction(pg_engine) as conn:
        stored = store.append_many(conn, "s/many", 0, events)
    assert [r.seq for r in stored] == [1, 2, 3, 4, 5]
    assert stored == sorted(stored, key=lambda r: r.id)  # ids follow the stream's order
    with pg_engine.connect() as conn:
        assert [r.to_json() for r in store.read_stream(conn, "s/many")] == [r.to_json() for r in stored]
        assert store.verify(conn, stream="s/many") == (5, None)


def test_a_unique_violation_is_sqlalchemys_integrity_error(pg_engine: Engine) -> None:
    with transaction(pg_engine) as conn:
        store.append(conn, "s/dup", 0, "t.one", {})
    with pytest.raises(AppendConflict) as caught, transaction(pg_engine) as conn:
        store.append(conn, "s/dup", 0, "t.again", {})
    assert isinstance(caught.value.__cause__, IntegrityError)
    with pg_engine.connect() as conn:  # nothing of the failed transaction was kept
        assert [r.type for r in store.read_stream(conn, "s/dup")] == ["t.one"]


def moved_on(engine: Engine) -> tuple[str, projection.Loaded]:
    """A job, and its projection row as read before a lease moved its seq on."""
    queue = queue_for(engine)
    body = {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}}
    job = queue.enqueue(validate_enqueue("factory", body)).job
    with engine.connect() as conn:
        before, _ = projection.load_at_clock(conn, job.id)
    assert before is not None
    assert queue.start_attempt(job.id, "w", 1, lambda _job: 60_000).status == "started"
    return job.id, before


def test_a_projection_update_at_a_stale_seq_conflicts(pg_engine: Engine) -> None:
    job_id, before = moved_on(pg_engine)
    with transaction(pg_engine) as conn:
        last = store.head(conn, f"jobs/{job_id}")
        assert last is not None
        with pytest.raises(AppendConflict):
            projection.save(conn, before.job, previous=before, last=last)


def test_a_dropped_connection_is_an_outage_and_the_pool_recovers(pg_engine: Engine) -> None:
    with pg_engine.connect() as conn, pg_engine.connect() as killer:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.commit()
        killer.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        killer.commit()
        with pytest.raises(Exception) as caught:
            _READ.rows(conn, {"stream": "s/none"})
    assert is_storage_outage(caught.value)
    with pg_engine.connect() as conn:  # the dead connection was invalidated, not handed out again
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
        assert list(_READ.rows(conn, {"stream": "s/none"})) == []


def test_a_listener_sees_every_statement(pg_engine: Engine) -> None:
    seen: list[str] = []

    def listen(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(pg_engine, "before_cursor_execute", listen)
    try:
        with transaction(pg_engine) as conn:
            assert not Direct.available(conn)
            store.append_many(conn, "s/seen", 0, [("t.a", {}), ("t.b", {})])
            _READ.rows(conn, {"stream": "s/seen"})
    finally:
        event.remove(pg_engine, "before_cursor_execute", listen)
    assert any(s.startswith("INSERT INTO receipts") for s in seen)
    assert any("FROM receipts" in s for s in seen)


def test_parameters_other_than_the_compiled_ones_are_refused(pg_engine: Engine) -> None:
    update = Direct(jobs.update().where(jobs.c.id == bindparam("b_id")))
    with transaction(pg_engine) as conn:
        assert update.count(conn, {"b_id": "nope", "status": "queued"}) == 0
        with pytest.raises(ValueError, match="differ from the compiled"):
            update.count(conn, {"b_id": "nope", "lane": "collect"})


def test_an_expanding_parameter_is_refused(pg_engine: Engine) -> None:
    many = Direct(select(jobs.c.id).where(jobs.c.id.in_(bindparam("ids", expanding=True))))
    with transaction(pg_engine) as conn, pytest.raises(ValueError, match="expanding"):
        many.rows(conn, {"ids": ["a"]})


@pytest.fixture
def _conn(pg_engine: Engine) -> Iterator[Connection]:
    with pg_engine.connect() as conn:
        yield conn


def test_the_clock_read_with_a_missing_job_still_gives_the_time(_conn: Connection) -> None:
    loaded, now = projection.load_at_clock(_conn, "no-such-job")
    assert loaded is None
    assert abs((datetime.now(UTC) - now).total_seconds()) < 60


def test_the_projected_columns_are_the_ones_a_row_sets(sqlite_engine: Engine) -> None:
    body = {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}}
    job = queue_for(sqlite_engine).enqueue(validate_enqueue("factory", body)).job
    assert tuple(projection._columns(job, "h", datetime.now(UTC))) == projection.PROJECTED_COLUMNS


def test_a_transition_whose_row_moved_on_writes_nothing_even_autocommitted(pg_engine: Engine) -> None:
    """The projection write comes first, in a CTE; the receipts and the companion (here: ending
    the job's pending deliveries) are written only if it wrote the row. When the row has moved on
    the statement writes nothing at all -- which is what makes it safe as its own transaction."""
    job_id, before = moved_on(pg_engine)
    with transaction(pg_engine) as conn:
        [decision] = delivery.begin_many(conn, [delivery.StartRequest(job_id, job_id, 60_000)], db_now(conn))
        assert isinstance(decision, delivery.StartDecision) and decision.created
        head = store.read_stream(conn, f"jobs/{job_id}")
        # The row moves on (as another writer's commit would move it) and commits.
        conn.execute(text("UPDATE jobs SET last_seq = last_seq + 100 WHERE id = :i"), {"i": job_id})
    stale = projection.Loaded(
        before.job.__class__.from_json({**before.job.to_json(), "seq": len(head)}),
        head[-1].hash,
        before.status_changed_at,
    )
    chained = store.chain(
        f"jobs/{job_id}",
        len(head),
        [("job.completed", {"result": None})],
        prev_hash=head[-1].hash,
        at=datetime.now(UTC),
    )
    after = stale.job.__class__.from_json(
        {**stale.job.to_json(), "seq": len(head) + 1, "status": "completed"}
    )
    companion = (delivery.SETTLE_JOB, delivery.settle_job_params(job_id, "completed", datetime.now(UTC)))
    with (
        autocommit_connection(pg_engine) as conn,
        pytest.raises(AppendConflict, match="projection moved past"),
    ):
        projection.append_and_save(conn, after, previous=stale, chained=chained, companion=companion)
    with pg_engine.connect() as conn:
        assert len(store.read_stream(conn, f"jobs/{job_id}")) == len(head)
        pending = (
            conn.execute(select(deliveries.c.state).where(deliveries.c.job_id == job_id)).scalars().all()
        )
    assert pending == ["pending"]


# -- prepared statements (RECEIPT_DB_PREPARED_STATEMENTS=enabled) ------------------------------------


@pytest.fixture
def prepared_engine(pg_database_url: str) -> Iterator[Engine]:
    from app.storage.db import make_engine

    engine = make_engine(pg_database_url, prepared_statements=True)
    yield engine
    close_queues(engine)
    engine.dispose()


def _prepared_here(conn: Connection) -> list[str]:
    return sorted(str(n) for n in conn.exec_driver_sql("SELECT name FROM pg_prepared_statements").scalars())


def test_prepared_statements_give_the_values_and_the_stream_sqlalchemy_would(
    prepared_engine: Engine, pg_engine: Engine
) -> None:
    queue = queue_for(prepared_engine)
    auth = {"userId": "u", "organizationId": "org"}
    job = queue.enqueue(
        validate_enqueue("factory", {"jobId": "p-1", "payload": {"kind": "factory.run", "authContext": auth}})
    ).job
    assert queue.start_attempt(job.id, "w", 1, lambda _job: 60_000).status == "started"
    assert queue.settle_attempt(job.id, "w", 1, result={"big": 2**70, "nested": [1, {"a": None}]}).applied
    with prepared_engine.connect() as conn:
        # Prepared once on this connection and executed by name; the hot statements are among them.
        assert any(n.startswith("receipt_") for n in _prepared_here(conn))
        store.append(conn, "s/prepared", 0, "t.one", {"n": 1, "big": 2**70})
        conn.commit()
        prepared_rows = [tuple(r) for r in _READ.rows(conn, {"stream": "s/prepared"})]
    with pg_engine.connect() as conn:  # the same database, nothing prepared
        assert [tuple(r) for r in _READ.rows(conn, {"stream": "s/prepared"})] == prepared_rows
        assert [tuple(r) for r in conn.execute(_READ.statement, {"stream": "s/prepared"})] == prepared_rows
        assert job.id == qualify("org", "p-1")
        assert store.verify(conn, stream="jobs/org/p-1") == (4, None)
        job_now = projection.load(conn, job.id)
    assert job_now is not None and job_now.job.status == "completed"
    assert job_now.job.result == {"big": 2**70, "nested": [1, {"a": None}]}
    assert_projection_equals_fold(pg_engine, job.id)


def test_a_statement_the_server_lost_is_prepared_again_on_an_autocommit_connection(
    prepared_engine: Engine,
) -> None:
    with autocommit_connection(prepared_engine) as conn:
        before = [tuple(r) for r in _READ.rows(conn, {"stream": "s/none"})]
        assert _prepared_here(conn)
        conn.exec_driver_sql("DEALLOCATE ALL")  # what a server-side reset would do
        assert _prepared_here(conn) == []
        assert [tuple(r) for r in _READ.rows(conn, {"stream": "s/none"})] == before
        assert len(_prepared_here(conn)) == 1  # prepared again, under a new name


def test_inside_a_transaction_a_lost_statement_is_a_transient_error_that_a_retry_mends(
    prepared_engine: Engine,
) -> None:
    from app.storage.retry import is_transient, retry_transient

    with prepared_engine.connect() as conn:
        _READ.rows(conn, {"stream": "s/none"})
        conn.exec_driver_sql("DEALLOCATE ALL")
        conn.commit()
        with pytest.raises(Exception) as lost:
            _READ.rows(conn, {"stream": "s/none"})
        conn.rollback()
    assert is_transient(lost.value)

    def read() -> int:
        with transaction(prepared_engine) as c:
            return len(_READ.rows(c, {"stream": "s/none"}))

    assert retry_transient(read, sleep=lambda _s: None) == 0


def test_a_statement_with_an_array_parameter_is_never_prepared(prepared_engine: Engine) -> None:
    # A generic plan for "id = ANY($1)" cannot know the array's length; one made while the table
    # was small kept scanning it as it grew (the claim's batch reads: 0.8 -> 1.5 ms over 4 000 jobs).
    with transaction(prepared_engine) as conn:
        loaded, now = projection.load_jobs_at_clock(conn, ["a", "b"])
        assert loaded == [] and now is not None
        rows = delivery._records_of(conn, ["a", "b"])
        assert list(rows) == []
        _READ.rows(conn, {"stream": "s/none"})  # a plain parameter: prepared
        statements = [
            str(s) for s in conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars()
        ]
    assert len(statements) == 1 and "ANY" not in statements[0]
