"""The wake-up path is publish-only and loud: no worker code in the API, no quiet fallback."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import kombu.transport
import pytest
import redis
from sqlalchemy.engine import Engine

from api.app import create_app
from api.wake import WakePublisher, WakeUnavailable, default_waker
from app.composition import queue_for
from app.config import Settings
from app.jobs.routing import DISPATCH_TASK, DRIVER_QUEUE
from app.jobs.validation import validate_enqueue
from app.storage import tokens
from delivery import wakes
from tests.support.api import json_of, payload
from tests.support.processes import PYTHON, REPO_ROOT, base_env

BROKEN = "receipt-broken"


@pytest.fixture
def broken_transport(monkeypatch: pytest.MonkeyPatch) -> str:
    """A broker URL whose kombu transport module cannot be imported."""
    monkeypatch.setitem(kombu.transport.TRANSPORT_ALIASES, BROKEN, "receipt_no_such_module:Transport")
    return f"{BROKEN}://127.0.0.1:1/0"


# Run in a fresh interpreter: build the web app with its real publisher, enqueue (the wake-up is
# published, loading the broker transport the configuration names), read the system page's broker
# report and /readyz, then list every loaded module of the worker side.
WEB_PROCESS = """
import sys
from api.app import create_app
from api.ui.system_views import probe
from app.config import Settings
from app.jobs.validation import validate_enqueue
from app.storage.migrate import upgrade
from tests.support.api import payload

home, redis_url = sys.argv[1], sys.argv[2]
settings = Settings.from_env({"RECEIPT_HOME": home, **({"REDIS_URL": redis_url} if redis_url else {})})
app = create_app(settings)
state = app.extensions["receipt"]
upgrade(state.engine)
state.queue.enqueue(validate_enqueue("factory", {"payload": payload()}))
with app.app_context():
    report = probe().report()
assert report.queues and all(q.depth is not None for q in report.queues), report
assert state.waker.check() == "ok"
print("transport", type(state.waker.delivery.celery.connection_for_write().transport).__module__)
print("loaded", ",".join(sorted(m for m in sys.modules if m.split(".")[0] in ("tasks", "workers"))))
"""


def _web_process_modules(tmp_path: Path, redis_url: str = "") -> dict[str, str]:
    out = subprocess.run(
        [PYTHON, "-c", WEB_PROCESS, str(tmp_path), redis_url],
        env=base_env(RECEIPT_HOME=str(tmp_path)),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return dict(line.partition(" ")[::2] for line in out.stdout.splitlines())


def test_the_web_process_loads_no_worker_code_on_the_embedded_broker(tmp_path: Path) -> None:
    seen = _web_process_modules(tmp_path)
    assert seen["loaded"] == "", f"the web process imported worker code: {seen['loaded']}"
    assert seen["transport"] == "delivery.folder_transport"


@pytest.mark.redis
def test_the_web_process_loads_no_worker_code_on_redis(tmp_path: Path, redis_url: str) -> None:
    """The configuration names its Redis transport by a string kombu imports on the first
    connection: that module is the delivery client's, so publishing loads no worker package."""
    seen = _web_process_modules(tmp_path, redis_url)
    assert seen["loaded"] == "", f"the web process imported worker code: {seen['loaded']}"
    assert seen["transport"] == "delivery.redis_transport"


@pytest.mark.redis
def test_an_enqueue_publishes_the_dispatch_task_by_name_to_the_driver_queue(
    sqlite_engine: Engine, redis_url: str
) -> None:
    publisher = WakePublisher(Settings.from_env({"REDIS_URL": redis_url}))
    client = redis.Redis.from_url(redis_url)
    try:
        publisher([])  # nothing dispatchable: nothing sent
        assert client.llen(DRIVER_QUEUE) == 0
        queue = queue_for(sqlite_engine, on_dispatchable=publisher)
        job = queue.enqueue(validate_enqueue("factory", {"payload": payload()})).job
        [raw] = client.lrange(DRIVER_QUEUE, 0, -1)
        # The id waits on the coalescing wake list; the message only wakes a scan (delivery/wakes.py).
        assert client.lrange(wakes.IDS_KEY, 0, -1) == [job.id.encode()]
    finally:
        client.close()
        publisher.delivery.close()
    message = json.loads(raw)
    assert message["headers"]["task"] == DISPATCH_TASK
    args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert args == [[]] and kwargs == {}


