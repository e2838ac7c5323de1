"""Benchmark: MedPI's patient packets, as `make packets` builds them (goal: the 366 in under 3 minutes on 2 cores).

    .venv/bin/python bench/bench_packets.py [--scale S] [--cells REASON:OBJECTIVE,...] [--workers N] [--same-as DIR]

Builds the packets (``build_packets``, seed 0; by default every cell of the task matrix, 366 patients) on at most 2
CPU cores and prints the wall time, the CPU seconds of the build and its worker processes, the peak memory of the
largest process, the draws the build needed and the draws simulated (those run ahead that the build did not need are
the price of the parallel workers). With --same-as DIR every file is compared with DIR's, a build of the same options
(`make packets`' out/medpi for the default ones, or a build by another version of the code): the bytes must not
depend on the code's speed or the number of workers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 180.0


def tree(path: Path) -> dict[str, str]:
    """Every file under ``path`` by its relative path, with its sha256."""
    return {
        p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of each cell's count (default 1: all 366)")
    ap.add_argument("--cells", help="only these cells, REASON:OBJECTIVE,... (default: every populated cell)")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core used)")
    ap.add_argument("--same-as", type=Path, metavar="DIR", help="a build of the same options to compare every file with")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 2:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    from craftmd.dataset_builder.packets import build_packets

    cells = args.cells.split(",") if args.cells else None
    with tempfile.TemporaryDirectory(prefix="craftmd-bench-") as tmp:
        out = Path(tmp) / "medpi"
        t0 = time.perf_counter()
        result = build_packets(out, seed=0, scale=args.scale, cells=cells, workers=args.workers, progress=False)
        wall = time.perf_counter() - t0
        files = tree(out)
    cpu = sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )
    peak_mib = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
    needed = sum(d["draws"] for d in result.draws.values())
    print(f"packets: {result.patients} patients in {len(result.draws)} cells, {needed} draws needed")
    print(
        f"draws simulated: {result.simulated} by {result.workers} worker(s) "
        f"({result.simulated - needed} run ahead and not needed: {(result.simulated - needed) / max(needed, 1):.0%})"
    )
    full = args.scale == 1 and not cells
    verdict = ("goal met" if wall < GOAL_S else "GOAL MISSED") if full else "not the full build: no goal"
    print(f"build time: {wall:.1f} s (goal < {GOAL_S:.0f} s on 2 cores for the 366: {verdict}; ran on {cores} core(s))")
    print(f"CPU: {cpu:.1f} s (the build's process and its workers); peak memory: {peak_mib:,.0f} MiB (largest process)")
    if args.same_as:
        other = tree(args.same_as)
        differ = sorted(k for k in set(files) | set(other) if files.get(k) != other.get(k))
        print(f"same bytes as {args.same_as}: " + ("yes, every file" if not differ else f"NO: {', '.join(differ)}"))
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
