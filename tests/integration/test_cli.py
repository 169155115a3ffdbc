"""The operator's CLI (``receipt``), run in-process via ``app.ops.cli.main`` and once as the installed
script."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.errors import no_job_message
from app.jobs.ids import client_id_of
from app.jobs.reducer import fold
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import job_stream
from app.ops.cli import main
from app.storage import org_policies, store, tokens
from app.storage.db import api_tokens, db_now, job_tags, jobs, make_engine, org_dispatch_policies, receipts
from app.storage.queue import Queue
from tests.support.queue_ops import complete, lease

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

Capture = pytest.CaptureFixture[str]


@pytest.fixture
def cli_env(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DATABASE_URL", database_url)
    return database_url


def enqueue(queue: Queue, **body: Any) -> str:
    body.setdefault("payload", {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}})
    return queue.enqueue(validate_enqueue("factory", body)).job.id


def some_jobs(engine: Engine) -> list[str]:
    """Jobs in several states, with commands, failures and an expired lease among them."""
    q = queue_for(engine)
    queued = enqueue(q, sessionKey="s1", tags={"team": "a", "run": "r1"})
    running = enqueue(q, tags={"team": "b"})
    lease(q, running, "w1", 60_000)
    q.heartbeat(running, "w1", 1, 60_000)
    q.command(running, "steer", payload={"p": 1})
    done = enqueue(q, lane="chat")
    lease(q, done, "w1", 60_000)
    q.progress(done, "w1", 1, {"pct": 10})
    q.fail(done, "w1", 1, "flaky", retryable=True)
    lease(q, done, "w2", 60_000)
    complete(q, done, "w2", 2, {"ok": True})
    canceled = enqueue(q)
    q.cancel(canceled, "no")
    return [queued, running, done, canceled]


def test_migrate_a_fresh_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    monkeypatch.setenv("DATABASE_URL", url)
    assert main(["migrate"]) == 0
    from tests.integration.test_migrations import head_revision

    assert f"database at revision {head_revision()}" in capsys.readouterr().err
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(receipts.c.id)).all() == []
            assert conn.execute(select(jobs.c.id)).all() == []
    finally:
        engine.dispose()


def test_verify_ok(cli_env: str, engine: Engine, capsys: Capture) -> None:
    ids = some_jobs(engine)
    with engine.connect() as conn:
        total = conn.execute(text("SELECT count(*) FROM receipts")).scalar_one()
        one = len(store.read_stream(conn, job_stream(ids[2])))
    assert main(["verify"]) == 0
    assert capsys.readouterr().out == f"ok: {total} receipts verified\n"
    assert main(["verify", "--stream", job_stream(ids[2])]) == 0
    assert capsys.readouterr().out == f"ok: {one} receipts verified\n"


@pytest.mark.own_database  # turns the append-only triggers off
def test_verify_broken_exits_1_naming_the_first_broken_receipt(
    cli_env: str, engine: Engine, capsys: Capture
) -> None:
    ids = some_jobs(engine)
    with engine.connect() as conn:
        victim = store.read_stream(conn, job_stream(ids[2]))[2]
    with engine.begin() as conn:  # bypass the append-only trigger in this test's database only
        if conn.dialect.name == "sqlite":
            conn.execute(text("DROP TRIGGER receipts_no_update"))
        else:
            conn.execute(text("ALTER TABLE receipts DISABLE TRIGGER USER"))
        conn.execute(update(receipts).where(receipts.c.id == victim.id).values(type="job.completed"))
    assert main(["verify"]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert f"id={victim.id} stream={victim.stream} seq={victim.seq}" in out.err
    assert out.err.startswith("BROKEN")
    assert main(["verify", "--stream", job_stream(ids[0])]) == 0  # an untouched stream still verifies


def _stream_lines(engine: Engine, job_id: str) -> tuple[str, dict[str, Any]]:
    with engine.connect() as conn:
        stream = store.read_stream(conn, job_stream(job_id))
    job = fold(r.to_receipt() for r in stream)
    assert job is not None
    return "".join(json.dumps(r.to_json()) + "\n" for r in stream), job.to_json()


def test_replay_from_a_file_prints_the_job(
    cli_env: str, engine: Engine, tmp_path: Path, capsys: Capture
) -> None:
    ids = some_jobs(engine)
    for job_id in ids:
        lines, expected = _stream_lines(engine, job_id)
        path = tmp_path / f"{client_id_of(job_id)}.jsonl"  # a key holds '/': name the file by the client id
        path.write_text(lines + "\n")  # a trailing blank line is fine
        assert main(["replay", str(path)]) == 0
        out = capsys.readouterr()
        assert json.loads(out.out) == expected and out.err == ""
    assert queue_for(engine).get(ids[2]) is not None


def test_replay_from_stdin(
    cli_env: str, engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    job_id = some_jobs(engine)[1]
    lines, expected = _stream_lines(engine, job_id)
    for argv in (["replay"], ["replay", "-"]):
        monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out) == expected


def test_replay_needs_no_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    lines = [
        {
            "stream": "jobs/j9",
            "type": "job.enqueued",
            "body": {"jobId": "j9", "agentId": "codex", "payload": {}},
        },
        {"stream": "jobs/j9", "type": "job.leased", "body": {"workerId": "w", "attempt": 1}},
    ]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(json.dumps(x) for x in lines)))
    assert main(["replay"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert (job["id"], job["status"], job["attempt"], job["seq"]) == ("j9", "leased", 1, 2)


def test_replay_invariant_violation(tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps(
            {
                "stream": "jobs/ghost-1",
                "seq": 1,
                "type": "job.heartbeat",
                "body": {"workerId": "w", "attempt": 1},
            }
        )
        + "\n"
    )
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr()
    assert out.err == no_job_message("ghost-1") + "\n" == "Invariant: no job for ghost-1\n"
    assert out.out == ""


def test_replay_of_only_ignored_events_prints_null(tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "late.jsonl"
    path.write_text(json.dumps({"stream": "jobs/x", "type": "job.failed", "body": {"error": "late"}}) + "\n")
    assert main(["replay", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) is None


@pytest.mark.parametrize(
    "content",
    [
        "not json\n",
        '{"stream": "jobs/x", "body": {}}\n',  # no type
        '{"stream": "jobs/x", "type": "job.enqueued", "body": [1, 2]}\n',  # body not an object
        '{"stream": "jobs/x", "type": "job.enqueued", "body": "text"}\n',
        "[1, 2, 3]\n",
        '{"stream": "jobs/x", "seq": "first", "type": "job.enqueued", "body": {}}\n',
    ],
)
def test_replay_of_a_malformed_file_exits_2_naming_the_line(
    tmp_path: Path, capsys: Capture, content: str
) -> None:
    path = tmp_path / "junk.jsonl"
    path.write_text("\n" + content)
    assert main(["replay", str(path)]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("line 2: not a receipt") and out.out == ""


def test_replay_of_a_missing_file_exits_2(tmp_path: Path, capsys: Capture) -> None:
    assert main(["replay", str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl" in capsys.readouterr().err


def _rows(engine: Engine) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    with engine.connect() as conn:
        job_rows = [tuple(r) for r in conn.execute(select(jobs).order_by(jobs.c.id))]
        token_rows = [tuple(r) for r in conn.execute(select(api_tokens).order_by(api_tokens.c.id))]
        tags = select(job_tags).order_by(job_tags.c.job_id, job_tags.c.key)
        tag_rows = [tuple(r) for r in conn.execute(tags)]
        policy_rows = [
            tuple(r)
            for r in conn.execute(
                select(org_dispatch_policies).order_by(org_dispatch_policies.c.organization_id)
            )
        ]
    return job_rows, token_rows, tag_rows, policy_rows


def test_rebuild_projections_reproduces_identical_rows(cli_env: str, engine: Engine, capsys: Capture) -> None:
    some_jobs(engine)
    tokens.create(engine, "o", scopes=["commands"], expires_in=timedelta(days=90))
    revoked, _ = tokens.create(engine, "o", system=True)
    assert tokens.revoke(engine, revoked.id)
    org_policies.set_policy(engine, "heavy", 3.0, None)
    org_policies.set_policy(engine, "heavy", 2.5, 20.0, by={"tokenId": "t"})
    org_policies.set_policy(engine, "slow", None, 0.5)
    org_policies.set_policy(engine, "gone", 4.0, None)
    org_policies.set_policy(engine, "gone", None, None)  # cleared: no row
    before = _rows(engine)
    assert len(before[0]) == 4 and len(before[1]) == 2 and len(before[2]) == 3
    assert [(r[0], r[1], r[2], r[3]) for r in before[3]] == [("heavy", 2.5, 20.0, 2), ("slow", None, 0.5, 1)]

    # Damage the projections (they are not append-only), then rebuild them from receipts.
    with engine.begin() as conn:
        conn.execute(update(jobs).values(status="completed", attempt=99))
        conn.execute(api_tokens.delete().where(api_tokens.c.id == revoked.id))
        conn.execute(job_tags.delete().where(job_tags.c.key == "team"))
        conn.execute(update(job_tags).values(value="forged"))
        conn.execute(update(org_dispatch_policies).values(weight=99.0))
        conn.execute(
            org_dispatch_policies.insert().values(organization_id="gone", last_seq=1, updated_at=db_now(conn))
        )
    assert _rows(engine) != before

    assert main(["rebuild-projections"]) == 0
    assert (
        capsys.readouterr().out
        == "rebuilt 4 jobs, 2 tokens, 0 objectives, 0 schedules and 2 dispatch policies from receipts\n"
    )
    assert _rows(engine) == before
    assert main(["rebuild-projections"]) == 0  # and again: still identical
    assert _rows(engine) == before


def test_token_create_prints_only_the_token_and_revoke_disables_it(
    cli_env: str, engine: Engine, capsys: Capture
) -> None:
    assert main(["token", "create", "--org", "org-7"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert len(lines) == 1 and out.out == lines[0] + "\n"
    secret = lines[0]
    assert secret.startswith("rcpt_") and " " not in secret and secret not in out.err
    with engine.connect() as conn:
        info = tokens.authenticate(conn, secret)
    assert info is not None and info.organization_id == "org-7" and not info.system
    assert info.id in out.err

    assert main(["token", "revoke", secret]) == 0
    with engine.connect() as conn:
        assert tokens.authenticate(conn, secret) is None
    assert main(["token", "revoke", secret]) == 1  # no live token any more
    assert "no such live token" in capsys.readouterr().err


def test_token_create_system_and_revoke_by_id(cli_env: str, engine: Engine, capsys: Capture) -> None:
    assert main(["token", "create", "--org", "ops", "--system"]) == 0
    secret = capsys.readouterr().out.strip()
    with engine.connect() as conn:
        info = tokens.authenticate(conn, secret)
    assert info is not None and info.system
    assert main(["token", "revoke", info.id]) == 0
    with engine.connect() as conn:
        assert tokens.authenticate(conn, secret) is None


def test_bad_configuration_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: Capture) -> None:
    monkeypatch.setenv("JOB_LEASE_MS", "soon")
    assert main(["verify"]) == 2
    assert "JOB_LEASE_MS" in capsys.readouterr().err


def test_installed_console_script(tmp_path: Path) -> None:
    """The `receipt` entry point installed in the venv: migrate, create a token, verify."""
    script = Path(sys.executable).with_name("receipt")
    assert script.exists(), f"{script} is not installed (pip install -e .)"
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIPT_")}
    env["DATABASE_URL"] = url

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    migrated = run("migrate")
    assert migrated.returncode == 0, migrated.stderr
    created = run("token", "create", "--org", "org-x")
    assert created.returncode == 0, created.stderr
    [secret] = created.stdout.splitlines()
    verified = run("verify")
    assert (verified.returncode, verified.stdout) == (0, "ok: 1 receipts verified\n")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            info = tokens.authenticate(conn, secret)
        assert info is not None and info.organization_id == "org-x"
    finally:
        engine.dispose()


def test_token_create_with_scope_and_expiry_then_list_shows_them_without_secrets(
    cli_env: str, engine: Engine, capsys: Capture
) -> None:
    assert main(["token", "create", "--org", "org-9", "--scope", "commands", "--expires-in", "90d"]) == 0
    out = capsys.readouterr()
    secret = out.out.strip()
    assert "scopes: commands" in out.err and "expires " in out.err
    with engine.connect() as conn:
        info = tokens.authenticate(conn, secret)
    assert info is not None and info.scopes == ("commands",)
    assert info.expires_at is not None and info.created_at is not None
    assert timedelta(days=89) < info.expires_at - info.created_at <= timedelta(days=90)
    assert main(["token", "create", "--org", "ops", "--system"]) == 0
    system_secret = capsys.readouterr().out.strip()
    assert main(["token", "revoke", info.id]) == 0
    capsys.readouterr()

    assert main(["token", "list"]) == 0
    table = capsys.readouterr().out
    header, *lines = table.splitlines()
    assert header.split() == [
        "id",
        "organizationId",
        "system",
        "scopes",
        "createdAt",
        "expiresAt",
        "revokedAt",
    ]
    assert len(lines) == 2
    assert secret not in table and system_secret not in table
    assert tokens.hash_token(secret) not in table  # not even the hash
    mine = next(line.split() for line in lines if line.startswith(info.id))
    assert mine[1:4] == ["org-9", "false", "commands"]
    assert mine[6] != "-"  # revoked

    assert main(["token", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {t["organizationId"]: t["scopes"] for t in listed} == {"org-9": ["commands"], "ops": []}
    assert all(
        set(t) == {"id", "organizationId", "system", "scopes", "createdAt", "expiresAt", "revokedAt"}
        for t in listed
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--scope", "admin"], "invalid choice"),
        (["--expires-in", "90"], "not a duration"),
        (["--expires-in", "0d"], "not a duration"),
    ],
)
def test_token_create_refuses_bad_scope_or_expiry(
    cli_env: str, engine: Engine, capsys: Capture, args: list[str], named: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["token", "create", "--org", "o", *args])
    assert info.value.code == 2
    assert named in capsys.readouterr().err
    with engine.connect() as conn:
        assert tokens.list_all(conn) == []


# -- across the archive boundary ----------------------------------------------------------------------


def test_verify_and_replay_across_the_archive_boundary(
    cli_env: str, engine: Engine, tmp_path: Path, capsys: Capture
) -> None:
    from app.retention import archive
    from app.retention.policy import Policy
    from app.retention.sink import DirectorySink
    from app.storage.db import archived_streams, db_now

    ids = some_jobs(engine)
    before: dict[str, Any] = {}
    with engine.connect() as conn:
        for i in ids:
            folded = fold(r.to_receipt() for r in store.read_stream(conn, job_stream(i)))
            assert folded is not None
            before[i] = folded
    folder = tmp_path / "archive"
    totals = archive.run_pass(
        engine,
        DirectorySink(folder),
        Policy(days=30),
        page_size=1,
        clock=lambda conn: db_now(conn) + timedelta(days=31),
    )
    assert totals.jobs == 2  # the completed and the canceled job; queued and running stay
    archived_ids = [i for i in ids if before[i].terminal]
    live = [i for i in ids if i not in archived_ids]
    live_receipts = sum(before[i].seq for i in live)
    archived_receipts = sum(before[i].seq for i in archived_ids)

    assert main(["verify"]) == 0
    assert capsys.readouterr().out == (
        f"ok: {live_receipts} receipts verified; 2 tombstones of archived streams checked\n"
    )
    assert main(["verify", "--archive", str(folder)]) == 0
    assert capsys.readouterr().out == (
        f"ok: {archived_receipts} archived receipts of 2 streams in 2 segments verified "
        "against 2 tombstones\n"
    )
    for job_id in archived_ids:
        assert main(["replay", "--archive", str(folder), job_stream(job_id)]) == 0
        assert json.loads(capsys.readouterr().out) == before[job_id].to_json()
    assert main(["replay", "--archive", str(folder), job_stream(live[0])]) == 1
    assert "holds no stream" in capsys.readouterr().err

    # A tombstone whose stream still has receipts, and a segment gone: both are named.
    segment = totals.segments[0]
    (folder / f"{segment}.jsonl.gz").unlink()
    assert main(["verify", "--archive", str(folder)]) == 1
    assert f"segment {segment} is named by tombstones but is not in the archive" in capsys.readouterr().err
    with engine.begin() as conn:
        conn.execute(
            archived_streams.update()
            .where(archived_streams.c.segment == totals.segments[1])
            .values(stream=job_stream(live[0]), key=live[0])
        )
    assert main(["verify"]) == 1
    err = capsys.readouterr().err
    assert f"tombstone {job_stream(live[0])}: receipts of the stream are still in the database" in err
