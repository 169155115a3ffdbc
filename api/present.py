"""The JSON the API answers with: a job (with its route) and the enqueue's ``async`` block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from flask import request

from api.auth import current
from api.context import state
from api.schemas import ORGANIZATION_PARAM
from app.dispatch import line
from app.jobs.reducer import Job
from app.jobs.routing import route
from app.storage.db import db_now


def job_json(job: Job) -> dict[str, Any]:
    """``Job.to_json()`` as its organisation sees it (``id`` is the id it knows the job by, beside
    ``organizationId``), plus the derived ``route`` (worker group, queue, contract agreement)."""
    out = job.to_json()
    out["id"] = job.client_id
    out["organizationId"] = job.organization_id
    out["route"] = route(job.agent_id, job.kind).to_json()
    return out


def with_waiting(items: list[dict[str, Any]], jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """``items`` (``job_json`` of ``jobs``, in order), each queued one that waits for a place
    saying why: ``waiting: {reason: concurrency | rate | share, key}`` (docs/dispatch.md)."""
    queued = [j for j in jobs if j.status == "queued"]
    if not queued:
        return items
    st = state()
    with st.engine.connect() as conn:
        why = line.waiting_reasons(conn, queued, st.settings, db_now(conn))
    for item, job in zip(items, jobs, strict=True):
        waiting = why.get(job.id)
        if waiting is not None:
            item["waiting"] = {"reason": waiting.reason, "key": waiting.key}
    return items


def job_path(job: Job, suffix: str = "") -> str:
    """Where the caller reads the job: in its own organisation by the job's id, or, for a system
    token acting in another, with that organisation named (``?organizationId=``)."""
    path = f"{request.script_root}/jobs/{job.client_id}{suffix}"
    if job.organization_id not in (None, current().organization_id):
        path += "?" + urlencode({ORGANIZATION_PARAM: job.organization_id})
    return path


def job_events_path(job: Job) -> str:
    return job_path(job, "/events")


def receipt_events_path(stream: str) -> str:
    return f"{request.script_root}/streams/{stream}/events"


def async_block(job: Job) -> dict[str, Any]:
    """Where to follow a job: its stream and the two event URLs (relative to this server)."""
    return {
        "jobId": job.client_id,
        "stream": job.stream,
        "jobEventsUrl": job_events_path(job),
        "receiptEventsUrl": receipt_events_path(job.stream),
        "status": job.status,
    }
