"""Benchmark: build the whole dataset from the pinned archive (goal: under 20 s on 2 cores).

Prints the wall time of ``build_dataset`` (reading and verifying the archive included)
and the process's peak memory. Runs on at most 2 CPU cores.

    .venv/bin/python bench/bench_build.py [--source PATH_OR_URL] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 20.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help="the upstream release (default: as `craftmd build`)")
    ap.add_argument("--repeat", type=int, default=1, help="builds to time (the best is reported)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 2:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    from craftmd.dataset_builder.build import build_dataset
    from craftmd.source import Source

    times = []
    with tempfile.TemporaryDirectory(prefix="craftmd-bench-") as tmp:
        for i in range(args.repeat):
            t0 = time.perf_counter()
            report = build_dataset(Source(args.source), Path(tmp) / f"data{i}", progress=False)
            times.append(time.perf_counter() - t0)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    best = min(times)
    rows = ", ".join(f"{c} {n:,}" for c, n in report.rows.items())
    print(f"source: {report.source['location']} (commit {report.source['commit'][:12]})")
    print(f"rows: {rows}")
    verdict = "goal met" if best < GOAL_S else "GOAL MISSED"
    print(f"build time: {best:.2f} s (best of {len(times)}; goal < {GOAL_S:.0f} s on 2 cores: {verdict}; ran on {cores} core(s))")
    print(f"peak memory: {peak_mib:,.0f} MiB (process max RSS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
