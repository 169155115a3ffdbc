"""``receipt schedules …``: declare, list, show, change, pause, resume, delete, trigger and backfill
schedules, and read their fires, over HTTP."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from receipt.cli import GROUPS, dev, timing
from receipt.cli.jobs import DEFAULT_KIND, STATUS_STYLE, payload_option_value
from receipt.cli.output import client_from_env, fail, no_retry_option, print_json
from receipt.client import ReceiptError

OVERLAPS = ("allow", "skip", "bufferOne", "cancelPrevious")
OUTCOME_STYLE = {
    "fired": "green",
    "missed": "red",
    "skipped": "yellow",
    "buffered": "cyan",
    "withdrawn": "magenta",
}


@dev.group(help=GROUPS["schedules"])
def schedules() -> None:
    pass


def _when(s: dict[str, Any]) -> str:
    if s.get("cron"):
        zone = s.get("timeZone") or "UTC"
        return f"{s['cron']} ({zone})"
    ms = int(s.get("intervalMs") or 0)
    return f"every {ms // 1000} s"


def _outcome(s: dict[str, Any]) -> str:
    last = s.get("lastOutcome")
    if not last:
        return ""
    style = OUTCOME_STYLE.get(last["type"], "")
    text = f"{last['type']} {last['tick']}"
    if last.get("reason") and last["type"] != "fired":
        text += f" ({last['reason']})"
    return f"[{style}]{text}[/{style}]" if style else text


@schedules.command("create")
@click.argument("schedule_id")
@click.option("--cron", help="Cron: 5 fields, or 6 with a leading seconds field; or @hourly, @daily ...")
@click.option("--every", help="An interval instead of a cron: 30s, 5m, 1h.")
@click.option("--tz", "time_zone", help="IANA time zone of the cron (default UTC), e.g. Europe/Paris.")
@click.option("--agent", "agent_id", required=True, help="The agent each tick's job is for.")
@click.option(
    "--kind",
    default=DEFAULT_KIND,
    show_default=True,
    help="The job payload's kind (the default is the one a deployment's own handlers take).",
)
@click.option("--payload", "payload_text", default="{}", show_default=True, help="JSON object, or @file.")
@click.option("--lane", help="chat, collect, steer or follow_up.")
@click.option("--max-attempts", type=int, help="1..8 (default 2).")
@click.option(
    "--overlap", type=click.Choice(OVERLAPS), help="While the previous job is active (default skip)."
)
@click.option("--catchup", help="Catch-up window after downtime (default 1m): 10s, 5m, 1h.")
@click.option("--jitter", help="Spread each tick's job over this much: 30s, 2m.")
@click.option("--start", "start_at", help="No tick before this time (RFC 3339).")
@click.option("--end", "end_at", help="No tick after this time (RFC 3339).")
@click.option("--paused", is_flag=True, help="Declare it paused.")
@click.option("--description", help="What it is for.")
@no_retry_option
def create(
    schedule_id: str,
    cron: str | None,
    every: str | None,
    time_zone: str | None,
    agent_id: str,
    kind: str,
    payload_text: str,
    lane: str | None,
    max_attempts: int | None,
    overlap: str | None,
    catchup: str | None,
    jitter: str | None,
    start_at: str | None,
    end_at: str | None,
    paused: bool,
    description: str | None,
) -> int:
    """Declare schedule SCHEDULE_ID; prints it as JSON. An existing id is returned unchanged."""
    if (cron is None) == (every is None):
        raise click.UsageError("give --cron or --every (exactly one)")
    job: dict[str, Any] = {"agentId": agent_id, "payload": payload_option_value(payload_text, kind)}
    if lane is not None:
        job["lane"] = lane
    if max_attempts is not None:
        job["maxAttempts"] = max_attempts
    body: dict[str, Any] = {"scheduleId": schedule_id, "job": job}
    if cron is not None:
        body["cron"] = cron
    if every is not None:
        body["intervalMs"] = timing.duration_ms(every, "--every")
    optional = {
        "timeZone": time_zone,
        "overlap": overlap,
        "catchupWindowMs": timing.duration_ms(catchup, "--catchup") if catchup else None,
        "jitterMs": timing.duration_ms(jitter, "--jitter") if jitter else None,
        "startAt": timing.at_option(start_at, "--start") if start_at else None,
        "endAt": timing.at_option(end_at, "--end") if end_at else None,
        "description": description,
        "paused": True if paused else None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    try:
        print_json(client_from_env().create_schedule(body))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


@schedules.command("list")
@click.option("--status", type=click.Choice(("active", "paused", "deleted")), help="Only this status.")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The page as JSON instead of a table.")
@no_retry_option
def list_schedules(status: str | None, limit: int, as_json: bool) -> int:
    """List schedules with their next fire time and last outcome."""
    try:
        page = client_from_env().schedules(status=status, limit=limit)
    except ReceiptError as exc:
        raise fail(exc) from exc
    if as_json:
        print_json(page)
        return 0
    table = Table("id", "when", "status", "overlap", "next fire", "last outcome", "fired/missed/skipped")
    for s in page["schedules"]:
        counts = s["counts"]
        table.add_row(
            s["id"],
            _when(s),
            s["status"],
            s["overlap"],
            s.get("nextFireAt") or "",
            _outcome(s),
            f"{counts['fired']}/{counts['missed']}/{counts['skipped']}",
        )
    console = Console()
    console.print(table)
    if page.get("nextCursor"):
        console.print("(more: raise --limit, or narrow with --status)")
    return 0


@schedules.command("show")
@click.argument("schedule_id")
@no_retry_option
def show(schedule_id: str) -> int:
    """Print one schedule as JSON."""
    try:
        print_json(client_from_env().schedule(schedule_id))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


@schedules.command("update")
@click.argument("schedule_id")
@click.option("--cron", help="A new cron (switches an interval schedule to cron).")
@click.option("--every", help="A new interval (switches a cron schedule to an interval).")
@click.option("--tz", "time_zone", help="A new IANA time zone.")
@click.option("--overlap", type=click.Choice(OVERLAPS))
@click.option("--catchup", help="A new catch-up window: 10s, 5m, 1h.")
@click.option("--jitter", help="A new jitter: 30s, 2m (0 for none).")
@click.option("--description", help="A new description.")
@no_retry_option
def update(
    schedule_id: str,
    cron: str | None,
    every: str | None,
    time_zone: str | None,
    overlap: str | None,
    catchup: str | None,
    jitter: str | None,
    description: str | None,
) -> int:
    """Change a schedule (only the options given); prints it as JSON."""
    if cron is not None and every is not None:
        raise click.UsageError("give --cron or --every, not both")
    changes: dict[str, Any] = {}
    if cron is not None:
        changes.update(cron=cron, intervalMs=None)
    if every is not None:
        changes.update(intervalMs=timing.duration_ms(every, "--every"), cron=None)
    if time_zone is not None:
        changes["timeZone"] = time_zone
    if overlap is not None:
        changes["overlap"] = overlap
    if catchup is not None:
        changes["catchupWindowMs"] = timing.duration_ms(catchup, "--catchup")
    if jitter is not None:
        changes["jitterMs"] = timing.duration_ms(jitter, "--jitter")
    if description is not None:
        changes["description"] = description
    if not changes:
        raise click.UsageError("nothing to change: give at least one option")
    try:
        print_json(client_from_env().update_schedule(schedule_id, **changes))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


@schedules.command("pause")
@click.argument("schedule_id")
@click.option("--reason", help="Recorded on the schedule.paused receipt.")
@no_retry_option
def pause(schedule_id: str, reason: str | None) -> int:
    """Pause a schedule; prints it as JSON."""
    try:
        print_json(client_from_env().pause_schedule(schedule_id, reason))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


@schedules.command("resume")
@click.argument("schedule_id")
@no_retry_option
def resume(schedule_id: str) -> int:
    """Resume a paused schedule from now; prints it as JSON."""
    try:
        print_json(client_from_env().resume_schedule(schedule_id))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


@schedules.command("delete")
@click.argument("schedule_id")
@no_retry_option
def delete(schedule_id: str) -> int:
    """Delete a schedule (its receipts and jobs stay)."""
    try:
        print_json(client_from_env().delete_schedule(schedule_id))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


@schedules.command("trigger")
@click.argument("schedule_id")
@click.option(
    "--overlap", type=click.Choice(OVERLAPS), help="This trigger's policy (default the schedule's)."
)
@click.option("-q", "--quiet", is_flag=True, help="Print only the job id (nothing when skipped).")
@no_retry_option
def trigger(schedule_id: str, overlap: str | None, quiet: bool) -> int:
    """Fire a tick now. Exits 0 when a job was enqueued, 1 when the overlap policy skipped it."""
    try:
        out = client_from_env().trigger_schedule(schedule_id, overlap)
    except ReceiptError as exc:
        raise fail(exc) from exc
    job = out.get("job")
    if quiet:
        if job:
            click.echo(job["id"])
    else:
        print_json({"outcome": out["outcome"], "job": job})
    return 0 if out["outcome"] == "fired" else 1


@schedules.command("backfill")
@click.argument("schedule_id")
@click.option("--from", "start_at", required=True, help="First time of the range (RFC 3339).")
@click.option("--to", "end_at", required=True, help="Last time of the range (RFC 3339), not after now.")
@no_retry_option
def backfill(schedule_id: str, start_at: str, end_at: str) -> int:
    """Fire every tick of a past range once (a repeated backfill enqueues nothing)."""
    try:
        out = client_from_env().backfill_schedule(
            schedule_id, timing.at_option(start_at, "--from"), timing.at_option(end_at, "--to")
        )
    except ReceiptError as exc:
        raise fail(exc) from exc
    print_json({"created": [j["id"] for j in out["created"]], "existing": out["existing"]})
    return 0


@schedules.command("fires")
@click.argument("schedule_id")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The page as JSON instead of a table.")
@no_retry_option
def fires(schedule_id: str, limit: int, as_json: bool) -> int:
    """A schedule's ticks, newest first: fired (with the job's status), missed, skipped, buffered."""
    try:
        page = client_from_env().schedule_fires(schedule_id, limit=limit)
    except ReceiptError as exc:
        raise fail(exc) from exc
    if as_json:
        print_json(page)
        return 0
    table = Table("seq", "outcome", "tick", "job", "job status", "detail")
    for f in page["fires"]:
        kind = f["type"].removeprefix("schedule.")
        style = OUTCOME_STYLE.get(kind, "")
        status = f.get("jobStatus") or ""
        status_style = STATUS_STYLE.get(status, "")
        detail = f.get("reason") or f.get("trigger") or ""
        if kind == "missed":
            detail = f"{f.get('count')} ticks {f.get('firstTick')} .. {f.get('lastTick')}"
        table.add_row(
            str(f["seq"]),
            f"[{style}]{kind}[/{style}]" if style else kind,
            f.get("tick") or f.get("lastTick") or "",
            f.get("jobId") or "",
            f"[{status_style}]{status}[/{status_style}]" if status_style else status,
            detail,
        )
    Console().print(table)
    return 0
