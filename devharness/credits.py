"""A live worker process's offer to the dispatch pass, for tests and benchmarks that run the worker
path in-process.

The pass sends only to free slots of live processes (docs/dispatch.md); a test that stands in for
a deployment's workers records what their processes would: a live liveness row naming the worker
queues and the slots. Renewed far ahead, so a long test never sees it lapse.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import delete, insert
from sqlalchemy.engine import Engine

from app.dispatch.line import queues_field
from app.jobs.routing import QUEUES
from app.storage.db import db_now, transaction, worker_liveness

AHEAD = timedelta(days=1)


def offer_slots(engine: Engine, slots: int = 64, queues: Iterable[str] = QUEUES.values()) -> str:
    """Record a live process consuming ``queues`` with ``slots``; returns its process id."""
    process = f"test-offer:{uuid.uuid4().hex[:8]}"
    with transaction(engine) as conn:
        now = db_now(conn)
        conn.execute(
            insert(worker_liveness).values(
                process_id=process,
                role="worker-chat",
                started_at=now,
                renewed_at=now + AHEAD,
                dead_at=None,
                queues=queues_field(list(queues)),
                slots=slots,
            )
        )
    return process


def withdraw(engine: Engine, process: str) -> None:
    with transaction(engine) as conn:
        conn.execute(delete(worker_liveness).where(worker_liveness.c.process_id == process))
