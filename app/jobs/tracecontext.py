"""A job's W3C trace context, as ``job.enqueued`` records it (``traceContext``).

``{"traceparent": "00-<32 hex>-<16 hex>-<2 hex>", "tracestate": "..."}``: the context the enqueue
ran in (the HTTP request's span, the caller's own ``traceparent``, an objective's context for its
task jobs, or a fresh root span). Kept in the receipt, so every attempt, retry, redrive, hand-back
and the archive find the one trace the job belongs to. Optional: a receipt written without it
folds as before, and the job then simply starts no trace of its own.

Pure: the W3C header grammar only; the OpenTelemetry side is ``app.tracing``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

TRACE_CONTEXT_FIELD: Final = "traceContext"
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
# W3C Trace Context, "traceparent Header": version 00's four fields; a trace id or parent id of all
# zeros is invalid, and version ff is forbidden.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
# W3C Trace Context, "tracestate Header": at most 32 list members; 512 characters is the length a
# vendor may truncate to, so nothing longer is kept.
TRACESTATE_MAX: Final = 512


def valid_traceparent(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    m = _TRACEPARENT.match(value)
    return m is not None and m.group(1) != "ff" and m.group(2) != "0" * 32 and m.group(3) != "0" * 16


def trace_context_of(value: Any) -> dict[str, str] | None:
    """The stored context of a ``traceContext`` value, or None when it holds no valid traceparent
    (a malformed one is dropped, never an error: tracing must not refuse or break a job)."""
    if not isinstance(value, Mapping):
        return None
    parent = value.get(TRACEPARENT)
    if not valid_traceparent(parent):
        return None
    out = {TRACEPARENT: str(parent)}
    state = value.get(TRACESTATE)
    if isinstance(state, str) and state and len(state) <= TRACESTATE_MAX:
        out[TRACESTATE] = state
    return out


def trace_id_of(ctx: Mapping[str, str] | None) -> str | None:
    """The 32-hex trace id of a stored context (the dashboard's trace link)."""
    if not ctx:
        return None
    return ctx[TRACEPARENT][3:35]
