"""Commands cannot see each other, or the host's sockets: real processes, as root.

Two tenants' commands run at the same time, held together by FIFOs in their own scratch
directories (the test writes them from outside) and by lines they print, never by sleeps. Each
leaves a secret, writes graffiti wherever it can, stores a kernel key, a System V segment and an
abstract socket, then hunts for the other's: by name over its whole filesystem, by the other's
exact paths, by signals, in /proc/keys and /proc/sysvipc. The socket test walks the command's
whole filesystem for unix sockets and tries each one, after showing that the host has such
sockets and that they answer from outside.

Commands call /usr/bin/python3: the view holds the system trees, not the worker's venv.
"""

from __future__ import annotations

import errno
import json
import os
import queue as queue_module
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.config import Settings
from app.storage.queue import Queue
from workers import sandbox
from workers.registry import default_registry
from workers.runner import AttemptResult, run_attempt

from .runtime_support import enqueue, receipts_of, wait_until
from .test_codex import PY, marked

HOST = sandbox.detect_host()
pytestmark = pytest.mark.skipif(
    not (HOST.root and HOST.tools and HOST.views),
    reason="needs a root worker with util-linux and mount_setattr (the private view)",
)

SETTINGS = Settings.from_env(
    {
        "RECEIPT_CODEX_COMMANDS": "enabled",
        "RECEIPT_CODEX_CPU_SECONDS": "120",
        "RECEIPT_CODEX_OUTPUT_TAIL_BYTES": "65536",
    }
)
# A user namespace instead of the root path: what a worker that is not root gets.
USERNS = sandbox.Host(root=False, user_namespaces=True, tools=True)
# Root on a host that forbids user namespaces (user.max_user_namespaces=0): no namespace per command.
ROOT_ALONE = replace(HOST, user_namespaces=False)
MODES = pytest.mark.parametrize(
    "host", [HOST, USERNS, ROOT_ALONE], ids=["root", "user-namespace", "root-without-user-namespaces"]
)
WALK_S = 90.0
WAIT_S = 60.0

# Walks every entry under / except /proc, whose entries are the namespace's own processes and
# kernel files (no socket inode lives there). Bounded: it says whether it finished.
WALK = r"""
import os, time
def walk(limit_s, visit):
    deadline = time.monotonic() + limit_s
    stack, count = ["/"], 0
    while stack:
        if time.monotonic() > deadline:
            return False, count
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            if entry.path == "/proc":
                continue
            count += 1
            visit(entry)
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
            except OSError:
                pass
    return True, count
"""

TENANT = (
    WALK
    + r"""
import ctypes, json, signal, socket, sys
name, other, key, other_key = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY = {"x86_64": 248, "aarch64": 217}[os.uname().machine]

def error(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return type(exc).__name__

# Leave things for the other to find: a secret, graffiti wherever writable, a key, a segment, a socket.
with open("secret-" + name, "w") as f:
    f.write("SECRET-" + name)
written = []
def graffiti(entry):
    if entry.is_dir(follow_symlinks=False):
        try:
            with open(os.path.join(entry.path, "graffiti-" + name), "w") as f:
                f.write(name)
            written.append(entry.path)
        except OSError:
            pass
left_complete, _ = walk(60, graffiti)
key_id = libc.syscall(ADD_KEY, b"user", ("receipt-" + name).encode(), b"x", 1, ctypes.c_int(-4))
segment = libc.shmget(key, 4096, 0o1666)
listener = socket.socket(socket.AF_UNIX)
listener.bind("\0receipt-" + name)
listener.listen()
os.mkfifo("go")
os.mkfifo("end")
ready = {"uid": os.getuid(), "scratch": os.getcwd(), "written": sorted(written), "complete": left_complete,
         "key": key_id, "segment": segment}
print("READY " + json.dumps(ready), flush=True)
with open("go") as f:
    orders = json.loads(f.read())

# Hunt for the other's.
found = []
def hunt(entry):
    if other in entry.name or (entry.name.startswith("receipt-codex-") and entry.path != os.getcwd()):
        found.append(entry.path)
complete, walked = walk(60, hunt)
def connect(address):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(address)
keys = open("/proc/keys").read()
segments = open("/proc/sysvipc/shm").read().split()
result = {
    "complete": complete,
    "walked": walked,
    "found": found,
    "tmp": sorted(os.listdir("/tmp")),
    "read_secret": error(lambda: open(orders["secret"]).read()),
    "list_scratch": error(lambda: os.listdir(orders["scratch"])),
    "kill_other": error(lambda: os.kill(orders["pid"], signal.SIGKILL)),
    "kill_all": error(lambda: os.kill(-1, signal.SIGKILL)),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "own_key": ("receipt-" + name) in keys,
    "other_key": ("receipt-" + other) in keys,
    "own_segment": str(key) in segments,
    "other_segment": str(other_key) in segments,
    "own_socket": error(lambda: connect("\0receipt-" + name)),
    "other_socket": error(lambda: connect("\0receipt-" + other)),
}
print("RESULT " + json.dumps(result), flush=True)
with open("end") as f:
    f.read()
"""
)

