"""Schemathesis against /openapi.json through the WSGI app (SQLite; bounded and deterministic).

Fails on any 5xx, on any status code, content type, header or body the document does not
declare, and on any request the document calls invalid that the server nonetheless accepts.
The catch-all 500 counter must stay at zero as well.
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
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy.engine import Engine

from tests.support.api import Api, build_api, make_settings

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture
def fuzz_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    # SQLite by default (fast); RECEIPT_TEST_FUZZ_BACKEND=postgres for a run against PostgreSQL.
    backend = os.environ.get("RECEIPT_TEST_FUZZ_BACKEND", "sqlite")
    engine: Engine = request.getfixturevalue("pg_engine" if backend == "postgres" else "sqlite_engine")
    # Event streams end at once (max 0 s): the fuzzer checks their headers and errors, not waits.
    api = build_api(engine, make_settings(tmp_path, sse_max_seconds=0, max_body_bytes=64 * 1024))
    api.job("a", jobId="known-job", sessionKey="s")
    yield api
    assert api.state.internal_errors == 0, "a fuzzed request reached the catch-all 500 handler"


# Per operation and generation mode: 10 operations x 2 modes x 20 = a few hundred requests in CI.
# A deeper, random run locally: RECEIPT_TEST_FUZZ_EXAMPLES=500 RECEIPT_TEST_FUZZ_RANDOM=1.
EXAMPLES_PER_OPERATION = int(os.environ.get("RECEIPT_TEST_FUZZ_EXAMPLES", "20"))
DERANDOMIZE = not os.environ.get("RECEIPT_TEST_FUZZ_RANDOM")


@pytest.mark.parametrize(
    ("mode", "who"),
    [
        (GenerationMode.POSITIVE, "system"),
        (GenerationMode.NEGATIVE, "system"),
        (GenerationMode.POSITIVE, "a"),  # an organisation's token: the 403 and 404 scoping paths
    ],
    ids=["positive-system", "negative-system", "positive-org"],
)
def test_api_conforms_to_its_document(fuzz_api: Api, mode: GenerationMode, who: str) -> None:
    # /openapi.json needs a token like everything but /healthz.
    headers = fuzz_api.headers(who)
    schema = schemathesis.openapi.from_wsgi("/openapi.json", fuzz_api.app, headers=headers)
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
            response = case.call_and_validate(checks=CHECKS)
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
    print(f"{mode.value}: {len(calls)} requests, statuses {sorted(set(calls))}, no negative: {no_negative}")
