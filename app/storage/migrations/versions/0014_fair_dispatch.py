"""Fair dispatch (docs/dispatch.md): the waiting line's columns and index, credits on liveness rows,
and the rate limiter's rows.

* ``jobs.worker_queue``, ``.priority``, ``.concurrency_key``, ``.concurrency_limit``, ``.debounce_key``:
  projection columns. ``worker_queue`` is filled here for every unfinished job (its route, computed
  as ``app.jobs.routing`` does); finished jobs keep NULL, which no pass reads.
* ``ix_jobs_line``: each organisation's queued jobs of a worker queue, by priority then age.
* ``ix_jobs_concurrency_key``, ``ix_jobs_debounce``: a key's attempts; a debounce's pending job.
* ``worker_liveness.queues`` and ``.slots``: what a live process offers the dispatch pass.
* ``dispatch_marks``: the pass's best-effort marks (rate limiters, organisations' last turns).

Expand-only: nullable columns, a column with a default, indexes and a new table. A previous release
writes job rows without ``worker_queue``: the dispatch pass fills it for the jobs it is woken for,
and the queued redrive wakes the rest. All of it is projection or best-effort:
``receipt rebuild-projections`` refills the job columns from receipts.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from app.jobs.routing import queue_for

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_UNFINISHED = ("queued", "leased", "running")


def upgrade() -> None:
    op.add_column("jobs", sa.Column("worker_queue", sa.String(64), nullable=True))
    op.add_column("jobs", sa.Column("priority", sa.SmallInteger(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("concurrency_key", sa.String(128), nullable=True))
    op.add_column("jobs", sa.Column("concurrency_limit", sa.SmallInteger(), nullable=True))
    op.add_column("jobs", sa.Column("debounce_key", sa.String(128), nullable=True))
    bind = op.get_bind()
    jobs = sa.table(
        "jobs", sa.column("id"), sa.column("agent_id"), sa.column("kind"), sa.column("status"), sa.column("worker_queue")
    )
    rows = bind.execute(
        sa.select(jobs.c.id, jobs.c.agent_id, jobs.c.kind).where(jobs.c.status.in_(_UNFINISHED))
    ).all()
    by_queue: dict[str, list[str]] = {}
    for row in rows:
        by_queue.setdefault(queue_for(row.agent_id, row.kind), []).append(row.id)
    for queue, ids in by_queue.items():
        for at in range(0, len(ids), 1000):
            bind.execute(sa.update(jobs).where(jobs.c.id.in_(ids[at : at + 1000])).values(worker_queue=queue))
    queued = sa.text("status = 'queued'")
    op.create_index(
        "ix_jobs_line",
        "jobs",
        ["worker_queue", "organization_id", sa.text("priority DESC"), "status_changed_at", "id"],
        postgresql_where=queued,
        sqlite_where=queued,
    )
    keyed = sa.text("concurrency_key IS NOT NULL")
    op.create_index(
        "ix_jobs_concurrency_key",
        "jobs",
        ["organization_id", "concurrency_key", "status"],
        postgresql_where=keyed,
        sqlite_where=keyed,
    )
    debounced = sa.text("status = 'queued' AND debounce_key IS NOT NULL")
    op.create_index(
        "ix_jobs_debounce",
        "jobs",
        ["organization_id", "debounce_key"],
        postgresql_where=debounced,
        sqlite_where=debounced,
    )
    op.add_column("worker_liveness", sa.Column("queues", sa.String(512), nullable=True))
    op.add_column("worker_liveness", sa.Column("slots", sa.Integer(), nullable=True))
    op.create_table(
        "dispatch_marks",
        sa.Column("key", sa.String(512), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("dispatch_marks")
    op.drop_column("worker_liveness", "slots")
    op.drop_column("worker_liveness", "queues")
    op.drop_index("ix_jobs_debounce", table_name="jobs")
    op.drop_index("ix_jobs_concurrency_key", table_name="jobs")
    op.drop_index("ix_jobs_line", table_name="jobs")
    op.drop_column("jobs", "debounce_key")
    op.drop_column("jobs", "concurrency_limit")
    op.drop_column("jobs", "concurrency_key")
    op.drop_column("jobs", "priority")
    op.drop_column("jobs", "worker_queue")
