"""Tables, engines and transactions: the one place that knows which database it is talking to.

Postgres is production; SQLite is the embedded default. Both run the same migrations and the
same test bodies. Everything dialect-specific (the clock, write locking, advisory locks) is a
named function here so that the rest of ``app/`` never branches on the dialect.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    literal,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.sql.elements import ColumnElement

from app.config import Settings
from app.jobs.times import as_utc as as_utc
from app.jobs.times import iso as iso
from app.jobs.times import parse_iso as parse_iso
from app.storage import jsontext
from app.storage.direct import PREPARED, Direct
from app.storage.files import create_private_file, private_dir

metadata = MetaData()

_Json = JSON().with_variant(JSONB(), "postgresql")
_Id = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER PRIMARY KEY only
_Time = DateTime(timezone=True)

# The append-only log. Nothing updates or deletes a row: a trigger enforces it (migration 0001).
# A job's or objective's storage key: ``<organizationId>/<id>`` (app.jobs.ids), or a bare id
# written before keys were qualified.
KEY_LENGTH = 384
# How much of a job's error text the projection keeps for a search by its start.
ERROR_TEXT_LENGTH = 256

receipts = Table(
    "receipts",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("stream", String(512), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("type", String(64), nullable=False),
    # Plain JSON, not JSONB: the stored text round-trips exactly, so the hash recomputes.
    Column("body", JSON(), nullable=False),
    Column("at", _Time, nullable=False),
    Column("prev_hash", String(64), nullable=True),
    Column("hash", String(64), nullable=False),
    UniqueConstraint("stream", "seq", name="uq_receipts_stream_seq"),
)

# Projection: each job's folded state, written in the receipt's transaction. Rebuildable
# from receipts by `receipt rebuild-projections`.
jobs = Table(
    "jobs",
    metadata,
    Column("id", String(KEY_LENGTH), primary_key=True),
    Column("organization_id", String(256), nullable=True),
    Column("agent_id", String(256), nullable=False),
    Column("lane", String(32), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("session_key", String(512), nullable=True),
    Column("attempt", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("lease_worker_id", String(256), nullable=True),
    Column("lease_attempt", Integer, nullable=True),
    Column("lease_expires_at", _Time, nullable=True),
    Column("abort_requested", Boolean, nullable=False),
    Column("created_at", _Time, nullable=False),
    Column("updated_at", _Time, nullable=False),
    Column("status_changed_at", _Time, nullable=False),
    Column("available_at", _Time, nullable=True),  # a retry's earliest redelivery (migration 0002)
    Column("last_seq", Integer, nullable=False),
    Column("last_hash", String(64), nullable=False),
    Column("state", _Json, nullable=False),
    # Migration 0012: what a search filters on beyond the columns above -- the job's tags (NULL:
    # none) and the start of its error's text (``projection.error_text``).
    Column("tags", _Json, nullable=True),
    Column("error_text", String(ERROR_TEXT_LENGTH), nullable=True),
    # Migration 0014: what the dispatch pass reads (docs/dispatch.md) -- the worker queue the job is
    # routed to (NULL on rows written before it; the migration fills the unfinished ones), its
    # priority, its concurrency key and limit, and its debounce key (app.jobs.flow).
    Column("worker_queue", String(64), nullable=True),
    Column("priority", SmallInteger, nullable=False, server_default="0"),
    Column("concurrency_key", String(128), nullable=True),
    Column("concurrency_limit", SmallInteger, nullable=True),
    Column("debounce_key", String(128), nullable=True),
    Index("ix_jobs_status_changed", "status", "status_changed_at"),
    Index("ix_jobs_session_status", "session_key", "status"),
    Index("ix_jobs_agent", "agent_id"),
    Index("ix_jobs_org_created", "organization_id", "created_at", "id"),
    Index("ix_jobs_lease_expiry", "status", "lease_expires_at"),
    Index("ix_jobs_available", "status", "available_at"),
    # Migration 0006: the status-filtered list, and the queued redrive's ordered batch.
    Index("ix_jobs_org_status_created", "organization_id", "status", "created_at", "id"),
    # Migration 0012: a search by kind or by agent, newest first, walks only that kind's (agent's) jobs.
    Index("ix_jobs_org_kind_created", "organization_id", "kind", "created_at", "id"),
    Index("ix_jobs_org_agent_created", "organization_id", "agent_id", "created_at", "id"),
    # Migration 0013: a search by lane, and a system identity's list of every organisation, newest
    # first (without them, a lane few jobs use, or the whole list, sorted the history for a page).
    Index("ix_jobs_org_lane_created", "organization_id", "lane", "created_at", "id"),
    Index("ix_jobs_created", "created_at", "id"),
    # The attempts that hold (or wait for) a concurrency key, and the pending job a debounce replaces.
    Index(
        "ix_jobs_concurrency_key",
        "organization_id",
        "concurrency_key",
        "status",
        postgresql_where=text("concurrency_key IS NOT NULL"),
        sqlite_where=text("concurrency_key IS NOT NULL"),
    ),
    Index(
        "ix_jobs_debounce",
        "organization_id",
        "debounce_key",
        postgresql_where=text("status = 'queued' AND debounce_key IS NOT NULL"),
        sqlite_where=text("status = 'queued' AND debounce_key IS NOT NULL"),
    ),
)
# Migration 0014: each organisation's waiting line in a worker queue, in the order the pass takes it
# (priority first, descending, then age), so the index hands each organisation's heads in order; over
# the queued jobs only, so it follows the backlog, not the history.
Index(
    "ix_jobs_line",
    jobs.c.worker_queue,
    jobs.c.organization_id,
    jobs.c.priority.desc(),
    jobs.c.status_changed_at,
    jobs.c.id,
    postgresql_where=jobs.c.status == "queued",
    sqlite_where=jobs.c.status == "queued",
)
# A worker queue's attempts in flight, the dispatch pass's count (migration 0016): only the few
# leased and running rows, so the count does not walk the history's dead versions.
Index(
    "ix_jobs_in_flight",
    jobs.c.worker_queue,
    jobs.c.organization_id,
    jobs.c.concurrency_key,
    postgresql_where=jobs.c.status.in_(("leased", "running")),
    sqlite_where=jobs.c.status.in_(("leased", "running")),
)
# A tag filter (``tags @> {"key": "value"}``): a GIN index over the tags. PostgreSQL only (migration
# 0012), as ix_jobs_queued_since; SQLite filters the rows its other indexes give.
Index("ix_jobs_tags", jobs.c.tags, postgresql_using="gin", postgresql_ops={"tags": "jsonb_path_ops"}).ddl_if(
    dialect="postgresql"
)
# The queued redrive reads queued jobs in the order they became deliverable: a partial
# expression index over the backlog only, so its size follows the backlog, not the history.
# Postgres only (migration 0006): SQLAlchemy cannot reflect SQLite expression indexes, and the
# embedded SQLite deployment never holds a history large enough to need it.
Index(
    "ix_jobs_queued_since",
    func.coalesce(jobs.c.available_at, jobs.c.status_changed_at),
    postgresql_where=jobs.c.status == "queued",
).ddl_if(dialect="postgresql")
# A search by the start of the error's text (migration 0013): the errored jobs of an organisation
# by error text, in byte order (``text_pattern_ops``, so ``LIKE 'prefix%'`` is a range of it
# whatever the database's collation). A rare prefix reads its few rows and sorts them for the
# page; a common one is faster walked newest first (``ix_jobs_org_created``): the planner weighs
# the two by the prefix's estimated share. PostgreSQL only: the operator class is.
Index(
    "ix_jobs_org_error",
    jobs.c.organization_id,
    jobs.c.error_text,
    jobs.c.created_at,
    jobs.c.id,
    postgresql_ops={"error_text": "text_pattern_ops"},
    postgresql_where=jobs.c.error_text.is_not(None),
).ddl_if(dialect="postgresql")
# The runs that name an objective, by the objective their payload names (migration 0017): what an
# objective's ledger summary reads its ``run`` workflows through (app/factory/ledger.py). Partial,
# so no other job's write touches it; PostgreSQL only, as the other expression indexes.
RUN_OBJECTIVE = jobs.c.state.op("->")(literal("payload", Text)).op("->>")(literal("objectiveId", Text))
Index(
    "ix_jobs_run_objective",
    RUN_OBJECTIVE,
    postgresql_where=text("kind = 'factory.run' AND ((state -> 'payload') ->> 'objectiveId') IS NOT NULL"),
).ddl_if(dialect="postgresql")
POSTGRES_ONLY_INDEXES = frozenset(
    {"ix_jobs_queued_since", "ix_jobs_tags", "ix_jobs_org_error", "ix_jobs_run_objective"}
)

# Projection of each job's tags, one row per tag (migration 0013): what a tag filter walks. Its
# index holds an organisation's jobs of one tag newest first, so the first page of
# ``GET /jobs?tag=key:value`` is a keyset walk of that tag's rows alone (the GIN index above finds
# the tagged jobs, then sorts all of them for the page). The database keeps it equal to
# ``jobs.tags``: a trigger on ``jobs`` (insert, and an update that changes the tags, organisation
# or creation time) writes it in the statement that writes the job's row, so every writer -- the
# one-statement transition, the bulk paths, ``receipt rebuild-projections``, the previous release
# during a deploy -- keeps it in the receipt's transaction; deleting the job (archiving, a rebuild)
# cascades. Key and value are unbounded text here: the enqueue bounds them, and a rebuild of an
# edited receipt must not fail on a length.
job_tags = Table(
    "job_tags",
    metadata,
    Column("job_id", String(KEY_LENGTH), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
    Column("organization_id", String(256), nullable=True),
    Column("created_at", _Time, nullable=False),
    Index("ix_job_tags_org_tag_created", "organization_id", "key", "value", "created_at", "job_id"),
)

# Projection of `tokens/<id>` streams: API tokens, stored as SHA-256 hashes only.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("organization_id", String(256), nullable=False),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("system", Boolean, nullable=False),
    Column("created_at", _Time, nullable=False),
    Column("revoked_at", _Time, nullable=True),
    # Migration 0003: space-separated scopes (e.g. "commands"; NULL = none) and an optional expiry.
    Column("scopes", String(256), nullable=True),
    Column("expires_at", _Time, nullable=True),
)

# Best-effort delivery records (the spec's driver/execute "promises"). Losing them loses no
# job: the queued redrive re-delivers from receipts. Keyed by structure -- (job id, purpose,
# observed queue state, generation) -- never by the spec's key text alone: a client jobId may
# contain ':', so ``x:redrive:1:queued`` is both a valid jobId and job x's redrive key (migration
# 0003). ``dispatch_key`` keeps the spec's text for people and logs.
deliveries = Table(
    "deliveries",
    metadata,
    Column("job_id", String(KEY_LENGTH), primary_key=True),
    Column("purpose", String(16), primary_key=True),  # dispatch | redrive | outbox
    Column("observed", String(64), primary_key=True),  # '' or '<seq>:<status>' for a redrive
    Column("generation", Integer, primary_key=True),
    Column("dispatch_key", String(512), nullable=False),
    Column("task_id", String(640), nullable=False),
    Column("state", String(16), nullable=False),  # pending | settled
    Column("outcome", String(64), nullable=True),
    Column("broker_epoch", String(64), nullable=True),  # which broker incarnation holds its message
    Column("created_at", _Time, nullable=False),
    Column("deadline_at", _Time, nullable=False),
    Column("settled_at", _Time, nullable=True),
    Index("ix_deliveries_job_created", "job_id", "created_at"),
    Index("ix_deliveries_state", "state", "deadline_at"),
)

# Best-effort loop bookkeeping so duplicate beats are harmless (single-flight + interval guard).
# ``expires_at`` is the claim's deadline, renewed by a live pass: a pass that died (its process
# killed, its database connection gone) frees the loop within about one interval (0003).
loop_runs = Table(
    "loop_runs",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("started_at", _Time, nullable=True),
    Column("finished_at", _Time, nullable=True),
    Column("owner", String(256), nullable=True),
    Column("expires_at", _Time, nullable=True),
)


# One row per worker process identity (app/jobs/liveness.py): renewed every couple of seconds by
# its process, marked dead by the worker-liveness loop, which then expires the jobs it holds.
# Best-effort and rebuildable: a live process re-inserts a missing row at its next renewal; a row
# lost with its process only delays that process's jobs to their own lease expiry.
worker_liveness = Table(
    "worker_liveness",
    metadata,
    Column("process_id", String(300), primary_key=True),
    Column("role", String(64), nullable=False),
    Column("started_at", _Time, nullable=False),
    Column("renewed_at", _Time, nullable=False),
    Column("dead_at", _Time, nullable=True),
    # Migration 0014: the credits a process offers the dispatch pass -- the worker queues it consumes
    # (space-separated) and how many attempts it runs at once. NULL: a process of an older release.
    Column("queues", String(512), nullable=True),
    Column("slots", Integer, nullable=True),
    Index("ix_worker_liveness_renewed", "dead_at", "renewed_at"),
)

# The dispatch pass's own marks (migration 0014), one time per key: a rate limiter's theoretical
# arrival time (``rate:<limiter>``, app/dispatch/rates.py) and when an organisation last got a place
# in a worker queue (``turn:<queue>:<org>``, the fair share's tie-break). Explicitly best-effort: a
# lost row forgets one emission interval (a limit may admit one extra dispatch) or one turn.
dispatch_marks = Table(
    "dispatch_marks",
    metadata,
    Column("key", String(512), primary_key=True),
    Column("at", _Time, nullable=False),
)

# Each organisation's dispatch policy set through the API (app/storage/org_policies.py): the fold of
# its ``dispatch-policies/<organizationId>`` stream, one row while it sets a weight or a rate (NULL:
# that field follows the settings). A projection: ``receipt rebuild-projections`` refills it
# (migration 0015).
org_dispatch_policies = Table(
    "org_dispatch_policies",
    metadata,
    Column("organization_id", String(256), primary_key=True),
    Column("weight", Float, nullable=True),
    Column("rate_per_s", Float, nullable=True),
    Column("last_seq", Integer, nullable=False),
    Column("updated_at", _Time, nullable=False),
)

# The callback outbox: one row per (callback event, target), written in the same transaction as
# the receipt that caused it (``dispatched``, which has no receipt, just before its message is
# sent). Bookkeeping, not truth: each row is derived from a receipt; a lost row loses one
# notification, never a job. The sender (delivery/callbacks.py) marks rows delivered or dead.
callback_outbox = Table(
    "callback_outbox",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False),  # stable across retries: the webhook-id
    Column("target", String(2048), nullable=False),
    Column("job_id", String(KEY_LENGTH), nullable=False),
    Column("event", String(16), nullable=False),
    Column("seq", Integer, nullable=False),  # the receipt's seq: delivery order per job
    Column("body", Text(), nullable=False),  # the exact bytes signed and sent
    Column("state", String(16), nullable=False),  # pending | delivered | dead
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", _Time, nullable=False),
    Column("created_at", _Time, nullable=False),
    Column("delivered_at", _Time, nullable=True),
    Column("last_error", String(512), nullable=True),
    UniqueConstraint("target", "event_id", name="uq_callback_outbox_target_event"),
    Index("ix_callback_outbox_state", "state", "id"),
    # Migration 0011: the archiving pass removes a page's rows by job.
    Index("ix_callback_outbox_job", "job_id"),
)


# Projection of `objectives/<id>` streams (migration 0003): one row per objective (its state without
# the tasks) and one per task, so a control step reads and writes only the tasks it touches.
objectives = Table(
    "objectives",
    metadata,
    Column("id", String(KEY_LENGTH), primary_key=True),
    Column("organization_id", String(256), nullable=True),
    Column("status", String(16), nullable=False),
    Column("phase", Integer, nullable=False),
    Column("title", String(256), nullable=False),
    Column("created_at", _Time, nullable=False),
    Column("updated_at", _Time, nullable=False),
    Column("status_changed_at", _Time, nullable=False),
    # Unconsumed control requests (the outbox): how many, and the seq of the oldest.
    Column("pending_count", Integer, nullable=False),
    Column("pending_seq", Integer, nullable=True),
    Column("audited", Boolean, nullable=False),
    Column("last_seq", Integer, nullable=False),
    Column("last_hash", String(64), nullable=False),
    Column("state", _Json, nullable=False),
    Index("ix_objectives_org_created", "organization_id", "created_at", "id"),
    Index("ix_objectives_status", "status", "status_changed_at"),
    Index("ix_objectives_pending", "pending_count"),
)

objective_tasks = Table(
    "objective_tasks",
    metadata,
    Column("objective_id", String(KEY_LENGTH), primary_key=True),
    Column("task_id", String(64), primary_key=True),
    Column("status", String(16), nullable=False),
    Column("job_id", String(KEY_LENGTH), nullable=True),
    Column("deps_remaining", Integer, nullable=False),
    Column("state", _Json, nullable=False),
    Index("ix_objective_tasks_status", "objective_id", "status"),
)


# The durable ledger beside receipts (migration 0007): rebuildable from receipts
# (`receipt rebuild-ledger`), written after the receipt commits and best effort.
durable_workflows = Table(
    "durable_workflows",
    metadata,
    Column("id", String(512), primary_key=True),  # "<durableWorkflow>:<objectiveId or jobId>"
    Column("name", String(64), nullable=False),  # the kind contract's durableWorkflow
    Column("objective_id", String(KEY_LENGTH), nullable=True),
    Column("job_id", String(KEY_LENGTH), nullable=True),
    Column("organization_id", String(256), nullable=True),
    Column("status", String(16), nullable=False),
    Column("steps", Integer, nullable=False),
    Column("started_at", _Time, nullable=True),
    Column("ended_at", _Time, nullable=True),
    Column("updated_at", _Time, nullable=False),
    Index("ix_durable_workflows_objective", "objective_id"),
    Index("ix_durable_workflows_job", "job_id"),  # migration 0011: the archiving pass, by job
)

durable_activities = Table(
    "durable_activities",
    metadata,
    Column("job_id", String(KEY_LENGTH), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("kind", String(64), nullable=False),
    Column("objective_id", String(KEY_LENGTH), nullable=True),
    Column("status", String(16), nullable=False),  # running|completed|failed|canceled|expired|released
    Column("worker_id", String(256), nullable=True),
    Column("started_at", _Time, nullable=False),
    Column("ended_at", _Time, nullable=True),
    Column("duration_ms", Integer, nullable=True),
    Index("ix_durable_activities_objective", "objective_id"),
)


# Projection of `schedules/<organizationId>/<id>` streams (migration 0009): one row per schedule, with
# the columns its pass scans: when its next tick is due (NULL: paused, deleted or past its end) and
# whether a tick waits buffered for its previous job to end.
schedules = Table(
    "schedules",
    metadata,
    Column("id", String(KEY_LENGTH), primary_key=True),
    Column("organization_id", String(256), nullable=False),
    Column("status", String(16), nullable=False),
    Column("next_fire_at", _Time, nullable=True),
    Column("buffered", Boolean, nullable=False),
    Column("created_at", _Time, nullable=False),
    Column("updated_at", _Time, nullable=False),
    Column("last_seq", Integer, nullable=False),
    Column("last_hash", String(64), nullable=False),
    Column("state", _Json, nullable=False),
    Index("ix_schedules_due", "status", "next_fire_at"),
    Index("ix_schedules_org_created", "organization_id", "created_at", "id"),
    Index("ix_schedules_buffered", "buffered"),
)


# Tombstones (migration 0011): one row per stream the archiving pass moved out of the database
# (app/retention/archive.py), written in the transaction that removes the stream's receipts, so the
# database keeps proving what left it: the stream's receipt count and final hash, the archive segment
# that holds it, and the pass that moved it. The append-only trigger lets a receipt go only while a
# pass's guard is set and its stream's tombstone names that pass. ``summary`` is what a re-post or a
# read of the archived id answers with. Never updated or deleted: a key stays taken.
archived_streams = Table(
    "archived_streams",
    metadata,
    Column("stream", String(512), primary_key=True),
    Column("kind", String(16), nullable=False),  # job | objective
    Column("key", String(KEY_LENGTH), nullable=False),
    Column("organization_id", String(256), nullable=True),
    Column("status", String(16), nullable=False),
    Column("receipt_count", Integer, nullable=False),
    Column("final_hash", String(64), nullable=False),
    Column("ended_at", _Time, nullable=False),
    Column("segment", String(256), nullable=False),
    Column("pass_id", String(64), nullable=False),
    Column("archived_at", _Time, nullable=False),
    Column("summary", JSON(), nullable=False),
)

# One row per segment an archiving pass committed, written in the transaction of its tombstones:
# what each pass moved (streams, receipts, bytes), for the system page, and the segments the pass's
# sweep keeps (a segment with no row here was never committed). Never updated or deleted.
# Verification holds the archive against the tombstones themselves.
archive_segments = Table(
    "archive_segments",
    metadata,
    Column("segment", String(256), primary_key=True),
    Column("pass_id", String(64), nullable=False),
    Column("streams", Integer, nullable=False),
    Column("receipts", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("written_at", _Time, nullable=False),
    Index("ix_archive_segments_written", "written_at"),
)

# SQLite's guard (migration 0011): the pass inserts its id here at the start of its transaction and
# removes it before commit; the delete trigger allows a receipt's removal only while a row names
# the pass its stream's tombstone records. SQLite has one writer at a time, so no other transaction
# ever sees the row. PostgreSQL uses a transaction-local setting (``receipt.archiving``) instead.
archive_guard = Table(
    "archive_guard",
    metadata,
    Column("pass_id", String(64), primary_key=True),
)


# -- engines ------------------------------------------------------------------------------


def make_engine(
    url: str, *, prepared_statements: bool = False, idle_in_transaction_ms: int = 0, **kwargs: Any
) -> Engine:
    """Open an engine; SQLite gets WAL, a busy timeout and explicit BEGIN for write locking.

    Every engine hides SQL parameters from its errors and logs: a failed statement
    must not put a payload, a token hash or a tenant's data into a log line.
    ``prepared_statements`` (``RECEIPT_DB_PREPARED_STATEMENTS``, PostgreSQL only): the hot
    statements are prepared once per connection (``app/storage/direct.py``).
    ``idle_in_transaction_ms`` (``RECEIPT_DB_IDLE_IN_TRANSACTION_MS``, PostgreSQL only; 0: none):
    the server ends a session idle that long inside a transaction, and its locks with it.
    """
    kwargs.setdefault("hide_parameters", True)
    kwargs.setdefault("json_serializer", jsontext.dumps)
    kwargs.setdefault("json_deserializer", jsontext.loads)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            # The embedded database lives in RECEIPT_HOME: private folder, 0600 file from byte one.
            private_dir(Path(path).parent)
            create_private_file(Path(path))
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not pysqlite, issue BEGIN, so a write transaction can take the lock.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            # BEGIN IMMEDIATE serialises writers up front: no deadlocking read→write upgrades.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    kwargs.setdefault("pool_size", 10)
    # Last in, first out: a process reuses its warmest connections and the rest stay idle, so the
    # idle-only ping (below) rarely runs on the hot path; FIFO rotated every checkout over the pool.
    kwargs.setdefault("pool_use_lifo", True)
    kwargs.setdefault("max_overflow", 20)
    engine = create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        _ping_when_idle(engine)
    if idle_in_transaction_ms:
        _end_idle_transactions_after(engine, idle_in_transaction_ms)
    if prepared_statements:

        @event.listens_for(engine.pool, "connect")
        def _prepare_here(_dbapi_conn: Any, record: Any) -> None:
            # A new server session has nothing prepared (the pool clears ``info`` on reconnect).
            record.info[PREPARED] = {}

    return engine


def engine_for(settings: Settings) -> Engine:
    """The engine a process opens on its configured database (``DATABASE_URL`` or the embedded file)."""
    url = settings.sqlalchemy_url
    pool = {} if url.startswith("sqlite") else {"pool_size": settings.db_pool_size}
    return make_engine(
        url,
        prepared_statements=settings.db_prepared_statements,
        idle_in_transaction_ms=settings.db_idle_in_transaction_ms,
        **pool,
    )


def _end_idle_transactions_after(engine: Engine, ms: int) -> None:
    """Have PostgreSQL end each of this engine's sessions that sits ``ms`` idle inside a transaction.

    A dispatch pass holds its queue's advisory lock for its whole transaction: a process frozen or
    cut off mid-pass would otherwise keep every other process's pass of that queue waiting until
    its TCP connection died. A session-level ``SET`` (committed, so the pool's reset keeps it), not
    the ``options`` startup parameter, which a pooler such as PgBouncer may refuse."""

    @event.listens_for(engine.pool, "connect")
    def _set_timeout(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"SET idle_in_transaction_session_timeout = {int(ms)}")
        finally:
            cur.close()
        dbapi_conn.commit()


# A pooled connection is pinged at checkout only when it sat idle this long. A busy
# process reuses its connections within milliseconds, so it skips the round trip that a ping on
# every checkout costs (one statement and one server transaction per checkout); a connection that
# sat idle through a database restart is still found dead here, and replaced before use.
IDLE_PING_AFTER_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    @event.listens_for(engine.pool, "checkin")
    def _stamp(_dbapi_conn: Any, record: Any) -> None:
        record.info["receipt_checked_in"] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _ping(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("receipt_checked_in")
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_AFTER_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # The pool discards this connection and checks out (or opens) another one.
            raise DisconnectionError(f"pooled connection failed its idle ping: {exc}") from exc


def is_sqlite(conn: Connection | Engine) -> bool:
    return conn.dialect.name == "sqlite"


def has_tag(conn: Connection | Engine, key: str, value: str) -> ColumnElement[bool]:
    """SQL for "the job is tagged ``key: value``". PostgreSQL: JSONB containment, which the GIN
    index ``ix_jobs_tags`` answers; SQLite: the key's value (quoted: a key may hold '.' or '-')."""
    if is_sqlite(conn):
        return func.json_extract(jobs.c.tags, f'$."{key}"') == value
    return type_coerce(jobs.c.tags, JSONB).contains({key: value})


@contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """A write transaction; the caller owns it, so a receipt and its projection commit together."""
    with engine.begin() as conn:
        yield conn


# -- the database clock ---------------------------------------------------------------------


# A SQLite engine may carry a clock of its own, ``engine.execution_options(receipt_clock=fn)``:
# the test kit's hand-moved clock (``receipt.testing``), so a test reaches a delayed job or a retry's
# backoff without waiting. Deployments never set it. On PostgreSQL the clock is read inside the
# statements that decide (``projection.load_at_clock``), so no option could stand in for it there.
CLOCK_OPTION = "receipt_clock"


def db_now(conn: Connection) -> datetime:
    """The database's clock (not the host's), so skewed hosts cannot steal or keep leases."""
    if is_sqlite(conn):
        clock = conn.get_execution_options().get(CLOCK_OPTION)
        if clock is not None:
            now: datetime = clock()
            return now
        raw = conn.execute(text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
        return datetime.strptime(raw, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
    [(value,)] = _CLOCK.rows(conn, {})
    return as_utc(value)


# On PostgreSQL it runs on the driver's cursor (app/storage/direct.py): every transaction that
# decides from more than one row reads the clock this way.
_CLOCK = Direct(select(func.clock_timestamp()))


def lock_key(conn: Connection, name: str) -> None:
    """Serialise transactions on one name (e.g. a session key) until commit.

    Postgres: a transaction-scoped advisory lock. SQLite: BEGIN IMMEDIATE already holds the
    database write lock for the whole transaction, so nothing more is needed.
    """
    if is_sqlite(conn):
        return
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _advisory_key(name)})


def lock_keys(conn: Connection, names: Sequence[str]) -> None:
    """``lock_key`` for many names in one round trip, taken in one global order (no deadlock
    between two callers locking overlapping sets)."""
    if is_sqlite(conn) or not names:
        return
    keys = sorted({_advisory_key(n) for n in names})
    conn.execute(_LOCK_MANY, {"keys": keys})


_LOCK_MANY = text(
    "SELECT pg_advisory_xact_lock(k) FROM (SELECT unnest(CAST(:keys AS bigint[])) AS k ORDER BY 1) AS ks"
)
# The count consumes every lock before the outer row's clock is read: the time is the holder's.
_LOCK_MANY_THEN_NOW = text(
    "SELECT clock_timestamp() FROM (SELECT count(*) AS n FROM ("
    "SELECT pg_advisory_xact_lock(k) FROM (SELECT unnest(CAST(:keys AS bigint[])) AS k ORDER BY 1) AS ks"
    ") AS locked) AS held"
)


def lock_keys_then_now(conn: Connection, names: Sequence[str]) -> datetime:
    """``lock_keys``, then the database's clock once they are held, in one round trip."""
    if is_sqlite(conn) or not names:
        lock_keys(conn, names)
        return db_now(conn)
    keys = sorted({_advisory_key(n) for n in names})
    return as_utc(conn.execute(_LOCK_MANY_THEN_NOW, {"keys": keys}).scalar_one())


def _advisory_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def autocommit_connection(engine: Engine) -> Iterator[Connection]:
    """A connection whose statements each commit on their own (PostgreSQL: psycopg2 autocommit).

    Not ``execution_options(isolation_level="AUTOCOMMIT")``: SQLAlchemy restores such a
    connection's isolation level when it is checked back in, and if the server dropped the
    connection meanwhile (a restart, ``pg_terminate_backend``) that restore raises the raw
    psycopg2 error out of ``close()`` *and never returns the connection to the pool* (SQLAlchemy
    2.1.9, ``_ConnectionRecord.checkin``): each such failure leaked a pool slot until checkouts
    timed out, and surfaced as a 500. Here the flag is set and cleared on the DBAPI connection
    directly; a connection whose flag cannot be cleared is invalidated (discarded), never
    returned to the pool in autocommit mode. SQLite connections are returned unchanged.
    """
    with engine.connect() as conn:
        if conn.dialect.name != "postgresql":
            yield conn
            return
        dbapi = conn.connection.dbapi_connection
        try:
            dbapi.autocommit = True  # type: ignore[union-attr]
        except Exception:
            conn.invalidate()
            raise
        try:
            yield conn
        finally:
            try:
                if not conn.invalidated:
                    conn.rollback()  # ends SQLAlchemy's autobegun transaction (no round trip)
                    dbapi.autocommit = False  # type: ignore[union-attr]
            except Exception:
                conn.invalidate()


# -- what counts as a storage outage (one classifier: the API's 503, retries) -------------------------

# SQLSTATE classes of a server going away: 08 connection exception, 57P operator intervention
# (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now), 53 insufficient resources.
_OUTAGE_SQLSTATE_PREFIXES = ("08", "57P", "53")


def _raw_dbapi_outage_types() -> tuple[type[BaseException], ...]:
    try:
        import psycopg2
    except ImportError:  # an embedded-only install
        return ()
    return (psycopg2.OperationalError, psycopg2.InterfaceError)


_RAW_OUTAGE_TYPES = _raw_dbapi_outage_types()


def is_storage_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) means the database is unreachable,
    restarting, overloaded or dropped the connection -- a retryable condition, not a bug.

    Covers SQLAlchemy's ``OperationalError``/``InterfaceError``, any ``DBAPIError`` that
    invalidated its connection, a pool checkout that timed out (``sqlalchemy.exc.TimeoutError``)
    or failed (``DisconnectionError``), a psycopg2 ``OperationalError``/``InterfaceError`` raised
    raw (outside a statement: pool reset, connection setup), and any SQLSTATE of class 08, 57P
    or 53 (AdminShutdown, CannotConnectNow, "server closed the connection unexpectedly").
    """
    from sqlalchemy import exc as sa_exc

    from app.jobs.errors import TransientStorageError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(
            current,
            TransientStorageError
            | sa_exc.OperationalError
            | sa_exc.InterfaceError
            | sa_exc.TimeoutError
            | sa_exc.DisconnectionError,
        ):
            return True
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if _RAW_OUTAGE_TYPES and isinstance(current, _RAW_OUTAGE_TYPES):
            return True
        code = getattr(current, "pgcode", None) or getattr(getattr(current, "orig", None), "pgcode", None)
        if isinstance(code, str) and code.startswith(_OUTAGE_SQLSTATE_PREFIXES):
            return True
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def session_lock(
    engine: Engine, name: str, *, wait_s: float, poll_s: float = 0.02, conn: Connection | None = None
) -> Iterator[bool]:
    """Hold a lock on ``name`` across transactions (Postgres: a session advisory lock on its own
    connection, or on ``conn``, an autocommit connection the caller holds at least as long),
    waiting up to ``wait_s``; yields whether it was taken. Callers must be safe without it (it
    saves duplicate work, it does not provide correctness). SQLite: always True, no lock (its
    write lock already serialises writers)."""
    if engine.dialect.name == "sqlite":
        yield True
        return
    with contextlib.ExitStack() as stack:
        held = conn if conn is not None else stack.enter_context(autocommit_connection(engine))
        key = {"k": _advisory_key(name)}
        deadline = time.monotonic() + wait_s
        while True:
            taken = bool(held.execute(text("SELECT pg_try_advisory_lock(:k)"), key).scalar_one())
            if taken or time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
        try:
            yield taken
        finally:
            if taken:
                held.execute(text("SELECT pg_advisory_unlock(:k)"), key)


class Reads:
    """Where a run of reads gets its connection (``with reads() as conn``).

    PostgreSQL: one autocommit connection, held by ``shared_reads`` for the whole run — one pool
    checkout and no BEGIN/ROLLBACK per read. SQLite: a connection per read, because an open SQLite
    read holds the database write lock (BEGIN IMMEDIATE) and would block the run's own writes.
    """

    def __init__(self, engine: Engine, held: Connection | None) -> None:
        self._engine = engine
        self.held = held

    @contextmanager
    def __call__(self) -> Iterator[Connection]:
        if self.held is not None:
            yield self.held
        else:
            with self._engine.connect() as conn:
                yield conn


@contextmanager
def shared_reads(engine: Engine) -> Iterator[Reads]:
    if engine.dialect.name == "sqlite":
        yield Reads(engine, None)
        return
    with autocommit_connection(engine) as conn:
        yield Reads(engine, conn)


def read_connection(engine: Engine) -> AbstractContextManager[Connection]:
    """A connection for single-statement reads (token lookup, stream polls, readiness).

    On PostgreSQL it runs in autocommit: psycopg2 otherwise wraps every read in its own
    BEGIN ... ROLLBACK, three round trips where one will do. SQLite keeps its ordinary connection
    (its engine issues ``BEGIN IMMEDIATE`` on begin, which must stay paired with a commit or
    rollback). How the flag is set matters when the server drops the connection:
    ``autocommit_connection``.
    """
    return autocommit_connection(engine)


def put_marks(conn: Connection, marks: Mapping[str, datetime]) -> None:
    """Set each ``dispatch_marks`` key to its time, inserting the missing ones, in one statement."""
    if not marks:
        return
    from sqlalchemy.dialects import postgresql, sqlite

    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    rows = [{"key": k, "at": v} for k, v in sorted(marks.items())]
    statement = dialect.insert(dispatch_marks).values(rows)
    conn.execute(statement.on_conflict_do_update(index_elements=["key"], set_={"at": statement.excluded.at}))
