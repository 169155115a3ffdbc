"""``receipt jobs …``: enqueue, list, show, cancel and follow jobs over HTTP.

``tail`` (and ``enqueue --follow``) exit with the job's end: 0 completed, 1 failed, 2 canceled;
3 when the job could not be followed (an API error, no such job, a network failure).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import click
from rich.console import Console
from rich.table import Table

from receipt.cli import GROUPS, dev, timing
from receipt.cli.output import Column, client_from_env, fail, fitted_table, no_retry_option, print_json
from receipt.client import Client, JobEvent, ReceiptError

# The exit status mirrors the job's end.
EXIT_CODES = {"completed": 0, "failed": 1, "canceled": 2}
EXIT_NOT_FOLLOWED = 3
# Consecutive failed reconnects (about a second apart) before tail gives up on the server.
FOLLOW_RECONNECTS = 30
STATUS_STYLE = {
    "queued": "cyan",
    "leased": "blue",
    "running": "blue",
    "completed": "green",
    "failed": "red",
    "canceled": "yellow",
}


@dev.group(help=GROUPS["jobs"])
def jobs() -> None:
    pass


@jobs.command("show")
@click.argument("job_id")
@no_retry_option
def show(job_id: str) -> int:
    """Print one job as JSON."""
    try:
        print_json(client_from_env().get(job_id))
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


def payload_option_value(text: str, kind: str) -> dict[str, Any]:
    """``--payload``: a JSON object, or ``@file`` holding one; ``--kind`` is set on it."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {text[1:]}: {exc.strerror}", param_hint="--payload"
            ) from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON ({exc})", param_hint="--payload") from exc
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    return {**data, "kind": kind}


# The kind of a job for an agent of the deployment's own (a handler RECEIPT_HANDLER_MODULES
# registers): the built-in kinds are a closed vocabulary, and this is the one whose contract serves
# any agent id (chat group, no command, no objective), as the README's "Using it" says.
DEFAULT_KIND = "factory.run"


def tag_option_value(tags: tuple[str, ...]) -> dict[str, str]:
    """``--tag key:value`` options as the enqueue's ``tags`` (the server checks keys and values)."""
    out: dict[str, str] = {}
    for tag in tags:
        key, sep, value = tag.partition(":")
        if not sep:
            raise click.BadParameter(f"{tag!r} is not key:value", param_hint="--tag")
        out[key] = value
    return out


def debounce_option_value(key: str | None, window_ms: int | None) -> dict[str, Any] | None:
    """``--debounce-key`` and ``--debounce-ms`` as the enqueue's ``debounce`` (the server checks them)."""
    if key is None and window_ms is None:
        return None
    if key is None or window_ms is None:
        raise click.UsageError("--debounce-key and --debounce-ms go together: the key and its window")
    return {"key": key, "windowMs": window_ms}


