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

from app.storage.group_commit import GroupCommit, GroupCommitAbandoned
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
    during_alone: Callable[[str], None] | None = None

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


def queued_behind(group: GroupCommit, n: int) -> None:
    wait_for(lambda: len(group._pending) == n, WAIT_S, what=f"{n} writes queued behind the commit")


def run_loaded(queue: FakeQueue, group: GroupCommit, others: list[str]) -> dict[str, Outcome | BaseException]:
    """``first`` commits alone and is held there while ``others`` arrive; then the gate opens."""
    gate = threading.Event()
    queue.gate = gate
    answers: dict[str, Outcome | BaseException] = {}

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
    group = GroupCommit(queue, 64)  # type: ignore[arg-type]
    assert group.mutate("a", decide) == Outcome("a")
    assert group.mutate("b", decide) == Outcome("b")
    # Idle: each write its own one-statement commit, nobody waited to be batched.
    assert queue.commits == [("alone", ["a"]), ("alone", ["b"])]
    assert (group.commits, group.writes, group.largest) == (2, 2, 1)


def test_writes_that_queue_behind_a_commit_share_the_next_one() -> None:
    queue = FakeQueue()
    group = GroupCommit(queue, 64)  # type: ignore[arg-type]
    others = [f"j{i}" for i in range(6)]
    answers = run_loaded(queue, group, others)
    assert queue.commits[0] == ("alone", ["first"])
    [(kind, ids)] = queue.commits[1:]
    assert kind == "many" and sorted(ids) == sorted(others)
    assert answers == {job_id: Outcome(job_id) for job_id in ["first", *others]}
    assert (group.commits, group.largest) == (2, 6)


def test_no_commit_carries_more_than_max_items() -> None:
    queue = FakeQueue()
    group = GroupCommit(queue, 4)  # type: ignore[arg-type]
    others = [f"j{i}" for i in range(9)]
    answers = run_loaded(queue, group, others)
    sizes = [len(ids) for _kind, ids in queue.commits[1:]]
    assert max(sizes) <= 4 and sum(sizes) == 9
    assert all(isinstance(answers[j], Outcome) for j in others)
    assert group.largest == 4


def test_a_failed_commit_finds_the_failing_write_and_settles_the_others() -> None:
    queue = FakeQueue(fail_many=ValueError("division by zero in one write"), fail_alone={"j1"})
    group = GroupCommit(queue, 64)  # type: ignore[arg-type]
    answers = run_loaded(queue, group, ["j0", "j1", "j2"])
    # The shared commit rolled back, so each write was committed again on its own ...
    assert [kind for kind, _ in queue.commits] == ["alone", "many", "alone", "alone", "alone"]
    # ... and only the write that fails alone reports a failure; no other caller saw one.
    assert isinstance(answers["j1"], ValueError) and "j1 refused" in str(answers["j1"])
    assert answers["j0"] == Outcome("j0") and answers["j2"] == Outcome("j2")


def test_a_failure_of_the_moment_is_every_writes_and_none_believes_it_settled() -> None:
    down = OperationalError("commit", {}, Exception("server closed the connection unexpectedly"))
    queue = FakeQueue(fail_many=down)
    group = GroupCommit(queue, 64)  # type: ignore[arg-type]
    answers = run_loaded(queue, group, ["j0", "j1"])
    assert [kind for kind, _ in queue.commits] == ["alone", "many"]  # not retried one by one
    assert answers["j0"] is down and answers["j1"] is down


def test_a_write_from_inside_the_leaders_commit_goes_alone_instead_of_waiting_for_itself() -> None:
    queue = FakeQueue()
    group = GroupCommit(queue, 64)  # type: ignore[arg-type]
    # An after-commit effect of "a" (run in the leader's thread) writes "b" through the group.
    queue.during_alone = lambda job_id: group.mutate("b", decide) if job_id == "a" else None
    done = threading.Event()
    threading.Thread(target=lambda: (group.mutate("a", decide), done.set()), daemon=True).start()
    assert done.wait(WAIT_S), "the nested write waited for the commit its own thread was running"
    assert queue.commits == [("alone", ["a"]), ("alone", ["b"])]


def test_a_leader_interrupted_mid_commit_releases_every_waiting_write() -> None:
    class Interrupted(BaseException):
        pass

    queue = FakeQueue()
    group = GroupCommit(queue, 64)  # type: ignore[arg-type]

    def interrupt(_items: object) -> list[Outcome | Exception]:
        raise Interrupted

    queue.mutate_many = interrupt  # type: ignore[method-assign]
    answers = run_loaded(queue, group, ["j0", "j1", "j2"])
    # Whichever of the three led the shared commit was interrupted; the others are told the commit
    # never finished (they retry), rather than waiting forever or believing they settled.
    assert sum(isinstance(a, Interrupted) for a in answers.values()) == 1
    assert sum(isinstance(a, GroupCommitAbandoned) for a in answers.values()) == 2


def test_group_commit_needs_room_for_two() -> None:
    with pytest.raises(ValueError, match="max_items >= 2"):
        GroupCommit(FakeQueue(), 1)  # type: ignore[arg-type]
