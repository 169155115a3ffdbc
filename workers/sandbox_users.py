"""Which user id a sandboxed attempt runs as when the worker is root: one of its own.

With ``RECEIPT_CODEX_UID_RANGE`` set (it is by default), each running attempt holds a user id of
the range that no other running attempt holds, claimed by an exclusive ``flock`` on
``/run/receipt/codex-uids/<uid>``, in turn round the range. Every worker process of the host
claims in the same folder, so the rule holds across processes, and the kernel drops a claim when
its descriptor closes, also when the worker dies. A user of its own gives each command its own process budget
(RLIMIT_NPROC counts per user), files no other running command can open even where both could
reach them, and processes no other command may signal.

The range must be free: no user or group of the host's database, and no subordinate range of
``/etc/subuid`` or ``/etc/subgid``, may fall in it, or a command would own that user's files.
The default, 1879048192-1879052287 (0x70000000 + 4 Ki: one lock file each at most, and far more
than the commands a host runs at once), lies in the block systemd's "Users, Groups, UIDs and GIDs"
document leaves unused, above the container ranges and below 2^31.
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

UID_LOCK_DIR = Path("/run/receipt/codex-uids")
RANGE_SETTING = "RECEIPT_CODEX_UID_RANGE"
# Ids the kernel treats specially: root, the overflow id and both spellings of (uid_t) -1.
RESERVED = frozenset({0, 65534, 65535, 4294967295})
SUBORDINATE_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))


class NoFreeUid(Exception):
    """Every id of the range is held by a running attempt; a later attempt may find one free."""


class UnusableLockDir(Exception):
    """The claims folder cannot be made, or is not the worker's alone (a claim there proves nothing)."""


@dataclass(frozen=True)
class UidRange:
    """Inclusive range of user ids (each also used as the attempt's group id)."""

    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> UidRange | None:
        """``FIRST-LAST``, or ``none`` (every command runs as ``RECEIPT_CODEX_USER``)."""
        value = text.strip().lower()
        if value == "none":
            return None
        first_text, sep, last_text = value.partition("-")
        try:
            if not sep:
                raise ValueError
            first, last = int(first_text), int(last_text)
        except ValueError:
            raise ValueError(
                f"{RANGE_SETTING} must be FIRST-LAST (two user ids) or none, not {text!r}"
            ) from None
        if not 0 < first <= last < 4294967295:
            raise ValueError(f"{RANGE_SETTING}: need 0 < FIRST <= LAST < 4294967295, not {text!r}")
        reserved = sorted(u for u in RESERVED if first <= u <= last)
        if reserved:
            raise ValueError(f"{RANGE_SETTING} {text!r} holds the reserved id {reserved[0]}")
        return cls(first, last)

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def overlaps(self, first: int, last: int) -> bool:
        return first <= self.last and self.first <= last


@lru_cache(maxsize=8)
def assigned_in(uids: UidRange) -> str | None:
    """The first user, group or subordinate range of this host inside ``uids`` (None: it is free).

    Enumerates the user database once per process and range: it changes seldom, and a worker
    checks its settings at every attempt.
    """
    for user in pwd.getpwall():
        if uids.overlaps(user.pw_uid, user.pw_uid):
            return f"user {user.pw_name!r} (uid {user.pw_uid})"
    for group in grp.getgrall():
        if uids.overlaps(group.gr_gid, group.gr_gid):
            return f"group {group.gr_name!r} (gid {group.gr_gid})"
    for path in SUBORDINATE_FILES:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.strip().split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                start, count = int(parts[1]), int(parts[2])
                if count and uids.overlaps(start, start + count - 1):
                    return f"the subordinate range {start}+{count} of {parts[0]!r} in {path}"
    return None


def check_free(uids: UidRange) -> None:
    """Raise ValueError when the host has given any id of ``uids`` to someone."""
    taken = assigned_in(uids)
    if taken is not None:
        raise ValueError(
            f"{RANGE_SETTING} {uids} holds {taken}; a command would own that user's files: "
            "choose ids nothing on this host uses"
        )


def _lock_dir(path: Path) -> Path:
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        with suppress(FileExistsError):
            path.mkdir(mode=0o700)
        info = os.lstat(path)
    except OSError as exc:
        raise UnusableLockDir(f"cannot use {path} to claim user ids: {exc}") from exc
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise UnusableLockDir(
            f"{path} must be a directory owned by the worker's user and writable by no one else"
        )
    return path


def _try_lock(folder: Path, uid: int) -> int | None:
    fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextmanager
def claim(uids: UidRange, lock_dir: Path = UID_LOCK_DIR) -> Iterator[int]:
    """Hold a free id of ``uids`` until the block ends: the first free one after the last claimed.

    Round the range rather than lowest first: an id comes back only after every other free id has
    had its turn, so whatever the kernel still holds of an attempt after it ends (keys waiting for
    the key collector, a user namespace being freed) is long gone when its id is used again. The
    cursor (``next-FIRST-LAST``) is read and moved under its own exclusive lock.
    """
    folder = _lock_dir(lock_dir)
    size = uids.last - uids.first + 1
    # One cursor per range: deployments with ranges of their own on one host keep their turns apart.
    where = folder / f"next-{uids.first}-{uids.last}"
    cursor = os.open(where, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(cursor, fcntl.LOCK_EX)
        try:
            start = int(os.pread(cursor, 32, 0) or b"0")
        except ValueError:
            start = uids.first
        if not uids.first <= start <= uids.last:
            start = uids.first
        for step in range(size):
            uid = uids.first + (start - uids.first + step) % size
            held = _try_lock(folder, uid)
            if held is not None:
                os.ftruncate(cursor, 0)
                os.pwrite(cursor, str(uids.first + (uid - uids.first + 1) % size).encode(), 0)
                break
        else:
            raise NoFreeUid(f"every user id of {RANGE_SETTING} ({uids}) is held by a running attempt")
    finally:
        os.close(cursor)  # drops the cursor's lock
    try:
        yield uid
    finally:
        os.close(held)  # drops the claim