@jobs.command("enqueue")
@click.argument("agent_id", required=False)
@click.option(
    "--kind",
    help=f"The payload kind: one of the built-in kinds (docs/api.md). Default {DEFAULT_KIND}, the kind "
    "a deployment's own handlers (RECEIPT_HANDLER_MODULES) take.",
)
@click.option("--payload", "payload_text", default="{}", show_default=True, help="JSON object, or @file.")
@click.option("--job-id", help="Idempotency key: re-posting it returns the existing job.")
@click.option("--lane", help="chat, collect, steer or follow_up.")
@click.option("--session-key", help="Session the job belongs to.")
@click.option("--singleton-mode", help="allow, cancel or steer (with --session-key).")
@click.option("--max-attempts", type=int, help="1..8 (default 2).")
@click.option("--tag", "tags", multiple=True, help="A tag to find the job by, key:value (repeatable).")
@click.option(
    "--at",
    "run_at",
    help="Do not start before this time: RFC 3339 (2026-05-01T09:00:00Z); without an offset it is "
    "this machine's local time. A past time starts at once.",
)
@click.option(
    "--in",
    "delay",
    help="Do not start before this long from now: 90s, 10m, 1h30m, 2d, 500ms.",
)
@click.option(
    "--priority",
    type=int,
    help="-10 (runs last) .. 10 (runs first) inside the organisation's share; default 0.",
)
@click.option(
    "--concurrency-key",
    help="At most --concurrency-limit jobs of the organisation with this key run at once.",
)
@click.option(
    "--concurrency-limit",
    type=int,
    help="1..1000, with --concurrency-key (default: the operator's limit for the key, else 1).",
)
@click.option(
    "--debounce-key",
    help="Wait --debounce-ms, and replace the organisation's job still queued with this key (it ends "
    "canceled, reason debounced). With --debounce-ms; not with --at or --in.",
)
@click.option("--debounce-ms", type=int, help="The debounce window in milliseconds (1..86400000).")
@click.option("--follow", is_flag=True, help="Then follow it like `tail` (and exit like it).")
@click.option(
    "--user",
    help="authContext.userId when the payload has no authContext "
    "(default: $RECEIPT_USER, else token:<tokenId>; the organisation is always the token's).",
)
@click.option(
    "-q", "--quiet", is_flag=True, help="Print only the job id (JOB=$(receipt jobs enqueue ... -q))."
)
@click.option(
    "--from",
    "from_file",
    type=click.File("r"),
    help="Enqueue every line of a JSON-lines file (- for stdin) instead: each line one enqueue's body "
    "plus its agentId, sent in batches (POST /jobs:batch); prints one line per job.",
)
@no_retry_option
def enqueue(
    agent_id: str | None,
    kind: str | None,
    payload_text: str,
    job_id: str | None,
    lane: str | None,
    session_key: str | None,
    singleton_mode: str | None,
    max_attempts: int | None,
    tags: tuple[str, ...],
    run_at: str | None,
    delay: str | None,
    priority: int | None,
    concurrency_key: str | None,
    concurrency_limit: int | None,
    debounce_key: str | None,
    debounce_ms: int | None,
    follow: bool,
    user: str | None,
    quiet: bool,
    from_file: TextIO | None,
) -> int:
    """Enqueue a job for AGENT_ID; prints it as JSON (or follows it with --follow).

    A payload without authContext gets the token's organisation and a userId (--user). With
    --from FILE, every line of FILE is one job instead (its own agentId, kind and fields).
    """
    if quiet and follow:
        raise click.UsageError("--quiet prints the id and exits; it cannot be combined with --follow")
    if from_file is not None:
        if agent_id is not None or kind is not None or follow:
            raise click.UsageError(
                "--from takes each job's agentId and kind from its line: no AGENT_ID, --kind or --follow"
            )
        return _enqueue_lines(from_file, user=user, quiet=quiet)
    if agent_id is None:
        raise click.UsageError("AGENT_ID is required (or --from FILE)")
    payload = payload_option_value(payload_text, kind or DEFAULT_KIND)
    fields = {
        "jobId": job_id,
        "lane": lane,
        "sessionKey": session_key,
        "singletonMode": singleton_mode,
        "maxAttempts": max_attempts,
        "tags": tag_option_value(tags) or None,
        "priority": priority,
        "concurrencyKey": concurrency_key,
        "concurrencyLimit": concurrency_limit,
        "debounce": debounce_option_value(debounce_key, debounce_ms),
    }
    if run_at is not None and delay is not None:
        raise click.UsageError("--at and --in say the same thing: give one")
    client = client_from_env(user=user)
    try:
        created = client.enqueue(
            agent_id,
            payload,
            run_at=timing.at_option(run_at) if run_at is not None else None,
            delay_ms=timing.duration_ms(delay, "--in") if delay is not None else None,
            **{k: v for k, v in fields.items() if v is not None},
        )
    except ReceiptError as exc:
        raise fail(exc) from exc
    job = created["job"]
    if quiet:
        click.echo(job["id"])
        return 0
    if not follow:
        print_json(job)
        return 0
    Console(stderr=True).print(f"enqueued [bold]{job['id']}[/bold] for {agent_id}")
    return _tail(client, job["id"])


