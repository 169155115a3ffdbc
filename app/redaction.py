"""Secrets in free text: what a log line or an error message must never carry, and the hiding of it.

``redacted`` (``app/config.py``) shows a whole setting as ``***``; free text (a logged exception,
an HTTP client's error naming the URL it called) can carry a secret anywhere inside it. So each
setting's mark says which texts are secret: a secret setting's whole value, and a URL setting's
password and query string. A ``Redactor`` built from a deployment's settings replaces those
texts wherever they appear. The log handler of every process (``app/ops/logs.py``) runs it on
each line, and code that turns a failure into a message runs it before the message is stored.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from app.config import MASK, Setting, Settings, declared

# A shorter secret would match everywhere in free text; ``redacted`` still masks it as a field.
MIN_SECRET_TEXT: Final = 4
# A URL's lone user-info this long is taken for a token (``https://<token>@host``), not a user name.
LONE_TOKEN_MIN: Final = 16


def url_secret_texts(url: str) -> set[str]:
    """What ``mask_url`` hides, as texts to look for elsewhere: the password (or a lone user-info
    token), the query string and each query value, both as written and percent-decoded.

    A lone user-info is usually a user name (``postgres@db``), and hunting a user name in free text
    would mangle every line that names the database (``postgresql://``): it counts as a secret text
    only when it is as long as a token (``LONE_TOKEN_MIN``). ``mask_url`` hides it either way."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return {url}  # not a URL that can be taken apart: all of it is hidden
    found: set[str] = set()
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        if ":" in userinfo:
            found.add(userinfo.split(":", 1)[1])
        elif len(userinfo) >= LONE_TOKEN_MIN:
            found.add(userinfo)
    if parts.query:
        found.add(parts.query)
        found.update(value for _name, value in parse_qsl(parts.query))
    return found | {unquote(text) for text in found}


def secret_texts(setting: Setting, value: Any) -> set[str]:
    """The parts of one setting's ``value`` that must never appear in free text."""
    if value is None or value == "":
        return set()
    if setting.secret:
        text = str(value)
        return {text, text.strip()}
    if setting.url:
        return url_secret_texts(str(value))
    return set()


class Redactor:
    """Replaces every secret text in free text (a log line, an error message) with ``***``."""

    def __init__(self, texts: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        unique = {t for t in texts if len(t) >= MIN_SECRET_TEXT}
        self._texts: tuple[str, ...] = tuple(sorted(unique, key=len, reverse=True))

    @classmethod
    def of(cls, settings: Settings) -> Redactor:
        """Every secret of ``settings``: each secret-marked value, each URL's password and query,
        also as a ``repr``, a JSON string or both would escape them (a logged list, a JSON line)."""
        texts: set[str] = set()
        for s in declared(type(settings)):
            texts |= secret_texts(s, getattr(settings, s.attr))
        quoted = texts | {repr(t)[1:-1] for t in texts}
        return cls(quoted | {json.dumps(t)[1:-1] for t in quoted})

    def __call__(self, text: str) -> str:
        # A substring test per secret (about 0.1 µs each on a log line) is several times faster
        # than one alternation pattern for the few secrets a deployment has.
        for secret in self._texts:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def __repr__(self) -> str:
        return f"Redactor({len(self._texts)} secret texts)"


@functools.lru_cache(maxsize=8)
def redactor(settings: Settings) -> Redactor:
    """The ``Redactor`` of ``settings``, built once per settings value (a process has one or two)."""
    return Redactor.of(settings)
