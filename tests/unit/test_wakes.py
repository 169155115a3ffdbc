"""The coalescing wake list (delivery/wakes.py) on an in-memory Redis: arming, listeners, prefixes,
and the fall-back to carrying ids in the message. tests/integration/test_dispatch.py runs the same
list on the real redis-server with a scanner and a listening driver."""

from __future__ import annotations

import pytest

from delivery import wakes
from delivery.wakes import WakeList, wake, wake_list_for
from tests.support.fake_redis import URL, FakeRedis


def test_the_first_push_arms_one_scan_and_later_pushes_ride_on_it(fake_redis: FakeRedis) -> None:
    wl = WakeList(URL)
    assert wl.push(["a"]) is True  # armed: the caller sends the one wake-up message
    assert wl.push(["b", "c"]) is False  # a scan is armed and has not started: it takes these too
    assert 0 < fake_redis.client().pttl(wl.armed_key) <= wakes.ARMED_TTL_MS
    assert wl.disarm_and_take(2) == ["a", "b"]
    assert wl.take(10) == ["c"]
    assert wl.take(10) == []
    assert wl.push(["d"]) is True  # the scan disarmed: the next push sends again


def test_a_listening_driver_means_no_message_at_all(fake_redis: FakeRedis) -> None:
    wl = WakeList(URL)
    assert wl.listen(10, block_s=0.01) == []  # announces itself, disarms, waits, nothing came
    client = fake_redis.client()
    assert 0 < client.pttl(wl.listening_key) <= wakes.LISTENING_TTL_MS
    assert wl.push(["a", "b"]) is False  # armed, but a listener is woken by the push itself
    assert wl.listen(10, block_s=0.01) == ["a", "b"]
    assert not client.exists(wl.armed_key)
    wl.stop_listening()
    assert wl.push(["c"]) is True  # nobody listens any more: messages again


def test_deployments_sharing_one_redis_under_different_prefixes_never_drain_each_other(
    fake_redis: FakeRedis,
) -> None:
    ours = wake_list_for(URL, {"global_keyprefix": "ours:"})
    theirs = wake_list_for(URL, {"global_keyprefix": "theirs:"})
    assert ours is not None and theirs is not None
    assert ours.push(["mine"]) is True and theirs.push(["yours"]) is True
    assert theirs.take(10) == ["yours"]
    assert ours.take(10) == ["mine"]
    assert wake_list_for(None) is None and wake_list_for("filesystem://localhost/") is None


def test_wake_sends_one_empty_message_when_it_armed_and_none_when_a_scan_is_armed(
    fake_redis: FakeRedis,
) -> None:
    wl = WakeList(URL)
    sent: list[list[str]] = []
    wake(sent.append, wl, ["a"])
    wake(sent.append, wl, ["b"])
    assert sent == [[]]  # the ids wait on the list, not in the message
    assert wl.disarm_and_take(10) == ["a", "b"]
    wake(sent.append, wl, [])
    assert sent == [[]]  # nothing to wake for


def test_with_the_list_down_the_ids_travel_in_the_message(
    fake_redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    wl = WakeList(URL)
    sent: list[list[str]] = []
    fake_redis.down()
    wake(sent.append, wl, ["a", "b"])
    assert sent == [["a", "b"]]
    assert "wake list unavailable" in caplog.text


def test_a_wake_up_that_cannot_be_sent_unarms_so_the_next_enqueue_sends_again(fake_redis: FakeRedis) -> None:
    wl = WakeList(URL)

    def broken(_ids: list[str]) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        wake(broken, wl, ["a"])
    assert not fake_redis.client().exists(wl.armed_key)
    sent: list[list[str]] = []
    wake(sent.append, wl, ["b"])
    assert sent == [[]]
    assert wl.disarm_and_take(10) == ["a", "b"]  # the first id waited on the list all along


def test_one_push_of_more_ids_than_a_lua_call_unpacks_lands_them_all_in_order(fake_redis: FakeRedis) -> None:
    """The push script sends the ids to RPUSH 1 000 at a time: a bulk enqueue's 2 500 in one push."""
    wl = WakeList(URL)
    ids = [f"job-{n:05d}" for n in range(2_500)]
    assert wl.push(ids) is True
    assert wl.disarm_and_take(3_000) == ids
    assert wl.push([]) is False  # nothing pushed, nothing armed
    assert not fake_redis.client().exists(wl.armed_key)


def test_the_push_script_is_loaded_again_after_the_server_forgot_it(fake_redis: FakeRedis) -> None:
    """A restarted Redis (or SCRIPT FLUSH) has an empty script cache: the next push loads it again."""
    wl = WakeList(URL)
    assert wl.push(["a"]) is True
    fake_redis.client().script_flush()
    assert wl.push(["b"]) is False  # still armed by the first push
    assert wl.disarm_and_take(10) == ["a", "b"]


def test_a_push_routes_each_id_to_its_queues_list_only_while_a_worker_listens_there(
    fake_redis: FakeRedis,
) -> None:
    """Per id: its worker queue's list while that queue's listening key lives, else the driver's
    list (a token, an id of no queue, a queue nobody listens to). Only the driver's list arms the
    scan and may ask for the wake-up message."""
    wl = WakeList(URL)
    assert wl.listen(10, block_s=0.01, queues=["q-chat"]) == []
    assert wl.push(["a", "b"], ["q-chat", "q-chat"]) is False  # all to the chat list: no message
    assert not fake_redis.client().exists(wl.armed_key)
    assert wl.push(["c", "@q-chat", "d"], ["q-codex", None, "q-chat"]) is True  # c and the token
    assert wl.listen(10, block_s=0.01, queues=["q-chat"]) == ["a", "b", "d"]
    assert wl.disarm_and_take(10) == ["c", "@q-chat"]


def test_the_driver_adopts_only_lists_nobody_listens_to(fake_redis: FakeRedis) -> None:
    wl = WakeList(URL)
    client = fake_redis.client()
    client.rpush(wl.queue_ids_key("q-chat"), "a", "b")
    client.rpush(wl.queue_ids_key("q-codex"), "c")
    client.set(wl.queue_listening_key("q-codex"), b"1", px=wakes.LISTENING_TTL_MS)
    assert wl.adopt(["q-chat", "q-codex", "q-control"]) == 2
    assert wl.take(10) == ["a", "b"]
    assert client.lrange(wl.queue_ids_key("q-codex"), 0, -1) == [b"c"]  # its worker still listens
    assert wl.stop_listening(["q-codex"]) == ["c"]  # a worker stopping hands its list over
    assert not client.exists(wl.queue_listening_key("q-codex"), wl.queue_ids_key("q-codex"))
