"""The dashboard's no-secrets rule for the JSON it displays (payloads, results, command bodies).

The API hands a job's payload back to its owner verbatim; a page on a shared screen should
not. Any object key that names a credential has its value replaced, at any depth. The rule is
by key name (a value cannot be recognised as secret by looking at it), and errs on the side of
hiding: ``tokenCount`` is hidden too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "•••• (hidden)"
# Compared against the key lower-cased with separators removed ("api_key" → "apikey").
_SECRET_KEY = re.compile(r"token|secret|passw|apikey|authorization|credential|privatekey|cookie|signature")
_SEPARATORS = re.compile(r"[\s_\-.]")
# Nesting past this depth is shown as text rather than walked (the API caps depth on input).
_MAX_DEPTH = 64


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(_SEPARATORS.sub("", key.lower())))


def redact(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` with every secret-named key's value replaced by ``REDACTED``."""
    if depth > _MAX_DEPTH:
        return REDACTED
    if isinstance(value, Mapping):
        return {
            str(k): (REDACTED if is_secret_key(str(k)) else redact(v, depth + 1)) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v, depth + 1) for v in value]
    return value


def pretty(value: Any) -> str:
    """Indented JSON of the redacted value, for a ``<pre>`` block."""
    return json.dumps(redact(value), indent=2, ensure_ascii=False, sort_keys=False, default=str)


def brief(value: Any, limit: int = 80) -> str:
    """One line of the redacted value, cut at ``limit`` characters (table cells)."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(redact(value), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
