"""The unfetched rule (delivery/fetches.py, "Unfetched"): a message sent at least
RECEIPT_REDELIVER_UNFETCHED_MS ago, fetched by nobody, whose queue holds nothing, is lost; a
message that may still wait in its queue -- a busy group's hand-back above all -- never is. Run on
the embedded broker's file records (delivery/folder_records.py), the same client shape as Redis."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from app.config import Settings
from delivery import fetches, folder_records
from delivery.folder_records import FolderRecords

TTL = 120_000
BOUND = Settings().redeliver_unfetched_ms


def pending(task_id: str = "j1:driver:0") -> fetches.Pending:
    return fetches.Pending("j1", "dispatch", "", 0, task_id, 10_000.0)


def write(records: FolderRecords, value: str, age_ms: int, task_id: str = "j1:driver:0") -> None:
    records.set(fetches.FETCH_PREFIX + task_id, value, px=TTL - age_ms)


def lengths_of(counts: dict[str, int]) -> object:
    def lengths(names: Iterable[str]) -> dict[str, int]:
        return {n: counts.get(n, 0) for n in names}

    return lengths


def judge(records: FolderRecords, counts: dict[str, int], lengths: object = None) -> bool:
    [found] = fetches.unfetched(
        records,
        [pending()],
        ["receipt-chat"],
        lengths or lengths_of(counts),  # type: ignore[arg-type]
        bound_ms=BOUND,
        ttl_ms=TTL,
    )
    return found


def test_the_default_bound_is_five_seconds_and_bounded() -> None:
    assert BOUND == 5000
    for bad in ("999", "60001", "x"):
        with pytest.raises(ValueError, match="RECEIPT_REDELIVER_UNFETCHED_MS"):
            Settings.from_env({"RECEIPT_REDELIVER_UNFETCHED_MS": bad})


def test_a_message_sent_past_the_bound_with_its_queue_empty_is_lost(tmp_path: Path) -> None:
    records = FolderRecords(tmp_path)
    write(records, "sent driver-1", BOUND + 500)
    assert judge(records, {}) is True


def test_younger_than_the_bound_it_is_not(tmp_path: Path) -> None:
    records = FolderRecords(tmp_path)
    write(records, "sent driver-1", BOUND - 1000)
    assert judge(records, {}) is False


def test_a_hand_back_waiting_in_a_busy_queue_is_never_lost(tmp_path: Path) -> None:
    """Every slot of the group busy: the handed-back message waits in the queue, its record back
    at ``sent``, as long as the long jobs run. Anything in the queue: not lost."""
    records = FolderRecords(tmp_path)
    write(records, "sent worker-7", BOUND * 10)
    assert judge(records, {"receipt-chat": 1}) is False
    # Another queue's backlog says nothing about this one.
    assert judge(records, {"receipt-codex": 5}) is True


def test_a_fetched_or_held_message_is_not_unfetched(tmp_path: Path) -> None:
    records = FolderRecords(tmp_path)
    write(records, "worker worker-7", BOUND * 10)
    assert judge(records, {}) is False
    write(records, "driver driver-2", BOUND * 10)
    assert judge(records, {}) is False


def test_a_record_that_changes_while_the_queue_is_counted_is_not_judged(tmp_path: Path) -> None:
    """The consumer fetched it (or handed it back) between the first read and the count."""
    records = FolderRecords(tmp_path)
    write(records, "sent driver-1", BOUND + 500)

    def fetched_meanwhile(names: Iterable[str]) -> dict[str, int]:
        write(records, "worker worker-7", 0)
        return dict.fromkeys(names, 0)

    assert judge(records, {}, fetched_meanwhile) is False
    write(records, "sent driver-1", BOUND + 500)

    def handed_back_meanwhile(names: Iterable[str]) -> dict[str, int]:
        write(records, "sent driver-1", 0)  # written again: its age starts over
        return dict.fromkeys(names, 0)

    assert judge(records, {}, handed_back_meanwhile) is False


def test_a_driver_message_is_judged_by_the_driver_queue(tmp_path: Path) -> None:
    records = FolderRecords(tmp_path)
    write(records, "queued", BOUND + 500)
    assert judge(records, {"receipt-driver": 1}) is False
    assert judge(records, {"receipt-chat": 1}) is True


def test_no_record_is_judged_by_the_delivery_age_and_both_queues(tmp_path: Path) -> None:
    """A broker restored from an older snapshot lost the record with the message."""
    records = FolderRecords(tmp_path)
    assert judge(records, {}) is True  # pending() is 10 s old
    assert judge(records, {"receipt-driver": 1}) is False
    assert judge(records, {"receipt-chat": 1}) is False
    [young] = fetches.unfetched(
        records,
        [fetches.Pending("j1", "dispatch", "", 0, "j1:driver:0", BOUND - 1.0)],
        ["receipt-chat"],
        lengths_of({}),  # type: ignore[arg-type]
        bound_ms=BOUND,
        ttl_ms=TTL,
    )
    assert young is False


def test_folder_records_expire_and_are_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_000_000]
    monkeypatch.setattr(folder_records, "_now_ms", lambda: now[0])
    records = FolderRecords(tmp_path / "records")
    records.set("k", "v", px=1)
    records.set("live", "v", px=60_000)
    assert records.get("live") == b"v" and records.exists("live") == 1
    assert 0 < records.pttl("live") <= 60_000
    now[0] += 2  # past k's time to live, well inside live's
    assert records.get("k") is None and records.pttl("k") == -2
    assert records.sweep() == 1
    assert records.get("live") == b"v"
