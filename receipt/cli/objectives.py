"""``receipt objective …``: launch, follow, show, list and cancel objectives over HTTP."""

from __future__ import annotations

from receipt.cli import dev


@dev.group()
def objective() -> None:
    """Factory objectives on the deployment at RECEIPT_URL."""
