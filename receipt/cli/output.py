"""Shared pieces of the developer CLI: one client from the environment, JSON printing, errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from receipt.client import Client, ReceiptError, RetryNotice

F = TypeVar("F", bound=Callable[..., Any])
_NO_RETRY = "receipt.no_retry"


def _remember_no_retry(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_NO_RETRY] = True


def no_retry_option(command: F) -> F:
    """``--no-retry``: fail at the first 429/503 instead of waiting for the server's Retry-After."""
    option = click.option(
        "--no-retry",
        is_flag=True,
        expose_value=False,
        callback=_remember_no_retry,
        help="Fail at once on 429/503 instead of waiting the server's Retry-After and trying again.",
    )
    return option(command)


def tell_retry(notice: RetryNotice) -> None:
    """One stderr line per wait, so a pause is never silent."""
    what = "rate limited" if notice.status == 429 else "unavailable"
    click.echo(
        f"{what} ({notice.status} {notice.code}): trying again in {notice.wait:.1f} s "
        f"(try {notice.next_try} of {notice.max_tries})",
        err=True,
    )


def client_from_env(*, user: str | None = None) -> Client:
    """The client of RECEIPT_URL / RECEIPT_TOKEN, retrying unless ``--no-retry`` was given."""
    ctx = click.get_current_context(silent=True)
    no_retry = ctx is not None and bool(ctx.meta.get(_NO_RETRY))
    try:
        if no_retry:
            return Client(user=user, retry=None)
        return Client(user=user, on_retry=tell_retry)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def fail(exc: ReceiptError) -> click.ClickException:
    """A ClickException (exit 1) naming the API's error code and message."""
    return click.ClickException(f"{exc.code}: {exc.message}")
