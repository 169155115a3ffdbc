"""Identifiers: time-ordered job ids, random secrets, and the organisation-qualified keys.

A client's ``jobId`` (or ``objectiveId``) is unique within its organisation only. Storage keys
carry the organisation: a job's key is ``<organizationId>/<jobId>`` and its stream
``jobs/<organizationId>/<jobId>``, so the same client id in two organisations is two jobs, and
no organisation can learn or take another's ids. Client ids cannot contain ``/``, so the last
``/`` of a key always separates the two. Keys written before organisations qualified them have
no ``/`` (a *bare* key); their organisation is the one their receipts name.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from typing import Final

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"
# An explicit jobId becomes part of a stream name and URLs: keep it to a safe alphabet.
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# An organisation id is part of every key, stream name and cursor: a safe alphabet, and no '/'.
ORGANIZATION_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
ORGANIZATION_ID_RULE: Final = (
    "must be 1-128 characters of letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
)
# Where the jobs the system enqueues for itself live (watchdog ticks). It starts with '_', which
# ORGANIZATION_ID_PATTERN refuses, so no token and no authContext can name it.
SYSTEM_ORGANIZATION: Final = "_system"
KEY_SEPARATOR: Final = "/"

# Shapes of the ids the system derives for itself (app.factory.vocab, app.factory.monitor,
# app.factory.watchdog, app.schedules.vocab). A client may not post a jobId of these shapes, so
# nothing the system will enqueue later can be taken in advance, even inside the client's own
# organisation.
RESERVED_JOB_ID_SHAPES: Final = (
    ("<objectiveId>:p<phase>:<taskId>", re.compile(r":p[0-9]+:")),
    ("<objectiveId>:control:<n>", re.compile(r":control:")),
    ("<objectiveId>:audit", re.compile(r":audit$")),
    ("<taskJobId>:monitor", re.compile(r":monitor$")),
    ("watchdog:<tick>", re.compile(r"^watchdog:")),
    # A schedule's fire (app.schedules.vocab.fire_client_id): a tick in UTC, 20260501T090000Z, and
    # a tick decided again after a withdrawal, 20260501T090000Z-17.
    ("<scheduleId>:<tick>", re.compile(r":[0-9]{8}T[0-9]{6}(?:\.[0-9]{3})?Z(?:-[0-9]+)?$")),
)


def reserved_shape(job_id: str) -> str | None:
    """The derived-id shape ``job_id`` has, if any (a client may post none of them)."""
    for shape, pattern in RESERVED_JOB_ID_SHAPES:
        if pattern.search(job_id):
            return shape
    return None


def qualify(organization_id: str | None, client_id: str) -> str:
    """The storage key of ``client_id`` in an organisation (``None``: the system's own)."""
    return f"{organization_id or SYSTEM_ORGANIZATION}{KEY_SEPARATOR}{client_id}"


def client_id_of(key: str) -> str:
    """The id a client knows a job or objective by: its key without the organisation."""
    return key.rpartition(KEY_SEPARATOR)[2]


def organization_of_key(key: str) -> str | None:
    """The organisation a key names; ``None`` for a bare key (written before keys were qualified)."""
    org, sep, _ = key.rpartition(KEY_SEPARATOR)
    return org if sep else None


def is_bare(key: str) -> bool:
    return KEY_SEPARATOR not in key


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
