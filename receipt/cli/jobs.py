"""``receipt jobs …``: enqueue, list, show, cancel and follow jobs over HTTP."""

from __future__ import annotations

import click

from receipt.cli import dev
from receipt.cli.output import client_from_env, fail, print_json
from receipt.client import ReceiptError


@dev.group()
def jobs() -> None:
    """Jobs on the deployment at RECEIPT_URL."""


@jobs.command("show")
@click.argument("job_id")
def show(job_id: str) -> int:
    """Print one job as JSON."""
    try:
        print_json(client_from_env().get(job_id))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0
