"""Organisation dispatch policies: each organisation's weight in the fair share of the workers and its
rate limit, set and read by a system token (docs/dispatch.md).

A policy set here is an ``organization.dispatch_set`` receipt on ``dispatch-policies/<org>``, and
overrides the settings (``RECEIPT_ORG_WEIGHTS``, ``RECEIPT_ORG_RATE_LIMITS``) field by field. Every
organisation's token gets 403: one organisation's policy decides another's share.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from flask.typing import ResponseReturnValue

from api import auth, schemas
from api.context import read_connection, state
from api.errors import forbidden
from api.openapi import Operation, operation
from app.dispatch import policies
from app.storage import org_policies
from app.storage.db import iso

blueprint = Blueprint("organizations", __name__)

_ORG_PATH = {"organizationId": schemas.ORGANIZATION_ID_PARAM}
_SYSTEM_ONLY = "dispatch policies weigh organisations against each other: use a system token"


def _require_system() -> None:
    if not auth.current().system:
        raise forbidden(_SYSTEM_ONLY)


def policy_json(e: policies.Effective) -> dict[str, Any]:
    stored = e.stored
    return {
        "organizationId": e.organization_id,
        "weight": stored.weight if stored is not None else None,
        "ratePerSecond": stored.rate_per_s if stored is not None else None,
        "updatedAt": iso(stored.updated_at) if stored is not None else None,
        "settings": {"weight": e.setting_weight, "ratePerSecond": e.setting_rate_per_s},
        "effective": {
            "weight": e.policy.weight,
            "ratePerSecond": e.policy.rate_per_s,
            "weightFrom": e.weight_from,
            "ratePerSecondFrom": e.rate_from,
        },
    }


@blueprint.put("/organizations/<organizationId>/dispatch")
@operation(
    Operation(
        summary="Set an organisation's dispatch policy: its fair-share weight and its rate limit.",
        description="System tokens only (403 otherwise). Both fields are given; null leaves that one to "
        "the settings (RECEIPT_ORG_WEIGHTS, RECEIPT_ORG_RATE_LIMITS). Written as an "
        "organization.dispatch_set receipt on dispatch-policies/<organizationId> (the same policy "
        "again writes nothing); every dispatch pass applies it within a second.",
        tag="organizations",
        path=_ORG_PATH,
        body=schemas.DISPATCH_POLICY_REQUEST,
        responses={200: schemas.DISPATCH_POLICY_RESPONSE},
        errors=(403,),
    )
)
def set_dispatch(organizationId: str, body: dict[str, Any]) -> ResponseReturnValue:
    _require_system()
    weight, rate = body["weight"], body["ratePerSecond"]
    stored, _written = org_policies.set_policy(
        state().engine,
        organizationId,
        float(weight) if weight is not None else None,
        float(rate) if rate is not None else None,
        by=auth.current().enqueuer().to_json(),
    )
    policies.forget_cached()  # this process's next pass applies it at once
    held = None if stored.empty else stored  # as a read answers: cleared is not set
    return {"policy": policy_json(policies.effective(state().settings, held, organizationId))}


@blueprint.get("/organizations/<organizationId>/dispatch")
@operation(
    Operation(
        summary="An organisation's dispatch policy: what this API set, what the settings say, and what "
        "applies.",
        description="System tokens only (403 otherwise). An organisation nothing names has the default "
        "policy (weight 1, no rate limit).",
        tag="organizations",
        path=_ORG_PATH,
        responses={200: schemas.DISPATCH_POLICY_RESPONSE},
        errors=(403,),
    )
)
def get_dispatch(organizationId: str) -> ResponseReturnValue:
    _require_system()
    with read_connection(state().engine) as conn:
        stored = org_policies.get(conn, organizationId)
    return {"policy": policy_json(policies.effective(state().settings, stored, organizationId))}


@blueprint.get("/organizations/dispatch")
@operation(
    Operation(
        summary="Every organisation's dispatch policy that is not the default's.",
        description="System tokens only (403 otherwise): each organisation the settings name or this API "
        "set a policy for, by id.",
        tag="organizations",
        responses={200: schemas.DISPATCH_POLICY_LIST},
        errors=(403,),
    )
)
def list_dispatch() -> ResponseReturnValue:
    _require_system()
    with read_connection(state().engine) as conn:
        stored = org_policies.list_all(conn)
    return {"policies": [policy_json(e) for e in policies.every_effective(state().settings, stored)]}
