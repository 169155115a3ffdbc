"""Request validation's fast pass (jsonschema-rs) may only accept what jsonschema accepts.

``api.inputs.check`` asks the compiled validator first and walks jsonschema's error tree only when
it refuses. The answer stays jsonschema's as long as the fast pass never accepts an instance that
jsonschema refuses: checked here over every schema ``api.schemas`` publishes, with generated JSON
and with mutations of bodies that are valid.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import inputs, schemas
from app.jobs.errors import ValidationError
from tests.support.examples import examples

SCHEMAS = {
    name: value
    for name, value in vars(schemas).items()
    if name.isupper() and isinstance(value, dict) and ("type" in value or "$ref" in value or "anyOf" in value)
}

AUTH = {"userId": "u", "organizationId": "o"}
ENQUEUE = {"payload": {"kind": "factory.dispatch", "goal": "g", "authContext": AUTH}}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["factory.dispatch", "codex", "steer", "abort", "queued", "o", "a\n", "", "x" * 300]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(["payload", "kind", "goal", "authContext", "jobId", "type", "message", "x"]),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=12,
)


def _agree(schema: dict[str, Any], instance: Any) -> None:
    fast, full = inputs._compiled(schema)
    if fast is not None and fast.is_valid(instance):
        errors = list(full.iter_errors(instance))
        assert not errors, f"the fast pass accepted what jsonschema refuses: {errors[0].message}"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=json_values)
def test_the_fast_pass_accepts_nothing_jsonschema_refuses(name: str, instance: Any) -> None:
    _agree(SCHEMAS[name], instance)


@settings(max_examples=examples(300), deadline=None)
@given(
    path=st.lists(
        st.sampled_from(["payload", "authContext", "kind", "goal", "userId"]), min_size=1, max_size=3
    ),
    value=json_values,
)
def test_a_mutated_enqueue_body_gets_jsonschemas_answer(path: list[str], value: Any) -> None:
    body: Any = copy.deepcopy(ENQUEUE)
    node = body
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    _agree(schemas.ENQUEUE_REQUEST, body)


class _Unwalkable:
    def iter_errors(self, _instance: Any) -> Any:
        raise AssertionError("the error tree was walked for a valid body")


def test_a_valid_body_never_walks_the_error_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = schemas.ENQUEUE_REQUEST
    fast, _full = inputs._compiled(schema)
    assert fast is not None, "the enqueue body's schema compiles for the fast pass"
    monkeypatch.setitem(inputs._COMPILED, id(schema), (schema, fast, _Unwalkable()))
    inputs.check(ENQUEUE, schema)
    with pytest.raises(AssertionError, match="walked"):
        inputs.check({"payload": 1}, schema)


def test_every_request_schema_has_a_fast_pass() -> None:
    requests = [n for n in SCHEMAS if n.endswith(("_REQUEST", "_QUERY", "_PARAM", "_HEADER"))]
    assert requests
    slow = [n for n in requests if inputs._compiled(SCHEMAS[n])[0] is None]
    assert not slow, f"request schemas checked without the fast pass: {slow}"


def test_a_refused_body_is_named_by_jsonschemas_best_match() -> None:
    body: Any = copy.deepcopy(ENQUEUE)
    body["payload"]["kind"] = 7
    with pytest.raises(ValidationError) as caught:
        inputs.check(body, schemas.ENQUEUE_REQUEST)
    assert caught.value.field.startswith("payload")


def test_a_trailing_newline_gets_jsonschemas_answer() -> None:
    # Python's "$" matches before a final newline; the fast pass's does not. It refuses, and the
    # error tree (Python's regular expressions) decides.
    schema = {"type": "string", "pattern": "^[a-z]+$"}
    fast, _full = inputs._compiled(schema)
    assert not fast.is_valid("abc\n")
    inputs.check("abc\n", schema)


@pytest.mark.parametrize("char", [chr(c) for c in range(0x3001) if chr(c).isspace() or c in (0x1B, 0xFEFF)])
def test_a_text_the_document_calls_non_blank_is_one_the_server_calls_non_empty(char: str) -> None:
    """A userId of U+001D alone passed the document's ``\\s`` (ECMA's leaves it out) and was then
    refused by the server's ``str.strip``: the document and the server now read blank alike, in
    both validators."""
    from jsonschema import Draft202012Validator

    from app.jobs.validation import validate_enqueue

    body = {"payload": {"kind": "factory.dispatch", "goal": "g", "authContext": {**AUTH, "userId": char}}}
    non_blank = bool(char.strip())
    assert Draft202012Validator(schemas.ENQUEUE_REQUEST).is_valid(body) == non_blank
    try:
        inputs.check(body, schemas.ENQUEUE_REQUEST)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted == non_blank
    if accepted:
        validate_enqueue("factory", body)  # what the document lets through, the server takes
