"""Entry point of Flower, Celery's monitor: ``python -m tasks.flower``.

Flower's web UI answers anyone who can reach it, so this refuses to start it without
authentication (``FLOWER_BASIC_AUTH=user:password`` or Flower's OAuth via ``FLOWER_AUTH``) unless
the deployment runs with ``RECEIPT_AUTH=disabled``, the same switch that opens Receipt's own API.
Port: ``PORT`` (the PaaS convention), default 5555.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from app.config import Settings
from tasks.celery_app import make_celery

log = logging.getLogger("receipt.flower")

AUTH_VARIABLES = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH")


def flower_argv(env: Mapping[str, str], settings: Settings) -> list[str]:
    """The ``celery flower`` arguments; refuses (SystemExit) when Flower would run unauthenticated."""
    if not any(env.get(name) for name in AUTH_VARIABLES) and not settings.auth_disabled:
        raise SystemExit(
            "refusing to start Flower without authentication: set FLOWER_BASIC_AUTH=user:password "
            "(or FLOWER_AUTH for OAuth), or RECEIPT_AUTH=disabled for a trusted network"
        )
    return ["flower", f"--port={env.get('PORT', '5555')}"]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    argv = flower_argv(os.environ, settings)
    if settings.auth_disabled:
        log.warning("Flower runs without authentication (RECEIPT_AUTH=disabled)")
    make_celery(settings).start(argv)


if __name__ == "__main__":
    main()
    sys.exit(0)
