"""gunicorn's access line per request, on only with ``RECEIPT_ACCESS_LOG=enabled``.

gunicorn writes an access line for every request whenever a logging configuration is given, as
Receipt gives one (``logs.dict_config``) so that every line shares its format. At a few hundred
enqueues a second that line was about 6 % of the web process's CPU (bench/README.md), the API's
counterpart of the per-attempt lines the workers no longer write at INFO. So by default the line is
skipped before gunicorn builds it, and each request is counted instead
(``receipt_http_requests_total``, ``api/app.py``); a platform's router logs every request it
forwards anyway.
"""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger

from app.config import Settings


class QuietAccessLogger(Logger):  # type: ignore[misc]  # gunicorn ships no types
    """gunicorn's logger without the access line (error lines unchanged)."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None


def logger_class(settings: Settings) -> type[Logger]:
    """The gunicorn logger class for ``settings``: gunicorn's own when access lines are on."""
    return Logger if settings.access_log else QuietAccessLogger