SOCKETS = (
    WALK
    + r"""
import json, socket, stat, sys
found, connected, errors = [], [], {}
def visit(entry):
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return
    if stat.S_ISSOCK(mode):
        found.append(entry.path)
complete, walked = walk(float(sys.argv[1]), visit)
for path in found + sys.argv[2:]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        try:
            s.connect(path)
            connected.append(path)
        except OSError as exc:
            errors[path] = type(exc).__name__
print(json.dumps({"complete": complete, "walked": walked, "found": found, "connected": connected,
                  "errors": errors, "top": sorted(os.listdir("/")), "tmp": sorted(os.listdir("/tmp"))}))
"""
)


class Running:
    """A command started directly through ``workers.sandbox``; its output lines arrive on a queue."""

    def __init__(self, argv: list[str], config: sandbox.SandboxConfig, host: sandbox.Host, stack: ExitStack):
        self.attempt = stack.enter_context(sandbox.attempt(config, host))
        self.proc = sandbox.start(
            argv,
            env={"PATH": sandbox.SANDBOX_PATH, "HOME": str(self.attempt.scratch)},
            cwd=self.attempt.scratch,
            config=config,
            host=host,
            attempt=self.attempt,
        )
        stack.callback(self.proc.finish)
        self.lines: queue_module.Queue[str] = queue_module.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.popen.stdout
        assert out is not None
        with out:
            for raw in iter(out.readline, b""):
                self.lines.put(raw.decode(errors="replace"))

    def expect(self, prefix: str) -> dict[str, Any]:
        """The JSON after the first line starting with ``prefix`` (bounded wait)."""
        while True:
            try:
                line = self.lines.get(timeout=WAIT_S)
            except queue_module.Empty:
                raise AssertionError(f"no {prefix!r} line within {WAIT_S} s; saw {self.seen}") from None
            self.seen.append(line)
            if line.startswith(prefix):
                return dict(json.loads(line[len(prefix) :]))


def send(fifo: Path, message: str) -> None:
    """Write ``message`` into a FIFO once its reader has it open (bounded)."""

    def opened() -> int | None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ENOENT):  # no reader yet
                return None
            raise

    fd = wait_until(opened, timeout=WAIT_S, what=f"a reader on {fifo}")
    try:
        os.set_blocking(fd, True)
        os.write(fd, message.encode())
    finally:
        os.close(fd)


SHARED_PLACES = ("/run", "/var/run", "/tmp", "/var/tmp", "/dev/shm", "/home", "/root")


def host_sockets() -> list[str]:
    """Unix sockets bound in the host's shared places (where daemons keep theirs), found from outside.

    The kernel's table of bound sockets (``/proc/net/unix``) names each one's path, so nothing is
    walked: a walk of the home folders' toolchains took seconds. Each is listed under every name
    the shared places give it (``/var/run`` is often a link to ``/run``)."""
    with open("/proc/net/unix") as table:
        paths = [fields[7] for fields in map(str.split, list(table)[1:]) if len(fields) > 7]
    # An abstract socket's name starts with "@": it has no path to hide.
    bound = {os.path.realpath(path) for path in paths if path.startswith("/")}
    found = set()
    for place in SHARED_PLACES:
        real = os.path.realpath(place)
        for path in bound:
            if path.startswith(real + "/"):
                alias = place + path[len(real) :]
                with suppress(OSError):
                    if stat.S_ISSOCK(os.lstat(alias).st_mode):
                        found.add(alias)
    return sorted(found)


def answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        try:
            s.connect(path)
            return True
        except OSError:
            return False


# -- two tenants at once ---------------------------------------------------------------------------


