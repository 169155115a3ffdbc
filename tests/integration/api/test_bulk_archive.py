"""POST /jobs:bulk with action archive, and GET /operations/{operationId}: the ended jobs a filter
selects leave the database as the archiving pass moves them (segment, tombstones, guarded removal),
each with its own job.archived receipt, audited on the operation's stream; a job that has not ended,
or that a live objective owns, is skipped and counted. On both backends."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.jobs.vocab import job_stream
from app.ops import bulk_actions
from app.ops.bulk_actions import operation_stream
from app.retention import verify
from app.retention.sink import DirectorySink
from app.storage import search, store, tombstones
from app.storage.db import job_tags, jobs
from tests.support.api import ORG_A, ORG_B, Api, json_of, key, payload


def _bulk(api: Api, who: str = "a", query: Mapping[str, str] | None = None, **body: Any) -> Any:
    return api.client.post("/jobs:bulk", json=body, query_string=dict(query or {}), headers=api.headers(who))


def _failed(api: Api, tag: str, who: str = "a") -> dict[str, Any]:
    org = ORG_B if who == "b" else ORG_A
    job = api.job(who, payload=payload(org=org), tags={"run": tag})
    api.queue.fail(key(job), None, None, "command exited with 1", retryable=False)
    return job


def _sink(api: Api) -> DirectorySink:
    return DirectorySink(api.state.settings.archive_path)


def _types(api: Api, stream: str) -> list[str]:
    with api.engine.connect() as conn:
        return [r.type for r in store.read_stream(conn, stream)]


def _archived_chain(api: Api, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    return verify.read_stream(_sink(api), job_stream(key(job)))


def test_a_bulk_archive_moves_the_ended_jobs_and_skips_the_rest(api: Api) -> None:
    ended = [_failed(api, "arch") for _ in range(3)]
    canceled = api.job(tags={"run": "arch"})
    api.queue.cancel(key(canceled), "no")
    ended.append(canceled)
    waiting = [api.job(tags={"run": "arch"}) for _ in range(2)]  # queued: skipped, not an error
    theirs = _failed(api, "arch", who="b")  # another organisation's: never reached
    flt = {"tag": "run:arch"}

    dry = json_of(_bulk(api, action="archive", filter=flt, dryRun=True))
    assert dry["count"] == 6
    before = api.receipt_count()
    first = json_of(_bulk(api, action="archive", filter=flt, idempotencyKey="tidy-1", limit=4))
    assert (first["matched"], first["processed"], first["done"]) == (6, 4, False)
    again = json_of(_bulk(api, action="archive", filter=flt, idempotencyKey="tidy-1", limit=4))
    assert again["repeated"] is True and again["nextCursor"] == first["nextCursor"]
    rest = json_of(
        _bulk(api, action="archive", filter=flt, idempotencyKey="tidy-1", limit=4, cursor=first["nextCursor"])
    )
    assert (rest["processed"], rest["affected"], rest["skipped"], rest["done"]) == (6, 4, 2, True)
    assert api.receipt_count() < before  # the ended jobs' receipts left for the archive

    for job in ended:
        gone = api.client.get(f"/jobs/{job['id']}", headers=api.headers())
        assert gone.status_code == 410, gone.json
        chain = _archived_chain(api, job)
        # Its own receipt is the last of its archived chain, naming the operation.
        assert chain[-1]["type"] == "job.archived" and chain[-1]["body"] == {"operationId": "tidy-1"}
        assert [r["type"] for r in chain].count("job.archived") == 1
    for job in waiting:
        assert (
            json_of(api.client.get(f"/jobs/{job['id']}", headers=api.headers()))["job"]["status"] == "queued"
        )
    assert (
        json_of(api.client.get(f"/jobs/{theirs['id']}", headers=api.headers("b")))["job"]["status"]
        == "failed"
    )
    with api.engine.connect() as conn:
        # Each archived job's tag rows went with its row; the others' stayed.
        tagged = {r.job_id for r in conn.execute(select(job_tags.c.job_id))}
        assert tagged == {key(j) for j in [*waiting, theirs]}
        found = [tombstones.find(conn, job_stream(key(j))) for j in ended]
        archive_report = verify.verify_archive(_sink(api), conn)
        live_report = verify.verify_tombstones(conn)
    assert all(t is not None and t.segment.startswith(bulk_actions.ARCHIVE_SEGMENT_PREFIX) for t in found)
    assert archive_report.ok and live_report.ok, archive_report.problems + live_report.problems
    assert archive_report.streams == 4

    audit = _types(api, operation_stream(ORG_A, "tidy-1"))
    assert audit == ["operation.started", "operation.page", "operation.page"]
    shown = json_of(api.client.get("/operations/tidy-1", headers=api.headers()))["operation"]
    assert (shown["action"], shown["matched"], shown["affected"], shown["skipped"]) == ("archive", 6, 4, 2)
    assert (shown["pages"], shown["done"], shown["filter"]) == (2, True, flt)
    assert shown["by"]["tokenId"] is not None and shown["stream"] == operation_stream(ORG_A, "tidy-1")


def test_an_objectives_ended_job_stays_with_its_live_objective(api: Api) -> None:
    objective = api.objective()
    owned = api.job(
        agent="factory-control",
        payload=payload("factory.objective.audit", objectiveId=objective["id"]),
        tags={"run": "obj"},
    )
    api.queue.fail(key(owned), None, None, "audit failed", retryable=False)
    lone = _failed(api, "obj")
    body = json_of(_bulk(api, action="archive", filter={"tag": "run:obj"}, idempotencyKey="obj-1"))
    assert (body["affected"], body["skipped"]) == (1, 1)
    assert api.client.get(f"/jobs/{lone['id']}", headers=api.headers()).status_code == 410
    kept = api.client.get(f"/jobs/{owned['id']}", headers=api.headers())
    assert kept.status_code == 200 and "job.archived" not in _types(api, owned["stream"])


def test_a_page_redone_after_a_crash_archives_once(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash after the jobs' job.archived receipts and before their archive commits: the same page
    again writes no second receipt and archives them."""
    made = [_failed(api, "crash") for _ in range(3)]
    flt = search.JobFilter(tag=("run", "crash"))
    sink = _sink(api)

    class Dies(Exception):
        pass

    real_write = sink.write

    def dying(name: str, lines: Any) -> Any:
        raise Dies(name)

    monkeypatch.setattr(sink, "write", dying)

    def page() -> bulk_actions.Progress:
        return bulk_actions.run_page(
            api.queue,
            organization_id=ORG_A,
            key="crash-1",
            action="archive",
            f=flt,
            by={"test": True},
            cursor=None,
            limit=10,
            sink=sink,
        )

    with pytest.raises(Dies):
        page()
    for job in made:  # recorded, still in the database, its stream whole
        assert _types(api, job["stream"])[-1] == "job.archived"
        assert api.client.get(f"/jobs/{job['id']}", headers=api.headers()).status_code == 200
    assert _types(api, operation_stream(ORG_A, "crash-1")) == []  # no page recorded: it is redone
    monkeypatch.setattr(sink, "write", real_write)
    done = page()
    assert (done.affected, done.skipped, done.done) == (3, 0, True)
    for job in made:
        assert [r["type"] for r in _archived_chain(api, job)].count("job.archived") == 1
    with api.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 0
        assert verify.verify_archive(sink, conn).ok


