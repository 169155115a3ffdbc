"""A worker's own ``/metrics`` (``RECEIPT_WORKER_METRICS_PORT``): token-guarded, counting its events."""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.ops import metrics

from .runtime_support import enqueue

TOKEN = "worker-scrape-secret"


def test_no_port_no_endpoint_and_no_token_no_start() -> None:
    assert metrics.start_worker_endpoint(None, TOKEN) is None
    with pytest.raises(SystemExit, match="RECEIPT_METRICS_TOKEN"):
        metrics.start_worker_endpoint(8099, None)


def test_the_endpoint_serves_this_process_counters_to_the_token_only(sqlite_engine: Engine) -> None:
    endpoint = metrics.WorkerEndpoint(0, TOKEN, host="127.0.0.1")  # port 0: any free port
    try:
        url = f"http://127.0.0.1:{endpoint.port}/metrics"

        def enqueued() -> float:
            r = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
            assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
            for family in text_string_to_metric_families(r.text):
                for sample in family.samples:
                    if sample.name == "receipt_jobs_enqueued_total" and sample.labels["group"] == "chat":
                        return float(sample.value)
            return 0.0

        before = enqueued()
        enqueue(queue_for(sqlite_engine, on_applied=metrics.observe), "some-agent")
        assert enqueued() == before + 1
        assert requests.get(url, timeout=10).status_code == 401
        assert requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
        other = url.replace("/metrics", "/jobs")
        assert (
            requests.get(other, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 404
        )
    finally:
        endpoint.close()
