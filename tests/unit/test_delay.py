"""Delayed jobs, the pure part: reading ``runAt``/``delayMs`` and deciding ``availableAt``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.jobs.delay import MAX_DELAY_MS, available_at, check_delay_ms, parse_run_at
from app.jobs.errors import ValidationError
from app.jobs.reducer import Receipt, fold
from app.jobs.validation import validate_enqueue

NOW = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
PAYLOAD = {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-05-01T09:30:00Z", datetime(2026, 5, 1, 9, 30, tzinfo=UTC)),
        ("2026-05-01t09:30:00z", datetime(2026, 5, 1, 9, 30, tzinfo=UTC)),
        ("2026-05-01T11:30:00+02:00", datetime(2026, 5, 1, 9, 30, tzinfo=UTC)),
        ("2026-05-01 09:30:00.250-00:30", datetime(2026, 5, 1, 10, 0, 0, 250_000, tzinfo=UTC)),
        # Valid RFC 3339 whose UTC instant leaves years 1..9999: the nearest instant.
        ("9999-12-31T23:00:00-05:00", datetime.max.replace(tzinfo=UTC)),
    ],
)
def test_run_at_reads_rfc3339_with_its_offset(text: str, expected: datetime) -> None:
    assert parse_run_at(text) == expected


@pytest.mark.parametrize(
    "text", ["2026-05-01T09:30:00", "2026-05-01", "tomorrow", "", "2026-13-01T00:00:00Z", 1746090000, None]
)
def test_run_at_without_an_offset_or_not_a_time_is_refused_naming_the_field(text: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_run_at(text)
    assert caught.value.field == "runAt"
    assert "RFC 3339" in caught.value.message


@pytest.mark.parametrize("value", [-1, MAX_DELAY_MS + 1, 1.5, True, "10"])
def test_delay_ms_outside_its_range_or_not_an_integer_is_refused(value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        check_delay_ms(value)
    assert caught.value.field == "delayMs"


def test_available_at_decides_on_the_clock_given() -> None:
    assert available_at(NOW, None, None) is None
    assert available_at(NOW, None, 0) is None
    assert available_at(NOW, None, 600_000) == NOW + timedelta(minutes=10)
    later = NOW + timedelta(hours=3)
    assert available_at(NOW, later, None) == later
    # Past due: accepted, and clamped to the enqueue's own (database) time.
    assert available_at(NOW, NOW - timedelta(days=400), None) == NOW


def test_an_enqueue_takes_run_at_or_delay_ms_but_not_both() -> None:
    req = validate_enqueue("factory", {"payload": PAYLOAD, "runAt": "2026-05-01T10:00:00+01:00"})
    assert (req.run_at, req.delay_ms) == (NOW, None)
    req = validate_enqueue("factory", {"payload": PAYLOAD, "delayMs": 5000, "runAt": None})
    assert (req.run_at, req.delay_ms) == (None, 5000)
    with pytest.raises(ValidationError) as caught:
        validate_enqueue("factory", {"payload": PAYLOAD, "delayMs": 5000, "runAt": "2026-05-01T10:00:00Z"})
    assert caught.value.field == "runAt" and "not both" in caught.value.message


def test_the_fold_keeps_available_at_until_the_job_is_leased() -> None:
    body = {
        "jobId": "o/j",
        "agentId": "factory",
        "payload": PAYLOAD,
        "availableAt": "2026-05-01T09:10:00.000000Z",
    }
    stream = "jobs/o/j"
    queued = fold([Receipt(stream, 1, "job.enqueued", body, "2026-05-01T09:00:00.000000Z")])
    assert queued is not None and (queued.status, queued.available_at) == ("queued", body["availableAt"])
    assert queued.to_json()["availableAt"] == body["availableAt"]
    leased = fold(
        [Receipt(stream, 2, "job.leased", {"workerId": "w", "attempt": 1}, "2026-05-01T09:10:01.000000Z")],
        queued,
    )
    assert leased is not None and (leased.status, leased.available_at) == ("leased", None)
