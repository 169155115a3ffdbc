"""Group commit's coordination (app/storage/group_commit.py) over a queue stand-in: who commits,
with whom, and what each caller is told. The real transaction is tests/integration/test_group_commit.py."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from app.storage.group_commit import COMMITS_IN_FLIGHT, GroupCommit, GroupCommitAbandoned
from tests.support.waiting import wait_for

WAIT_S = 10


@dataclass
class Outcome:
    job_id: str
    applied: bool = True


@dataclass
class FakeQueue:
    """Records each commit: ``("alone", [id])`` or ``("many", [ids])``."""

    commits: list[tuple[str, list[str]]] = field(default_factory=list)
    gate: threading.Event | None = None  # the first commit waits on it
    fail_many: Exception | None = None
    fail_alone: set[str] = field(default_factory=set)
    during_alone: Callable[[str], Any] | None = None

    def mutate_alone(self, job_id: str, decide: Any) -> Outcome:
        self.commits.append(("alone", [job_id]))
        self._hold()
        if self.during_alone is not None:
            self.during_alone(job_id)
        if job_id in self.fail_alone:
            raise ValueError(f"{job_id} refused")
        return Outcome(job_id)

    def mutate_many(self, items: Sequence[tuple[str, Any]]) -> list[Outcome | Exception]:
        self.commits.append(("many", [job_id for job_id, _ in items]))
        self._hold()
        if self.fail_many is not None:
            raise self.fail_many
        return [Outcome(job_id) for job_id, _ in items]

    def _hold(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            assert gate.wait(WAIT_S)


def decide(_job: Any, _now: Any) -> list[Any]:
    return []


def queued_behind(group: Any, n: int) -> None:
    wait_for(lambda: len(group._pending) == n, WAIT_S, what=f"{n} writes queued behind the commit")


def grouped(queue: FakeQueue, max_items: int, *args: Any, **kwargs: Any) -> Any:
    """A GroupCommit over the stand-in (typed Any: the stand-in answers its own ``Outcome``)."""
    return GroupCommit(queue, max_items, *args, **kwargs)  # type: ignore[arg-type]


def run_loaded(queue: FakeQueue, group: Any, others: list[str]) -> dict[str, Any]:
    """``first`` commits alone and is held there while ``others`` arrive; then the gate opens."""
    gate = threading.Event()
    queue.gate = gate
    answers: dict[str, Any] = {}

    def call(job_id: str) -> None:
        try:
            answers[job_id] = group.mutate(job_id, decide)
        except BaseException as exc:
            answers[job_id] = exc

    with ThreadPoolExecutor(len(others) + 1) as pool:
        pool.submit(call, "first")
        wait_for(lambda: queue.commits == [("alone", ["first"])], WAIT_S, what="the first commit")
        for job_id in others:
            pool.submit(call, job_id)
        queued_behind(group, len(others))
        gate.set()
    return answers


def test_a_write_that_finds_no_commit_in_flight_commits_at_once_alone() -> None:
    queue = FakeQueue()
    group = grouped(queue, 64, in_flight=1)
    assert group.mutate("a", decide) == Outcome("a")
    assert group.mutate("b", decide) == Outcome("b")
    # Idle: each write its own one-statement commit, nobody waited to be batched.
    assert queue.commits == [("alone", ["a"]), ("alone", ["b"])]
    assert (group.commits, group.writes, group.largest) == (2, 2, 1)


def test_writes_that_queue_behind_a_commit_share_the_next_one() -> None:
    queue = FakeQueue()
    sizes: list[int] = []
    group = grouped(queue, 64, sizes.append, in_flight=1)
    others = [f"j{i}" for i in range(6)]
    answers = run_loaded(queue, group, others)
    assert sizes == [1, 6]  # what receipt_group_commit_writes observes
    assert queue.commits[0] == ("alone", ["first"])
    [(kind, ids)] = queue.commits[1:]
    assert kind == "many" and sorted(ids) == sorted(others)
    assert answers == {job_id: Outcome(job_id) for job_id in ["first", *others]}
    assert (group.commits, group.largest) == (2, 6)


def test_no_commit_carries_more_than_max_items() -> None:
    queue = FakeQueue()
    group = grouped(queue, 4, in_flight=1)
    others = [f"j{i}" for i in range(9)]
    answers = run_loaded(queue, group, others)
    sizes = [len(ids) for _kind, ids in queue.commits[1:]]
    assert max(sizes) <= 4 and sum(sizes) == 9
    assert all(isinstance(answers[j], Outcome) for j in others)
    assert group.largest == 4


def test_a_failed_commit_finds_the_failing_write_and_settles_the_others() -> None:
    queue = FakeQueue(fail_many=ValueError("division by zero in one write"), fail_alone={"j1"})
    group = grouped(queue, 64, in_flight=1)
    answers = run_loaded(queue, group, ["j0", "j1", "j2"])
    # The shared commit rolled back, so each write was committed again on its own ...
    assert [kind for kind, _ in queue.commits] == ["alone", "many", "alone", "alone", "alone"]
    # ... and only the write that fails alone reports a failure; no other caller saw one.
    assert isinstance(answers["j1"], ValueError) and "j1 refused" in str(answers["j1"])
    assert answers["j0"] == Outcome("j0") and answers["j2"] == Outcome("j2")


def test_a_failure_of_the_moment_is_every_writes_and_none_believes_it_settled() -> None:
    down = OperationalError("commit", {}, Exception("server closed the connection unexpectedly"))
    queue = FakeQueue(fail_many=down)
    group = grouped(queue, 64, in_flight=1)
    answers = run_loaded(queue, group, ["j0", "j1"])
    assert [kind for kind, _ in queue.commits] == ["alone", "many"]  # not retried one by one
    assert answers["j0"] is down and answers["j1"] is down


def test_a_write_from_inside_the_leaders_commit_goes_alone_instead_of_waiting_for_itself() -> None:
    queue = FakeQueue()
    group = grouped(queue, 64, in_flight=1)
    # An after-commit effect of "a" (run in the leader's thread) writes "b" through the group.
    queue.during_alone = lambda job_id: group.mutate("b", decide) if job_id == "a" else None
    done = threading.Event()

    def write_a() -> None:
        group.mutate("a", decide)
        done.set()

    threading.Thread(target=write_a, daemon=True).start()
    assert done.wait(WAIT_S), "the nested write waited for the commit its own thread was running"
    assert queue.commits == [("alone", ["a"]), ("alone", ["b"])]


def test_a_leader_interrupted_mid_commit_releases_every_waiting_write() -> None:
    class Interrupted(BaseException):
        pass

    queue = FakeQueue()
    group = grouped(queue, 64, in_flight=1)

    def interrupt(_items: object) -> list[Outcome | Exception]:
        raise Interrupted

    queue.mutate_many = interrupt  # type: ignore[method-assign,assignment]
    answers = run_loaded(queue, group, ["j0", "j1", "j2"])
    # Whichever of the three led the shared commit was interrupted; the others are told the commit
    # never finished (they retry), rather than waiting forever or believing they settled.
    assert sum(isinstance(a, Interrupted) for a in answers.values()) == 1
    assert sum(isinstance(a, GroupCommitAbandoned) for a in answers.values()) == 2


def test_group_commit_needs_room_for_two() -> None:
    with pytest.raises(ValueError, match="max_items >= 2"):
        GroupCommit(FakeQueue(), 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="in_flight >= 1"):
        GroupCommit(FakeQueue(), 8, in_flight=0)  # type: ignore[arg-type]


def test_two_commits_run_at_once_and_the_writes_behind_them_share_the_next() -> None:
    """COMMITS_IN_FLIGHT is 2: a second write does not wait for the first's commit; a third does."""
    assert COMMITS_IN_FLIGHT == 2
    queue = FakeQueue()
    group = grouped(queue, 64)
    gates = [threading.Event(), threading.Event()]
    running = [0, 0]  # now, most at once
    lock = threading.Lock()
    real_alone, real_many = queue.mutate_alone, queue.mutate_many

    def held(commit: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            with lock:
                running[0] += 1
                running[1] = max(running)
                gate = gates.pop(0) if gates else None
            try:
                if gate is not None:
                    assert gate.wait(WAIT_S)
                return commit(*args)
            finally:
                with lock:
                    running[0] -= 1

        return run

    opened = list(gates)
    queue.mutate_alone = held(real_alone)  # type: ignore[method-assign]
    queue.mutate_many = held(real_many)  # type: ignore[method-assign]
    answers: dict[str, Any] = {}
    with ThreadPoolExecutor(6) as pool:

        def write(job_id: str) -> None:
            answers[job_id] = group.mutate(job_id, decide)

        for job_id in ("a", "b"):
            pool.submit(write, job_id)
        wait_for(lambda: not gates, WAIT_S, what="two commits running at once")
        for job_id in ("c", "d", "e", "f"):
            pool.submit(write, job_id)
        queued_behind(group, 4)
        for gate in opened:
            gate.set()
    assert sorted(answers) == ["a", "b", "c", "d", "e", "f"]
    assert running[1] == 2
    first_two = [c for c in queue.commits if c[1] in (["a"], ["b"])]
    behind = [ids for _kind, ids in queue.commits if ids not in (["a"], ["b"])]
    assert sorted(first_two) == [("alone", ["a"]), ("alone", ["b"])]
    # The four that queued went in at most two commits (one per slot as the slots freed).
    assert sorted(j for ids in behind for j in ids) == ["c", "d", "e", "f"] and len(behind) <= 2
