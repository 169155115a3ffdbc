"""``receipt``: the one command line, operator verbs and developer groups.

Verbs: migrate, verify, replay, rebuild-projections, rebuild-ledger, token create|list|revoke, config,
callbacks, dead-letters, up, logs. Every verb reads configuration from the environment through
``Settings`` and nothing else. The developer groups (``jobs``, ``objective``) talk HTTP to
``RECEIPT_URL`` and live in ``receipt.cli``; they are listed here so ``receipt --help`` shows every command.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.exc import SQLAlchemyError

from app.config import Settings, mask_url, redacted, settings_markdown_table
from app.jobs.errors import InvariantError
from app.jobs.privilege import TOKEN_SCOPES
from app.jobs.reducer import Receipt, fold
from app.jobs.vocab import job_stream
from app.ops import preflight
from app.ops.preflight import Schema
from app.redaction import redactor
from app.storage.db import engine_for, iso, transaction


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from app.storage.migrate import current, upgrade

    engine = engine_for(settings)
    upgrade(engine)
    shown = mask_url(engine.url.render_as_string(hide_password=False))
    print(f"database at revision {current(engine)} ({shown})", file=sys.stderr)
    return 0


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from app.retention import verify as archived
    from app.retention.sink import DirectorySink
    from app.storage import store

    if args.archive is not None:
        with engine_for(settings).connect() as conn:
            report = archived.verify_archive(DirectorySink(Path(args.archive)), conn)
        if not report.ok:
            _print_problems(report)
            return 1
        print(
            f"ok: {report.receipts} archived receipts of {report.streams} streams in {report.segments} "
            f"segments verified against {report.tombstones} tombstones"
            + (f" ({report.unreferenced} unreferenced copies)" if report.unreferenced else "")
        )
        return 0
    with engine_for(settings).connect() as conn:
        checked, broken = store.verify(conn, stream=args.stream)
        report = archived.verify_tombstones(conn) if args.stream is None else archived.Report()
    if broken is not None:
        r = broken.receipt
        print(f"BROKEN at receipt id={r.id} stream={r.stream} seq={r.seq}: {broken.reason}", file=sys.stderr)
        return 1
    if not report.ok:
        _print_problems(report)
        return 1
    tail = f"; {report.tombstones} tombstones of archived streams checked" if report.tombstones else ""
    print(f"ok: {checked} receipts verified{tail}")
    return 0


def _print_problems(report: Any) -> None:
    for problem in report.problems:
        print(f"BROKEN: {problem}", file=sys.stderr)
    if report.more_problems:
        print(f"... and {report.more_problems} more", file=sys.stderr)


def read_receipts(source: TextIO) -> list[Receipt]:
    """Receipts as JSON lines: ``{"stream"?, "seq"?, "type", "body", "at"?}`` per line."""
    out: list[Receipt] = []
    for n, line in enumerate(source, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            body = data.get("body") or {}
            if not isinstance(body, dict):
                # The reducer folds objects only; anything else would crash it with a traceback.
                raise TypeError(f"body must be an object, not {type(body).__name__}")
            out.append(
                Receipt(
                    stream=str(data.get("stream", job_stream("unknown"))),
                    seq=int(data.get("seq", n)),
                    type=str(data["type"]),
                    body=body,
                    at=data.get("at"),
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"line {n}: not a receipt ({exc})") from exc
    return out


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    if args.archive is not None:
        return _replay_archived(args, settings)
    try:
        if args.file and args.file != "-":
            with open(args.file, encoding="utf-8") as fh:
                receipts = read_receipts(fh)
        else:
            receipts = read_receipts(sys.stdin)
    except (ValueError, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return _print_fold(receipts)


def _replay_archived(args: argparse.Namespace, settings: Settings) -> int:
    """``replay --archive DIR STREAM``: fold a stream the archiving pass moved out."""
    from app.retention import verify as archived
    from app.retention.sink import DirectorySink

    if not args.file or args.file == "-":
        print(
            "replay --archive needs the stream to read (e.g. jobs/<organizationId>/<jobId>)", file=sys.stderr
        )
        return 2
    sink = DirectorySink(Path(args.archive))
    try:
        try:
            with engine_for(settings).connect() as conn:
                lines = archived.read_stream(sink, args.file, conn)
        except SQLAlchemyError:
            # No database to say which segment holds it (an archive read elsewhere): search them all.
            lines = archived.read_stream(sink, args.file)
    except KeyError:
        print(f"the archive in {args.archive} holds no stream {args.file}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    receipts = [Receipt(r["stream"], int(r["seq"]), r["type"], r["body"], r["at"]) for r in lines]
    return _print_fold(receipts)


def _print_fold(receipts: list[Receipt]) -> int:
    from app.factory.reducer import fold as fold_objective
    from app.factory.vocab import OBJECTIVE_STREAM_PREFIX
    from app.schedules.reducer import fold as fold_schedule
    from app.schedules.vocab import SCHEDULE_STREAM_PREFIX

    try:
        if receipts and receipts[0].stream.startswith(SCHEDULE_STREAM_PREFIX):
            schedule = fold_schedule(receipts)
            out = schedule.to_json() if schedule is not None else None
        elif receipts and receipts[0].stream.startswith(OBJECTIVE_STREAM_PREFIX):
            # An objectives/<id> stream folds with the objective reducer.
            obj = fold_objective(receipts)
            out = None
            if obj is not None:
                out = {**obj.header_json(), "tasks": [obj.tasks[t].to_json() for t in obj.task_order]}
        else:
            job = fold(receipts)
            out = job.to_json() if job else None
    except InvariantError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    from app.factory import storage as objective_storage
    from app.schedules import storage as schedule_storage
    from app.storage import org_policies, projection, tokens

    with transaction(engine_for(settings)) as conn:
        n_jobs = projection.rebuild(conn)
        n_tokens = tokens.rebuild(conn)
        n_objectives = objective_storage.rebuild(conn)
        n_schedules = schedule_storage.rebuild(conn)
        n_policies = org_policies.rebuild(conn)
    print(
        f"rebuilt {n_jobs} jobs, {n_tokens} tokens, {n_objectives} objectives, {n_schedules} "
        f"schedules and {n_policies} dispatch policies from receipts"
    )
    return 0


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s`` or ``2w``: a positive whole number and one unit."""
    value, unit = text.strip()[:-1], text.strip()[-1:].lower()
    if unit not in _DURATION_UNITS or not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: use a positive whole number and one of s, m, h, d, w (e.g. 90d)"
        )
    return timedelta(seconds=int(value) * _DURATION_UNITS[unit])


