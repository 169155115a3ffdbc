"""How many examples a property test draws.

``make test`` draws each property's full count. The tiers run while working (``make unit``,
``make test-fast``) set ``RECEIPT_TEST_EXAMPLES=fast`` and draw a quarter of it (at least ten), so
every property still runs there, less deeply; ``make test`` is where the depth is. Hypothesis keeps
a failing example in ``.hypothesis/`` and replays it first on the next run, whichever the count.
"""

from __future__ import annotations

import os

FAST = os.environ.get("RECEIPT_TEST_EXAMPLES", "full") == "fast"


def examples(full: int) -> int:
    """``full`` in ``make test``; a quarter of it, at least ten, in the fast tiers."""
    return max(10, full // 4) if FAST else full
