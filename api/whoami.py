"""``GET /whoami``: what the request's token stands for, so a client can fill in what it implies.

A client that enqueues needs ``payload.authContext.organizationId``, which the server already
knows from the token; rather than make every caller type it, the client asks once and caches the
answer. The secret itself is never echoed: the answer is the token's id, organisation, system
flag and scopes, all of which ``receipt token list`` shows to an operator anyway.
"""

from __future__ import annotations

from flask import Blueprint
from flask.typing import ResponseReturnValue

from api import auth, schemas
from api.openapi import Operation, operation

blueprint = Blueprint("whoami", __name__)


@blueprint.get("/whoami")
@operation(
    Operation(
        summary="The caller's token: its organisation, id, system flag and scopes.",
        description="Clients default payload.authContext.organizationId to this organizationId. "
        "The token's secret is never returned.",
        tag="meta",
        responses={200: schemas.WHOAMI},
    )
)
def whoami() -> ResponseReturnValue:
    identity = auth.current()
    return {
        "organizationId": identity.organization_id,
        "tokenId": identity.token_id,
        "system": identity.system,
        "scopes": list(identity.scopes),
    }
