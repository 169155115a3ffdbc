"""PID 1 of a sandboxed command: builds the command's filesystem view, then runs and reaps it.

``workers.sandbox`` runs this file as ``python -I -S sandbox_init.py PLAN -- ARGV...`` inside the
command's new PID, mount and IPC namespaces (and network namespace), as root: the host's root, or
root of a user namespace when the worker is not root. PLAN is ``key=value`` words (``plan_args``,
readable in ``ps``; JSON would cost its parser's import, ~5 ms, on every command):

1. ``view``: a fresh tmpfs becomes ``/``. Into it go read-only bind mounts of the visible system
   trees, the namespace's own ``/proc``, a minimal ``/dev``, private tmpfs at ``/tmp``, ``/var/tmp``
   and ``/dev/shm``, and read-write binds of the paths to keep (the attempt's scratch directory,
   the workspace root) at their own paths. Then ``pivot_root`` and the old root is detached, so no
   path leads back to the host's tree.
2. Fork the command (chdir to ``cwd``, exec ARGV). With ``user`` (a root worker), the command
   first enters a user namespace of its own in which PID 1 maps root and that user id and group
   id, and no other, to themselves: the kernel keeps a user's keyrings (and its persistent keyring) per user
   namespace, so what one command stores there dies with it instead of waiting, under the same
   user id, for a later attempt. ``setpriv`` in ARGV then switches to that user.
3. Reap every orphan the kernel hands PID 1, and exit with the command's status (128 + signal when
   it was killed). This exit ends the namespace.

Everything fails closed: when a step of the view fails, the command never starts.

Only the standard library, imported at the top: ``-I`` leaves the repository off ``sys.path``, and
once the root has moved nothing outside the view could be imported. ``-S`` skips ``site``, and
``_signal`` stands for ``signal`` (which imports ``enum``), for the start-up time paid by every
command. The worker imports this module too, for ``plan_args`` and ``SYSCALLS``.
"""

from __future__ import annotations

import _signal
import ctypes
import os
import sys
import warnings  # noqa: F401  os.execvp imports it lazily, when the root has moved and it cannot be found

# For the annotations alone: importing typing would pull in re and functools on every command.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

# Syscalls glibc does not wrap, by machine. mount_setattr is 442 on every architecture.
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {"pivot_root": 155},
    "aarch64": {"pivot_root": 41},
}
MOUNT_SETATTR = 442

# The device nodes a command gets: the harmless character devices every program may expect.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# The root of the view is built here (in the private mount namespace) before it becomes "/".
STAGING = "/tmp"
# Exit status when the sandbox itself cannot be set up (the command never ran).
SETUP_FAILED = 125
SETUP_PREFIX = "receipt sandbox: "

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MNT_DETACH = 0x2
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
CLONE_NEWUSER = 0x10000000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.syscall.restype = ctypes.c_long


class MountAttr(ctypes.Structure):
    """``struct mount_attr`` of mount_setattr(2)."""

    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    fs = fstype.encode() if fstype else None
    options = data.encode() if data else None
    _check(_libc.mount(source.encode(), target.encode(), fs, flags, options), f"mount {source} on {target}")


def _setattr(path: str, attr_set: int, *, recursive: bool) -> None:
    attr = MountAttr(attr_set, 0, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    _check(
        _libc.syscall(MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)),
        f"mount_setattr {path}",
    )


def _syscall(name: str, *args: Any) -> int:
    number = SYSCALLS[os.uname().machine][name]
    return _check(_libc.syscall(number, *args), name)


