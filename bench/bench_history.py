"""History metrics: how fast the ``history`` scorer scores every recorded conversation, against plain rouge-score.

Uses ``out/data`` and ``out/releases`` of ``make leaderboard`` when they are there (or ``--data`` / ``--releases``),
else builds and ingests into a temporary folder first (about a minute). Then prints:

1. the ``history`` scorer over every conversation of every release (about 50,000), scores computed in memory
   (``history_scores``: reading, tokenizing, every metric; worker processes as ``craftmd score --scorer history`` uses them;
   goal: under 20 s on 2 cores), and the same including writing each release's scores.parquet (on copies);
2. plain ``rouge_score.rouge_scorer.RougeScorer(use_stemmer=True)`` computing the same ROUGE figures
   (patient coverage and every question pair) on a sample of conversations, extrapolated to all of them.

    .venv/bin/python bench/bench_history.py [--data out/data] [--releases out/releases] [--sample 300]
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("out/data"))
    ap.add_argument("--releases", type=Path, default=Path("out/releases"))
    ap.add_argument("--sample", type=int, default=300, help="conversations per release for plain rouge-score")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()

    from craftmd.release import find_releases
    from craftmd.scoring import history as H

    tmp = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        data, releases = args.data, args.releases
        if not (data / "all").exists() or not releases.exists():
            from craftmd.dataset_builder.build import build_dataset
            from craftmd.generation.ingest import ingest
            from craftmd.source import Source

            src = Source()
            data, releases = tmp / "data", tmp / "releases"
            build_dataset(src, data, progress=False)
            ingest(src, data, releases, progress=False)
        rels = [r for r in find_releases(releases) if r.has("conversations")]

        t0 = time.perf_counter()
        n = rows = 0
        for r in rels:
            table, rec = H.history_scores(r, data, progress=False, workers=args.workers)
            n += rec["conversations"]
            rows += table.num_rows
        ours = time.perf_counter() - t0
        print(f"history scorer: {n:,} conversations, {rows:,} scores in {ours:.1f} s ({1e6 * ours / n:.0f} µs a conversation)")

        from craftmd.scoring.score import score_release

        copies = tmp / "copies"
        for r in rels:
            shutil.copytree(r.path, copies / r.path.name)
        t0 = time.perf_counter()
        for r in rels:
            score_release(copies / r.path.name, data, ["history"], force=True, progress=False, options={"workers": args.workers})
        print(f"  with writing every release's scores.parquet: {time.perf_counter() - t0:.1f} s")

        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
        one = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
        from craftmd.dataset import load_config

        vign = dict(load_config(data, "all").select("case_id", "vignette").iter_rows())
        if (data / "nejm_image").exists():
            vign.update(load_config(data, "nejm_image").select("case_id", "vignette").iter_rows())
        spent = 0.0
        done = 0
        for r in rels:
            conv = r.table("conversations").to_pylist()
            sample = random.Random(14).sample(conv, min(args.sample, len(conv)))
            t0 = time.perf_counter()
            for row in sample:
                roles = [m["role"] for m in row["messages"]]
                contents = [m["content"] for m in row["messages"]]
                doctor, patient, questions, _ = H.split_turns(roles, contents)
                ref = vign[row["case_id"]]
                one.score(ref, "\n".join(patient))
                qs = [doctor[i] for i in questions]
                pairs = [scorer.score(qs[i], qs[j]) for i in range(len(qs)) for j in range(i + 1, len(qs))]
                math.fsum(p["rougeL"].fmeasure for p in pairs)
            spent += (time.perf_counter() - t0) * len(conv) / len(sample)
            done += len(sample)
        print(
            f"plain rouge-score (one process): {done:,} sampled conversations, extrapolated to all {n:,}: {spent:.0f} s "
            f"({spent / ours:.0f}x the history scorer)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