def _enqueue_lines(lines: TextIO, *, user: str | None, quiet: bool) -> int:
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise click.BadParameter(f"line {number} is not valid JSON ({exc})", param_hint="--from") from exc
        if not isinstance(entry, dict):
            raise click.BadParameter(f"line {number} is not a JSON object", param_hint="--from")
        items.append(entry)
    if not items:
        raise click.BadParameter("holds no job", param_hint="--from")
    try:
        answered = client_from_env(user=user).enqueue_many(items)
    except ReceiptError as exc:
        raise fail(exc) from exc
    for entry in answered:
        job = entry["job"]
        if quiet:
            click.echo(job["id"])
        else:
            fields = {"index": entry["index"], "created": entry["created"], "steered": entry["steered"]}
            click.echo(json.dumps({**fields, "id": job["id"], "status": job["status"]}))
    return 0


@jobs.command("list")
@click.option("--status", help="queued, leased, running, completed, failed or canceled.")
@click.option("--agent", "agent_id", help="Only this agent id.")
@click.option("--lane", help="Only this lane.")
@click.option("--kind", help="Only this payload kind.")
@click.option("--tag", help="Only jobs tagged key:value.")
@click.option("--error-prefix", help="Only jobs whose error text starts with this.")
@click.option("--since", help="Created at or after this RFC 3339 time.")
@click.option("--until", help="Created before this RFC 3339 time.")
@click.option("--cursor", help="Continue after a page (its nextCursor).")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The page as JSON instead of a table.")
@no_retry_option
def list_jobs(
    status: str | None,
    agent_id: str | None,
    lane: str | None,
    kind: str | None,
    tag: str | None,
    error_prefix: str | None,
    since: str | None,
    until: str | None,
    cursor: str | None,
    limit: int,
    as_json: bool,
) -> int:
    """List jobs, newest first; the filters combine (the server refuses a bad one, naming it)."""
    filters = {
        "status": status,
        "agentId": agent_id,
        "lane": lane,
        "kind": kind,
        "tag": tag,
        "errorPrefix": error_prefix,
        "createdAfter": since,
        "createdBefore": until,
        "cursor": cursor,
    }
    return _list_page(filters, limit, as_json, LIST_COLUMNS, _list_row)


def _list_row(job: dict[str, Any]) -> list[str]:
    style = STATUS_STYLE.get(job["status"], "")
    return [
        job["id"],
        job["agentId"],
        f"[{style}]{job['status']}[/{style}]" if style else job["status"],
        f"{job['attempt']}/{job['maxAttempts']}",
        job["lane"],
        job["updatedAt"] or "",
        job.get("availableAt") or "" if job["status"] == "queued" else "",
    ]


def _list_page(
    filters: dict[str, Any],
    limit: int,
    as_json: bool,
    columns: tuple[Column, ...],
    row: Callable[[dict[str, Any]], list[str]],
) -> int:
    """``GET /jobs`` with the filters given, printed as JSON or as a table of ``row(job)``."""
    try:
        page = client_from_env().list(limit=limit, **{k: v for k, v in filters.items() if v is not None})
    except ReceiptError as exc:
        raise fail(exc) from exc
    if as_json:
        print_json(page)
        return 0
    console = Console()
    # Narrow terminals lose the right-hand columns first; an id is never cut short.
    console.print(fitted_table(columns, [row(job) for job in page["jobs"]], console.width))
    if page.get("nextCursor"):
        console.print(f"(more: --cursor {page['nextCursor']}, or narrow the filters)")
    return 0


LIST_COLUMNS = (
    Column("id", ident=True),
    Column("agent"),
    Column("status"),
    Column("attempt"),
    Column("lane"),
    Column("updated"),
    Column("not before"),
)