def test_two_tenants_running_at_once_cannot_read_list_signal_or_write_to_each_other() -> None:
    config = sandbox.SandboxConfig.from_settings(SETTINGS)
    names = {"a": f"tenant-a-{uuid.uuid4().hex}", "b": f"tenant-b-{uuid.uuid4().hex}"}
    keys = {"a": random.randrange(1 << 20, 1 << 30), "b": random.randrange(1 << 30, 1 << 31)}
    with ExitStack() as stack:
        run = {
            me: Running(
                [PY, "-c", TENANT, names[me], names[you], str(keys[me]), str(keys[you])], config, HOST, stack
            )
            for me, you in (("a", "b"), ("b", "a"))
        }
        ready = {me: r.expect("READY ") for me, r in run.items()}
        # Both are running now, each blocked on its own FIFO, each secret on the host's disk.
        assert ready["a"]["uid"] != ready["b"]["uid"], "two running attempts share a user id"
        for me, r in run.items():
            secret = r.attempt.scratch / f"secret-{names[me]}"
            assert secret.read_text() == f"SECRET-{names[me]}"
            assert secret.stat().st_uid == ready[me]["uid"]
            assert ready[me]["scratch"] == str(r.attempt.scratch)
            assert ready[me]["complete"], "the graffiti walk did not finish"
            assert ready[me]["key"] > 0 and ready[me]["segment"] >= 0
            # Writable for the command: its scratch directory and its private temp folders only.
            assert set(ready[me]["written"]) <= {str(r.attempt.scratch), "/tmp", "/var/tmp", "/dev/shm"}
            assert str(r.attempt.scratch) in ready[me]["written"]
        hosts = {me: marked(names[me]) for me in run}
        assert all(hosts.values()), "each command is a live process on the host"
        for me, you in (("a", "b"), ("b", "a")):
            other = run[you].attempt.scratch
            orders = {
                "secret": str(other / f"secret-{names[you]}"),
                "scratch": str(other),
                "pid": max(hosts[you]),
            }
            send(run[me].attempt.scratch / "go", json.dumps(orders))
        result = {me: r.expect("RESULT ") for me, r in run.items()}
        for me in run:
            got = result[me]
            assert got["complete"] and got["walked"] > 1000, got  # it walked the whole view
            assert got["found"] == [], f"{me} found the other's files: {got['found']}"
            assert got["tmp"] == sorted([run[me].attempt.scratch.name, f"graffiti-{names[me]}"])
            assert got["read_secret"] == "FileNotFoundError"
            assert got["list_scratch"] == "FileNotFoundError"
            assert got["kill_other"] == "ProcessLookupError"
            assert got["kill_all"] == "ProcessLookupError"  # nothing it may signal but itself and PID 1
            assert len(got["pids"]) == 2 and got["pids"][0] == 1
            assert (got["own_key"], got["other_key"]) == (True, False)
            assert (got["own_segment"], got["other_segment"]) == (True, False)
            assert (got["own_socket"], got["other_socket"]) == ("ok", "ConnectionRefusedError")
            assert run[me].proc.poll() is None, f"{me} died: the other's signals reached it"
            # Nothing of the other's landed in this one's scratch directory, seen from the host.
            assert sorted(p.name for p in run[me].attempt.scratch.iterdir()) == sorted(
                ["secret-" + names[me], "graffiti-" + names[me], "go", "end"]
            )
        for r in run.values():
            send(r.attempt.scratch / "end", "done")
        for r in run.values():
            assert r.proc.popen.wait(WAIT_S) == 0, r.seen
    assert not any(marked(n) for n in names.values())
    # The graffiti stayed in the commands' private folders: none reached the host's.
    for shared in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not [n for n in os.listdir(shared) if n.startswith("graffiti-tenant-")], shared


KEYS = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
USER_KEYRING, DESCRIBE, SEARCH = -4, 6, 10

def search():
    found = libc.syscall(KEYCTL, SEARCH, ctypes.c_int(USER_KEYRING), b"user", b"receipt-left-behind", 0)
    return found if found > 0 else os.strerror(ctypes.get_errno())

def describe(serial):
    buf = ctypes.create_string_buffer(256)
    got = libc.syscall(KEYCTL, DESCRIBE, ctypes.c_int(serial), buf, 256)
    return buf.value.decode() if got >= 0 else os.strerror(ctypes.get_errno())

