"""The JSON the API answers with: a job (with its route) and the enqueue's ``async`` block."""

from __future__ import annotations

from typing import Any

from flask import request

from app.jobs.reducer import Job
from app.jobs.routing import route


def job_json(job: Job) -> dict[str, Any]:
    """``Job.to_json()`` plus the derived ``route`` (worker group, queue, contract agreement)."""
    out = job.to_json()
    out["route"] = route(job.agent_id, job.kind).to_json()
    return out


def job_path(job_id: str) -> str:
    return f"{request.script_root}/jobs/{job_id}"


def job_events_path(job_id: str) -> str:
    return f"{job_path(job_id)}/events"


def receipt_events_path(stream: str) -> str:
    return f"{request.script_root}/streams/{stream}/events"


def async_block(job: Job) -> dict[str, Any]:
    """Where to follow a job: its stream and the two event URLs (relative to this server)."""
    return {
        "jobId": job.id,
        "stream": job.stream,
        "jobEventsUrl": job_events_path(job.id),
        "receiptEventsUrl": receipt_events_path(job.stream),
        "status": job.status,
    }
