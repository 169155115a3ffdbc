"""The schema of a job's payload: its kind and who it acts for (the authContext an objective carries too).

The schemas check shape; ``app.jobs.validation`` applies the deeper rules of each kind's payload.
"""

from __future__ import annotations

from api.schemas.base import JSON_VALUE, NO_NUL, ORGANIZATION_ID, Schema, string_enum, text
from app.jobs.kinds import KINDS_WITHOUT_AUTH_CONTEXT, PAYLOAD_KINDS
from app.jobs.vocab import AUTH_CONTEXT_OPTIONAL, AUTH_CONTEXT_REQUIRED

AUTH_CONTEXT: Schema = {
    "type": "object",
    "description": "Who the job acts for. organizationId must be the caller's organisation.",
    "properties": {
        "userId": text(),
        "organizationId": ORGANIZATION_ID,
        **{name: text(2048, nullable=True, non_blank=False) for name in AUTH_CONTEXT_OPTIONAL},
    },
    "additionalProperties": False,
}

_KINDS_NEEDING_AUTH = [kind for kind in PAYLOAD_KINDS if kind not in KINDS_WITHOUT_AUTH_CONTEXT]

PAYLOAD: Schema = {
    "type": "object",
    "description": f"The job's input: a kind (one of the {len(PAYLOAD_KINDS)}) and any kind-specific fields.",
    "properties": {
        "kind": string_enum(PAYLOAD_KINDS),
        "authContext": {**AUTH_CONTEXT, "type": ["object", "null"]},
    },
    "required": ["kind"],
    "propertyNames": {"pattern": NO_NUL},
    "additionalProperties": JSON_VALUE,
    # Spec: every kind except factory.objective.watchdog needs authContext with userId and
    # organizationId; the watchdog may omit it. (Conditioned on the known kinds, so an unknown
    # kind is reported as the kind error — listing every kind — not as a missing authContext.)
    "if": {"properties": {"kind": {"enum": _KINDS_NEEDING_AUTH}}, "required": ["kind"]},
    "then": {
        "required": ["authContext"],
        "properties": {"authContext": {"type": "object", "required": list(AUTH_CONTEXT_REQUIRED)}},
    },
}
