"""``receipt objective …``: launch, follow, show, list and cancel objectives over HTTP.

``launch plan.json --follow`` polls ``GET /objectives/<id>`` and draws a progress bar of settled
tasks and a table of every task's status until the objective ends (exit 0 when it completed,
1 when it failed or was canceled).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from receipt.cli import dev
from receipt.cli.output import client_from_env, fail, print_json
from receipt.client import Client, ReceiptError

TERMINAL = ("completed", "failed", "canceled")
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


@dev.group()
def objective() -> None:
    """Factory objectives on the deployment at RECEIPT_URL."""


def _table(obj: dict[str, Any], limit: int = 40) -> Table:
    table = Table(title=f"{obj['title']} [{obj['status']}]", expand=False)
    for name in ("task", "agent", "status", "attempt", "job"):
        table.add_column(name)
    tasks = obj["tasks"]
    for t in tasks[:limit]:
        style = STYLE.get(t["status"], "")
        table.add_row(
            t["id"], t["agentId"], f"[{style}]{t['status']}[/]", str(t["attempt"]), t["jobId"] or ""
        )
    if len(tasks) > limit:
        rest: dict[str, int] = {}
        for t in tasks[limit:]:
            rest[t["status"]] = rest.get(t["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(rest.items()))
        table.add_row(f"… {len(tasks) - limit} more", "", summary, "", "")
    return table


def follow(client: Client, objective_id: str, interval: float, console: Console) -> dict[str, Any]:
    """Poll until the objective ends; draw progress and the task table live. Returns the last state."""
    obj = client.objective(objective_id)
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )
    bar = progress.add_task(objective_id, total=len(obj["tasks"]))
    with Live(Group(progress, _table(obj)), console=console, refresh_per_second=8) as live:
        while True:
            settled = sum(1 for t in obj["tasks"] if t["status"] in SETTLED_TASK)
            progress.update(bar, completed=settled, description=f"{objective_id} {obj['status']}")
            live.update(Group(progress, _table(obj)))
            if obj["status"] in TERMINAL:
                return obj
            time.sleep(interval)
            obj = client.objective(objective_id)


@objective.command("launch")
@click.argument("plan_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--follow", "follow_", is_flag=True, help="Show the graph's progress until it ends.")
@click.option("--interval", default=0.5, show_default=True, help="Seconds between polls with --follow.")
def launch(plan_file: Path, follow_: bool, interval: float) -> int:
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
        final = follow(client, objective_id, interval, console)
    except ReceiptError as exc:
        raise fail(exc) from exc
    click.echo(json.dumps({"objectiveId": objective_id, "status": final["status"]}))
    return 0 if final["status"] == "completed" else 1


@objective.command("show")
@click.argument("objective_id")
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
@click.option("--interval", default=0.5, show_default=True, help="Seconds between polls with --follow.")
def replan(objective_id: str, plan_file: Path, reason: str | None, follow_: bool, interval: float) -> int:
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
        final = follow(client, objective_id, interval, console)
    except ReceiptError as exc:
        raise fail(exc) from exc
    click.echo(json.dumps({"objectiveId": objective_id, "status": final["status"], "phase": final["phase"]}))
    return 0 if final["status"] == "completed" else 1


@objective.command("cancel")
@click.argument("objective_id")
@click.option("--reason")
def cancel(objective_id: str, reason: str | None) -> int:
    """Cancel an objective (409 once it has ended)."""
    try:
        obj = client_from_env().cancel_objective(objective_id, reason)
    except ReceiptError as exc:
        raise fail(exc) from exc
    click.echo(f"{obj['id']}\t{obj['status']} (cancel requested)")
    return 0
