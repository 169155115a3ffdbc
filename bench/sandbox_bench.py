"""What the command sandbox costs per command: start-to-exit time of ``/bin/true``.

    .venv/bin/python bench/sandbox_bench.py [--runs 50]

Prints the median and 95th percentile wall time of one command, started the way the codex
handler starts it (``workers.sandbox.attempt``, ``start``, then ``finish``), beside a plain
``subprocess.run``, for each layer of the sandbox alone and all together, and which protections
this host gives. Run it alone on a quiet machine. Figures only; no assertion.

- ``namespaces``: rlimits, PID/IPC/network namespaces, one shared user: the sandbox as it was
  before the view (no view, no uid range, no user namespace per command);
- ``+ uid``: a user id claimed per attempt (``RECEIPT_CODEX_UID_RANGE``);
- ``+ userns``: and a user namespace of its own per command;
- ``full``: and the private filesystem view (``RECEIPT_CODEX_FILESYSTEM=private``): the default;
- ``not root``: the default as a worker that is not root gets it (``unshare --user``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import Settings
from workers import sandbox


def _time(fns: dict[str, Callable[[], None]], runs: int) -> dict[str, list[float]]:
    """Each function ``runs`` times, taking turns, so a drift in the machine's load hits all alike."""
    for fn in fns.values():
        fn()  # warm: page cache, the claims folder
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            out[name].append((time.perf_counter() - start) * 1000)
    return out


def _report(name: str, samples: list[float], base: float | None) -> float:
    ordered = sorted(samples)
    median = statistics.median(ordered)
    p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
    added = f"   (+{median - base:5.1f} ms over namespaces)" if base is not None else ""
    print(f"{name:<12} median {median:7.1f} ms   p95 {p95:7.1f} ms   ({len(ordered)} runs){added}")
    return median


def _sandboxed(settings: Settings, host: sandbox.Host) -> Callable[[], None]:
    config = sandbox.SandboxConfig.from_settings(settings)

    def run() -> None:
        with sandbox.attempt(config, host) as attempt:
            proc = sandbox.start(
                ["/bin/true"],
                env={"PATH": sandbox.SANDBOX_PATH},
                cwd=attempt.scratch,
                config=config,
                host=host,
                attempt=attempt,
            )
            assert proc.popen.stdout is not None
            output = proc.popen.stdout.read()
            proc.popen.wait()
            proc.finish()
            proc.popen.stdout.close()
            assert proc.popen.returncode == 0, output

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    default = Settings()
    host = sandbox.detect_host()
    print(f"host: {host}")
    off = sandbox.protections_off(sandbox.SandboxConfig.from_settings(default), host)
    print("protections off:", off or "none")

    def plain() -> None:
        subprocess.run(["/bin/true"], check=True)

    no_userns = replace(host, user_namespaces=False)
    layers = {
        "namespaces": (replace(default, codex_filesystem="host", codex_uid_range="none"), no_userns),
        "+ uid": (replace(default, codex_filesystem="host"), no_userns),
        "+ userns": (replace(default, codex_filesystem="host"), host),
        "full": (default, host),
    }
    fns = {"plain": plain} | {name: _sandboxed(st, h) for name, (st, h) in layers.items()}
    if host.tools:
        fns["not root"] = _sandboxed(default, sandbox.Host(root=False, user_namespaces=True, tools=True))
    samples = _time(fns, args.runs)
    base = statistics.median(samples["namespaces"])
    for name, taken in samples.items():
        _report(name, taken, None if name in ("plain", "namespaces") else base)


if __name__ == "__main__":
    main()
