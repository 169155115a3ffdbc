"""Entry point of Flower, Celery's monitor: ``python -m tasks.flower``.

Flower's web UI answers anyone who can reach it (and can revoke or rate-limit tasks), so it never
serves unauthenticated beyond this machine, and it never refuses to start for want of credentials
(a process runner such as honcho stops every process when one exits):

- with authentication (``FLOWER_BASIC_AUTH=user:password``, or Flower's OAuth via ``FLOWER_AUTH``)
  it binds ``FLOWER_ADDRESS``, loopback (``127.0.0.1``) by default;
- without, it binds loopback whatever ``FLOWER_ADDRESS`` says, and logs one warning line naming
  the setting that would open it.

Port: ``PORT`` (the PaaS convention), default 5555. A PaaS that routes to ``PORT`` needs
``FLOWER_ADDRESS=0.0.0.0`` and therefore authentication.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from collections.abc import Mapping

from app.config import Settings
from app.ops import logs, preflight
from tasks.celery_app import make_celery

log = logging.getLogger("receipt.flower")

AUTH_VARIABLES = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH")
DEFAULT_ADDRESS = "127.0.0.1"


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name we cannot vouch for: treat as reachable from elsewhere


def flower_argv(env: Mapping[str, str]) -> tuple[list[str], str | None]:
    """The ``celery flower`` arguments, and the warning to log when Flower runs unauthenticated."""
    requested = env.get("FLOWER_ADDRESS", "").strip() or DEFAULT_ADDRESS
    address, warning = requested, None
    if not any(env.get(name) for name in AUTH_VARIABLES):
        address = requested if is_loopback(requested) else DEFAULT_ADDRESS
        moved = "" if address == requested else f" (not FLOWER_ADDRESS={requested})"
        warning = (
            f"Flower runs without authentication, so only on {address}{moved}: set "
            "FLOWER_BASIC_AUTH=user:password (or FLOWER_AUTH for OAuth) to serve it on another interface"
        )
    return ["flower", f"--address={address}", f"--port={env.get('PORT', '5555')}"], warning


def main() -> None:
    settings = Settings.from_env()
    # Receipt's one logging configuration, like every other process: its format, and its filter
    # that keeps every secret setting out of the log.
    logs.configure(settings, "flower")
    argv, warning = flower_argv(os.environ)
    # Flower reads the broker only; it never opens the database.
    preflight.require(settings, database=None, broker=True, log=log)
    if warning is not None:
        log.warning(warning)
    make_celery(settings).start(argv)


if __name__ == "__main__":
    main()
    sys.exit(0)
