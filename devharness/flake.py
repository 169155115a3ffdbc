"""Run the suite (or the given tests) N times and list every test that failed at least once.

    python -m devharness.flake N [pytest arguments...]

Each run writes a JUnit report; the summary names each failing test with how many of the N runs
it failed, and each run's time and counts, so a flake is seen the day it appears. Exits 1 when a
test failed in any run.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

DEFAULT_ARGS = ("-n", "2", "--dist", "loadgroup", "-m", "not soak")


def failures_of(report: Path) -> tuple[list[str], int]:
    """The ids of the failed or errored test cases in a JUnit report, and how many cases ran."""
    root = ET.parse(report).getroot()
    failed: list[str] = []
    cases = 0
    for case in root.iter("testcase"):
        cases += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return failed, cases


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: python -m devharness.flake N [pytest arguments...]", file=sys.stderr)
        return 2
    runs, extra = int(argv[0]), argv[1:]
    counts: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="receipt-flake-") as folder:
        for n in range(1, runs + 1):
            report = Path(folder) / f"run-{n}.xml"
            started = time.monotonic()
            code = subprocess.call(
                [sys.executable, "-m", "pytest", "-q", *DEFAULT_ARGS, f"--junitxml={report}", *extra]
            )
            elapsed = time.monotonic() - started
            failed, cases = failures_of(report) if report.exists() else (["<no report: pytest crashed>"], 0)
            counts.update(failed)
            print(f"flake: run {n}/{runs}: exit {code}, {cases} tests, {len(failed)} failed, {elapsed:.0f} s")
    if not counts:
        print(f"flake: no test failed in {runs} runs")
        return 0
    print(f"flake: {len(counts)} tests failed at least once in {runs} runs:")
    for test, times in counts.most_common():
        print(f"  {times}/{runs}  {test}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
