"""The bulk phase of bench/compare.py: its rows, its flags, the producer's batches and the table."""

from __future__ import annotations

import io
import json
import sys
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Connection, Engine

from bench import compare
from bench.systems import BY_NAME, SYSTEMS, BulkSender, Database, Deployment, Sender, System
from devharness.processes import Harness


class Recording(System):
    """A system whose bulk path records the batches it was sent (no processes, no database)."""

    name = kind = "recording"
    label = "Recording"
    bulk_label = "Recording, bulk"

    def __init__(self, *, refusals: int = 0) -> None:
        self.batches: list[list[str]] = []
        self.refusals = refusals
        self.lock = threading.Lock()

    def start(
        self, stack: ExitStack, harness: Harness, home: Path, db: Database, *, prepared: bool
    ) -> Deployment:
        raise NotImplementedError

    def done_count(self, conn: Connection, prefix: str, result: dict[str, Any]) -> int:
        raise NotImplementedError

    def timings(
        self, dep: Deployment, conn: Connection, prefix: str, result: dict[str, Any]
    ) -> tuple[list[float], float]:
        raise NotImplementedError

    def sender(self, engine: Engine, prefix: str) -> Sender:
        raise AssertionError("the bulk mode sends through bulk_sender only")

    def bulk_sender(self, engine: Engine, prefix: str) -> BulkSender:
        def send_many(job_ids: list[str]) -> list[str]:
            with self.lock:
                if self.refusals:
                    self.refusals -= 1
                    raise RuntimeError("FATAL: sorry, too many clients already")
                self.batches.append(job_ids)
            return [f"key-{job_id}" for job_id in job_ids]

        return send_many


def produce_bulk(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], system: System, n: int, batch: int
) -> dict[str, Any]:
    monkeypatch.setenv("BENCH_DB", "postgresql://unused/db")
    monkeypatch.setattr("app.storage.db.make_engine", lambda *args, **kwargs: None)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    compare.producer_main(system, "bulk", "p-", n, 2, 0.0, batch)
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_every_system_with_a_bulk_path_has_a_row_and_procrastinate_also_one_at_a_time() -> None:
    rows = compare.bulk_rows(list(SYSTEMS))
    assert [row.name for row in rows] == [
        "receipt-python",
        "receipt-http",
        "procrastinate",
        "procrastinate-single",
        "celery",
    ]
    single = rows[3]
    assert not single.batched and single.system is BY_NAME["procrastinate"]
    assert single.label == "Procrastinate 3, c=8, defer, one at a time"
    assert rows[2].label == "Procrastinate 3, c=8, batch_defer"


def test_the_floors_have_no_bulk_row() -> None:
    assert compare.bulk_rows([BY_NAME["floor"], BY_NAME["floor-reads"]]) == []


@pytest.mark.parametrize(
    ("argv", "jobs", "size"),
    [
        ([], 0, compare.BULK_SIZE),
        (["--bulk"], 10_000, 500),
        (["--bulk", "2000"], 2000, 500),
        (["--quick", "--bulk"], 1000, 100),
        (["--quick", "--bulk", "300", "--bulk-size", "50"], 300, 50),
        (["--bulk", "--quick"], 1000, 100),
    ],
)
def test_the_bulk_flags(argv: list[str], jobs: int, size: int) -> None:
    args = compare.parse_args(argv)
    assert (args.bulk, args.bulk_size) == (jobs, size)


def test_a_bulk_size_below_one_is_refused() -> None:
    with pytest.raises(SystemExit):
        compare.parse_args(["--bulk", "--bulk-size", "0"])


def test_the_producer_sends_whole_batches_and_times_every_job_by_its_batch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    system = Recording()
    result = produce_bulk(monkeypatch, capsys, system, 10, 3)
    assert result["errors"] == [] and result["retried"] == 0
    assert sorted(system.batches) == [
        ["p-000000", "p-000001", "p-000002"],
        ["p-000003", "p-000004", "p-000005"],
        ["p-000006", "p-000007", "p-000008"],
        ["p-000009"],
    ]
    assert sorted(result["sent"]) == [f"key-p-{i:06d}" for i in range(10)]
    # A batch's jobs share its send time: one call sent them all.
    assert result["sent"]["key-p-000000"] == result["sent"]["key-p-000002"]


def test_the_producer_retries_a_batch_refused_for_the_connection_limit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("time.sleep", lambda seconds: None)  # the retry's back-off
    system = Recording(refusals=1)
    result = produce_bulk(monkeypatch, capsys, system, 4, 2)
    assert result["errors"] == [] and result["retried"] == 1
    assert len(result["sent"]) == 4


def test_the_bulk_table_holds_receipt_s_http_row_against_the_faster_procrastinate_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = {row.name: row for row in compare.bulk_rows(list(SYSTEMS))}

    def figures(*throughputs: float) -> list[compare.BulkFigures]:
        return [compare.BulkFigures(t, {"producer": 0.1, "postgres": 0.5}) for t in throughputs]

    bulk = {
        rows["receipt-http"]: figures(290.0, 300.0, 310.0),
        rows["procrastinate"]: figures(150.0, 150.0, 150.0),
        rows["procrastinate-single"]: figures(180.0, 200.0, 190.0),
    }
    compare.report_bulk(compare.parse_args(["--bulk"]), bulk)
    out = capsys.readouterr().out
    assert "10000 per row in batches of 500" in out
    assert "3 rounds" in out
    # 300 against 190 (defer, one at a time: the faster of the two)
    assert "the faster Procrastinate mode: 1.58  met" in out
    assert "Receipt, HTTP POST /jobs:batch" in out and "producer 0.10, postgres 0.50; total 0.60" in out
