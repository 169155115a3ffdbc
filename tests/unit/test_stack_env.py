"""``RECEIPT_TEST_STACK_ENV``: settings given to every process of every end-to-end stack of a run
(``devharness/stack.py``), since Receipt's own variables never pass from the shell to a test."""

from __future__ import annotations

import pytest

from devharness.stack import STACK_ENV, stack_env_from


def test_pairs_are_read_and_nothing_set_is_nothing() -> None:
    assert stack_env_from({}) == {}
    assert stack_env_from({STACK_ENV: " "}) == {}
    assert stack_env_from({STACK_ENV: "RECEIPT_DELIVERY_BATCH_MAX=8, RECEIPT_GROUP_COMMIT_MAX = 1"}) == {
        "RECEIPT_DELIVERY_BATCH_MAX": "8",
        "RECEIPT_GROUP_COMMIT_MAX": "1",
    }


def test_a_malformed_pair_is_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match=STACK_ENV):
        stack_env_from({STACK_ENV: "RECEIPT_DELIVERY_BATCH_MAX"})
