"""The JSON columns' text (app/storage/jsontext.py): orjson, and the standard library where orjson
would change a value (an integer beyond 64 bits, written or read)."""

from __future__ import annotations

import json

from app.storage import jsontext

BIG = 2**70


def test_ordinary_values_round_trip_as_json_reads_them() -> None:
    value = {"kind": "factory.run", "n": 3, "x": 0.1, "ok": True, "none": None, "list": [1, "a", {"é": "ü"}]}
    text = jsontext.dumps(value)
    assert json.loads(text) == value
    assert jsontext.loads(text) == value
    assert jsontext.loads(text.encode()) == value


def test_an_integer_beyond_64_bits_is_written_and_read_exactly() -> None:
    value = {"big": BIG, "negative": -BIG, "edge": 2**63, "max": 2**63 - 1}
    text = jsontext.dumps(value)
    assert json.loads(text) == value
    read = jsontext.loads(text)
    assert read == value and isinstance(read["big"], int)
    assert jsontext.loads(text.encode()) == value


def test_a_long_digit_run_inside_a_string_reads_the_same() -> None:
    value = {"id": "job-12345678901234567890123", "n": 12345678901234567890}
    assert jsontext.loads(json.dumps(value)) == value


def test_non_string_keys_are_written_as_json_writes_them() -> None:
    assert json.loads(jsontext.dumps({1: "a"})) == json.loads(json.dumps({1: "a"}))