def cmd_rebuild_ledger(args: argparse.Namespace, settings: Settings) -> int:
    from app.factory import ledger

    counts = ledger.rebuild(engine_for(settings))
    print(
        f"rebuilt the durable ledger from receipts: {counts['workflows']} workflows and "
        f"{counts['activities']} activities over {counts['jobs']} jobs"
    )
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    from app.storage import tokens

    engine = engine_for(settings)
    if args.token_cmd == "create":
        try:
            info, secret = tokens.create(
                engine, args.org, system=args.system, scopes=args.scope or (), expires_in=args.expires_in
            )
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        extra = [" (system)" if info.system else ""]
        if info.scopes:
            extra.append(f" scopes: {', '.join(info.scopes)}")
        if info.expires_at is not None:
            extra.append(f" expires {iso(info.expires_at)}")
        print(
            f"created token {info.id} for organization {info.organization_id}{''.join(extra)}",
            file=sys.stderr,
        )
        print(secret)  # alone on stdout, so scripts can capture it
        return 0
    if args.token_cmd == "list":
        with engine.connect() as conn:
            listed = [t.to_json() for t in tokens.list_all(conn)]
        if args.json:
            print(json.dumps(listed, indent=2))
            return 0
        columns = ("id", "organizationId", "system", "scopes", "createdAt", "expiresAt", "revokedAt")
        rows = [[_cell(t[c]) for c in columns] for t in listed]
        widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
        for line in [list(columns), *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        return 0
    if tokens.revoke(engine, args.token):
        print("revoked", file=sys.stderr)
        return 0
    print("no such live token", file=sys.stderr)
    return 1


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value).lower() if isinstance(value, bool) else str(value)


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    if args.markdown:
        print(settings_markdown_table())
    else:
        # Never a password or token on screen (nor in a terminal's scrollback): every value marked
        # secret in app/config.py is ***, every URL setting shows no password or query string.
        print(json.dumps(redacted(settings), indent=2))
    return 0


