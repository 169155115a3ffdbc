"""Delivery callbacks: a JSON POST on ``dispatched``, ``completed``, ``failed`` and ``canceled``.

Spec: to ``RECEIPT_RESONATE_CALLBACK_URL`` and ``RECEIPT_EVENT_CALLBACK_URL``, 5 s timeout, and
``Authorization: Bearer $RECEIPT_CALLBACK_TOKEN`` when set. Posts run on a small thread pool, so
a slow or dead target never delays or fails a settlement; failures are logged and dropped.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import requests

from app.config import Settings
from app.jobs.reducer import Job
from app.ops import metrics

log = logging.getLogger("receipt.callbacks")

CALLBACK_TIMEOUT_S = 5.0
CALLBACK_EVENTS = ("dispatched", "completed", "failed", "canceled")


def callback_body(event: str, job: Job) -> dict[str, Any]:
    return {
        "event": event,
        "jobId": job.id,
        "agentId": job.agent_id,
        "status": job.status,
        "attempt": job.attempt,
        "result": job.result,
        "error": job.error,
        "stream": job.stream,
    }


class Callbacks:
    """Fire-and-forget poster bound to one process's settings."""

    def __init__(self, settings: Settings, *, max_workers: int = 4) -> None:
        self.urls = [u for u in (settings.callback_url, settings.event_callback_url) if u]
        self.headers = {"Content-Type": "application/json"}
        if settings.callback_token:
            self.headers["Authorization"] = f"Bearer {settings.callback_token}"
        self._pool = (
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="receipt-callback")
            if self.urls
            else None
        )

    def post(self, event: str, job: Job) -> list[Future[None]]:
        if self._pool is None or event not in CALLBACK_EVENTS:
            return []
        body = callback_body(event, job)
        return [self._pool.submit(self._send, url, body) for url in self.urls]

    def _send(self, url: str, body: dict[str, Any]) -> None:
        try:
            response = requests.post(url, json=body, headers=self.headers, timeout=CALLBACK_TIMEOUT_S)
            if response.status_code >= 400:
                metrics.registry_metrics().callback_failures.labels(body["event"]).inc()
                log.warning(
                    "callback %s for %s answered %s", body["event"], body["jobId"], response.status_code
                )
        except requests.RequestException as exc:
            metrics.registry_metrics().callback_failures.labels(body["event"]).inc()
            log.warning("callback %s for %s failed: %s", body["event"], body["jobId"], exc)