if sys.argv[1] == "store":
    name, data = b"receipt-left-behind", b"tenant data"
    serial = libc.syscall(ADD_KEY, b"user", name, data, len(data), ctypes.c_int(USER_KEYRING))
else:
    serial = int(sys.argv[2])
print(json.dumps({"uid": os.getuid(), "serial": serial, "search": search(), "describe": describe(serial)}))
"""


def test_a_key_a_command_stores_dies_with_it_and_ids_come_round_in_turn() -> None:
    # A range of two ids of its own (other tests and helpers claim from the default range).
    pair = replace(SETTINGS, codex_uid_range="1879900000-1879900001")
    config = sandbox.SandboxConfig.from_settings(pair)
    reports: list[dict[str, Any]] = []
    for argv in (["store"], ["look"], ["look"]):
        if reports:
            argv.append(str(reports[0]["serial"]))
        with ExitStack() as stack:
            running = Running([PY, "-c", KEYS, *argv], config, HOST, stack)
            assert running.proc.popen.wait(WAIT_S) == 0, running.seen
            running.proc.finish()
            reports.append(json.loads(running.lines.get(timeout=WAIT_S)))
    stored, other, same = reports
    # The key is in the command's user keyring, where its owner finds it...
    assert stored["serial"] > 0 and stored["search"] == stored["serial"]
    assert stored["describe"] == f"user;{stored['uid']};{stored['uid']};3f010000;receipt-left-behind"
    # ...the next attempt runs as the range's other id, which may not even look at the key...
    assert other["uid"] != stored["uid"]
    assert other["search"] == os.strerror(errno.ENOKEY)
    assert other["describe"] in (os.strerror(errno.EACCES), os.strerror(errno.ENOKEY))
    # ...and when the id comes round again, its keyring is a new one: the key died with its command.
    assert same["uid"] == stored["uid"]
    assert same["search"] == os.strerror(errno.ENOKEY)


# -- sockets ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def on_the_host() -> list[str]:
    """The host's sockets in shared places; the sandbox's walk must not reach any of them."""
    return host_sockets()


def test_the_host_has_sockets_that_answer_from_outside(on_the_host: list[str]) -> None:
    """The precondition that keeps the socket tests from passing vacuously."""
    if not on_the_host:
        pytest.skip("this host has no unix socket in /run, /tmp, /var/tmp, /dev/shm or home folders")
    assert any(answers(path) for path in on_the_host), on_the_host
    if os.path.exists("/run/postgresql/.s.PGSQL.5432"):
        assert answers("/run/postgresql/.s.PGSQL.5432")


def _check_no_socket_reachable(report: dict[str, Any], on_the_host: list[str]) -> None:
    assert report["complete"], f"the walk did not finish in {WALK_S} s ({report['walked']} entries)"
    assert report["walked"] > 1000, report  # it really walked the system trees
    assert report["connected"] == [], f"a command connected to {report['connected']}"
    for path in [*on_the_host, "/run/postgresql/.s.PGSQL.5432", "/run/mysqld/mysqld.sock"]:
        assert report["errors"][path] == "FileNotFoundError", (path, report["errors"].get(path))
    assert not {"root", "home", "work", "srv", "mnt", "media"} & set(report["top"]), report["top"]


@MODES
def test_no_unix_socket_anywhere_in_a_commands_filesystem_answers(
    host: sandbox.Host, on_the_host: list[str]
) -> None:
    config = sandbox.SandboxConfig.from_settings(SETTINGS)
    targets = [*on_the_host, "/run/postgresql/.s.PGSQL.5432", "/run/mysqld/mysqld.sock"]
    with ExitStack() as stack:
        r = Running([PY, "-c", SOCKETS, str(WALK_S), *targets], config, host, stack)
        assert r.proc.popen.wait(WALK_S + 30) == 0, r.seen
        r.proc.finish()
        report = json.loads(r.lines.get(timeout=WAIT_S))
    _check_no_socket_reachable(report, on_the_host)
    assert report["tmp"] == [r.attempt.scratch.name]


# -- the real handler path: a factory.task.run job on the codex handler ----------------------------

B_SCRIPT = r"""
import json, os
with open("b-secret.txt", "w") as f:
    f.write("B's secret")
os.mkfifo("release")
print("READY " + json.dumps({"secret": os.path.abspath("b-secret.txt")}), flush=True)
with open("release") as f:
    f.read()