def cmd_callbacks(args: argparse.Namespace, settings: Settings) -> int:
    """The callback outbox: counts by state, then the newest rows (dead letters with --state dead)."""
    from app.storage import outbox

    engine = engine_for(settings)
    with engine.connect() as conn:
        counts = outbox.counts(conn)
        rows = outbox.listing(conn, args.state, args.limit)
    hide = redactor(settings)
    for row in rows:
        # A target is a callback URL setting (its password and query shown as ***); an error
        # recorded by an older sender may quote it.
        row["target"] = mask_url(str(row["target"]))
        if row.get("last_error"):
            row["last_error"] = hide(str(row["last_error"]))
    print(json.dumps({"counts": counts, "rows": rows}, indent=2, default=str))
    return 0


def cmd_dead_letters(args: argparse.Namespace, settings: Settings) -> int:
    """Broker messages no worker could decode, newest first (app/ops/dead_letters.py)."""
    from app.ops import dead_letters

    found = dead_letters.store_for(settings).listed(args.limit)
    print(json.dumps({"count": len(found), "rows": [d.as_json() for d in found]}, indent=2))
    return 0


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from app.ops.supervisor import run_up

    return run_up(settings, port=args.port, host=args.host, verbose=args.verbose)


def cmd_logs(args: argparse.Namespace, settings: Settings) -> int:
    from app.ops.logtail import show

    try:
        return show(settings, args.role, follow=args.follow, lines=args.lines, out=sys.stdout)
    except KeyboardInterrupt:
        return 0


DEVELOPER_GROUPS = ("jobs", "objective")
# What each verb checks before it runs (app/ops/preflight.py): the schema it needs (None: it opens
# no database) and whether it needs the broker. `migrate` and `up` bring the schema to the last
# migration themselves; the other database verbs need it there. `migrate` touches only the
# database: a platform's release phase must not fail because an unrelated service is down.
PREFLIGHT: dict[str, tuple[Schema | None, bool]] = {
    "migrate": (Schema.ANY, False),
    "up": (Schema.ANY, True),
    "verify": (Schema.HEAD, False),
    "rebuild-projections": (Schema.HEAD, False),
    "rebuild-ledger": (Schema.HEAD, False),
    "token": (Schema.HEAD, False),
    "callbacks": (Schema.HEAD, False),
    "dead-letters": (None, True),
}
# The process names `receipt up` supervises (app.ops.supervisor.process_specs), one log file each.
SUPERVISED_ROLES = ("web", "driver", "chat", "codex", "control", "beat")


