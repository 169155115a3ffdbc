"""Property tests of the pure Factory core (random DAGs with random outcomes).

Whatever order control steps, stale steps and job progress interleave in, and however often a
step repeats, the objective ends in the same terminal state: under ``continue`` every task's
status is fixed by the outcomes alone; under ``failFast`` the objective's status is, and no task
is left pending or active. Every task's job is created at most once (deterministic job ids).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.factory import control
from tests.support.examples import examples
from tests.unit.factory_sim import World


@st.composite
def dags(draw: Any) -> tuple[dict[str, list[str]], dict[str, str]]:
    n = draw(st.integers(min_value=1, max_value=9))
    ids = [f"t{i}" for i in range(n)]
    deps = {}
    for i, tid in enumerate(ids):
        deps[tid] = sorted(draw(st.sets(st.sampled_from(ids[:i]), max_size=3))) if i else []
    outcomes = {tid: draw(st.sampled_from(["ok", "ok", "ok", "fail"])) for tid in ids}
    # Present the plan in a shuffled order: nothing may depend on the order tasks are listed in.
    order = draw(st.permutations(ids))
    return {t: deps[t] for t in order}, outcomes


def expected_continue(deps: dict[str, list[str]], outcomes: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}

    def status(t: str) -> str:
        if t not in out:
            if any(status(d) != "completed" for d in deps[t]):
                out[t] = "skipped"
            else:
                out[t] = "completed" if outcomes[t] == "ok" else "failed"
        return out[t]

    for t in deps:
        status(t)
    return out


def run(world: World, choices: Any) -> World:
    """Interleave control steps (fresh, stale, repeated) with job progress until nothing moves."""
    stale: list[tuple[int, control.Decision]] = []
    for _ in range(2000):
        if world.quiet():
            for at, d in stale:
                world.apply(at, d, acted=True)  # late stale steps must change nothing that matters
            stale.clear()
            if world.quiet():
                break
        action = choices.draw(st.integers(min_value=0, max_value=5))
        active = world.active_jobs()
        if action <= 1 and active:
            world.advance(choices.draw(st.sampled_from(active)))
        elif action == 2 and len(stale) < 3:
            # A concurrent step: decided and acted on now (its jobs exist and may run and settle),
            # its receipts appended later — only if nothing but control requests came in between.
            at, d = world.decide()
            world.act(d)
            stale.append((at, d))
        elif action == 3 and stale:
            at, d = stale.pop(0)
            world.apply(at, d, acted=True)
        else:
            world.step()
            if choices.draw(st.booleans()):
                world.step()  # a repeated step
    else:
        raise AssertionError("the objective never settled")
    world.step()
    return world


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.data())
def test_continue_reaches_the_same_terminal_state_in_any_order(dag: Any, data: Any) -> None:
    deps, outcomes = dag
    world = run(World.launch(deps, outcomes, "continue"), data)
    expected = expected_continue(deps, outcomes)
    assert world.statuses() == expected
    assert world.obj.status == ("completed" if all(s == "completed" for s in expected.values()) else "failed")
    assert all(n == 1 for n in world.created.values())
    # A further step over the settled objective proposes nothing.
    assert world.decide()[1].events == []


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.data())
def test_fail_fast_reaches_the_same_terminal_state_in_any_order(dag: Any, data: Any) -> None:
    deps, outcomes = dag
    world = run(World.launch(deps, outcomes, "failFast"), data)
    statuses = world.statuses()
    assert all(s in ("completed", "failed", "canceled", "skipped") for s in statuses.values())
    if all(o == "ok" for o in outcomes.values()):
        assert world.obj.status == "completed" and set(statuses.values()) == {"completed"}
    else:
        assert world.obj.status == "failed"
        assert "failed" in statuses.values()
        assert world.obj.failing is not None
    for t, s in statuses.items():
        if outcomes[t] == "fail":
            assert s != "completed"
        if s == "completed":
            assert all(statuses[d] == "completed" for d in deps[t])
    assert all(n == 1 for n in world.created.values())
    assert not world.active_jobs()


@settings(max_examples=examples(80), deadline=None)
@given(dags())
def test_dependency_results_reach_their_dependents(dag: Any) -> None:
    deps, _ = dag
    outcomes = dict.fromkeys(deps, "ok")
    world = World.launch(deps, outcomes, "failFast")
    while not world.quiet():
        world.step()
        for job_id in world.active_jobs():
            world.advance(job_id)
    world.step()
    assert world.obj.status == "completed"
    for t, ds in deps.items():
        result = world.obj.tasks[t].result
        assert set(result["inputs"]) == set(ds)
        for d in ds:
            assert result["inputs"][d]["task"] == d
