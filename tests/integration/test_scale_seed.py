"""``bench/scale.py``'s bulk seeding: the fast path writes the rows the slow path would, and the
post-load check catches a projection row that is not the fold of its receipts."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.storage import projection
from app.storage.db import deliveries, jobs, receipts
from bench import scale

# The scale benchmark's seeding, not the runtime: make test runs it, make test-fast does not.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("finished", [True, False])
def test_template_fill_equals_the_slow_path(finished: bool) -> None:
    template = scale.Template(finished)
    start = datetime(2026, 3, 1, 23, 59, 59, 999_000, tzinfo=UTC)  # crosses a day, a month
    for n in range(50):
        created = start + timedelta(microseconds=n * 7_777)
        job_id, organization = scale.seed_id(n * 104_729), scale.org(n)
        expected = scale.render(scale.job_rows(job_id, organization, created, finished))
        assert template.fill(job_id, organization, created) == expected
    receipts_text, _, delivery_text = template.fill("seed-00000001", "bench-org-1", start)
    assert receipts_text.count("\n") == (4 if finished else 1)
    assert bool(delivery_text) == finished


def test_seeded_database_verifies_and_folds(pg_engine: Engine) -> None:
    rng = random.Random(3)
    plan = scale.seed(pg_engine, 120, 30, rng, chunk=40)
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(receipts)).scalar_one() == 4 * 120 + 30
        assert conn.execute(select(func.count()).select_from(deliveries)).scalar_one() == 120
        statuses = dict(
            (s, n) for s, n in conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        )
    assert statuses == {"completed": 120, "queued": 30}
    assert sorted(plan.queued_ids()) == sorted(
        scale.seed_id(i) for i, kind in enumerate(plan.kinds) if not kind
    )
    scale.check_sample(pg_engine, rng, plan, n=len(plan))  # every job
    # The seeded rows are what rebuilding the projection from the receipts writes.
    with pg_engine.begin() as conn:
        before = {r.id: dict(r._mapping) for r in conn.execute(select(jobs))}
        assert projection.rebuild(conn) == len(plan)
        after = {r.id: dict(r._mapping) for r in conn.execute(select(jobs))}
    assert after == before


def test_check_sample_catches_a_projection_row_that_is_not_the_fold(pg_engine: Engine) -> None:
    plan = scale.seed(pg_engine, 10, 0, random.Random(4), chunk=10)
    with pg_engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == scale.seed_id(7)).values(attempt=2))
    with pytest.raises(AssertionError, match="seed-00000007"):
        scale.check_sample(pg_engine, random.Random(5), plan, n=len(plan))


def test_every_timed_operation_runs_and_the_claim_is_rolled_back(pg_engine: Engine) -> None:

    rng = random.Random(6)
    plan = scale.seed(pg_engine, 60, 60, rng, chunk=50)
    ops = scale.operations(pg_engine, queue_for(pg_engine), len(plan), plan.queued_ids(), rng)
    assert "dispatch claim, batch of 50" in ops
    for op in ops.values():
        op()
    with pg_engine.connect() as conn:
        pending = conn.execute(text("SELECT count(*) FROM deliveries WHERE state = 'pending'")).scalar_one()
    assert pending == 0  # the claim's 50 inserts were rolled back
