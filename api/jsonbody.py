"""Strict JSON input: what the API accepts as a request body, before any schema looks at it.

Python's ``json`` is lenient where Receipt cannot be: it accepts ``NaN``/``Infinity`` (not JSON,
and a receipt's canonical encoding refuses them later), turns ``1e999`` into infinity, and
passes lone UTF-16 surrogates and ``\\u0000`` through (Postgres ``jsonb`` and ``text`` reject
both — a 500 after the request had been accepted). This module rejects all of them up front,
naming where in the body the bad value sits, so nothing malformed can reach a write.
"""

from __future__ import annotations

import json
import math
from typing import Any

from api.errors import invalid_json
from app.jobs.errors import ValidationError

# Deeper than any real payload; bounds the work every later walker (schema, hash, database) does.
MAX_DEPTH = 64


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def parse(data: bytes) -> Any:
    """Decode a request body as strict JSON; raises ``ApiError`` (400) when it is not."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_json("body is not UTF-8") from exc
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise invalid_json(f"nested deeper than {MAX_DEPTH} levels") from exc
    except ValueError as exc:  # JSONDecodeError, our constants/floats, int digit limits
        raise invalid_json(str(exc)) from exc
    check_storable(value)
    return value


def field_path(parent: str, key: str | int) -> str:
    """``payload.authContext.userId`` / ``payload.items[3]``: how errors name a place in a body."""
    if isinstance(key, int):
        return f"{parent or 'body'}[{key}]"
    return f"{parent}.{key}" if parent else key


def check_storable(value: Any) -> None:
    """Reject strings Postgres cannot store and nesting past ``MAX_DEPTH`` (iteratively: no recursion)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValidationError(path or "body", f"nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item, path or "body")
        elif isinstance(item, dict):
            for key, child in item.items():
                # Keys are checked before being put in a field name, so the name itself is safe.
                _check_text(key, path or "body")
                stack.append((child, field_path(path, key), depth + 1))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                stack.append((child, field_path(path, index), depth + 1))


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise ValidationError(path, "must not contain the NUL character (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(path, "must not contain unpaired UTF-16 surrogates") from exc


def check_param(value: str, name: str) -> None:
    """The same text rules for a path or query parameter (a NUL there would reach SQL)."""
    _check_text(value, name)