@pytest.mark.redis
def test_enqueues_while_a_scan_is_armed_send_no_more_messages_and_the_scan_takes_every_id(
    sqlite_engine: Engine, redis_url: str
) -> None:
    publisher = WakePublisher(Settings.from_env({"REDIS_URL": redis_url}))
    client = redis.Redis.from_url(redis_url)
    try:
        queue = queue_for(sqlite_engine, on_dispatchable=publisher)
        ids = [queue.enqueue(validate_enqueue("factory", {"payload": payload()})).job.id for _ in range(5)]
        assert client.llen(DRIVER_QUEUE) == 1  # one scan armed for all five
        wake_list = wakes.WakeList(redis_url)
        wake_list.disarm()  # the scan starts: from here a new enqueue arms the next one
        assert wake_list.take(3) + wake_list.take(3) == ids and wake_list.take(3) == []
        late = queue.enqueue(validate_enqueue("factory", {"payload": payload()})).job.id
        assert client.llen(DRIVER_QUEUE) == 2 and wake_list.take(10) == [late]
    finally:
        client.close()
        publisher.delivery.close()


def test_without_redis_the_wake_up_carries_its_ids() -> None:
    sent: list[list[str]] = []
    wakes.wake(sent.append, None, ["a", "b"])
    wakes.wake(sent.append, None, [])
    assert sent == [["a", "b"]]


def test_a_wake_list_that_cannot_be_reached_falls_back_to_ids_in_the_message() -> None:
    class Down(wakes.WakeList):
        def __init__(self) -> None:
            pass

        def push(self, ids: Sequence[str], queues: Sequence[str | None] | None = None) -> bool:
            raise ConnectionError("redis is down")

    sent: list[list[str]] = []
    wakes.wake(sent.append, Down(), ["a"])
    assert sent == [["a"]]


def test_a_wake_up_that_cannot_be_sent_disarms_so_the_next_enqueue_sends_again() -> None:
    class Recording(wakes.WakeList):
        def __init__(self) -> None:
            self.disarmed = 0

        def push(self, ids: Sequence[str], queues: Sequence[str | None] | None = None) -> bool:
            return True

        def disarm(self) -> None:
            self.disarmed += 1

    def broken(ids: list[str]) -> None:
        raise OSError("broker down")

    recording = Recording()
    with pytest.raises(OSError, match="broker down"):
        wakes.wake(broken, recording, ["a"])
    assert recording.disarmed == 1


def test_a_publisher_that_cannot_be_imported_stops_start_up(
    sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "celery", None)  # "import celery" now raises ImportError
    settings = Settings.from_env({"RECEIPT_HOME": str(tmp_path)})
    with pytest.raises(WakeUnavailable, match="cannot be imported"):
        create_app(settings, engine=sqlite_engine)


def test_a_transport_that_cannot_load_stops_start_up(
    sqlite_engine: Engine, tmp_path: Path, broken_transport: str
) -> None:
    settings = Settings.from_env({"RECEIPT_HOME": str(tmp_path), "REDIS_URL": broken_transport})
    with pytest.raises(WakeUnavailable, match="receipt_no_such_module"):
        create_app(settings, engine=sqlite_engine)


def test_readyz_fails_naming_wake_when_the_publisher_breaks(
    sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken_transport: str
) -> None:
    settings = Settings.from_env({"RECEIPT_HOME": str(tmp_path)})
    publisher = default_waker(settings)  # healthy at start-up (embedded folder broker)
    app = create_app(settings, engine=sqlite_engine, on_dispatchable=publisher)
    headers = {"Authorization": f"Bearer {tokens.create(sqlite_engine, 'org-a')[1]}"}
    client = app.test_client()
    ready = json_of(client.get("/readyz", headers=headers))
    assert {k: ready[k] for k in ("database", "broker", "wake")} == {
        "database": "ok",
        "broker": "ok",
        "wake": "ok",
    }

    # The transport module goes missing under a running app (a broken install, a bad upgrade).
    monkeypatch.setattr(publisher.delivery.celery.conf, "broker_url", broken_transport)
    # The URL names the transport again (the embedded configuration names ours).
    monkeypatch.setitem(publisher.delivery.celery.conf, "broker_transport", None)
    response = client.get("/readyz", headers=headers)
    assert response.status_code == 503
    error = json_of(response)["error"]
    assert "wake" in error["message"]
    assert "receipt_no_such_module" in error["details"]["wake"]
