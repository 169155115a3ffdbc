"""An in-memory world for the pure Factory core: objective receipts, task jobs, control steps.

Jobs are simulated (queued → running → settled by a predetermined outcome); every settlement
writes a control request, as the queue's outbox does; control steps run ``control.decide`` and are
applied with the storage's optimistic rule (a step decided on an older state applies only when
nothing but control requests was appended since).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from app.factory import control
from app.factory.plan import validate_objective
from app.factory.reducer import Objective, reduce
from app.factory.vocab import objective_stream
from app.jobs.reducer import Job, Receipt

AUTH = {"userId": "u", "organizationId": "org"}


def plan_body(deps: dict[str, list[str]], policy: str = "continue", **extra: Any) -> dict[str, Any]:
    return {
        "objectiveId": "obj",
        "title": "t",
        "goal": "g",
        "failurePolicy": policy,
        "authContext": AUTH,
        "plan": {
            "tasks": [
                {"id": t, "agentId": "test-agent", "payload": {"kind": "factory.task.run"}, "dependsOn": d}
                for t, d in deps.items()
            ]
        },
        **extra,
    }


@dataclass
class World:
    obj: Objective
    outcomes: dict[str, str]  # task id -> "ok" | "fail"
    jobs: dict[str, Job] = field(default_factory=dict)
    created: dict[str, int] = field(default_factory=dict)  # job id -> times created
    log: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    request_n: int = 0

    @classmethod
    def launch(cls, deps: dict[str, list[str]], outcomes: dict[str, str], policy: str) -> World:
        spec = validate_objective(plan_body(deps, policy))
        body = {
            "objectiveId": "obj",
            "title": spec.title,
            "goal": spec.goal,
            "failurePolicy": spec.failure_policy,
            "authContext": dict(spec.auth_context),
            "launchedBy": None,
            "phase": 1,
            "tasks": [t.to_json() for t in spec.tasks],
        }
        w = cls(obj=None, outcomes=outcomes)  # type: ignore[arg-type]
        w.append("objective.launched", body)
        w.append("objective.control_requested", {"requestId": "launch", "reason": "launch"})
        return w

    def append(self, type_: str, body: dict[str, Any]) -> None:
        seq = (self.obj.seq if self.obj else 0) + 1
        new = reduce(
            self.obj,
            Receipt(objective_stream("obj"), seq, type_, body, at=f"2026-01-01T00:00:{seq % 60:02d}.000000Z"),
        )
        assert new is not None
        self.obj = new
        self.log.append((type_, body))

    def request(self, reason: str, job_id: str | None = None, task_id: str | None = None) -> None:
        if self.obj.terminal:
            return  # storage.request_control writes nothing for an ended objective
        self.request_n += 1
        self.append(
            "objective.control_requested",
            {"requestId": f"r{self.request_n}", "reason": reason, "jobId": job_id, "taskId": task_id},
        )

    # -- control
    def decide(self) -> tuple[int, control.Decision]:
        """What service.control_step reads: the jobs of the tasks the requests name, or of every
        unfinished task when a failure, a cancel or a broad request needs the full view."""
        named = {r.task_id for r in self.obj.pending if r.task_id}
        unfinished = [t for t in self.obj.tasks.values() if t.status in ("queued", "running") and t.job_id]
        view = {t.job_id: self.jobs.get(t.job_id) for t in unfinished if t.id in named and t.job_id}
        if control.needs_full_view(self.obj, view):
            view = {t.job_id: self.jobs.get(t.job_id) for t in unfinished if t.job_id}
        return self.obj.seq, control.decide(self.obj, view)

    def apply(self, decided_at: int, d: control.Decision, *, acted: bool = False) -> bool:
        # Actions run before the append, as in service.control_step: a step whose append then
        # conflicts has still enqueued and canceled (idempotently).
        if not acted:
            self.act(d)
        newer = self.log[decided_at:]
        if any(t != "objective.control_requested" for t, _ in newer):
            return False  # conflict: the caller re-decides
        for type_, body in d.events:
            self.append(type_, body)
        return True

    def act(self, d: control.Decision) -> None:
        for task_id in d.enqueue:
            task = d.state.tasks[task_id]
            job_id = task.job_id or ""
            if job_id not in self.jobs:
                payload = control.task_payload(
                    self.obj, task, {k: v.result for k, v in d.state.tasks.items()}
                )
                self.jobs[job_id] = Job(job_id, task.agent_id, "collect", payload, None, "allow", 2, "org")
                self.created[job_id] = self.created.get(job_id, 0) + 1
        for c in d.cancel:
            job = self.jobs[c.job_id]
            if job.status == "queued":
                self.jobs[c.job_id] = replace(job, status="canceled", error=c.reason)
                self.request("task_settled", c.job_id, job.payload.get("taskId"))
            elif not job.terminal:
                self.jobs[c.job_id] = replace(job, abort_requested=True)

    def step(self) -> None:
        while True:
            at, d = self.decide()
            if self.apply(at, d):
                return

    # -- jobs
    def active_jobs(self) -> list[str]:
        return sorted(j for j, job in self.jobs.items() if not job.terminal)

    def advance(self, job_id: str) -> None:
        job = self.jobs[job_id]
        task_id = str(job.payload["taskId"])
        if job.status == "queued":
            self.jobs[job_id] = replace(job, status="running", attempt=1)
            return
        if job.abort_requested:
            self.jobs[job_id] = replace(job, status="canceled", error="aborted")
        elif self.outcomes[task_id] == "ok":
            result = {"task": task_id, "inputs": job.payload.get("inputs", {})}
            self.jobs[job_id] = replace(job, status="completed", result=result)
        else:
            self.jobs[job_id] = replace(job, status="failed", error=f"{task_id} failed")
        self.request("task_settled", job_id, task_id)

    def quiet(self) -> bool:
        return not self.obj.pending and not self.active_jobs()

    def statuses(self) -> dict[str, str]:
        return {t: self.obj.tasks[t].status for t in self.obj.task_order}
