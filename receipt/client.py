"""A typed Python client for Receipt's HTTP API.

    from receipt.client import Client
    client = Client("http://127.0.0.1:8080", token="rcpt_...")
    job = client.enqueue("codex", {"kind": "factory.task.run", ...})

Every error the API answers with becomes a ``ReceiptError`` (or a subclass) carrying the API's
error ``code``, ``status`` and ``details``, so callers branch on codes, never on messages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import requests

DEFAULT_TIMEOUT_S = 30.0

JsonObject = dict[str, Any]


class ReceiptError(Exception):
    """The API answered with an error: ``status``, the API's ``code``, its message and details."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class AuthError(ReceiptError):
    """401 or 403: the token is missing, invalid, revoked or lacks a scope."""


class NotFound(ReceiptError):
    """404: no such resource, or one that belongs to another organisation."""


class Conflict(ReceiptError):
    """409: the request conflicts with the resource's state (e.g. it is already terminal)."""


class InvalidRequest(ReceiptError):
    """400/413/422: the request was refused before anything was written; ``details`` names the field."""


class RateLimited(ReceiptError):
    """429: too many requests or streams; ``retry_after`` says when to try again (seconds)."""

    retry_after: float | None = None


def _error_class(status: int) -> type[ReceiptError]:
    if status in (401, 403):
        return AuthError
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status == 429:
        return RateLimited
    if 400 <= status < 500:
        return InvalidRequest
    return ReceiptError


class Client:
    """One deployment, one token. Thread-safe as far as ``requests.Session`` is."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        session: requests.Session | None = None,
    ) -> None:
        resolved = url or os.environ.get("RECEIPT_URL")
        if not resolved:
            raise ValueError("no Receipt URL: pass url= or set RECEIPT_URL")
        self.url = resolved.rstrip("/")
        self.token = token if token is not None else os.environ.get("RECEIPT_TOKEN")
        self.timeout = timeout
        self.session = session or requests.Session()

    # -- transport -------------------------------------------------------------------------------

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        out = {"Accept": "application/json"}
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        if extra:
            out.update(extra)
        return out

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> JsonObject:
        """One API call; the decoded JSON object, or a typed ``ReceiptError``."""
        response = self.session.request(
            method,
            self.url + path,
            json=json,
            params={k: v for k, v in (params or {}).items() if v is not None},
            headers=self.headers(),
            timeout=self.timeout,
            allow_redirects=False,
        )
        return self.decode(response)

    @staticmethod
    def decode(response: requests.Response) -> JsonObject:
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code >= 400:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            cls = _error_class(response.status_code)
            exc = cls(
                response.status_code,
                str(error.get("code", "http_error")),
                str(error.get("message", response.reason)),
                error.get("details"),
            )
            if isinstance(exc, RateLimited):
                retry = response.headers.get("Retry-After")
                exc.retry_after = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
            raise exc
        if not isinstance(data, dict):
            raise ReceiptError(response.status_code, "invalid_response", "the API did not answer JSON")
        return data

    # -- jobs ------------------------------------------------------------------------------------

    def enqueue(self, agent_id: str, payload: Mapping[str, Any], **fields: Any) -> JsonObject:
        """POST /agents/<agentId>/jobs; ``fields`` are the body's other keys (jobId, lane, ...)."""
        body = {"payload": dict(payload), **fields}
        return self.request("POST", f"/agents/{agent_id}/jobs", json=body)

    def get(self, job_id: str) -> JsonObject:
        """The job (``{"job": {...}}`` unwrapped)."""
        job: JsonObject = self.request("GET", f"/jobs/{job_id}")["job"]
        return job

    def list(self, **filters: Any) -> JsonObject:
        """GET /jobs with filters (status, agentId, lane, limit, cursor, ...): the page as sent."""
        return self.request("GET", "/jobs", params=filters)

    def cancel(self, job_id: str, reason: str | None = None) -> JsonObject:
        return self.request("POST", f"/jobs/{job_id}/cancel", json={"reason": reason} if reason else {})

    def commands(self, job_id: str, body: Mapping[str, Any]) -> JsonObject:
        """POST /jobs/<jobId>/commands (steer, follow_up, abort)."""
        return self.request("POST", f"/jobs/{job_id}/commands", json=dict(body))

    # -- objectives ------------------------------------------------------------------------------

    def launch_objective(self, body: Mapping[str, Any]) -> JsonObject:
        """POST /objectives with ``{title, goal, plan, objectiveId?, failurePolicy?, authContext?}``:
        the response as sent (``{"objective": ..., "async": {...}}``)."""
        return self.request("POST", "/objectives", json=dict(body))

    def objective(self, objective_id: str) -> JsonObject:
        """The objective (``{"objective": {...}}`` unwrapped), every task with its status and result."""
        obj: JsonObject = self.request("GET", f"/objectives/{objective_id}")["objective"]
        return obj

    def objectives(self, **filters: Any) -> JsonObject:
        """GET /objectives with filters (status, limit, cursor, organizationId): the page as sent."""
        return self.request("GET", "/objectives", params=filters)

    def replan_objective(
        self, objective_id: str, tasks: Sequence[Mapping[str, Any]], reason: str | None = None
    ) -> JsonObject:
        """POST /objectives/<id>/plan: phase n+1 with ``tasks``; the objective (unwrapped).
        A terminal objective raises ``Conflict``; a bad plan ``BadRequest`` naming the field."""
        body: dict[str, Any] = {"tasks": [dict(t) for t in tasks]}
        if reason:
            body["reason"] = reason
        obj: JsonObject = self.request("POST", f"/objectives/{objective_id}/plan", json=body)["objective"]
        return obj

    def cancel_objective(self, objective_id: str, reason: str | None = None) -> JsonObject:
        """POST /objectives/<id>/cancel; the objective (unwrapped). A terminal one raises ``Conflict``."""
        body = {"reason": reason} if reason else {}
        obj: JsonObject = self.request("POST", f"/objectives/{objective_id}/cancel", json=body)["objective"]
        return obj
