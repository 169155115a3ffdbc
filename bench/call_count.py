"""Python function calls per job through the real code, counted instead of timed.

    .venv/bin/python -m bench.call_count [--small 20] [--large 60]

Runs ``bench.runtime_bench``'s in-process profile of a no-op job (enqueue, dispatch, worker: the
real code on a fresh PostgreSQL database) under cProfile twice, with ``--small`` and ``--large``
jobs, and prints the difference divided by the difference in jobs, per top-level package: the
set-up cancels, and a call count does not move with the machine's load, so two checkouts can be
compared where timed rounds scatter more than the difference sought (a path that should cost
nothing, such as tracing turned off). Run it from the checkout to measure (it imports that tree).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
from collections import Counter

sys.path.insert(0, os.getcwd())


def _package(filename: str, root: str) -> str:
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    if filename.startswith(root):
        return filename[len(root) :].split("/", 1)[0]
    return "(other)"


def calls_by_package(jobs: int) -> Counter[str]:
    import bench.runtime_bench as rb

    rb.PROFILE_JOBS = jobs
    profile = cProfile.Profile()
    profile.enable()
    rb.profile_one_job()
    profile.disable()
    root = os.getcwd() + "/"
    by: Counter[str] = Counter()
    for (filename, _line, _name), (_cc, calls, _tt, _ct, _callers) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        by[_package(filename, root)] += calls
    return by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--large", type=int, default=60)
    args = parser.parse_args()
    calls_by_package(1)  # imports and first-use caches, which would count in the first run only
    small, large = calls_by_package(args.small), calls_by_package(args.large)
    span = args.large - args.small
    per_job = {k: (large[k] - small[k]) / span for k in set(small) | set(large)}
    shown = {k: v for k, v in per_job.items() if abs(v) >= 0.5 and k != "(other)"}
    print(f"# Python calls per job, ({args.large} jobs - {args.small} jobs) / {span}, tree {os.getcwd()}")
    for name, n in sorted(shown.items(), key=lambda kv: -kv[1]):
        print(f"{n:10.1f}  {name}")
    print(f"{sum(shown.values()):10.1f}  total (packages above)")


if __name__ == "__main__":
    main()