def _tmpfs(target: str, mode: str, size_kb: int, flags: int = MS_NOSUID | MS_NODEV) -> None:
    _mount("tmpfs", target, "tmpfs", flags, f"mode={mode},size={size_kb}k")


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def build_view(view: dict[str, Any]) -> None:
    """Make the view ``/`` for this mount namespace (see the module docstring)."""
    # Sources first, as O_PATH descriptors: the staging tmpfs is about to cover /tmp, where the
    # scratch directory usually lives, and a bind from /proc/self/fd/N reaches a covered path.
    opened: list[int] = []

    def hold(path: str, *, directory: bool) -> str:
        flags = os.O_PATH | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0)
        fd = os.open(path, flags)
        opened.append(fd)
        return f"/proc/self/fd/{fd}"

    tmp_kb = int(view["tmpfs_mb"]) * 1024
    visible: list[tuple[str, str, bool]] = []  # (path, source or symlink target, is a symlink)
    for path in sorted(view["visible"], key=_depth):
        if os.path.islink(path):
            visible.append((path, os.readlink(path), True))
        elif os.path.isdir(path):
            visible.append((path, hold(path, directory=True), False))
    keep = [(path, hold(path, directory=True)) for path in sorted(view["keep"], key=_depth)]
    present = [name for name in DEVICES if os.path.exists(f"/dev/{name}")]
    devices = [(name, hold(f"/dev/{name}", directory=False)) for name in present]
    proc = hold("/proc", directory=True)
    try:
        root = STAGING
        _tmpfs(root, "0755", 1024)
        for path, source, link in visible:
            target = root + path
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if link:
                if not os.path.lexists(target):
                    os.symlink(source, target)
                continue
            os.makedirs(target, exist_ok=True)
            _mount(source, target, None, MS_BIND | MS_REC)
            _setattr(target, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive=True)
        os.makedirs(root + "/proc", exist_ok=True)
        _mount(proc, root + "/proc", None, MS_BIND | MS_REC)
        _build_dev(root + "/dev", devices, tmp_kb)
        for private in ("/tmp", "/var/tmp"):
            os.makedirs(root + private, exist_ok=True)
            _tmpfs(root + private, "1777", tmp_kb)
        os.makedirs(root + "/run", exist_ok=True)
        for path, source in keep:
            target = root + path
            os.makedirs(target, exist_ok=True)
            _mount(source, target, None, MS_BIND)
            _setattr(target, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive=False)
        _setattr(root, MOUNT_ATTR_RDONLY, recursive=False)
        os.chdir(root)
        _syscall("pivot_root", b".", b".")
        # The old root now sits on top of the new one: detach it, whole, with everything under it.
        _check(_libc.umount2(b".", MNT_DETACH), "umount the old root")
        os.chdir("/")
    finally:
        for fd in opened:
            os.close(fd)


