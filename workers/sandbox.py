"""The sandbox every codex command runs in.

When the worker is root, a command runs as::

    setpriv --pdeathsig KILL --            # a SIGKILLed worker takes the whole tree with it
      prlimit --cpu --as --nproc --fsize --nofile --
        unshare --pid --fork --kill-child --mount-proc --ipc [--net] --
          <python -I -S sandbox_init.py PLAN -->  # PID 1 of the namespaces, still root: builds the view
            [a user namespace of its own]  # made by PID 1, mapping only the command's user
            setpriv --reuid --regid --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all --
              <argv>                       # the command, as a user id of its own

- A user id of its own per running attempt, from ``RECEIPT_CODEX_UID_RANGE``
  (``workers.sandbox_users``): concurrent commands share no files or process budget.
  ``none`` runs every command as ``RECEIPT_CODEX_USER`` instead. And a user namespace of its own
  per command, mapping only that user: the kernel's keyrings are per user namespace, so a key a
  command stores dies with it.
- A private filesystem view (``workers.sandbox_init``): a read-only bind of each tree of
  ``RECEIPT_CODEX_VISIBLE_PATHS``, the attempt's scratch directory and the workspace root
  read-write at their own paths, private tmpfs at ``/tmp``, ``/var/tmp`` and ``/dev/shm``, a
  minimal ``/dev``, the namespace's ``/proc``. Nothing else of the host exists in it: not other
  commands' scratch directories, not a socket under ``/run`` or ``/tmp``, not ``/home``.
  Hidden rather than read-only, because read-only does not stop ``connect()`` on a socket file.
- A new PID namespace: the command sees only its own processes (``/proc`` is remounted), so the
  worker's ``/proc/<pid>/environ`` is out of reach; and when PID 1 ends, the kernel kills every
  process left in the namespace, whatever it did with ``setsid`` or double forks.
- PID 1 stays root, so the parent-death signal ``unshare --kill-child`` gives it survives the
  command's change of user (a credential change clears a process's own parent-death signal).
- A new IPC namespace (System V objects and POSIX message queues are per command), and a new
  network namespace with no interface up unless ``RECEIPT_CODEX_NETWORK=host``; the network
  namespace also separates abstract unix sockets.
- rlimits through ``prlimit``, inherited by everything below it.
- Util-linux binaries rather than ``preexec_fn``: the worker is multi-threaded (Celery's thread
  pool), where running Python between fork and exec can deadlock. Python 3.11 has no
  ``os.unshare`` either. The mounts are made by PID 1, a process of its own, single-threaded.

Not root: a user namespace stands in for the user switch when the kernel allows it (detected,
not assumed), with the same PID, IPC, network namespaces and filesystem view, the command keeping
no capability; without one, only rlimits (minus the process count, which would count every
process of the worker's own user), a new session and the parent-death signal remain.
``protections_off`` says which, and the codex worker logs it once at start.

Every attempt ends by killing what is left of the tree, not only on abort or timeout, and its
scratch directory is removed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import posixpath
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from app.config import Settings
from workers import sandbox_init, sandbox_users
from workers.sandbox_users import UidRange

log = logging.getLogger("receipt.sandbox")

NETWORK_MODES = ("none", "host")
FILESYSTEM_MODES = ("private", "host")
# The PATH of a command that runs as another user: system folders only.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KILL_GRACE_S = 2.0
# How long the end of an attempt waits for the namespace's last process to disappear.
REAP_TIMEOUT_S = 10.0
INIT_SCRIPT = str(Path(sandbox_init.__file__).resolve())


class SandboxRefused(Exception):
    """A command the sandbox will not start (a ``cwd`` outside the rules); never worth a retry."""


@dataclass(frozen=True)
class Limits:
    """The rlimits of one command (each applies per process, except the process count)."""

    cpu_seconds: int
    memory_mb: int
    max_processes: int
    max_file_mb: int
    max_open_files: int

    def prlimit_args(self, *, with_nproc: bool) -> list[str]:
        args = [
            f"--cpu={self.cpu_seconds}",
            f"--as={self.memory_mb * 1024 * 1024}",
            f"--fsize={self.max_file_mb * 1024 * 1024}",
            f"--nofile={self.max_open_files}",
        ]
        if with_nproc:
            args.append(f"--nproc={self.max_processes}")
        return args


@dataclass(frozen=True)
class Host:
    """What this host lets the sandbox do, detected once per process."""

    root: bool
    user_namespaces: bool
    tools: bool  # setpriv, prlimit and unshare are installed
    # mount_setattr(2) (Linux 5.12+) and a known syscall number for pivot_root(2): what the
    # filesystem view needs.
    views: bool = True

    @property
    def namespaces(self) -> bool:
        return self.tools and (self.root or self.user_namespaces)


def _has_mount_setattr() -> bool:
    if os.uname().machine not in sandbox_init.SYSCALLS:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # Invalid on purpose (no descriptor): a kernel that has the call answers EBADF, one without ENOSYS.
    libc.syscall(sandbox_init.MOUNT_SETATTR, -1, b"", 0, None, 0)
    return ctypes.get_errno() != 38  # ENOSYS


@lru_cache(maxsize=1)
def detect_host() -> Host:
    """Probe the host: root, util-linux tools, whether this process may make a user namespace."""
    tools = all(shutil.which(t) for t in ("setpriv", "prlimit", "unshare"))
    root = os.geteuid() == 0
    userns = False
    if tools:
        # Root too: a host may forbid user namespaces to everyone (user.max_user_namespaces=0).
        try:
            probe = subprocess.run(
                ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "true"],
                capture_output=True,
                timeout=10,
                check=False,
            )
            userns = probe.returncode == 0
        except (OSError, subprocess.SubprocessError):
            userns = False
    return Host(root=root, user_namespaces=userns, tools=tools, views=_has_mount_setattr())


def _visible_paths(text: str) -> tuple[str, ...]:
    paths = []
    for raw in text.split(","):
        path = raw.strip()
        if not path:
            continue
        if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
            raise ValueError(
                "RECEIPT_CODEX_VISIBLE_PATHS must list absolute, normalised paths other than /, "
                f"separated by commas; not {path!r}"
            )
        paths.append(path)
    return tuple(dict.fromkeys(paths))


@dataclass(frozen=True)
class SandboxConfig:
    """The sandbox settings of a deployment (``RECEIPT_CODEX_*``)."""

    user: str
    network: str
    workspace_root: str | None
    scratch_root: str | None
    limits: Limits
    filesystem: str = "private"
    visible_paths: tuple[str, ...] = ()
    tmpfs_mb: int = 64
    uid_range: UidRange | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> SandboxConfig:
        network = settings.codex_network.strip().lower()
        if network not in NETWORK_MODES:
            raise ValueError(
                f"RECEIPT_CODEX_NETWORK must be one of {', '.join(NETWORK_MODES)}, not {network!r}"
            )
        filesystem = settings.codex_filesystem.strip().lower()
        if filesystem not in FILESYSTEM_MODES:
            raise ValueError(
                f"RECEIPT_CODEX_FILESYSTEM must be one of {', '.join(FILESYSTEM_MODES)}, not {filesystem!r}"
            )
        for env, value in (
            ("RECEIPT_CODEX_CPU_SECONDS", settings.codex_cpu_seconds),
            ("RECEIPT_CODEX_MEMORY_MB", settings.codex_memory_mb),
            ("RECEIPT_CODEX_MAX_PROCESSES", settings.codex_max_processes),
            ("RECEIPT_CODEX_MAX_FILE_MB", settings.codex_max_file_mb),
            ("RECEIPT_CODEX_MAX_OPEN_FILES", settings.codex_max_open_files),
            ("RECEIPT_CODEX_TMPFS_MB", settings.codex_tmpfs_mb),
        ):
            if value <= 0:
                raise ValueError(f"{env} must be a positive whole number, not {value}")
        workspace_root = settings.codex_workspace_root or None
        if workspace_root is not None and Path(workspace_root).resolve() == Path("/"):
            raise ValueError("RECEIPT_CODEX_WORKSPACE_ROOT must not be /: a command would see the whole host")
        uid_range = UidRange.parse(settings.codex_uid_range)
        if uid_range is not None:
            sandbox_users.check_free(uid_range)
        return cls(
            user=settings.codex_user,
            network=network,
            workspace_root=workspace_root,
            scratch_root=settings.codex_scratch_root or None,
            limits=Limits(
                cpu_seconds=settings.codex_cpu_seconds,
                memory_mb=settings.codex_memory_mb,
                max_processes=settings.codex_max_processes,
                max_file_mb=settings.codex_max_file_mb,
                max_open_files=settings.codex_max_open_files,
            ),
            filesystem=filesystem,
            visible_paths=_visible_paths(settings.codex_visible_paths),
            tmpfs_mb=settings.codex_tmpfs_mb,
            uid_range=uid_range,
        )


def has_view(config: SandboxConfig, host: Host) -> bool:
    """Whether commands get the private filesystem view on this host with these settings."""
    return config.filesystem == "private" and host.namespaces and host.views


def protections_off(config: SandboxConfig, host: Host) -> list[str]:
    """Which protections this host cannot give a command, in words (empty: all of them are on)."""
    off: list[str] = []
    if not host.tools:
        return ["every protection: util-linux setpriv/prlimit/unshare are not installed"]
    if not host.root:
        off.append(
            f"running as user {config.user!r} (the worker is not root: commands run as the worker's user)"
        )
        off.append("a user id per attempt (needs a root worker)")
        off.append("process-count limit (RLIMIT_NPROC would count every process of the worker's user)")
        if not host.user_namespaces:
            off.append("PID namespace (a command's setsid/double-forked processes are only killed by group)")
            off.append("private /proc (a command can read /proc of the worker's other processes)")
            off.append(
                "network namespace and IPC namespace (the kernel refuses unprivileged user namespaces)"
            )
            off.append(
                "private filesystem view (the kernel refuses unprivileged user namespaces): a command "
                "reaches every file and unix socket the worker's user can, other commands' included"
            )
    elif not host.user_namespaces:
        off.append(
            "a user namespace per command (this host refuses user namespaces): kernel keys a command "
            "stores outlive it under its user id, and commands running as one user share its process budget"
        )
    if host.root and config.uid_range is None:
        off.append(
            f"a user id per attempt (RECEIPT_CODEX_UID_RANGE=none): every command runs as "
            f"{config.user!r}, and commands running at once may open each other's files where both "
            "can reach them (the workspace root) and see each other's kernel keys"
        )
    if host.namespaces and config.filesystem == "private" and not host.views:
        machines = " or ".join(sandbox_init.SYSCALLS)
        off.append(
            f"private filesystem view (needs mount_setattr, Linux 5.12+, on {machines}): a command "
            "reaches every unix socket and file its user can, other commands' scratch directories included"
        )
    if config.filesystem == "host":
        off.append("private filesystem view (RECEIPT_CODEX_FILESYSTEM=host)")
    if config.network == "host":
        off.append("network namespace (RECEIPT_CODEX_NETWORK=host)")
    return off


def resolve_cwd(cwd: str | None, scratch: Path, workspace_root: str | None) -> Path:
    """Where a command runs: inside ``RECEIPT_CODEX_WORKSPACE_ROOT`` or its scratch directory.

    A relative ``cwd`` is taken from the workspace root (unset: from the scratch directory);
    symlinks and ``..`` are resolved before the check, so neither can leave the allowed roots.
    """
    if cwd is None:
        return scratch
    roots = [scratch.resolve()]
    if workspace_root:
        roots.append(Path(workspace_root).resolve())
    base = roots[-1]
    resolved = (base / cwd).resolve()  # an absolute cwd replaces base
    if not any(resolved == root or root in resolved.parents for root in roots):
        where = "RECEIPT_CODEX_WORKSPACE_ROOT" if workspace_root else "the attempt's scratch directory"
        raise SandboxRefused(
            f"payload.cwd: {cwd!r} resolves outside {where}; a command's cwd must stay inside it"
        )
    if not resolved.is_dir():
        raise SandboxRefused(f"payload.cwd: {cwd!r} is not a directory")
    return resolved


def _named_user_ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SandboxRefused(f"RECEIPT_CODEX_USER {user!r} does not exist on this host") from None
    if entry.pw_uid == 0:
        raise SandboxRefused("RECEIPT_CODEX_USER must not be root")
    return entry.pw_uid, entry.pw_gid


@dataclass(frozen=True)
class Attempt:
    """What one attempt runs with: a fresh scratch directory and, under a root worker, its user."""

    scratch: Path
    uid: int | None = None  # None: the worker's own user (not root)
    gid: int | None = None


@contextmanager
def attempt(config: SandboxConfig, host: Host) -> Iterator[Attempt]:
    """Claim the attempt's user and make its scratch directory; both are released afterwards.

    Raises ``sandbox_users.NoFreeUid`` when every id of the range is in use (worth a retry later).
    """
    with ExitStack() as stack:
        uid = gid = None
        if host.root and host.tools:
            if config.uid_range is not None:
                uid = gid = stack.enter_context(sandbox_users.claim(config.uid_range))
            else:
                uid, gid = _named_user_ids(config.user)
        if has_view(config, host) and config.workspace_root and not Path(config.workspace_root).is_dir():
            raise SandboxRefused(
                f"RECEIPT_CODEX_WORKSPACE_ROOT {config.workspace_root!r} is not a directory on this host"
            )
        # Resolved: the view puts it at this path, and HOME and TMPDIR name it.
        path = Path(tempfile.mkdtemp(prefix="receipt-codex-", dir=config.scratch_root)).resolve()
        # Registered before the chown: the directory goes, whatever happens next. It goes before
        # the user id is released (callbacks run last in, first out).
        stack.callback(shutil.rmtree, path, ignore_errors=True)
        if uid is not None and gid is not None:
            os.chown(path, uid, gid)
        yield Attempt(path, uid, gid)


def visible(path: Path, config: SandboxConfig, host: Host, attempt: Attempt) -> bool:
    """Whether ``path`` leads to a file inside the command's view (always true without a view).

    Both sides resolved: a symlink in a visible tree that points out of the view dangles inside it.
    """
    if not has_view(config, host):
        return True
    roots = [*config.visible_paths, str(attempt.scratch)]
    if config.workspace_root:
        roots.append(config.workspace_root)
    target = path.resolve()
    return any(target == root or root in target.parents for root in (Path(r).resolve() for r in roots))


def init_plan(config: SandboxConfig, host: Host, attempt: Attempt, cwd: Path) -> dict[str, Any]:
    """What PID 1 sets up before it starts the command (``workers.sandbox_init``)."""
    view = None
    if has_view(config, host):
        keep = [str(attempt.scratch.resolve())]
        if config.workspace_root:
            keep.append(str(Path(config.workspace_root).resolve()))
        view = {"visible": list(config.visible_paths), "keep": keep, "tmpfs_mb": config.tmpfs_mb}
    # As root, the command gets a user namespace of its own (mapping only its user): its kernel
    # keyrings die with it. Not root, the user namespace of unshare --user is its own already.
    user = None
    if host.root and host.user_namespaces and attempt.uid is not None and attempt.gid is not None:
        user = [attempt.uid, attempt.gid]
    return {"view": view, "user": user, "cwd": str(cwd)}


def build_argv(
    argv: Sequence[str], config: SandboxConfig, host: Host, attempt: Attempt, cwd: Path
) -> list[str]:
    """The full argv that runs ``argv`` in the sandbox (never through a shell)."""
    if not host.tools:
        return list(argv)
    outer = [
        "setpriv",
        "--pdeathsig",
        "KILL",
        "--",
        "prlimit",
        *config.limits.prlimit_args(with_nproc=host.root),
    ]
    outer.append("--")
    if not host.namespaces:
        return [*outer, *argv]
    unshare = ["unshare"]
    if not host.root:
        unshare += ["--user", "--map-root-user"]
    unshare += ["--pid", "--fork", "--kill-child", "--mount-proc", "--ipc"]
    if config.network != "host":
        unshare.append("--net")
    plan = sandbox_init.plan_args(init_plan(config, host, attempt, cwd))
    inner = [sys.executable, "-I", "-S", INIT_SCRIPT, *plan, "--", "setpriv"]
    if host.root:
        if attempt.uid is None or attempt.gid is None:
            raise SandboxRefused("a root worker runs a command only as a user of its own; none was claimed")
        inner += [f"--reuid={attempt.uid}", f"--regid={attempt.gid}", "--clear-groups"]
    # As root of a user namespace the command keeps no capability either: with one, it could
    # unmount its view and see the host's tree beneath.
    inner += ["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
    return [*outer, *unshare, "--", *inner, *argv]


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's), from /proc; empty when unknown."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _signal(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Process:
    """One sandboxed command: started by ``start``, ended (always, whole tree) by ``finish``."""

    def __init__(self, proc: subprocess.Popen[bytes], host: Host) -> None:
        self.popen = proc
        self._host = host
        # The namespace's PID 1 (the init), known once the fork below unshare has happened.
        self._init_pid: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def _ns_init(self) -> int | None:
        """PID 1 of the command's namespace while ``unshare`` still runs (so its pid is not reused)."""
        if not self._host.namespaces or self.popen.poll() is not None:
            return None
        if self._init_pid is None:
            # setpriv and prlimit exec in place, so the Popen pid *is* unshare; its one child is PID 1.
            children = _children(self.popen.pid)
            self._init_pid = children[0] if children else None
        return self._init_pid

    def terminate(self, grace_s: float = KILL_GRACE_S) -> None:
        """Ask the command to stop (SIGTERM), then kill the whole tree after ``grace_s``."""
        init = self._ns_init()
        if init is not None:
            # PID 1 ignores SIGTERM from outside its namespace unless it handles it; the command
            # is its child, so the signal goes there.
            for child in _children(init):
                _signal(child, signal.SIGTERM)
        else:
            _signal_group(self.popen.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            self.popen.wait(grace_s)
        self.kill()

    def kill(self) -> None:
        """Kill every process of the command now and wait until none is left (bounded)."""
        init = self._ns_init()
        if init is not None:
            _signal(init, signal.SIGKILL)  # the namespace dies with its PID 1
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("sandboxed command %d did not die after SIGKILL", self.popen.pid)
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while init is not None and _alive(init) and time.monotonic() < deadline:
            time.sleep(0.01)

    def finish(self) -> None:
        """End of every attempt: nothing the command started may outlive it."""
        if self.popen.poll() is None:
            self.kill()
            return
        if not self._host.namespaces:
            # The command is done, but without a PID namespace its group may still hold
            # descendants (their membership keeps the group id from being reused).
            _signal_group(self.popen.pid, signal.SIGKILL)
        # With a namespace, unshare exits only after its PID 1, and the kernel has killed and
        # reaped every other process of the namespace before PID 1's exit completes.
        init = self._init_pid
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while init is not None and _alive(init) and time.monotonic() < deadline:
            time.sleep(0.01)


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    config: SandboxConfig,
    host: Host,
    attempt: Attempt,
) -> Process:
    """Start ``argv`` in the sandbox with stdout+stderr on one pipe; raises OSError if it cannot.

    ``cwd`` is a host path; with a filesystem view the command finds it at the same path.
    """
    proc = subprocess.Popen(
        build_argv(argv, config, host, attempt, cwd),
        cwd=str(cwd),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )
    process = Process(proc, host)
    return process