@jobs.command("waiting")
@click.option("--agent", "agent_id", help="Only this agent id.")
@click.option("--kind", help="Only this payload kind.")
@click.option("--tag", help="Only jobs tagged key:value.")
@click.option("--cursor", help="Continue after a page (its nextCursor).")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The page as JSON instead of a table.")
@no_retry_option
def waiting(
    agent_id: str | None, kind: str | None, tag: str | None, cursor: str | None, limit: int, as_json: bool
) -> int:
    """Queued jobs, newest first, each with why it waits: concurrency (its key runs its limit),
    rate (a rate limit has no allowance), share (other organisations' turns), or not before a time."""
    filters = {"status": "queued", "agentId": agent_id, "kind": kind, "tag": tag, "cursor": cursor}
    return _list_page(filters, limit, as_json, WAITING_COLUMNS, _waiting_row)


def _waiting_row(job: dict[str, Any]) -> list[str]:
    why = job.get("waiting") or {}
    reason = why.get("reason") or ("not before" if job.get("availableAt") else "sent")
    return [
        job["id"],
        job["agentId"],
        reason,
        why.get("key") or "",
        job.get("availableAt") or "",
        job["updatedAt"] or "",
    ]


WAITING_COLUMNS = (
    Column("id", ident=True),
    Column("agent"),
    Column("waiting"),
    Column("key"),
    Column("not before"),
    Column("queued since"),
)


@jobs.command("replay")
@click.argument("job_id")
@click.option(
    "--replay-key", help="Derive the new job's id from this key (default 1): re-running is idempotent."
)
@click.option("--job-id", "new_id", help="Choose the new job's id instead.")
@click.option(
    "--payload", "payload_text", help="An edited payload (JSON object, or @file); default: the job's."
)
@click.option("--tag", "tags", multiple=True, help="The new job's tags, key:value (default: the job's).")
@no_retry_option
def replay(
    job_id: str, replay_key: str | None, new_id: str | None, payload_text: str | None, tags: tuple[str, ...]
) -> int:
    """Replay an ended job as a new one (same or edited payload); prints {job, created, replayOf}."""
    client = client_from_env()
    fields: dict[str, Any] = {"replayKey": replay_key, "jobId": new_id}
    if tags:
        fields["tags"] = tag_option_value(tags)
    try:
        if payload_text is not None:
            kind = str(client.get(job_id)["payload"].get("kind", ""))
            fields["payload"] = client.with_auth_context(payload_option_value(payload_text, kind))
        answer = client.replay(job_id, **{k: v for k, v in fields.items() if v is not None})
    except ReceiptError as exc:
        raise fail(exc) from exc
    print_json(answer)
    return 0


@jobs.command("dead-letters")
@click.option("--agent", "agent_id", help="Only this agent id.")
@click.option("--kind", help="Only this payload kind.")
@click.option("--error-prefix", help="Only errors starting with this.")
@click.option(
    "--replay",
    "replay_key",
    metavar="KEY",
    help="Replay every dead letter the filters select instead (POST /jobs:bulk, idempotency key KEY: "
    "running it again replays nothing twice); prints the progress of each page.",
)
@click.option("--dry-run", is_flag=True, help="With --replay: only count and sample.")
@click.option("--org", "organization_id", help="The organisation (required with a system token).")
@click.option("--json", "as_json", is_flag=True, help="The view as JSON instead of a table.")
@no_retry_option
def dead_letters(
    agent_id: str | None,
    kind: str | None,
    error_prefix: str | None,
    replay_key: str | None,
    dry_run: bool,
    organization_id: str | None,
    as_json: bool,
) -> int:
    """Jobs that failed for good, per agent and kind with counts by error; --replay KEY re-runs them."""
    filters = {"agentId": agent_id, "kind": kind, "errorPrefix": error_prefix}
    chosen = {k: v for k, v in filters.items() if v is not None}
    client = client_from_env()
    try:
        if replay_key is None and not dry_run:
            view = client.dead_letters(organization_id=organization_id, **chosen)
        else:
            return _replay_dead_letters(client, chosen, replay_key, dry_run, organization_id)
    except ReceiptError as exc:
        raise fail(exc) from exc
    if as_json:
        print_json(view)
        return 0
    table = Table("agent", "kind", "count", "error", "of these")
    for group in view["groups"]:
        for i, error in enumerate(group["errors"]):
            first = i == 0
            table.add_row(
                group["agentId"] if first else "",
                group["kind"] if first else "",
                str(group["count"]) if first else "",
                error["error"] or "(no error text)",
                str(error["count"]),
            )
    Console().print(table)
    return 0


