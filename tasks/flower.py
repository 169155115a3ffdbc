"""Entry point of Flower, Celery's monitor: ``python -m tasks.flower``.

Flower's web UI answers anyone who can reach it (and can revoke or rate-limit tasks), so:

- it binds loopback (``127.0.0.1``) unless ``FLOWER_ADDRESS`` says otherwise;
- bound anywhere but loopback, it always requires authentication (``FLOWER_BASIC_AUTH=user:password``
  or Flower's OAuth via ``FLOWER_AUTH``), whatever ``RECEIPT_AUTH`` says;
- on loopback it still requires authentication unless the deployment runs with
  ``RECEIPT_AUTH=disabled``, the same switch that opens Receipt's own API.

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


def flower_argv(env: Mapping[str, str], settings: Settings) -> list[str]:
    """The ``celery flower`` arguments; refuses (SystemExit) when Flower would run unauthenticated."""
    address = env.get("FLOWER_ADDRESS", "").strip() or DEFAULT_ADDRESS
    authenticated = any(env.get(name) for name in AUTH_VARIABLES)
    if not authenticated and not is_loopback(address):
        raise SystemExit(
            f"refusing to start Flower on {address} without authentication: set "
            "FLOWER_BASIC_AUTH=user:password (or FLOWER_AUTH for OAuth); off loopback this is "
            "required even with RECEIPT_AUTH=disabled"
        )
    if not authenticated and not settings.auth_disabled:
        raise SystemExit(
            "refusing to start Flower without authentication: set FLOWER_BASIC_AUTH=user:password "
            "(or FLOWER_AUTH for OAuth), or RECEIPT_AUTH=disabled for a trusted machine"
        )
    return ["flower", f"--address={address}", f"--port={env.get('PORT', '5555')}"]


def main() -> None:
    settings = Settings.from_env()
    # Receipt's one logging configuration, like every other process: its format, and its filter
    # that keeps every secret setting out of the log.
    logs.configure(settings, "flower")
    argv = flower_argv(os.environ, settings)
    # Flower reads the broker only; it never opens the database.
    preflight.require(settings, database=None, broker=True, log=log)
    if not any(os.environ.get(name) for name in AUTH_VARIABLES):
        log.warning("Flower runs without authentication on loopback (RECEIPT_AUTH=disabled)")
    make_celery(settings).start(argv)


if __name__ == "__main__":
    main()
    sys.exit(0)
