"""The schemas of an organisation's dispatch policy: its weight in the fair share of the workers and
its rate limit, as a system token sets and reads them (``api/organizations.py``)."""

from __future__ import annotations

from api.schemas.base import SCOPE_ORGANIZATION_PARAM, TIME, Schema, ref
from app.config import ORG_RATE_MAX_PER_S, ORG_RATE_RULE, ORG_WEIGHT_MAX, ORG_WEIGHT_RULE

ORGANIZATION_ID_PARAM: Schema = {**SCOPE_ORGANIZATION_PARAM, "description": "The organisation."}

DISPATCH_POLICY_REQUEST: Schema = {
    "type": "object",
    "title": "DispatchPolicyRequest",
    "description": "The whole policy the API holds for the organisation: both fields, either null to "
    "leave it to the settings (RECEIPT_ORG_WEIGHTS, RECEIPT_ORG_RATE_LIMITS).",
    "properties": {
        "weight": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": ORG_WEIGHT_MAX,
            "x-message": ORG_WEIGHT_RULE,
            "description": "Its share of a worker group's free slots relative to other organisations "
            "with queued work (1: equal; 3: three times another's).",
        },
        "ratePerSecond": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": ORG_RATE_MAX_PER_S,
            "x-message": ORG_RATE_RULE,
            "description": "At most this many of its jobs dispatched per second, across every process "
            "(0.5: one every two seconds).",
        },
    },
    "required": ["weight", "ratePerSecond"],
    "additionalProperties": False,
}

_FIELDS: Schema = {
    "type": "object",
    "properties": {"weight": {"type": ["number", "null"]}, "ratePerSecond": {"type": ["number", "null"]}},
    "required": ["weight", "ratePerSecond"],
}
_SOURCE: Schema = {"type": "string", "enum": ["api", "setting", "default"]}

DISPATCH_POLICY: Schema = {
    "type": "object",
    "properties": {
        "organizationId": {"type": "string"},
        "weight": {"type": ["number", "null"], "description": "Set through this API (null: not set)."},
        "ratePerSecond": {"type": ["number", "null"], "description": "Set through this API (null: not set)."},
        "updatedAt": {**TIME, "description": "When this API last set it (null: never)."},
        "settings": {**_FIELDS, "description": "What RECEIPT_ORG_WEIGHTS and RECEIPT_ORG_RATE_LIMITS say."},
        "effective": {
            "type": "object",
            "description": "What the dispatch pass applies, per field: this API's value, else the "
            "setting's, else the default (weight 1, no rate limit); within a second in every process.",
            "properties": {
                "weight": {"type": "number"},
                "ratePerSecond": {"type": ["number", "null"]},
                "weightFrom": _SOURCE,
                "ratePerSecondFrom": _SOURCE,
            },
            "required": ["weight", "ratePerSecond", "weightFrom", "ratePerSecondFrom"],
        },
    },
    "required": ["organizationId", "weight", "ratePerSecond", "updatedAt", "settings", "effective"],
}

DISPATCH_POLICY_RESPONSE: Schema = {
    "type": "object",
    "properties": {"policy": ref("DispatchPolicy")},
    "required": ["policy"],
}

DISPATCH_POLICY_LIST: Schema = {
    "type": "object",
    "properties": {
        "policies": {
            "type": "array",
            "items": ref("DispatchPolicy"),
            "description": "Every organisation the settings name or this API set a policy for, by id.",
        }
    },
    "required": ["policies"],
}
