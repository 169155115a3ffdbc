"""``GET /metrics``: Prometheus text exposition (docs/metrics.md lists every metric).

Who may scrape: a **system token**, or the secret in ``RECEIPT_METRICS_TOKEN`` when it is set
(so a Prometheus server needs no API token that could also write jobs). An organisation's token
is refused with 403: the metrics count every organisation's jobs and name their agent ids.
"""

from __future__ import annotations

import hmac

from flask import Blueprint, Response, request
from flask.typing import ResponseReturnValue

from api import auth
from api.context import state
from api.errors import forbidden
from api.openapi import Operation, operation
from app.config import Settings
from app.ops import metrics

blueprint = Blueprint("metrics", __name__)

# The identity of a request that presented RECEIPT_METRICS_TOKEN: it may read /metrics, nothing else.
SCRAPER = auth.Identity(organization_id=None, system=False, token_id="metrics-token")
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
ENDPOINT = "metrics.metrics_view"


def presents_metrics_token(settings: Settings, endpoint: str | None) -> bool:
    """True when this request is a scrape of /metrics carrying ``RECEIPT_METRICS_TOKEN``."""
    expected = settings.metrics_token
    if not expected or endpoint != ENDPOINT:
        return False
    header = request.headers.get("Authorization", "")
    scheme, _, secret = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(secret.strip().encode(), expected.encode())


@blueprint.get("/metrics")
@operation(
    Operation(
        summary="Prometheus metrics (text exposition format).",
        description="Readable with a system token or with RECEIPT_METRICS_TOKEN; an organisation's "
        "token gets 403 (the metrics span every organisation). See docs/metrics.md.",
        tag="meta",
        responses={200: {"type": "string"}},
        media=PROMETHEUS_TEXT,
        errors=(403,),
    )
)
def metrics_view() -> ResponseReturnValue:
    identity = auth.current()
    if identity is not SCRAPER and not identity.system:
        raise forbidden("metrics span every organisation: use a system token or RECEIPT_METRICS_TOKEN")
    st = state()
    body, _content_type = metrics.exposition(st.engine, st.settings)
    return Response(body, status=200, content_type=PROMETHEUS_TEXT)
