"""Peak memory and time of ``craftmd validate`` on a large generated submission.

A dataset folder of ``--cases`` stand-in cases and a JSON Lines submission of ``--lines``
valid rows (every case × setting × format, over as many trials as it takes; responses of
about 40 characters) are written to a temporary folder (not timed). Each validation then
runs in a fresh Python process, so its peak resident memory (``VmHWM``, reset after the
baseline through ``/proc/self/clear_refs``; ``ru_maxrss`` off Linux) is its own:

* ``baseline``: the process after its imports and the dataset's cases are loaded;
* ``peak``: the process' highest resident memory while it validated the file;
* ``grown``: peak minus baseline, what reading the file cost (goal: under 300 MB for 1M lines).

``--parquet`` also times the same rows as a parquet file; ``--tracemalloc`` adds the peak of
Python's own allocations (slower: every allocation is traced).

    .venv/bin/python bench/bench_validate.py [--lines 1000000] [--parquet] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from craftmd.scoring.submission import dataset_cases, validate_submission
path, data, trace = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
dataset_cases(data)  # imports and the dataset's cases: the baseline


def rss(field):  # kB; ru_maxrss would carry the parent's peak across exec
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


base = rss("VmRSS")
try:
    open("/proc/self/clear_refs", "w").write("5")  # the peak from here on
except OSError:
    pass
if trace:
    import tracemalloc
    tracemalloc.start()
t = time.perf_counter()
v = validate_submission(path, data)
wall = time.perf_counter() - t
out = {"rows": v.rows.height, "wall_s": wall, "baseline_kb": base, "peak_kb": rss("VmHWM")}
if trace:
    out["tracemalloc_peak_b"] = tracemalloc.get_traced_memory()[1]
print(json.dumps(out))
"""

SETTINGS = ("vignette", "multiturn", "singleturn", "summarized", "exam", "multiturn_no_exam", "multiturn_plus_exam")
FORMATS = ("mcq4", "mcq_many", "frq", "top3")


def write_inputs(tmp: Path, lines: int, cases: int) -> tuple[Path, Path]:
    import polars as pl

    data = tmp / "data"
    (data / "all").mkdir(parents=True)
    ids = [f"case_{i}" for i in range(1, cases + 1)]
    pl.DataFrame({"case_id": ids, "source": ["medqa_usmle"] * cases, "specialty": ["Dermatology"] * cases}).write_parquet(
        data / "all" / "test-00000-of-00001.parquet"
    )
    sub = tmp / "submission.jsonl"
    per_trial = cases * len(SETTINGS) * len(FORMATS)
    with sub.open("w") as f:
        for i in range(lines):
            trial, rest = divmod(i, per_trial)
            c, rest = divmod(rest, len(SETTINGS) * len(FORMATS))
            s, fm = divmod(rest, len(FORMATS))
            f.write(
                json.dumps(
                    {
                        "case_id": ids[c],
                        "trial": trial,
                        "setting": SETTINGS[s],
                        "format": FORMATS[fm],
                        "response": f"**Final Diagnosis:** Diagnosis number {i % 997}",
                    }
                )
                + "\n"
            )
    return data, sub


def measure(path: Path, data: Path, trace: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), str(data), "1" if trace else "0"], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout)


def report(what: str, size: int, m: dict) -> None:
    mb = lambda kb: kb / 1024  # noqa: E731 - ru_maxrss is in KiB on Linux
    line = (
        f"{what:8s} {m['rows']:>9,} rows  {size / 2**20:8.1f} MiB file  {m['wall_s']:7.1f} s  baseline {mb(m['baseline_kb']):6.0f} MB  "
        f"peak {mb(m['peak_kb']):6.0f} MB  grown {mb(m['peak_kb'] - m['baseline_kb']):6.0f} MB"
    )
    if "tracemalloc_peak_b" in m:
        line += f"  python allocations peak {m['tracemalloc_peak_b'] / 2**20:6.0f} MB"
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--cases", type=int, default=2_500)
    ap.add_argument("--parquet", action="store_true", help="also validate the same rows as parquet")
    ap.add_argument("--tracemalloc", action="store_true", help="also report the peak of Python's allocations")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t = time.perf_counter()
        data, sub = write_inputs(tmp, args.lines, args.cases)
        print(f"inputs written in {time.perf_counter() - t:.1f} s (not timed below)", file=sys.stderr)
        report("jsonl", sub.stat().st_size, measure(sub, data, args.tracemalloc))
        if args.parquet:
            import polars as pl

            pq = tmp / "submission.parquet"
            pl.read_ndjson(sub).write_parquet(pq)
            report("parquet", pq.stat().st_size, measure(pq, data, args.tracemalloc))


if __name__ == "__main__":
    main()
