"""Whether a raw broker message is an envelope kombu can hand to a consumer (pure but for kombu).

kombu's virtual transports decode a message's bytes (``loads``) and read its envelope (the
``properties``, the ``delivery_tag``, the body in its ``body_encoding``) inside the worker's
consumer loop, where any exception is "Unrecoverable" and stops the worker. The folder and Redis
transports of ``delivery/`` ask this first, and keep what fails as a dead letter instead.
"""

from __future__ import annotations

import binascii
from typing import Any

from kombu.utils import json as kombu_json

_json: Any = kombu_json  # kombu ships no type hints


def decode_envelope(channel: Any, raw: bytes) -> tuple[Any, str]:
    """(payload, "") when ``raw`` is a message ``channel`` can deliver; (None, reason) otherwise."""
    if not raw:
        return None, "empty message"
    try:
        payload = _json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(payload, dict):
        return None, "not a kombu envelope (a JSON object)"
    properties = payload.get("properties")
    if not isinstance(properties, dict) or "delivery_tag" not in properties:
        return None, "not a kombu envelope (no properties.delivery_tag)"
    if not isinstance(properties.get("delivery_info"), dict):
        return None, "not a kombu envelope (no properties.delivery_info)"
    if not isinstance(payload.get("headers", {}), dict | None):
        return None, "not a kombu envelope (headers not an object)"
    try:
        channel.Message(payload, channel=channel)
    except (binascii.Error, ValueError, TypeError, KeyError, AttributeError) as exc:
        return None, f"body not decodable ({type(exc).__name__}: {exc})"
    return payload, ""
