"""Finding jobs at a million: ``job_tags`` (one row per tag of each job, kept by the database),
and indexes for the lane, error-prefix and every-organisation lists.

* ``job_tags (job_id, key, value, organization_id, created_at)``: primary key (job, key), the job's
  row referenced with ``ON DELETE CASCADE`` (archiving a job, or a rebuild emptying ``jobs``, takes
  its tags with it).
* ``ix_job_tags_org_tag_created (organization_id, key, value, created_at, job_id)``: an
  organisation's jobs of one tag, newest first -- the keyset walk of a tag filter's page, where the
  GIN index of 0012 finds every tagged job and sorts them all, or the planner walks every job of
  the organisation testing its tags (``bench/README.md``, "Filtered list at a million jobs").
* Two triggers on ``jobs`` write it: after an insert of a tagged row, and after an update that
  changes a row's tags, organisation or creation time (which no transition does, but a row written
  before 0012 had no tags and gets them on its next transition). So every writer of a
  ``jobs`` row keeps ``job_tags`` equal to ``jobs.tags`` in the same statement: this release's
  one-statement transitions and bulk inserts, ``receipt rebuild-projections``, and the previous
  release's processes during a deploy, which know nothing of this table.
* The rows of jobs already tagged are copied here.
* ``ix_jobs_org_lane_created``, ``ix_jobs_created``: an organisation's jobs of one lane, and every
  organisation's jobs (a system identity's list), newest first. ``ix_jobs_org_error`` (PostgreSQL
  only): an organisation's errored jobs by error text in byte order (``text_pattern_ops``), so a
  rare error prefix is a short range rather than a walk of the whole history.

Expand-only: a new table, four indexes and two triggers that only ever add what the ``jobs`` rows
already say; a previous release reads and writes exactly what it did. All of it is projection:
``receipt rebuild-projections`` refills it with ``jobs``. A deployment whose ``jobs`` table is
large runs this in a quiet hour, or builds the three ``jobs`` indexes first (``docs/runbook.md``): the
copy and the index builds hold the migration's transaction (43 s for a million jobs of two tags each
on the bench machine).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_Time = sa.DateTime(timezone=True)
# What the triggers watch: a transition rewrites every column, but only these decide the rows.
_WATCHED = ("tags", "organization_id", "created_at")

_PG_FUNCTION = """
    CREATE OR REPLACE FUNCTION job_tags_of_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            DELETE FROM job_tags WHERE job_id = OLD.id;
        END IF;
        IF jsonb_typeof(NEW.tags) = 'object' THEN
            INSERT INTO job_tags (job_id, key, value, organization_id, created_at)
            SELECT NEW.id, t.key, t.value, NEW.organization_id, NEW.created_at
            FROM jsonb_each_text(NEW.tags) AS t WHERE t.value IS NOT NULL;
        END IF;
        RETURN NULL;
    END $$
"""
_PG_CHANGED = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in _WATCHED)

# SQLite: the same rule as two trigger bodies (a trigger there runs statements, not a function).
_SQLITE_INSERT_TAGS = """
    INSERT INTO job_tags (job_id, key, value, organization_id, created_at)
    SELECT NEW.id, t.key, t.value, NEW.organization_id, NEW.created_at
    FROM json_each(NEW.tags) AS t WHERE t.value IS NOT NULL;
"""
_SQLITE_CHANGED = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _WATCHED)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "job_tags",
        sa.Column(
            "job_id", sa.String(384), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("organization_id", sa.String(256), nullable=True),
        sa.Column("created_at", _Time, nullable=False),
    )
    if postgres:
        op.execute(_PG_FUNCTION)
        op.execute("""
            CREATE TRIGGER job_tags_on_insert AFTER INSERT ON jobs FOR EACH ROW
            WHEN (jsonb_typeof(NEW.tags) = 'object') EXECUTE FUNCTION job_tags_of_row()
        """)
        op.execute(f"""
            CREATE TRIGGER job_tags_on_update AFTER UPDATE OF {", ".join(_WATCHED)} ON jobs FOR EACH ROW
            WHEN ({_PG_CHANGED}) EXECUTE FUNCTION job_tags_of_row()
        """)
        op.execute("""
            INSERT INTO job_tags (job_id, key, value, organization_id, created_at)
            SELECT j.id, t.key, t.value, j.organization_id, j.created_at
            FROM jobs j, jsonb_each_text(j.tags) AS t
            WHERE jsonb_typeof(j.tags) = 'object' AND t.value IS NOT NULL
        """)
    else:
        op.execute(f"""
            CREATE TRIGGER job_tags_on_insert AFTER INSERT ON jobs
            WHEN json_type(NEW.tags) = 'object'
            BEGIN {_SQLITE_INSERT_TAGS} END
        """)
        op.execute(f"""
            CREATE TRIGGER job_tags_on_update AFTER UPDATE OF {", ".join(_WATCHED)} ON jobs
            WHEN {_SQLITE_CHANGED}
            BEGIN
                DELETE FROM job_tags WHERE job_id = OLD.id;
                {_SQLITE_INSERT_TAGS.replace("WHERE", "WHERE json_type(NEW.tags) = 'object' AND")}
            END
        """)
        op.execute("""
            INSERT INTO job_tags (job_id, key, value, organization_id, created_at)
            SELECT j.id, t.key, t.value, j.organization_id, j.created_at
            FROM jobs j, json_each(j.tags) AS t
            WHERE json_type(j.tags) = 'object' AND t.value IS NOT NULL
        """)
    op.create_index(
        "ix_job_tags_org_tag_created", "job_tags", ["organization_id", "key", "value", "created_at", "job_id"]
    )
    # The other filters' first pages at a million jobs (bench/search_bench.py). A deployment whose
    # ``jobs`` table is large builds them first without blocking writes (``CREATE INDEX
    # CONCURRENTLY IF NOT EXISTS ...``, docs/runbook.md): then nothing is built here.
    op.create_index(
        "ix_jobs_org_lane_created", "jobs", ["organization_id", "lane", "created_at", "id"], if_not_exists=True
    )
    op.create_index("ix_jobs_created", "jobs", ["created_at", "id"], if_not_exists=True)
    if postgres:
        op.create_index(
            "ix_jobs_org_error",
            "jobs",
            ["organization_id", "error_text", "created_at", "id"],
            postgresql_ops={"error_text": "text_pattern_ops"},
            postgresql_where=sa.text("error_text IS NOT NULL"),
            if_not_exists=True,
        )


def downgrade() -> None:
    if _pg():
        op.drop_index("ix_jobs_org_error", table_name="jobs")
    op.drop_index("ix_jobs_created", table_name="jobs")
    op.drop_index("ix_jobs_org_lane_created", table_name="jobs")
    op.execute("DROP TRIGGER job_tags_on_update" + (" ON jobs" if _pg() else ""))
    op.execute("DROP TRIGGER job_tags_on_insert" + (" ON jobs" if _pg() else ""))
    if _pg():
        op.execute("DROP FUNCTION job_tags_of_row()")
    op.drop_index("ix_job_tags_org_tag_created", table_name="job_tags")
    op.drop_table("job_tags")


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"
