"""The client's retry policy and authContext defaults, with a scripted session and a fake sleeper.

No server: the session answers from a script, the sleeper records instead of sleeping, and the
jitter's randomness is a fixed number, so every wait is known exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from app.jobs.kinds import KINDS_WITHOUT_AUTH_CONTEXT
from receipt import client as client_module
from receipt.client import Client, RateLimited, ReceiptError, RetryNotice
from receipt.retry import NO_RETRY, RetryPolicy, parse_retry_after

URL = "http://receipt.test"
WHOAMI = {"organizationId": "org-a", "tokenId": "tok_1", "system": False, "scopes": []}


def response(status: int, body: Any = None, headers: dict[str, str] | None = None) -> requests.Response:
    r = requests.Response()
    r.status_code = status
    r._content = json.dumps(body if body is not None else {}).encode()
    r.headers.update({"Content-Type": "application/json", **(headers or {})})
    return r


def refused(
    status: int = 429, retry_after: str | None = "2", code: str = "rate_limited"
) -> requests.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return response(status, {"error": {"code": code, "message": "later"}}, headers)


class ScriptedSession(requests.Session):
    """Answers each request with the next scripted response (the whoami route always answers)."""

    def __init__(self, answers: Iterable[requests.Response]) -> None:
        super().__init__()
        self.answers = list(answers)
        self.sent: list[tuple[str, str, Any]] = []

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        self.sent.append((str(method), str(url), kwargs.get("json")))
        if str(url).endswith("/whoami"):
            return response(200, WHOAMI)
        return self.answers.pop(0)


class Harness:
    def __init__(self, *answers: requests.Response, **client_args: Any) -> None:
        self.session = ScriptedSession(answers)
        self.slept: list[float] = []
        self.notices: list[RetryNotice] = []
        self.client = Client(
            URL,
            token="rcpt_x",
            session=self.session,
            sleep=self.slept.append,
            rand=lambda: 0.5,
            on_retry=self.notices.append,
            **client_args,
        )


# -- the policy: a pure function ----------------------------------------------------------------


def test_the_wait_is_retry_after_plus_the_jitters_share() -> None:
    policy = RetryPolicy(max_tries=5, max_wait=100, jitter=1.0)
    assert policy.delay(tries=1, waited=0, retry_after=3, rand=0.0) == 3.0
    assert policy.delay(tries=1, waited=0, retry_after=3, rand=0.25) == 3.25
    assert policy.delay(tries=1, waited=0, retry_after=None, rand=0.0) == policy.fallback_wait


def test_the_policy_gives_up_after_max_tries_or_when_a_wait_would_pass_max_wait() -> None:
    policy = RetryPolicy(max_tries=3, max_wait=10, jitter=0)
    assert policy.delay(tries=2, waited=0, retry_after=1, rand=0) == 1
    assert policy.delay(tries=3, waited=0, retry_after=1, rand=0) is None  # three tries made
    assert policy.delay(tries=1, waited=8, retry_after=2, rand=0) == 2  # exactly at the bound
    assert policy.delay(tries=1, waited=8, retry_after=3, rand=0) is None  # would pass it
    assert NO_RETRY.delay(tries=1, waited=0, retry_after=0, rand=0) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tries", 0), ("max_wait", -1.0), ("jitter", float("nan")), ("fallback_wait", float("inf"))],
)
def test_a_nonsense_policy_is_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]


def test_retry_after_reads_seconds_and_http_dates_and_nothing_else() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0  # in the past: now
    for bad in (None, "", "soon", "-3", "nan", "inf"):
        assert parse_retry_after(bad) is None


# -- the client applies it ----------------------------------------------------------------------


def test_a_429_is_retried_after_retry_after_plus_jitter_and_then_lands() -> None:
    h = Harness(refused(retry_after="2"), refused(retry_after="1"), response(202, {"job": {"id": "j1"}}))
    created = h.client.enqueue("codex", {"kind": "factory.run"})
    assert created["job"]["id"] == "j1"
    assert h.slept == [2.5, 1.5]  # Retry-After + 0.5 x the default 1 s of jitter
    assert [(n.status, n.code, n.next_try, n.max_tries) for n in h.notices] == [
        (429, "rate_limited", 2, 5),
        (429, "rate_limited", 3, 5),
    ]
    posts = [s for s in h.session.sent if s[0] == "POST"]
    assert len(posts) == 3 and posts[0][2] == posts[2][2]  # the same body each time


def test_the_client_gives_up_after_max_tries_with_the_servers_retry_after() -> None:
    h = Harness(*(refused(retry_after="1") for _ in range(3)), retry=RetryPolicy(max_tries=3))
    with pytest.raises(RateLimited) as raised:
        h.client.enqueue("codex", {"kind": "factory.run"})
    assert raised.value.retry_after == 1.0 and raised.value.code == "rate_limited"
    assert h.slept == [1.5, 1.5]  # two waits between three tries


def test_the_client_does_not_start_a_wait_that_would_pass_max_wait() -> None:
    h = Harness(refused(retry_after="60"), retry=RetryPolicy(max_wait=30))
    with pytest.raises(RateLimited):
        h.client.list()
    assert h.slept == []


def test_retry_none_and_no_retry_turn_it_off() -> None:
    for policy in (None, NO_RETRY):
        h = Harness(refused(), retry=policy)
        with pytest.raises(RateLimited):
            h.client.get("j1")
        assert h.slept == [] and len(h.session.sent) == 1


def test_a_503_is_retried_only_when_the_request_is_safe_to_repeat() -> None:
    unavailable = refused(503, retry_after="1", code="unavailable")
    # A read: repeated.
    h = Harness(unavailable, response(200, {"job": {"id": "j1"}}))
    assert h.client.get("j1")["id"] == "j1" and h.slept == [1.5]
    # A write with an idempotency key: repeated.
    h = Harness(refused(503, "1", "unavailable"), response(202, {"job": {"id": "k"}}))
    assert h.client.enqueue("a", {"kind": "factory.run"}, jobId="k")["job"]["id"] == "k"
    assert h.slept == [1.5]
    # A write without one may have been committed before the 503: not repeated.
    h = Harness(refused(503, "1", "unavailable"))
    with pytest.raises(ReceiptError) as raised:
        h.client.enqueue("a", {"kind": "factory.run"})
    assert raised.value.status == 503 and h.slept == []
    # A 503 that does not say when to come back did not ask to be repeated.
    h = Harness(refused(503, None, "unavailable"))
    with pytest.raises(ReceiptError):
        h.client.get("j1")
    assert h.slept == []


# -- authContext from the token -----------------------------------------------------------------


def posted_payloads(h: Harness) -> list[dict[str, Any]]:
    return [body["payload"] for method, _url, body in h.session.sent if method == "POST"]


def test_a_payload_without_auth_context_gets_the_tokens_organisation_asked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RECEIPT_USER", raising=False)
    h = Harness(response(202, {"job": {}}), response(202, {"job": {}}))
    h.client.enqueue("codex", {"kind": "factory.task.run", "command": ["echo"]})
    h.client.enqueue("codex", {"kind": "factory.task.run", "command": ["echo"]})
    expected = {"userId": "token:tok_1", "organizationId": "org-a"}
    assert [p["authContext"] for p in posted_payloads(h)] == [expected, expected]
    assert [url for method, url, _ in h.session.sent if method == "GET"] == [f"{URL}/whoami"]


def test_the_user_id_comes_from_user_then_receipt_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECEIPT_USER", "from-env")
    h = Harness(response(202, {"job": {}}))
    h.client.enqueue("codex", {"kind": "factory.run"})
    assert posted_payloads(h)[0]["authContext"]["userId"] == "from-env"
    h = Harness(response(202, {"job": {}}), user="alice")
    h.client.enqueue("codex", {"kind": "factory.run"})
    assert posted_payloads(h)[0]["authContext"] == {"userId": "alice", "organizationId": "org-a"}


def test_an_explicit_auth_context_and_the_kind_without_one_are_sent_untouched() -> None:
    mine = {"userId": "me", "organizationId": "org-z"}
    h = Harness(response(202, {"job": {}}), response(202, {"job": {}}), response(202, {"job": {}}))
    h.client.enqueue("codex", {"kind": "factory.run", "authContext": mine})
    h.client.enqueue("codex", {"kind": "factory.run", "authContext": None})
    h.client.enqueue("factory-control", {"kind": "factory.objective.watchdog"})
    sent = posted_payloads(h)
    assert sent[0]["authContext"] == mine and sent[1]["authContext"] is None
    assert "authContext" not in sent[2]
    assert all(m != "GET" for m, _u, _b in h.session.sent)  # nothing needed the token's answer


def test_the_client_knows_the_one_kind_the_server_takes_without_auth_context() -> None:
    assert client_module.KINDS_WITHOUT_AUTH_CONTEXT == KINDS_WITHOUT_AUTH_CONTEXT