print("B done", flush=True)
"""

A_SCRIPT = (
    WALK
    + r"""
import json, sys
target = sys.argv[1]
found = []
def look(entry):
    other_scratch = entry.name.startswith("receipt-codex-") and entry.path != os.getcwd()
    if entry.name == "b-secret.txt" or other_scratch:
        found.append(entry.path)
tmp_found = [n for n in os.listdir("/tmp") if n != os.path.basename(os.getcwd())]
complete, walked = walk(60, look)
try:
    read = open(target).read()
except OSError as exc:
    read = type(exc).__name__
report = {"complete": complete, "walked": walked, "found": found, "tmp_found": tmp_found, "read": read}
print(json.dumps(report))
"""
)


@pytest.fixture
def pg_queue(pg_engine: Engine) -> Iterator[Queue]:
    yield Queue(pg_engine)


def _in_thread(queue: Queue, job_id: str) -> tuple[threading.Thread, dict[str, AttemptResult]]:
    box: dict[str, AttemptResult] = {}
    thread = threading.Thread(
        target=lambda: box.update(out=run_attempt(queue, SETTINGS, default_registry(), job_id, 1)),
        daemon=True,
    )
    thread.start()
    return thread, box


def _output(engine: Engine, job_id: str) -> str:
    return "".join(
        r.body["progress"]["output"] for r in receipts_of(engine, job_id) if r.type == "job.progress"
    )


def test_while_b_writes_in_its_scratch_directory_a_walks_tmp_and_root_and_finds_nothing(
    pg_queue: Queue, pg_engine: Engine
) -> None:
    marker = f"tenant-b-{uuid.uuid4().hex}"
    b_job = enqueue(pg_queue, "codex", max_attempts=1, command=[PY, "-c", B_SCRIPT, marker])
    b_thread, b_box = _in_thread(pg_queue, b_job.id)

    def b_ready() -> str | None:
        return next((ln for ln in _output(pg_engine, b_job.id).splitlines() if ln.startswith("READY ")), None)

    try:
        line = wait_until(b_ready, timeout=WAIT_S, what="B's secret to be written")
        b_secret = Path(json.loads(line[len("READY ") :])["secret"])
        # On the host's disk, in the shared temp folder, while A hunts.
        assert b_secret.read_text() == "B's secret"
        assert b_secret.parent.parent == Path(tempfile.gettempdir())

        a_job = enqueue(pg_queue, "codex", max_attempts=1, command=[PY, "-c", A_SCRIPT, str(b_secret)])
        a_thread, a_box = _in_thread(pg_queue, a_job.id)
        a_thread.join(WALK_S + 30)
        assert not a_thread.is_alive()
        a = a_box["out"].job
        assert a is not None and a.status == "completed", a
        hunt = json.loads(a.result["outputTail"])
        assert hunt["complete"] and hunt["walked"] > 1000, hunt
        assert (hunt["found"], hunt["tmp_found"], hunt["read"]) == ([], [], "FileNotFoundError")
        assert b_thread.is_alive() and b_secret.exists(), "B must still be running while A hunts"
        send(b_secret.parent / "release", "go")
        b_thread.join(WAIT_S)
        assert not b_thread.is_alive()
        b = b_box["out"].job
        assert b is not None and b.status == "completed", b
        assert "B done" in b.result["outputTail"]
        assert not b_secret.parent.exists(), "B's scratch directory is removed with its attempt"
        assert not marked(marker)
    finally:
        if b_thread.is_alive():
            pg_queue.cancel(b_job.id, "test cleanup")
            b_thread.join(WAIT_S)


def test_through_the_codex_handler_no_host_socket_answers(
    pg_queue: Queue, pg_engine: Engine, on_the_host: list[str]
) -> None:
    targets = [*on_the_host, "/run/postgresql/.s.PGSQL.5432", "/run/mysqld/mysqld.sock"]
    job = enqueue(pg_queue, "codex", max_attempts=1, command=[PY, "-c", SOCKETS, str(WALK_S), *targets])
    out = run_attempt(pg_queue, SETTINGS, default_registry(), job.id, 1)
    assert out.job is not None and out.job.status == "completed", out.job
    _check_no_socket_reachable(json.loads(out.job.result["outputTail"]), on_the_host)


# -- the view holds: a command cannot take it apart, and sees what it should -------------------------

ESCAPE = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
MNT_DETACH, MS_REMOUNT, MS_BIND, CLONE_NEWUSER, CLONE_NEWNS = 2, 32, 4096, 0x10000000, 0x20000

def tries():
    out = {}
    for path in ("/tmp", "/", "/etc", "/dev"):
        done = libc.umount2(path.encode(), MNT_DETACH) == 0
        out["umount " + path] = done or os.strerror(ctypes.get_errno())
    done = libc.mount(None, b"/etc", None, MS_REMOUNT | MS_BIND, None) == 0
    out["remount /etc rw"] = done or os.strerror(ctypes.get_errno())
    try:
        open("/etc/receipt-escape", "w").close()
        out["write /etc"] = True
    except OSError as exc:
        out["write /etc"] = exc.strerror
    out["tmp"] = sorted(os.listdir("/tmp"))
    return out

report = {"as the command": tries()}
# With a user namespace and a mount namespace of its own it holds every capability there; the
# view's mounts came from a more privileged namespace, locked together, and stay put.
own = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0
report["own namespaces"] = own or os.strerror(ctypes.get_errno())
if own:
    report["in its own namespaces"] = tries()
print(json.dumps(report))
"""


