"""The developer CLI over HTTP (`RECEIPT_URL`, `RECEIPT_TOKEN`): `receipt jobs`, `receipt objective`,
`receipt schedules`.

Built on click + rich. The operator verbs (migrate, verify, token, up, …) live in ``app.ops.cli``,
which hands these groups their arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

# Each group's one-line help, shown by `receipt --help` (app.ops.cli) and `receipt GROUP --help`.
GROUPS = {
    "jobs": "enqueue, list, show, cancel and follow jobs over HTTP (RECEIPT_URL, RECEIPT_TOKEN)",
    "objective": "launch, follow, show, list, replan and cancel Factory objectives over HTTP",
    "schedules": "declare, list, show, update, pause, resume, delete, trigger and backfill schedules, "
    "and read their fires, over HTTP",
}


@click.group()
def dev() -> None:
    """Talk to a Receipt deployment over HTTP."""


def main(argv: Sequence[str]) -> int:
    from receipt.cli import jobs, objectives, schedules  # noqa: F401  (registers the groups)

    try:
        result = dev.main(args=list(argv), prog_name="receipt", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        return 130
    return result if isinstance(result, int) else 0
