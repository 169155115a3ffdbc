"""The dispatch choice (app/dispatch/choice.py): fair share, priority inside a line, key limits and
rate allowances, as a pure function, with property tests over any line and any interleaving."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.dispatch.choice import Candidate, Line, Waiting, choose
from tests.support.examples import examples


def heads(
    org: str, n: int, *, key: str | None = None, limit: int | None = None, since: float = 0.0
) -> list[Candidate]:
    return [Candidate(f"{org}-{i}", org, since + i, key, limit) for i in range(n)]


def test_a_burst_from_one_organisation_does_not_take_the_place_another_needs() -> None:
    # A has 3 000 queued and 8 in flight; B has one job and nothing in flight: one place frees.
    line = Line(places=1, heads={"a": heads("a", 50), "b": heads("b", 1, since=999.0)}, in_flight={"a": 8})
    got = choose(line)
    assert [c.job_id for c in got.send] == ["b-0"]
    assert got.waiting["a-0"] == Waiting("share")


def test_free_places_go_round_robin_while_every_organisation_has_work() -> None:
    line = Line(
        places=6, heads={"a": heads("a", 10), "b": heads("b", 10, since=0.5), "c": heads("c", 10, since=0.7)}
    )
    assert [c.job_id for c in choose(line).send] == ["a-0", "b-0", "c-0", "a-1", "b-1", "c-1"]


def test_ties_go_to_the_organisation_whose_next_job_waited_longest() -> None:
    line = Line(places=1, heads={"a": heads("a", 1, since=10.0), "b": heads("b", 1, since=5.0)})
    assert [c.job_id for c in choose(line).send] == ["b-0"]


def test_a_weight_of_three_gets_three_places_for_each_one_of_weight_one() -> None:
    line = Line(places=8, heads={"a": heads("a", 20), "b": heads("b", 20)}, weights={"a": 3.0})
    sent = [c.org for c in choose(line).send]
    assert sent.count("a") == 6 and sent.count("b") == 2


def test_priority_is_the_order_of_a_line_and_never_crosses_lines() -> None:
    # The caller orders each line by priority then age; A's high-priority job is at its head, yet
    # with A already holding more places, B's next job still goes first.
    a = [Candidate("a-urgent", "a", 50.0), *heads("a", 3)]
    line = Line(places=1, heads={"a": a, "b": heads("b", 1, since=60.0)}, in_flight={"a": 2})
    assert [c.job_id for c in choose(line).send] == ["b-0"]
    assert [c.job_id for c in choose(Line(places=1, heads={"a": a})).send] == ["a-urgent"]


def test_a_full_key_waits_with_its_key_and_the_line_moves_on() -> None:
    line = Line(
        places=2,
        heads={"a": [Candidate("a-k", "a", 0.0, "k", 1), Candidate("a-free", "a", 1.0)]},
        key_in_flight={("a", "k"): 1},
    )
    got = choose(line)
    assert [c.job_id for c in got.send] == ["a-free"]
    assert got.waiting["a-k"] == Waiting("concurrency", "k")


def test_a_key_is_scoped_to_its_organisation() -> None:
    line = Line(
        places=2,
        heads={"a": [Candidate("a-k", "a", 0.0, "k", 1)], "b": [Candidate("b-k", "b", 0.0, "k", 1)]},
        key_in_flight={("a", "k"): 1},
    )
    assert [c.job_id for c in choose(line).send] == ["b-k"]


def test_a_limiter_admits_only_its_allowance_and_the_rest_wait_for_rate() -> None:
    line = Line(
        places=5,
        heads={"a": [Candidate(f"a-{i}", "a", i, "api", 10, "key:a:api") for i in range(4)]},
        allowance={"key:a:api": 2},
    )
    got = choose(line)
    assert [c.job_id for c in got.send] == ["a-0", "a-1"]
    assert got.waiting["a-2"] == Waiting("rate", "api")
    assert got.spent == {"key:a:api": 2}


def test_an_organisation_limiter_holds_the_whole_organisation() -> None:
    line = Line(
        places=4,
        heads={"a": heads("a", 3), "b": heads("b", 3, since=0.5)},
        allowance={"org:a": 1},
        org_limiter={"a": "org:a"},
    )
    got = choose(line)
    assert sorted(c.job_id for c in got.send) == ["a-0", "b-0", "b-1", "b-2"]
    assert got.waiting["a-1"] == Waiting("rate")


def test_no_place_sends_nothing_and_every_head_waits_for_its_share() -> None:
    got = choose(Line(places=0, heads={"a": heads("a", 2)}))
    assert got.send == () and set(got.waiting) == {"a-0", "a-1"}


# -- properties --------------------------------------------------------------------------------

ORGS = ["a", "b", "c", "d"]
KEYS = [None, "k1", "k2"]


@st.composite
def lines(draw: st.DrawFn) -> Line:
    heads_by_org: dict[str, list[Candidate]] = {}
    n = 0
    for org in draw(st.lists(st.sampled_from(ORGS), unique=True, max_size=4)):
        line = []
        for _ in range(draw(st.integers(0, 6))):
            key = draw(st.sampled_from(KEYS))
            line.append(
                Candidate(
                    f"j{n}", org, draw(st.floats(0, 100)), key, draw(st.integers(1, 3)) if key else None
                )
            )
            n += 1
        heads_by_org[org] = line
    key_in_flight = {
        (org, key): draw(st.integers(0, 3)) for org in heads_by_org for key in KEYS if key is not None
    }
    return Line(
        places=draw(st.integers(0, 12)),
        heads=heads_by_org,
        in_flight={org: draw(st.integers(0, 5)) for org in heads_by_org},
        key_in_flight=key_in_flight,
        weights={org: draw(st.sampled_from([0.5, 1.0, 2.0])) for org in heads_by_org},
    )


@settings(max_examples=examples(300), deadline=None)
@given(lines())
def test_property_no_key_goes_past_its_limit_and_no_place_is_used_twice(line: Line) -> None:
    got = choose(line)
    assert len(got.send) <= line.places
    assert len({c.job_id for c in got.send}) == len(got.send)
    for c in got.send:
        if c.key is not None:
            assert line.key_in_flight.get((c.org, c.key), 0) < (c.limit or 1)
    for (org, key), before in line.key_in_flight.items():
        sent = [c for c in got.send if c.org == org and c.key == key]
        if sent:
            assert before + len(sent) <= max(c.limit or 1 for c in sent)
    # Every head is either sent or says why it waits.
    every = {c.job_id for heads in line.heads.values() for c in heads}
    assert {c.job_id for c in got.send} | set(got.waiting) == every
    assert not {c.job_id for c in got.send} & set(got.waiting)


@settings(max_examples=examples(300), deadline=None)
@given(lines())
def test_property_each_line_runs_in_its_own_order(line: Line) -> None:
    got = choose(line)
    for org, heads in line.heads.items():
        sent = [c.job_id for c in got.send if c.org == org]
        order = [c.job_id for c in heads]
        assert sent == sorted(sent, key=order.index)


@settings(max_examples=examples(300), deadline=None)
@given(lines())
def test_property_a_place_left_unused_means_no_head_could_take_it(line: Line) -> None:
    got = choose(line)
    if len(got.send) < line.places:
        assert all(w.reason != "share" for w in got.waiting.values())


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(ORGS), st.integers(0, 3), st.sampled_from([None, *ORGS])),
        min_size=1,
        max_size=80,
    )
)
def test_property_no_organisation_with_work_starves_over_any_interleaving(
    events: list[tuple[str, int, str | None]],
) -> None:
    """Jobs arrive, places free and attempts finish in any order (an adversary picks whose): an
    organisation with work and nothing in flight gets one of the next ``len(ORGS)`` places."""
    lines: dict[str, list[Candidate]] = {org: [] for org in ORGS}
    running: dict[str, int] = dict.fromkeys(ORGS, 0)
    last_turn: dict[str, float] = {}
    waited: dict[str, int] = dict.fromkeys(ORGS, 0)
    n = 0
    for t, (org, arrivals, finishes) in enumerate(events):
        lines[org].extend(Candidate(f"j{n + i}", org, float(t)) for i in range(arrivals))
        n += arrivals
        if finishes is not None and running[finishes]:
            running[finishes] -= 1
        got = choose(
            Line(
                places=1,
                heads={o: list(h) for o, h in lines.items() if h},
                in_flight=running,
                last_turn=last_turn,
            )
        )
        for c in got.send:
            lines[c.org].remove(c)
            running[c.org] += 1
            last_turn[c.org] = float(t)
        for o, h in lines.items():
            starved = h and running[o] == 0 and not any(c.org == o for c in got.send)
            waited[o] = waited[o] + 1 if starved and got.send else 0 if not starved else waited[o]
            assert waited[o] < len(ORGS)


def test_one_slot_and_an_old_backlog_still_take_turns() -> None:
    """One place at a time, A's jobs finishing as fast as they start: B's single job, younger than
    all of A's backlog, runs at the second place, not after the backlog."""
    a, b = heads("a", 20), heads("b", 1, since=100.0)
    got = choose(Line(places=1, heads={"a": a, "b": b}, last_turn={"a": 5.0}))
    assert [c.job_id for c in got.send] == ["b-0"]
    assert [
        c.job_id for c in choose(Line(places=1, heads={"a": a, "b": b}, last_turn={"a": 5.0, "b": 6.0})).send
    ] == ["a-0"]