@MODES
def test_a_command_cannot_unmount_or_remount_its_view(host: sandbox.Host) -> None:
    config = sandbox.SandboxConfig.from_settings(SETTINGS)
    with ExitStack() as stack:
        r = Running([PY, "-c", ESCAPE], config, host, stack)
        assert r.proc.popen.wait(WAIT_S) == 0, r.seen
        r.proc.finish()
        report = json.loads(r.lines.get(timeout=WAIT_S))
    scratch = r.attempt.scratch.name
    assert report["own namespaces"] is True, report  # the harder case is really tried
    for where in ("as the command", "in its own namespaces"):
        got = report[where]
        assert not [k for k, v in got.items() if v is True], (where, got)
        assert got["tmp"] == [scratch], (where, got)
        assert got["write /etc"] == "Read-only file system", (where, got)
    assert not os.path.exists("/etc/receipt-escape")


def test_the_workspace_root_is_shared_read_write_at_its_own_path_and_nothing_beside_it(
    tmp_path: Path,
) -> None:
    parent = Path(tempfile.mkdtemp(prefix="receipt-test-ws-"))
    try:
        workspace = parent / "workspace"
        workspace.mkdir(mode=0o777)
        workspace.chmod(0o777)
        (parent / "beside").mkdir()
        (workspace / "input.txt").write_text("from the host")
        settings = replace(SETTINGS, codex_workspace_root=str(workspace))
        script = (
            "import json, os, sys\n"
            "ws = sys.argv[1]\n"
            "open(os.path.join(ws, 'output.txt'), 'w').write('from the command')\n"
            "print(json.dumps({'input': open(os.path.join(ws, 'input.txt')).read(),\n"
            "                  'parent': sorted(os.listdir(os.path.dirname(ws))), 'cwd': os.getcwd()}))\n"
        )
        config = sandbox.SandboxConfig.from_settings(settings)
        with ExitStack() as stack:
            r = Running([PY, "-c", script, str(workspace)], config, HOST, stack)
            assert r.proc.popen.wait(WAIT_S) == 0, r.seen
            r.proc.finish()
            report = json.loads(r.lines.get(timeout=WAIT_S))
        assert report["input"] == "from the host"
        assert report["parent"] == ["workspace"]  # its siblings on the host are not in the view
        assert report["cwd"] == str(r.attempt.scratch)
        assert (workspace / "output.txt").read_text() == "from the command"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_an_executable_outside_the_view_is_refused_before_anything_runs(pg_queue: Queue) -> None:
    # The worker's own interpreter lives outside the system trees the view shows.
    venv_python = str(Path(sys.executable).absolute())
    job = enqueue(pg_queue, "codex", max_attempts=3, command=[venv_python, "-c", "print('ran')"])
    out = run_attempt(pg_queue, SETTINGS, default_registry(), job.id, 1)
    assert out.job is not None and (out.job.status, out.job.attempt) == ("failed", 1)
    assert "outside the command's filesystem view" in out.job.error
    assert "RECEIPT_CODEX_VISIBLE_PATHS" in out.job.error


# -- a worker that is really not root -------------------------------------------------------------

