"""Integration kinds on ``codex``: ``factory.integration.validate`` and ``factory.integration.publish``.

- **validate** runs ``payload.command`` through the codex command runner (``workers.handlers.codex
  .run_command``: the same gating by ``RECEIPT_CODEX_COMMANDS``, argv-only execution, process-group
  kill, env isolation and output bounds as ``factory.task.run``); a non-zero exit fails the task
  with the output tail.
- **publish** with ``payload.command`` does the same (``app.jobs.privilege.runs_command`` decides,
  as it does for the API's scope check). Without a command it POSTs the objective's
  task results (``{objectiveId, phase, publishedAt, tasks: [{id, phase, status, jobId, result,
  error}]}``) to the deployment's ``RECEIPT_INTEGRATION_PUBLISH_URL`` — a setting, never a payload
  field, so a plan cannot aim a worker at an arbitrary address — signed with the Standard Webhooks
  scheme (``webhook-id`` = the job id and attempt, ``webhook-timestamp``, ``webhook-signature``:
  HMAC-SHA256 by the ``standardwebhooks`` library under ``RECEIPT_INTEGRATION_PUBLISH_SECRET``).
  No redirects are followed; a 2xx completes, a 5xx or a network error is a retryable failure, a
  4xx a final one.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

import requests
from standardwebhooks.webhooks import Webhook

from app.factory import service
from app.jobs import kinds
from app.jobs.ids import client_id_of
from app.jobs.privilege import runs_command
from workers.handler import HandlerError, JobContext
from workers.handlers import codex
from workers.kinds import handles

PUBLISH_TIMEOUT_S: Final = 30.0


@handles(kinds.VALIDATE)
def validate(ctx: JobContext) -> Any:
    return codex.run_command(ctx)


@handles(kinds.PUBLISH)
def publish(ctx: JobContext) -> Any:
    if runs_command(ctx.job.agent_id, ctx.job.kind, ctx.payload):
        return codex.run_command(ctx)
    return publish_results(ctx)  # a signed POST, not a command


def webhook(secret: str) -> Webhook:
    """A ``whsec_…`` secret is base64 (the standard form); any other text is used as raw bytes."""
    return Webhook(secret) if secret.startswith("whsec_") else Webhook(secret.encode())


def results_body(ctx: JobContext) -> dict[str, Any]:
    objective_id = ctx.payload.get("objectiveId")
    if not isinstance(objective_id, str):
        raise HandlerError("factory.integration.publish needs payload.objectiveId", retryable=False)
    # Only the job's own organisation's objective; another's is exactly as absent.
    obj = service.find(ctx.queue.engine, ctx.job.organization_id, objective_id)
    if obj is None:
        raise HandlerError(f"no objective {objective_id!r} in this job's organisation", retryable=False)
    return {
        "objectiveId": obj.client_id,
        "phase": obj.phase,
        "tasks": [
            {
                "id": t.id,
                "phase": t.phase,
                "status": t.status,
                "jobId": client_id_of(t.job_id) if t.job_id else None,
                "result": t.result,
                "error": t.error,
            }
            for t in sorted(obj.tasks.values(), key=lambda t: (t.phase, t.id))
            if t.kind != kinds.PUBLISH.name
        ],
    }


def publish_results(ctx: JobContext) -> dict[str, Any]:
    url = ctx.settings.integration_publish_url
    secret = ctx.settings.integration_publish_secret
    if not url or not secret:
        raise HandlerError(
            "factory.integration.publish without a command needs RECEIPT_INTEGRATION_PUBLISH_URL and "
            "RECEIPT_INTEGRATION_PUBLISH_SECRET on this deployment",
            retryable=False,
        )
    now = datetime.now(UTC)
    body = {**results_body(ctx), "publishedAt": now.isoformat()}
    data = json.dumps(body, separators=(",", ":"), sort_keys=True)
    message_id = f"{ctx.job.id}:{ctx.attempt}"
    headers = {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": webhook(secret).sign(message_id, now, data),
    }
    try:
        with requests.post(
            url, data=data.encode(), headers=headers, timeout=PUBLISH_TIMEOUT_S, allow_redirects=False
        ) as response:
            status, text = response.status_code, response.text[:300]
    except requests.RequestException as exc:
        raise HandlerError(f"publish to the configured URL failed: {exc}", retryable=True) from None
    if 200 <= status < 300:
        return {
            "published": True,
            "status": status,
            "webhookId": message_id,
            "tasks": len(body["tasks"]),
        }
    raise HandlerError(f"publish answered {status}: {text}", retryable=status >= 500)
