"""Schemathesis against /openapi.json through the WSGI app (SQLite; bounded and deterministic).

Every check ``schemathesis run --checks all`` runs: any 5xx; any status code, content type,
header or body the document does not declare; any request the document calls invalid that the
server accepts; and any request the document calls *valid* that the server refuses (so every
rule the server enforces — no U+0000 in strings, only server-issued cursors, a session key for
singleton modes — must be in the document). A stateful run follows the document's links from
enqueue to the created job's get, commands, cancel, events and receipts. The catch-all 500
counter must stay at zero as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance
from sqlalchemy.engine import Engine

from app.storage import tokens
from tests.support.api import ORG_A, Api, build_api, idle_loops, make_settings

# Generated requests over the whole HTTP contract take tens of seconds: make test runs them,
# make test-fast does not.
pytestmark = pytest.mark.slow

# The tenant bounds, made tight so the fuzzer meets them (429, 409 too_many_commands, short pages)
# and checks those responses against the document too.
TIGHT = {
    "rate_limit_writes": "8/minute",
    "max_commands_per_job": 2,
    "max_page_bytes": 4096,
    "sse_max_streams_per_token": 1,
}


@pytest.fixture
def fuzz_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    # SQLite by default (fast); RECEIPT_TEST_FUZZ_BACKEND=postgres for a run against PostgreSQL.
    backend = os.environ.get("RECEIPT_TEST_FUZZ_BACKEND", "sqlite")
    engine: Engine = request.getfixturevalue("pg_engine" if backend == "postgres" else "sqlite_engine")
    callspec = getattr(request.node, "callspec", None)
    tight = TIGHT if callspec is not None and "tight" in callspec.id else {}
    # Event streams end at once (max 0 s): the fuzzer checks their headers and errors, not waits.
    # No worker runs here: idle loops keep /readyz ready however long the fuzzer runs.
    loops_idle = idle_loops()
    api = build_api(
        engine,
        make_settings(tmp_path, sse_max_seconds=0, max_body_bytes=64 * 1024, **tight, **loops_idle),
    )
    api.job("a", jobId="known-job", sessionKey="s")
    # A token with the commands scope: its codex posts are accepted, others' get 403.
    api.secrets["commands"] = tokens.create(engine, ORG_A, scopes=["commands"])[1]
    yield api
    assert api.state.internal_errors == 0, "a fuzzed request reached the catch-all 500 handler"


# Per operation and generation mode: 10 operations x 2 modes x 20 = a few hundred requests in CI.
# A deeper, random run locally: RECEIPT_TEST_FUZZ_EXAMPLES=500 RECEIPT_TEST_FUZZ_RANDOM=1.
EXAMPLES_PER_OPERATION = int(os.environ.get("RECEIPT_TEST_FUZZ_EXAMPLES", "20"))
DERANDOMIZE = not os.environ.get("RECEIPT_TEST_FUZZ_RANDOM")


def fuzz_config(extra: dict[str, Any] | None = None) -> SchemathesisConfig:
    """Schemathesis's configuration for these runs: generation from the document alone.

    Its source analysis (literal values lifted from the application's Python source and mixed
    into generated bodies) builds a JSON Schema validator per generated case: measured, about
    two thirds of each case's generation time, for values the document's own examples and
    patterns already reach. RECEIPT_TEST_FUZZ_CONSTANTS=1 turns it back on for a deeper run."""
    constants = bool(os.environ.get("RECEIPT_TEST_FUZZ_CONSTANTS"))
    return SchemathesisConfig.from_dict({"analysis": {"constants": {"enabled": constants}}, **(extra or {})})


# Operations whose bodies carry a plan: JSON Schema can describe a plan's shape, not its graph.
GRAPH_RULED = frozenset({"POST /objectives", "POST /objectives/{objectiveId}/plan"})
# Operations whose bodies carry rules a schema cannot state either: a cron expression croniter runs,
# an IANA zone that exists, a job template the job validation accepts, a backfill range in the past
# (relative to the server's clock); their descriptions state them, and breaking one is a 400.
TEXT_RULED = frozenset(
    {"POST /schedules", "PATCH /schedules/{scheduleId}", "POST /schedules/{scheduleId}/backfill"}
)


@pytest.mark.parametrize(
    ("mode", "who"),
    [
        (GenerationMode.POSITIVE, "system"),
        (GenerationMode.NEGATIVE, "system"),
        (GenerationMode.POSITIVE, "a"),  # an organisation's token: the 403 and 404 scoping paths
        (GenerationMode.POSITIVE, "commands"),  # an organisation's token with the commands scope
        (GenerationMode.POSITIVE, "a"),  # the same under tight bounds: 429s and too_many_commands
    ],
    ids=["positive-system", "negative-system", "positive-org", "positive-commands", "positive-org-tight"],
)
def test_api_conforms_to_its_document(
    fuzz_api: Api, mode: GenerationMode, who: str, request: pytest.FixtureRequest
) -> None:
    # /openapi.json needs a token like everything but /healthz.
    headers = fuzz_api.headers(who)
    schema = schemathesis.openapi.from_wsgi(
        "/openapi.json", fuzz_api.app, headers=headers, config=fuzz_config()
    )
    # An invalid body past RECEIPT_MAX_BODY_BYTES is refused whole with 413 payload_too_large
    # before it is parsed: that is a rejection too (schemathesis's default list lacks 413).
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    if "tight" in request.node.callspec.id:
        # A batch of more jobs than one window of the tight write limit allows could never pass:
        # 413 (split it), a limit of this deployment that the document cannot state as a schema.
        acceptance = schema.config.checks.positive_data_acceptance
        acceptance.expected_statuses = [*acceptance.expected_statuses, "413"]
    ran = 0
    calls: list[int] = []
    no_negative: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an Err would raise here, as intended
        has_input = bool(operation.path_parameters or operation.query or operation.headers or operation.body)
        if mode is GenerationMode.NEGATIVE and not has_input:
            continue  # nothing to make invalid

        @given(case=operation.as_strategy(generation_mode=mode, headers=headers))
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            derandomize=DERANDOMIZE,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            # Every check, as `schemathesis run --checks all`, except one where a schema cannot say
            # it: a plan's graph rules (cycles, unknown dependencies, each task's job validation)
            # are stated in the operation's description, and a plan breaking them is a 400.
            # run() is called within this iteration, so the loop variable is the one meant.
            ruled = GRAPH_RULED | TEXT_RULED
            excluded = [positive_data_acceptance] if operation.label in ruled else []  # noqa: B023
            # The token passed here too, so schemathesis counts it as explicit (valid) auth and
            # probes the operation without it and with a wrong one (ignored_auth), instead of
            # taking a 200 answered to the real token for acceptance of a generated one.
            response = case.call_and_validate(headers=headers, excluded_checks=excluded)
            calls.append(response.status_code)

        try:
            run()
        except Unsatisfiable:
            # Only the (fixed) Authorization header could be made invalid: nothing to send.
            assert mode is GenerationMode.NEGATIVE, operation.label
            no_negative.append(operation.label)
            continue
        ran += 1
    # Schemathesis leaves out the document's own path (/openapi.json); every other operation ran.
    assert ran >= (7 if mode is GenerationMode.NEGATIVE else 10), no_negative
    if fuzz_api.state.settings.rate_limit_writes == TIGHT["rate_limit_writes"]:
        assert 429 in calls, "the tight run must meet the write limit (and validate its 429)"
    print(f"{mode.value}: {len(calls)} requests, statuses {sorted(set(calls))}, no negative: {no_negative}")


# Stateful: scenarios of up to STEPS calls, following the document's links from a created job.
STATEFUL_SCENARIOS = int(os.environ.get("RECEIPT_TEST_FUZZ_SCENARIOS", "15"))
STATEFUL_STEPS = 6


def test_stateful_links_follow_a_created_job_through_every_job_operation(fuzz_api: Api) -> None:
    headers = fuzz_api.headers("system")
    document = fuzz_api.client.get("/openapi.json", headers=headers).json
    assert document is not None
    links = document["paths"]["/agents/{agentId}/jobs"]["post"]["responses"]["202"]["links"]
    assert {link["operationId"] for link in links.values()} >= {
        "jobs_get_job",
        "jobs_send_command",
        "jobs_cancel",
        "streams_job_events",
    }
    # The document's own links only (no inferred ones): this run proves *they* lead somewhere.
    config = fuzz_config({"phases": {"stateful": {"inference": {"algorithms": []}}}})
    schema = schemathesis.openapi.from_wsgi("/openapi.json", fuzz_api.app, headers=headers, config=config)
    answered: set[str] = set()

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": headers}

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            # Every check; `headers` tells the auth checks that this token was given, not generated.
            case.validate_response(
                response,
                headers=headers,
                additional_checks=additional_checks,
                transport_kwargs=kwargs or None,
                recorder=self.recorder,
            )

        def step(self, input: Any) -> Any:
            output = super().step(input)
            if output.response.status_code < 300:
                answered.add(input.case.operation.label)
            return output

    Workflow.run(
        settings=settings(
            max_examples=STATEFUL_SCENARIOS,
            stateful_step_count=STATEFUL_STEPS,
            derandomize=DERANDOMIZE,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )
    # Past the 404s: operations on a job created in the scenario answered through the links.
    assert {
        "POST /agents/{agentId}/jobs",
        "POST /jobs/{jobId}/commands",
        "POST /jobs/{jobId}/cancel",
        "GET /jobs/{jobId}/events",
    } <= answered, sorted(answered)
    print(f"stateful: operations that answered 2xx: {sorted(answered)}")