AS_A_WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from app.config import Settings
from workers import sandbox
host = sandbox.detect_host()
config = sandbox.SandboxConfig.from_settings(Settings())
with sandbox.attempt(config, host) as attempt:
    proc = sandbox.start(
        sys.argv[2:], env={"PATH": sandbox.SANDBOX_PATH}, cwd=attempt.scratch, config=config, host=host,
        attempt=attempt,
    )
    out = proc.popen.stdout.read().decode()
    proc.popen.wait(60)
    proc.finish()
print(json.dumps({"host": [host.root, host.user_namespaces], "off": sandbox.protections_off(config, host),
                  "exit": proc.popen.returncode, "report": out}))
"""


def test_a_worker_that_is_not_root_gives_its_commands_the_view_in_a_user_namespace(
    on_the_host: list[str],
) -> None:
    """The worker's own code run as ``nobody`` (system Python): the unprivileged path, not simulated."""
    repo = str(Path(__file__).resolve().parents[2])
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-S"]
    importing = f"import sys; sys.path.insert(0, {repo!r}); import workers.sandbox"
    probe = subprocess.run([*as_nobody, "-c", importing], capture_output=True, check=False, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot import this checkout with the system Python: {probe.stderr[-300:]!r}")
    targets = [*on_the_host, "/run/postgresql/.s.PGSQL.5432", "/run/mysqld/mysqld.sock"]
    command = [PY, "-c", SOCKETS, str(WALK_S), *targets]
    done = subprocess.run(
        [*as_nobody, "-c", AS_A_WORKER, repo, *command], capture_output=True, check=False, timeout=WALK_S + 60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    worker = json.loads(done.stdout)
    if not worker["host"][1]:
        pytest.skip("this kernel refuses unprivileged user namespaces (protections_off says so)")
    assert worker["host"] == [False, True]
    assert not any("filesystem view" in line for line in worker["off"]), worker["off"]
    assert worker["exit"] == 0, worker["report"]
    _check_no_socket_reachable(json.loads(worker["report"]), on_the_host)


# glibc keeps signals 32 and 33 for its threads and refuses to set them; make starts its recipes
# with both ignored, and glibc installs its own handlers there when a program needs them.
GLIBC_RESERVED_MASK = (1 << 31) | (1 << 32)


def test_a_command_starts_with_no_signal_ignored(pg_queue: Queue) -> None:
    # Python (PID 1) ignores SIGPIPE and SIGXFSZ, and a worker under nohup ignores SIGHUP; through
    # exec a command would inherit that, and a shell pipeline would never see its reader go, nor a
    # writer past RLIMIT_FSIZE be stopped.
    job = enqueue(pg_queue, "codex", max_attempts=1, command=["/bin/grep", "SigIgn", "/proc/self/status"])
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        out = run_attempt(pg_queue, SETTINGS, default_registry(), job.id, 1)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert out.job is not None and out.job.status == "completed", out.job
    label, mask = out.job.result["outputTail"].split()
    assert label == "SigIgn:"
    assert int(mask, 16) & ~GLIBC_RESERVED_MASK == 0, f"ignored at start: {mask}"


HOG = r"""
import os, sys, time
kids, refused = 0, "no"
try:
    for _ in range(int(sys.argv[1])):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        kids += 1
except OSError as exc:
    refused = type(exc).__name__
print(kids, refused, flush=True)
if sys.argv[2] == "hold":
    time.sleep(60)  # holds its budget until the test ends the attempt
"""


def test_each_command_has_its_own_process_budget_even_as_the_same_user() -> None:
    # One shared user (no range): the budget is still per command, as each has its own user namespace.
    shared = replace(SETTINGS, codex_uid_range="none", codex_max_processes=24)
    config = sandbox.SandboxConfig.from_settings(shared)
    with ExitStack() as stack:
        hog = Running([PY, "-c", HOG, "100", "hold"], config, HOST, stack)
        kids, refused = hog.lines.get(timeout=WAIT_S).split()
        assert (int(kids) < 24, refused) == (True, "BlockingIOError")  # it hit its own limit
        # While the hog holds its whole budget, a neighbour running as the same user forks freely.
        neighbour = Running([PY, "-c", HOG, "10", "go"], config, HOST, stack)
        assert neighbour.proc.popen.wait(WAIT_S) == 0, neighbour.seen
        assert neighbour.lines.get(timeout=WAIT_S).split() == ["10", "no"]
        assert hog.proc.poll() is None
