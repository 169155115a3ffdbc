"""Claiming a user id per attempt (``workers.sandbox_users``): exclusive across threads and
processes, in turn round the range, released when the holder ends, refused in an unsafe folder."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.waiting import wait_for
from workers import sandbox_users
from workers.sandbox_users import NoFreeUid, UidRange, UnusableLockDir

RANGE = UidRange(1879950000, 1879950002)
REPO = Path(__file__).resolve().parents[2]

HOLD = """
import sys
from pathlib import Path
from workers.sandbox_users import UidRange, claim
with claim(UidRange(int(sys.argv[1]), int(sys.argv[2])), Path(sys.argv[3])) as uid:
    print(uid, flush=True)
    sys.stdin.read()  # hold the claim until the test closes our stdin
"""


def test_claims_go_round_the_range_never_twice_and_come_back_when_released(tmp_path: Path) -> None:
    locks = tmp_path / "uids"
    one_by_one = []
    for _ in range(4):
        with sandbox_users.claim(RANGE, locks) as uid:
            one_by_one.append(uid)
    # Each released id waits for the others' turn before it comes back.
    assert one_by_one == [1879950000, 1879950001, 1879950002, 1879950000]
    with ExitStack() as stack:
        held = [stack.enter_context(sandbox_users.claim(RANGE, locks)) for _ in range(3)]
        assert held == [1879950001, 1879950002, 1879950000]
        with pytest.raises(NoFreeUid, match="RECEIPT_CODEX_UID_RANGE"), sandbox_users.claim(RANGE, locks):
            pass
    assert (os.stat(locks).st_mode & 0o777) == 0o700


def test_threads_claiming_at_once_each_get_their_own_id(tmp_path: Path) -> None:
    locks = tmp_path / "uids"
    wide = UidRange(1879950000, 1879950099)
    barrier = threading.Barrier(8)
    got: list[int] = []
    lock = threading.Lock()
    release = threading.Event()

    def worker() -> None:
        barrier.wait(10)
        with sandbox_users.claim(wide, locks) as uid:
            with lock:
                got.append(uid)
            release.wait(10)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(got) == 8, 10, interval=0.01, what="eight claims held at once")
    finally:
        release.set()
        for t in threads:
            t.join(10)
    assert sorted(got) == list(range(1879950000, 1879950008))


def test_another_process_holding_an_id_is_respected_until_it_dies(tmp_path: Path) -> None:
    locks = tmp_path / "uids"
    pair = UidRange(RANGE.first, RANGE.first + 1)
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(pair.first), str(pair.last), str(locks)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == str(pair.first)
            with sandbox_users.claim(pair, locks) as uid:
                assert uid == pair.last
            # The turn is the holder's id again, and it is still held: the other one comes.
            with sandbox_users.claim(pair, locks) as uid:
                assert uid == pair.last
            holder.kill()  # a worker killed outright: the kernel drops its claim with its descriptors
            holder.wait(10)
            with sandbox_users.claim(pair, locks) as uid:
                assert uid == pair.first
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(10)


def test_a_claims_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    locks = tmp_path / "uids"
    locks.mkdir(mode=0o700)
    locks.chmod(0o777)
    with pytest.raises(UnusableLockDir, match="writable by no one else"), sandbox_users.claim(RANGE, locks):
        pass
    (tmp_path / "file").write_text("")
    with (
        pytest.raises(UnusableLockDir, match="cannot use"),
        sandbox_users.claim(RANGE, tmp_path / "file" / "uids"),
    ):
        pass


def test_a_range_holding_a_user_or_a_subordinate_range_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="holds user "):
        sandbox_users.check_free(UidRange(1, 1000))
    subuid = tmp_path / "subuid"
    subuid.write_text("builder:1879960000:65536\n")
    monkeypatch.setattr(sandbox_users, "SUBORDINATE_FILES", (subuid,))
    sandbox_users.assigned_in.cache_clear()
    try:
        with pytest.raises(ValueError, match="subordinate range 1879960000\\+65536 of 'builder'"):
            sandbox_users.check_free(UidRange(1879990000, 1879990010))
        sandbox_users.check_free(UidRange(1879950000, 1879959999))  # just below it: free
    finally:
        sandbox_users.assigned_in.cache_clear()
