"""Shared output helpers for the developer CLI: one client from the environment, JSON printing."""

from __future__ import annotations

import json
from typing import Any

import click

from receipt.client import Client, ReceiptError


def client_from_env() -> Client:
    try:
        return Client()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def fail(exc: ReceiptError) -> click.ClickException:
    """A ClickException (exit 1) naming the API's error code and message."""
    return click.ClickException(f"{exc.code}: {exc.message}")
