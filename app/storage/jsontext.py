"""JSON text for the JSON columns (job state, receipt bodies, delivery and ledger rows): orjson.

Every transition writes a job's folded state and its receipts' bodies as JSON and reads the state
back, several times per job; the standard library's encoder and decoder were about 3 % of a
worker's CPU and 2 % of the API's (bench/README.md, "Half the CPU per job"). orjson, a maintained C/Rust
library, gives the same JSON for the values Receipt stores (validated JSON: strings, numbers,
booleans, null, lists and objects, floats always finite) several times faster. Two edges keep the
standard library, so no value ever changes on the way in or out:

- an integer outside 64 bits, which orjson refuses to write;
- a text with a run of 19 or more digits, where such an integer may be: orjson would read it as
  a float, and the fold and the hash chain need it exact.

The hash chain itself never depends on this text: ``app.storage.store`` hashes its own canonical
form of each body.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# 2**63 has 19 digits: a run that long may be an integer orjson would read as a float.
_LONG_DIGITS = re.compile(r"\d{19}")
_LONG_DIGITS_BYTES = re.compile(rb"\d{19}")


def dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # an integer beyond 64 bits (anything else fails the same way in json)
        return json.dumps(value, ensure_ascii=False)


def loads(text: str | bytes) -> Any:
    long = _LONG_DIGITS.search(text) if isinstance(text, str) else _LONG_DIGITS_BYTES.search(text)
    return json.loads(text) if long else orjson.loads(text)
