"""``receipt objective …``: launch, follow, show, list and cancel objectives over HTTP.

``launch plan.json --follow`` follows ``GET /objectives/<id>/events`` (a snapshot, then only what
changed) and draws a progress bar of settled tasks and a table of every task's status until the
objective ends (exit 0 when it completed, 1 when it failed or was canceled).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from receipt.cli import GROUPS, dev
from receipt.cli.output import Column, client_from_env, fail, fitted_table, no_retry_option, print_json
from receipt.client import Client, ReceiptError

TERMINAL = ("completed", "failed", "canceled")
# A dropped event stream is resumed (Last-Event-ID); this many failures in a row give up.
FOLLOW_RECONNECTS = 5
SETTLED_TASK = ("completed", "failed", "canceled", "skipped")
STYLE = {
    "completed": "green",
    "failed": "red",
    "canceled": "yellow",
    "skipped": "dim",
    "running": "cyan",
    "queued": "blue",
    "pending": "white",
    "active": "cyan",
}


@dev.group(help=GROUPS["objective"])
def objective() -> None:
    pass


TASK_COLUMNS = (
    Column("task", ident=True),
    Column("agent"),
    Column("status"),
    Column("attempt"),
    Column("job", ident=True),
)


def _table(obj: dict[str, Any], width: int, limit: int = 40) -> Table:
    tasks = obj["tasks"]
    rows = [
        [
            t["id"],
            t["agentId"],
            f"[{STYLE.get(t['status'], '')}]{t['status']}[/]",
            str(t["attempt"]),
            t["jobId"] or "",
        ]
        for t in tasks[:limit]
    ]
    if len(tasks) > limit:
        rest: dict[str, int] = {}
        for t in tasks[limit:]:
            rest[t["status"]] = rest.get(t["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(rest.items()))
        rows.append([f"… {len(tasks) - limit} more", "", summary, "", ""])
    # A narrow terminal loses the agent, status and attempt columns first; an id is never cut short.
    return fitted_table(TASK_COLUMNS, rows, width, title=f"{obj['title']} [{obj['status']}]", expand=False)


def follow(client: Client, objective_id: str, console: Console) -> dict[str, Any]:
    """Follow the objective's event stream until it ends; draw progress and the task table live.

    The stream sends a snapshot and then only what changed (``Client.follow_objective`` applies
    it), so a 1 000-task objective costs one small event per change, not a GET per redraw.
    Returns the last state.
    """
    obj = client.objective(objective_id)
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )
    bar = progress.add_task(objective_id, total=len(obj["tasks"]))

    def draw(live: Live, obj: dict[str, Any]) -> None:
        settled = sum(1 for t in obj["tasks"] if t["status"] in SETTLED_TASK)
        description = f"{objective_id} {obj['status']}"
        progress.update(bar, completed=settled, total=len(obj["tasks"]), description=description)
        live.update(Group(progress, _table(obj, console.width)))

    with Live(Group(progress, _table(obj, console.width)), console=console, refresh_per_second=8) as live:
        draw(live, obj)
        if obj["status"] not in TERMINAL:
            for event in client.follow_objective(objective_id, max_reconnects=FOLLOW_RECONNECTS):
                obj = event.objective
                draw(live, obj)
                if obj["status"] in TERMINAL:
                    break
    if not console.is_terminal:
        # rich ends the last frame with a newline only on a terminal: end it here, so that the
        # result line that follows on the same file (2>&1) starts a line of its own.
        console.line()
    return obj


@objective.command("launch")
@click.argument("plan_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--follow", "follow_", is_flag=True, help="Show the graph's progress until it ends.")
@no_retry_option
def launch(plan_file: Path, follow_: bool) -> int:
    """Launch the objective in PLAN_FILE (the POST /objectives body: title, goal, plan, ...)."""
    try:
        body = json.loads(plan_file.read_text())
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"{plan_file}: not a JSON file ({exc})") from exc
    client = client_from_env()
    try:
        launched = client.launch_objective(body)
        objective_id = launched["async"]["objectiveId"]
        if not follow_:
            print_json(launched)
            return 0
        console = Console(stderr=True)
        console.print(f"launched [bold]{objective_id}[/] ({len(launched['objective']['tasks'])} tasks)")
        final = follow(client, objective_id, console)
    except ReceiptError as exc:
        raise fail(exc) from exc
    click.echo(json.dumps({"objectiveId": objective_id, "status": final["status"]}))
    return 0 if final["status"] == "completed" else 1


@objective.command("show")
@click.argument("objective_id")
@no_retry_option
def show(objective_id: str) -> int:
    """Print one objective as JSON."""
    try:
        print_json(client_from_env().objective(objective_id))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


@objective.command("list")
@click.option("--status", type=click.Choice(["active", "completed", "failed", "canceled"]))
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--cursor")
@no_retry_option
def list_(status: str | None, limit: int, cursor: str | None) -> int:
    """List objectives, newest first (one line each)."""
    try:
        page = client_from_env().objectives(status=status, limit=limit, cursor=cursor)
    except ReceiptError as exc:
        raise fail(exc) from exc
    for obj in page["objectives"]:
        done = sum(1 for t in obj["tasks"] if t["status"] == "completed")
        click.echo(f"{obj['id']}\t{obj['status']}\t{done}/{len(obj['tasks'])}\t{obj['title']}")
    if page.get("nextCursor"):
        click.echo(f"next: --cursor {page['nextCursor']}", err=True)
    return 0


@objective.command("replan")
@click.argument("objective_id")
@click.argument("plan_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--reason")
@click.option("--follow", "follow_", is_flag=True, help="Show the graph's progress until it ends.")
@no_retry_option
def replan(objective_id: str, plan_file: Path, reason: str | None, follow_: bool) -> int:
    """Start the next phase of OBJECTIVE_ID with the plan in PLAN_FILE ({"tasks": [...]}, or a launch
    body whose "plan" holds them). The earlier phases' jobs are canceled or aborted."""
    try:
        body = json.loads(plan_file.read_text())
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"{plan_file}: not a JSON file ({exc})") from exc
    source = body.get("plan", body) if isinstance(body, dict) else None
    if not isinstance(source, dict) or not isinstance(source.get("tasks"), list):
        raise click.UsageError(f'{plan_file}: expected {{"tasks": [...]}} or a launch body with "plan"')
    client = client_from_env()
    try:
        obj = client.replan_objective(objective_id, source["tasks"], reason)
        if not follow_:
            click.echo(f"{obj['id']}\t{obj['status']}\tphase {obj['phase']}")
            return 0
        console = Console(stderr=True)
        console.print(f"replanned [bold]{objective_id}[/]: phase {obj['phase']}")
        final = follow(client, objective_id, console)
    except ReceiptError as exc:
        raise fail(exc) from exc
    click.echo(json.dumps({"objectiveId": objective_id, "status": final["status"], "phase": final["phase"]}))
    return 0 if final["status"] == "completed" else 1


@objective.command("cancel")
@click.argument("objective_id")
@click.option("--reason")
@no_retry_option
def cancel(objective_id: str, reason: str | None) -> int:
    """Cancel an objective (409 once it has ended)."""
    try:
        obj = client_from_env().cancel_objective(objective_id, reason)
    except ReceiptError as exc:
        raise fail(exc) from exc
    click.echo(f"{obj['id']}\t{obj['status']} (cancel requested)")
    return 0
