"""What the command sandbox costs per command: start-to-exit time of ``/bin/true``, plain and sandboxed.

    .venv/bin/python bench/sandbox_bench.py [--runs 50]

Prints the median and 95th percentile wall time of one command, started the way the codex
handler starts it (``workers.sandbox.start`` then ``finish``), beside a plain ``subprocess.run``,
and which protections this host gives. Figures only; no assertion.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import Settings
from workers import sandbox


def _time(fn: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - start) * 1000)
    return out


def _report(name: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
    print(
        f"{name:<12} median {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms   ({len(ordered)} runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    config = sandbox.SandboxConfig.from_settings(Settings())
    host = sandbox.detect_host()
    print(f"host: root={host.root} user_namespaces={host.user_namespaces} tools={host.tools}")
    print("protections off:", sandbox.protections_off(config, host) or "none")

    def plain() -> None:
        subprocess.run(["/bin/true"], check=True)

    def sandboxed() -> None:
        with sandbox.scratch_directory(config, host) as scratch:
            proc = sandbox.start(
                ["/bin/true"], env={"PATH": sandbox.SANDBOX_PATH}, cwd=scratch, config=config, host=host
            )
            assert proc.popen.stdout is not None
            proc.popen.stdout.read()
            proc.popen.wait()
            proc.finish()
            proc.popen.stdout.close()
            assert proc.popen.returncode == 0

    _report("plain", _time(plain, args.runs))
    _report("sandboxed", _time(sandboxed, args.runs))


if __name__ == "__main__":
    main()