def build_parser() -> argparse.ArgumentParser:
    from receipt.cli import GROUPS

    p = argparse.ArgumentParser(
        prog="receipt",
        description="Receipt: durable background jobs.",
        epilog="`receipt COMMAND --help` describes one command; jobs and objective talk HTTP to "
        "RECEIPT_URL with RECEIPT_TOKEN (the export line `receipt up` prints).",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser("migrate", help="bring the database to the latest schema").set_defaults(fn=cmd_migrate)
    v = sub.add_parser(
        "verify", help="recompute every receipt hash chain, and check the tombstones of archived streams"
    )
    v.add_argument("--stream", help="verify only this stream")
    v.add_argument(
        "--archive",
        metavar="DIR",
        help="verify the archive in DIR instead: every archived chain, held against its tombstone",
    )
    v.set_defaults(fn=cmd_verify)
    r = sub.add_parser(
        "replay",
        help="fold receipts (JSON lines) and print the job (or the objective, for objectives/ streams)",
    )
    r.add_argument(
        "file", nargs="?", help="file of JSON lines (default: stdin); with --archive, the stream to read"
    )
    r.add_argument("--archive", metavar="DIR", help="read the stream from the archive in DIR")
    r.set_defaults(fn=cmd_replay)
    sub.add_parser(
        "rebuild-projections",
        help="rebuild the jobs, token, objective, schedule and dispatch-policy tables from receipts",
    ).set_defaults(fn=cmd_rebuild)
    sub.add_parser(
        "rebuild-ledger", help="rebuild the durable ledger (workflows, activities) from receipts"
    ).set_defaults(fn=cmd_rebuild_ledger)
    t = sub.add_parser("token", help="create, list or revoke API tokens")
    tsub = t.add_subparsers(dest="token_cmd", required=True)
    tc = tsub.add_parser("create", help="create a token; prints it alone on stdout")
    tc.add_argument("--org", required=True, help="organization id the token acts for")
    tc.add_argument("--system", action="store_true", help="may act for any organization")
    tc.add_argument(
        "--scope",
        action="append",
        choices=TOKEN_SCOPES,
        help="grant a scope (repeatable); 'commands' may post jobs that run a command",
    )
    tc.add_argument("--expires-in", type=parse_duration, help="e.g. 90d, 12h, 30m (default: never)")
    tl = tsub.add_parser("list", help="list tokens (never their secrets)")
    tl.add_argument("--json", action="store_true", help="JSON instead of a table")
    tr = tsub.add_parser("revoke", help="revoke a token (by id or by the token itself)")
    tr.add_argument("token")
    t.set_defaults(fn=cmd_token)
    c = sub.add_parser("config", help="print the configuration")
    c.add_argument("--markdown", action="store_true", help="the README's configuration table")
    c.set_defaults(fn=cmd_config)
    cb = sub.add_parser(
        "callbacks", help="list the callback outbox (dead-lettered callbacks with --state dead)"
    )
    cb.add_argument("--state", choices=("pending", "delivered", "dead"), help="only rows in this state")
    cb.add_argument("--limit", type=int, default=100)
    cb.set_defaults(fn=cmd_callbacks)
    dl = sub.add_parser(
        "dead-letters", help="list broker messages no worker could decode (kept aside, newest first)"
    )
    dl.add_argument("--limit", type=int, default=100)
    dl.set_defaults(fn=cmd_dead_letters)
    u = sub.add_parser("up", help="run the whole system on this machine")
    u.add_argument("--port", type=int, default=8080)
    u.add_argument("--host", default="127.0.0.1")
    u.add_argument("--verbose", action="store_true", help="stream every process's log, prefixed")
    u.set_defaults(fn=cmd_up)
    lg = sub.add_parser("logs", help="print (or -f follow) the logs `receipt up` writes")
    lg.add_argument("role", nargs="?", choices=SUPERVISED_ROLES, help="one process (default: all)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C")
    lg.add_argument("-n", "--lines", type=int, default=50, help="lines of history per file (default 50)")
    lg.set_defaults(fn=cmd_logs)
    for name, summary in GROUPS.items():
        # Listed for --help only: main() hands these groups to receipt.cli before argparse runs.
        sub.add_parser(name, help=summary, add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from receipt.cli import GROUPS

    if argv and argv[0] in GROUPS:
        # The developer verbs talk HTTP only; they live in the client package (click + rich).
        from receipt.cli import main as developer_main

        return developer_main(argv)
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    schema, broker = PREFLIGHT.get(args.cmd, (None, False))
    found = preflight.problems(settings, database=schema, broker=broker)
    if found:
        preflight.report(found)
        return preflight.EXIT_CODE
    code: int = args.fn(args, settings)
    return code


if __name__ == "__main__":
    sys.exit(main())
