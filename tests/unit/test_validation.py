"""Every rule of ``app.jobs.validation``: each rejection names the field and, for closed sets, the
allowed values."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.jobs.errors import ValidationError
from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.validation import (
    ENQUEUE_FIELDS,
    EnqueueRequest,
    clamp_max_attempts,
    validate_auth_context,
    validate_enqueue,
)

LANES = ["chat", "collect", "steer", "follow_up"]
KINDS = [
    "factory.dispatch",
    "factory.run",
    "factory.integration.publish",
    "factory.integration.validate",
    "factory.objective.audit",
    "factory.objective.control",
    "factory.objective.watchdog",
    "factory.task.monitor",
    "factory.task.run",
]
MODES = ["allow", "cancel", "steer"]
AUTH = {"userId": "u1", "organizationId": "o1"}


def ok(**body: Any) -> dict[str, Any]:
    body.setdefault("payload", {"kind": "factory.run", "authContext": dict(AUTH)})
    return body


def rejected(body: Any, agent: Any = "codex") -> ValidationError:
    with pytest.raises(ValidationError) as err:
        validate_enqueue(agent, body)
    return err.value


def test_defaults() -> None:
    r = validate_enqueue("codex", ok())
    assert r == EnqueueRequest(
        agent_id="codex",
        payload={"kind": "factory.run", "authContext": AUTH},
        job_id=None,
        lane="collect",
        session_key=None,
        singleton_mode="allow",
        max_attempts=2,
    )
    assert r.organization_id == "o1"
    # Explicit nulls mean "the default" too.
    assert validate_enqueue("codex", ok(lane=None, singletonMode=None, maxAttempts=None)) == r


@pytest.mark.parametrize("lane", LANES)
def test_every_lane_is_accepted(lane: str) -> None:
    assert validate_enqueue("codex", ok(lane=lane)).lane == lane


@pytest.mark.parametrize("lane", ["fast", "Chat", "", "followUp", 1, ["chat"]])
def test_lane_names_the_four_lanes(lane: Any) -> None:
    err = rejected(ok(lane=lane))
    assert err.field == "lane" and err.allowed == LANES
    assert str(err) == "lane: is not a lane (allowed: chat, collect, steer, follow_up)"
    assert err.to_details() == {"field": "lane", "allowed": LANES}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_accepted(kind: str) -> None:
    assert validate_enqueue("codex", ok(payload={"kind": kind, "authContext": AUTH})).payload["kind"] == kind


@pytest.mark.parametrize("kind", ["factory.nope", "factory", "", None, 3, "FACTORY.RUN"])
def test_payload_kind_names_every_kind(kind: Any) -> None:
    err = rejected(ok(payload={"kind": kind, "authContext": AUTH}))
    assert err.field == "payload.kind" and err.allowed == list(PAYLOAD_KINDS) == KINDS


@pytest.mark.parametrize("payload", [None, "factory.run", ["factory.run"], 1])
def test_payload_must_be_an_object(payload: Any) -> None:
    assert rejected(ok(payload=payload)).field == "payload"


def test_missing_payload() -> None:
    assert rejected({}).field == "payload"


@pytest.mark.parametrize("mode", MODES)
def test_every_singleton_mode_is_accepted(mode: str) -> None:
    assert validate_enqueue("codex", ok(singletonMode=mode, sessionKey="s")).singleton_mode == mode


@pytest.mark.parametrize("mode", ["replace", "", "CANCEL", True])
def test_singleton_mode_names_the_three_modes(mode: Any) -> None:
    err = rejected(ok(singletonMode=mode, sessionKey="s"))
    assert err.field == "singletonMode" and err.allowed == MODES


@pytest.mark.parametrize("mode", ["cancel", "steer"])
def test_singleton_modes_other_than_allow_need_a_session_key(mode: str) -> None:
    err = rejected(ok(singletonMode=mode))
    assert err.field == "sessionKey" and mode in str(err)


@pytest.mark.parametrize("key", ["", "   ", 5, "x" * 513])
def test_session_key_must_be_a_short_non_empty_string(key: Any) -> None:
    assert rejected(ok(sessionKey=key)).field == "sessionKey"


def test_session_key_limit_is_inclusive() -> None:
    assert validate_enqueue("codex", ok(sessionKey="x" * 512)).session_key == "x" * 512


# -- authContext ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "factory.objective.watchdog"])
def test_auth_context_is_required_for_every_kind_but_the_watchdog(kind: str) -> None:
    err = rejected(ok(payload={"kind": kind}))
    assert err.field == "payload.authContext" and "userId" in str(err) and "organizationId" in str(err)


@pytest.mark.parametrize("missing", ["userId", "organizationId"])
def test_auth_context_needs_user_and_organization(missing: str) -> None:
    partial = {k: v for k, v in AUTH.items() if k != missing}
    assert (
        rejected(ok(payload={"kind": "factory.run", "authContext": partial})).field
        == f"payload.authContext.{missing}"
    )
    for bad in ("", "  ", 7, None):
        ctx: dict[str, Any] = {**AUTH, missing: bad}
        assert (
            rejected(ok(payload={"kind": "factory.run", "authContext": ctx})).field
            == f"payload.authContext.{missing}"
        )


def test_watchdog_is_exempt_from_the_auth_context() -> None:
    r = validate_enqueue("factory-control", ok(payload={"kind": "factory.objective.watchdog"}))
    assert r.organization_id is None
    # If it does carry one, what it carries must still be well-formed.
    with pytest.raises(ValidationError) as err:
        validate_auth_context("factory.objective.watchdog", {"userId": 5})
    assert err.value.field == "payload.authContext.userId"
    validate_auth_context("factory.objective.watchdog", {"organizationId": "o"})  # partial is fine
    validate_auth_context("factory.objective.watchdog", {})


def test_auth_context_must_be_an_object() -> None:
    err = rejected(ok(payload={"kind": "factory.run", "authContext": "u1/o1"}))
    assert err.field == "payload.authContext"


@pytest.mark.parametrize("name", ["workspaceId", "receiptConnectGatewayUrl", "sessionId", "source"])
def test_auth_context_optional_fields(name: str) -> None:
    good = {**AUTH, name: "value"}
    assert (
        validate_enqueue("codex", ok(payload={"kind": "factory.run", "authContext": good})).payload[
            "authContext"
        ]
        == good
    )
    bad = {**AUTH, name: 42}
    assert (
        rejected(ok(payload={"kind": "factory.run", "authContext": bad})).field
        == f"payload.authContext.{name}"
    )


def test_auth_context_unknown_field_names_the_allowed_ones() -> None:
    err = rejected(ok(payload={"kind": "factory.run", "authContext": {**AUTH, "role": "admin"}}))
    assert err.field == "payload.authContext.role"
    assert err.allowed == [
        "userId",
        "organizationId",
        "workspaceId",
        "receiptConnectGatewayUrl",
        "sessionId",
        "source",
    ]


# -- the rest of the body --------------------------------------------------------------------------


def test_unknown_body_fields_are_rejected_naming_the_known_ones() -> None:
    err = rejected(ok(urgency=1))
    assert err.field == "urgency" and err.allowed == list(ENQUEUE_FIELDS)
    assert set(ENQUEUE_FIELDS) == {
        "jobId",
        "lane",
        "payload",
        "sessionKey",
        "singletonMode",
        "maxAttempts",
        "runAt",
        "delayMs",
        "tags",
        "priority",
        "concurrencyKey",
        "concurrencyLimit",
        "debounce",
    }


@pytest.mark.parametrize("body", [None, [], "x", 1])
def test_body_must_be_an_object(body: Any) -> None:
    assert rejected(body).field == "body"


@pytest.mark.parametrize("agent", [None, "", "   ", 7, "a" * 257])
def test_agent_id_must_be_a_short_non_empty_string(agent: Any) -> None:
    assert rejected(ok(), agent=agent).field == "agentId"


def test_unknown_agent_ids_are_accepted() -> None:
    """Spec ("The trap"): nothing rejects an unknown agent id at post time."""
    assert validate_enqueue("no-such-agent", ok()).agent_id == "no-such-agent"


@pytest.mark.parametrize("job_id", ["a", "A1", "job-1", "x.y_z:1-2", "9" * 128])
def test_job_id_pattern_accepts(job_id: str) -> None:
    assert validate_enqueue("codex", ok(jobId=job_id)).job_id == job_id


@pytest.mark.parametrize(
    "job_id", ["", "-lead", ".x", "_x", "a/b", "a b", "a?", "é", "9" * 129, "abc\n", "abc\r", 12, ["a"]]
)
def test_job_id_pattern_rejects(job_id: Any) -> None:
    assert rejected(ok(jobId=job_id)).field == "jobId"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (math.nan, "payload.x"),
        (math.inf, "payload.x"),
        (-math.inf, "payload.x"),
        ({"deep": [1, {"y": math.nan}]}, "payload.x.deep[1].y"),
        ([0.5, math.inf], "payload.x[1]"),
    ],
)
def test_nan_and_infinity_are_rejected(value: Any, path: str) -> None:
    err = rejected(ok(payload={"kind": "factory.run", "authContext": AUTH, "x": value}))
    assert err.field == path and "finite" in str(err)


def test_finite_floats_are_fine() -> None:
    r = validate_enqueue(
        "codex", ok(payload={"kind": "factory.run", "authContext": AUTH, "x": [1.5, -0.0, 1e308]})
    )
    assert r.payload["x"] == [1.5, -0.0, 1e308]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (-100, 1),
        (-1, 1),
        (0, 1),
        (1, 1),
        (2, 2),
        (7, 7),
        (8, 8),
        (9, 8),
        (99, 8),
        (10**12, 8),
    ],
)
def test_max_attempts_is_clamped_to_1_to_8(given: int, expected: int) -> None:
    assert validate_enqueue("codex", ok(maxAttempts=given)).max_attempts == expected
    assert clamp_max_attempts(given) == expected


@pytest.mark.parametrize("value", [True, False, "3", 2.0, 2.5, [2], {}])
def test_max_attempts_must_be_an_integer_and_not_a_bool(value: Any) -> None:
    err = rejected(ok(maxAttempts=value))
    assert err.field == "maxAttempts" and "1..8" in str(err)


def test_payload_is_copied_not_aliased() -> None:
    body = ok()
    r = validate_enqueue("codex", body)
    body["payload"]["kind"] = "factory.task.run"
    assert r.payload["kind"] == "factory.run"


def test_first_error_reported_is_deterministic() -> None:
    # Two unknown fields: the error names the first in sorted order, every time.
    assert rejected(ok(zeta=1, alpha=2)).field == "alpha"
