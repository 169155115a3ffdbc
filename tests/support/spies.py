"""Counting what a test's code calls: a wrapper that counts, then calls through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def counting(seen: dict[str, int], name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, counting each call under ``seen[name]``."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        seen[name] += 1
        return real(*args, **kwargs)

    return wrapped
