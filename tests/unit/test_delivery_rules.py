"""The driver starter's pure rules (spec: "Driver RPC" — generations, active_delivery, 32 bound)."""

from __future__ import annotations

import pytest

from app.jobs.errors import (
    ACTIVE_DELIVERY_REASON,
    MAX_DELIVERY_GENERATIONS,
    DeliveryGenerationsExceeded,
    generations_exceeded_message,
)
from app.storage.delivery import attempt_fence, decide_generation, driver_task_id, parse_fence, redrive_key


def test_first_delivery_is_generation_zero() -> None:
    d = decide_generation(None, False, "job-1", "job-1")
    assert (d.created, d.generation, d.reason) == (True, 0, None)
    assert d.task_id == driver_task_id("job-1", 0)


def test_a_pending_delivery_blocks_with_active_delivery() -> None:
    d = decide_generation(4, True, "job-1", "job-1")
    assert (d.created, d.generation, d.task_id) == (False, 4, None)
    assert d.reason == ACTIVE_DELIVERY_REASON == "active_delivery"


def test_a_terminal_delivery_advances_the_generation() -> None:
    d = decide_generation(4, False, "job-1", "job-1")
    assert (d.created, d.generation) == (True, 5)
    assert d.task_id == "job-1:driver:5"


def test_task_ids_differ_per_generation_and_key() -> None:
    ids = {decide_generation(g, False, "j", k).task_id for g in range(3) for k in ("j", "j:redrive:3:queued")}
    assert len(ids) == 6


def test_the_32nd_generation_is_the_last() -> None:
    assert MAX_DELIVERY_GENERATIONS == 32
    assert decide_generation(30, False, "job-1", "job-1").generation == 31
    with pytest.raises(DeliveryGenerationsExceeded) as info:
        decide_generation(31, False, "job-1", "job-1")
    assert str(info.value) == "resonate delivery recovery exceeded 32 generations for job-1"
    assert str(info.value) == generations_exceeded_message("job-1")


def test_a_pending_last_generation_is_still_just_active_not_exceeded() -> None:
    assert decide_generation(31, True, "job-1", "job-1").reason == ACTIVE_DELIVERY_REASON


def test_fence_and_redrive_key_formats() -> None:
    assert attempt_fence("job-1", 3) == "job-1:attempt:3"
    assert parse_fence("job:with:colons:attempt:12") == ("job:with:colons", 12)
    assert redrive_key("job-1", 7, "queued") == "job-1:redrive:7:queued"
