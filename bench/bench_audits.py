"""Audit speed: MELD over every vignette against a loopback server, and the upstream expert figures.

MELD sends one request per case (2,004) to a loopback OpenAI-compatible server that
answers after ``--latency`` seconds; with ``--concurrency`` requests in flight the floor is
ceil(cases / concurrency) × latency. The client and the server share one Python process,
so each request also costs some milliseconds of CPU (the openai client's request building
and the server's threads); the goal is therefore relative: the requests really overlap
(peak in flight = concurrency) and the run is ≥ 5 × faster than one request at a time
(cases × latency). Then the recomputation of the paper's expert figures from the pinned
source (one pass over the archive plus the workbooks); goal ≤ 30 s.

    .venv/bin/python bench/bench_audits.py [--latency 0.1] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import io
import math
import re
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from loopback import LoopbackServer  # noqa: E402

from craftmd.scoring import meld  # noqa: E402
from craftmd.analysis.agreement.expert import upstream_expert_results  # noqa: E402
from craftmd.source import Source  # noqa: E402

CONFIGS = {"medqa_usmle": "MedQA_USMLE", "derm_public": "dermatology_public", "derm_private": "dermatology_private"}


def write_dataset(source: Source, out: Path) -> None:
    df = pl.read_csv(io.BytesIO(source.read("data/usmle_and_derm_dataset.csv")), infer_schema_length=0)
    for config, upstream in CONFIGS.items():
        (out / config).mkdir(parents=True)
        df.filter(pl.col("dataset") == upstream).select("case_id", pl.col("case_vignette").alias("vignette")).write_parquet(
            out / config / "test-00000-of-00001.parquet"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    source = Source()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_dataset(source, tmp / "data")
        truth = {c.first_half: c.second_half for c in meld.meld_cases(tmp / "data")}
        pat = re.compile(r"\*\*Case Vignette\*\*: (.*)\Z", re.S)
        with LoopbackServer(lambda r: truth[pat.search(r["messages"][0]["content"]).group(1)], latency=args.latency) as server:
            t0 = time.perf_counter()
            out = meld.run_meld(tmp / "data", "openai/loopback", tmp / "meld", base_url=server.base_url,
                                concurrency=args.concurrency, progress=False)  # fmt: skip
            wall = time.perf_counter() - t0
            peak = server.max_in_flight
        n = len(truth)
        floor = math.ceil(n / args.concurrency) * args.latency
        flagged = meld.read_similarities(out)["flagged"].sum()
        serial = n * args.latency
        met = peak == args.concurrency and serial / wall >= 5 and flagged == n
        ok &= met
        print(f"MELD: {n} cases, {n / wall:.1f} cases/s, wall {wall:.1f} s, floor {floor:.1f} s, one-at-a-time {serial:.0f} s "
              f"({serial / wall:.1f} x), peak in flight {peak}, flagged {flagged}/{n} (a reciting model); "
              f"goal peak = {args.concurrency} and >= 5 x: {'met' if met else 'MISSED'}")  # fmt: skip
    t0 = time.perf_counter()
    res = upstream_expert_results(source)
    wall = time.perf_counter() - t0
    ok &= wall <= 30
    print(
        f"expert figures: {wall:.1f} s (goal <= 30 s); grader vs dermatologists {res['grader_counts']['agreement_pct']} % (published 93.35 %)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
