"""Identifiers: time-ordered job ids and random secrets."""

from __future__ import annotations

import os
import re
import secrets
import time

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"
# An explicit jobId becomes part of a stream name and URLs: keep it to a safe alphabet.
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def new_id(prefix: str = "") -> str:
    """26 characters, lexicographically ordered by creation time (48-bit ms + 80 random bits)."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return prefix + "".join(reversed(chars))


def new_token() -> str:
    """An API token: 32 random bytes, URL-safe, with a recognisable prefix for secret scanners."""
    return "rcpt_" + secrets.token_urlsafe(32)
