"""Shared pieces of the developer CLI: one client from the environment, JSON printing, errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from rich.table import Table
from rich.text import Text

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


@dataclass(frozen=True)
class Column:
    """A table column. An ``ident`` column (a job or objective id) is never cut short: the others,
    from the right, are left out first until the table fits, and past that the id wraps."""

    name: str
    ident: bool = False


def fitted_table(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int, **kwargs: Any
) -> Table:
    """A rich table of ``rows`` (cells may hold rich markup) that fits ``width`` without cutting
    an id short: columns that are not ids are dropped from the right until it fits."""

    def natural(index: int) -> int:
        cells = [Text.from_markup(row[index]).cell_len for row in rows]
        return max([len(columns[index].name), *cells])

    shown = list(range(len(columns)))
    # A rich box table: one space of padding each side of a cell, and a border between and around.
    while sum(natural(i) + 3 for i in shown) + 1 > width:
        droppable = [i for i in shown if not columns[i].ident]
        if not droppable or len(shown) == 1:
            break
        shown.remove(droppable[-1])
    table = Table(**kwargs)
    for i in shown:
        column = columns[i]
        if column.ident:
            table.add_column(column.name, overflow="fold", min_width=min(natural(i), max(8, width - 4)))
        else:
            table.add_column(column.name)
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table
