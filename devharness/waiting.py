"""Polling against a deadline (the only way tests and benchmarks synchronise), and free ports."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    *,
    interval: float = 0.1,
    what: str = "condition",
    ignore: tuple[type[BaseException], ...] = (),
    check: Callable[[], None] | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds.

    ``ignore`` lists exceptions that count as "not yet"; ``check`` runs between polls and may
    raise to stop waiting early (e.g. when a process the condition depends on has died).
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}; last value: {last!r}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of asking."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