def test_operation_progress_is_per_organisation_and_a_system_token_names_it(api: Api) -> None:
    _failed(api, "p")
    started = _bulk(api, action="replay", filter={"tag": "run:p"}, idempotencyKey="prog-1")
    assert started.status_code == 200, started.json
    mine = api.client.get("/operations/prog-1", headers=api.headers())
    assert mine.status_code == 200 and json_of(mine)["operation"]["affected"] == 1
    # B cannot tell A's operation from a key no one used.
    theirs = api.client.get("/operations/prog-1", headers=api.headers("b"))
    nobody = api.client.get("/operations/never-used", headers=api.headers("b"))
    assert theirs.status_code == nobody.status_code == 404
    assert json_of(theirs) == json_of(nobody)
    # A system token must name the organisation, for the progress as for the action.
    unnamed = api.client.get("/operations/prog-1", headers=api.headers("system"))
    assert unnamed.status_code == 403 and json_of(unnamed)["error"]["details"]["field"] == "organizationId"
    named = api.client.get(
        "/operations/prog-1", query_string={"organizationId": ORG_A}, headers=api.headers("system")
    )
    assert json_of(named)["operation"]["operationId"] == "prog-1"
    action = _bulk(api, "system", action="archive", filter={}, dryRun=True)
    assert action.status_code == 403 and json_of(action)["error"]["details"]["field"] == "organizationId"
    bad = api.client.get("/operations/bad key", headers=api.headers())
    assert bad.status_code == 400 and json_of(bad)["error"]["details"]["field"] == "operationId"


def test_the_archive_goes_where_the_deployment_keeps_it(api: Api, tmp_path: Path) -> None:
    job = _failed(api, "where")
    json_of(_bulk(api, action="archive", filter={"tag": "run:where"}, idempotencyKey="where-1"))
    names = _sink(api).names()
    assert len(names) == 1 and names[0].startswith(bulk_actions.ARCHIVE_SEGMENT_PREFIX)
    assert str(api.state.settings.archive_path).startswith(str(tmp_path))
    assert _archived_chain(api, job)[0]["type"] == "job.enqueued"