def _build_dev(dev: str, devices: Sequence[tuple[str, str]], tmp_kb: int) -> None:
    """A /dev of a few harmless nodes, its own pseudo-terminals and a private /dev/shm.

    Not the host's: that one may hold a syslog socket (/dev/log), the host's terminals, and
    device nodes left open to every user (/dev/kvm, /dev/fuse on some hosts).
    """
    os.makedirs(dev, exist_ok=True)
    _tmpfs(dev, "0755", 64, MS_NOSUID | MS_NOEXEC)
    for name, source in devices:
        node = f"{dev}/{name}"
        with open(node, "w"):
            pass
        _mount(source, node, None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/pts")
    _mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    os.mkdir(f"{dev}/shm")
    _tmpfs(f"{dev}/shm", "1777", tmp_kb)
    _setattr(dev, MOUNT_ATTR_RDONLY, recursive=False)


def plan_args(plan: dict[str, Any]) -> list[str]:
    """PLAN as the words ``parse_plan`` reads (``workers.sandbox.init_plan`` makes the dict)."""
    words = [f"cwd={plan['cwd']}"]
    view = plan.get("view")
    if view is not None:
        words.append(f"tmpfs_mb={int(view['tmpfs_mb'])}")
        words += [f"visible={path}" for path in view["visible"]]
        words += [f"keep={path}" for path in view["keep"]]
    if plan.get("user") is not None:
        uid, gid = plan["user"]
        words.append(f"user={int(uid)}:{int(gid)}")
    return words


def parse_plan(args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``PLAN -- ARGV`` back into the plan and the command's argv."""
    end = list(args).index("--")
    plan: dict[str, Any] = {"view": None, "user": None, "cwd": "/"}
    view: dict[str, Any] = {"visible": [], "keep": [], "tmpfs_mb": 0}
    for word in args[:end]:
        key, _, value = word.partition("=")
        if key == "cwd":
            plan["cwd"] = value
        elif key == "tmpfs_mb":
            view["tmpfs_mb"] = int(value)
            plan["view"] = view
        elif key in ("visible", "keep"):
            view[key].append(value)
        elif key == "user":
            uid, gid = value.split(":")
            plan["user"] = [int(uid), int(gid)]
        else:
            raise ValueError(f"unknown plan word {word!r}")
    return plan, list(args[end + 1 :])


def _map_user(pid: int, uid: int, gid: int) -> None:
    """Map root and ``uid``/``gid`` to themselves, and nothing else, in ``pid``'s user namespace.

    Root is mapped so that the child, still root, keeps its capabilities in the namespace through
    ``exec``: ``setpriv`` needs them to switch to the command's user and drop every capability.
    The command can never be root there again (``no_new_privs``, an empty bounding set).
    """
    for name, ident in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 0 1\n{ident} {ident} 1\n")


def _reset_dispositions() -> None:
    """Every signal Python may set back to its default (glibc keeps 32 and 33 for itself)."""
    for sig in _signal.valid_signals():
        if sig in (_signal.SIGKILL, _signal.SIGSTOP):
            continue
        try:
            _signal.signal(sig, _signal.SIG_DFL)
        except (OSError, ValueError):
            continue


def _start(plan: dict[str, Any], argv: Sequence[str]) -> int:
    """Fork the command: in a user namespace of its own when PLAN names its user; its pid."""
    user = plan.get("user")
    made_r, made_w = os.pipe()  # the child: "my user namespace exists"
    mapped_r, mapped_w = os.pipe()  # PID 1: "its map is written"
    pid = os.fork()
    if pid == 0:
        os.close(made_r)
        os.close(mapped_w)
        # An ignored signal passes through exec: Python ignores SIGPIPE and SIGXFSZ, and a worker
        # started under nohup or make ignores more. The command starts with every default.
        _reset_dispositions()
        code = 127
        try:
            if user is not None:
                code = SETUP_FAILED
                _check(_libc.unshare(CLONE_NEWUSER), "unshare a user namespace")
                os.write(made_w, b"+")
                if os.read(mapped_r, 1) != b"+":
                    raise OSError("PID 1 did not map the command's user namespace")
                code = 127
            os.chdir(plan["cwd"])
            os.execvp(argv[0], list(argv))
        except OSError as exc:
            print(f"{SETUP_PREFIX}cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    os.close(made_w)
    os.close(mapped_r)
    try:
        if user is not None and os.read(made_r, 1) == b"+":
            _map_user(pid, int(user[0]), int(user[1]))
            os.write(mapped_w, b"+")
    except OSError as exc:
        print(f"{SETUP_PREFIX}cannot map the command's user namespace: {exc}", file=sys.stderr, flush=True)
    finally:
        os.close(made_r)
        os.close(mapped_w)  # a child still waiting reads end-of-file and gives up
    return pid


def run(plan: dict[str, Any], argv: Sequence[str]) -> int:
    if plan.get("view") is not None:
        try:
            build_view(plan["view"])
        except (OSError, KeyError, ValueError) as exc:
            print(
                f"{SETUP_PREFIX}cannot build the command's filesystem view: {exc}",
                file=sys.stderr,
                flush=True,
            )
            return SETUP_FAILED
    pid = _start(plan, argv)
    while True:
        try:
            done, status = os.wait()
        except ChildProcessError:
            return 0
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(run(*parse_plan(sys.argv[1:])))