def _replay_dead_letters(
    client: Any, filters: dict[str, str], key: str | None, dry_run: bool, organization_id: str | None
) -> int:
    flt = {"status": "failed", **filters}
    if dry_run:
        print_json(client.bulk(organization_id=organization_id, action="replay", filter=flt, dryRun=True))
        return 0
    cursor = None
    while True:
        body: dict[str, Any] = {"action": "replay", "filter": flt, "idempotencyKey": key}
        if cursor is not None:
            body["cursor"] = cursor
        progress = client.bulk(organization_id=organization_id, **body)
        click.echo(
            json.dumps({k: progress[k] for k in ("processed", "affected", "skipped", "matched", "done")})
        )
        cursor = progress["nextCursor"]
        if cursor is None:
            return 0


@jobs.command("cancel")
@click.argument("job_id")
@click.option("--reason", help="Recorded on the cancel (or abort) receipt.")
@no_retry_option
def cancel(job_id: str, reason: str | None) -> int:
    """Cancel a job (a running one is sent an abort); prints the job as JSON."""
    try:
        print_json(client_from_env().cancel(job_id, reason)["job"])
    except ReceiptError as exc:
        raise fail(exc) from exc
    return 0


@jobs.command("tail")
@click.argument("job_id")
@no_retry_option
def tail(job_id: str) -> int:
    """Follow a job live: status changes and progress as they happen.

    Exits 0 when it completes, 1 when it fails, 2 when it is canceled (3: could not follow).
    """
    return _tail(client_from_env(), job_id)


def _describe(event: JobEvent) -> str:
    job = event.job
    style = STATUS_STYLE.get(event.status, "")
    lease = job.get("lease") or {}
    who = f" by {lease['workerId']}" if lease.get("workerId") else ""
    return f"[{style}]{event.status}[/{style}] attempt {job.get('attempt', 0)}{who}"


def _tail(client: Client, job_id: str) -> int:
    out = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    last_status: str | None = None
    last_progress: Any = None
    final: JobEvent | None = None
    try:
        # The spinner draws on a terminal only; piped output gets the plain lines.
        with err.status(f"following {job_id}", spinner="dots") as spinner:
            for event in client.follow(job_id, max_reconnects=FOLLOW_RECONNECTS):
                job = event.job
                if event.status != last_status or event.terminal:
                    out.print(f"{event.seq:>4}  {_describe(event)}")
                    last_status = event.status
                if job.get("progress") is not None and job["progress"] != last_progress:
                    last_progress = job["progress"]
                    out.print(f"{event.seq:>4}  progress {json.dumps(last_progress, sort_keys=True)}")
                spinner.update(f"{job_id}: {event.status} (seq {event.seq})")
                final = event
    except ReceiptError as exc:
        err.print(f"[red]{exc.code}: {exc.message}[/red]")
        return EXIT_NOT_FOLLOWED
    except Exception as exc:  # network failure past the client's reconnects
        err.print(f"[red]could not follow {job_id}: {exc}[/red]")
        return EXIT_NOT_FOLLOWED
    if final is None:
        return EXIT_NOT_FOLLOWED
    job = final.job
    if final.status == "completed":
        out.print(f"result {json.dumps(job.get('result'), sort_keys=True)}")
    elif job.get("error") is not None:
        out.print(f"error {json.dumps(job.get('error'), sort_keys=True)}")
    return EXIT_CODES.get(final.status, EXIT_NOT_FOLLOWED)
