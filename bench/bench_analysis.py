"""Time regenerating every table and figure from ingested releases, against the same
bootstrap written as an upstream-style per-comparison Python loop.

    python bench/bench_analysis.py [--releases DIR --dataset DIR] [--loop-sample K]

The vectorised run is the real thing, from nothing (a fresh output folder): every cell (model x setting x format x
grader x group), 10,000 case resamples each, every paired bootstrap and McNemar test with Holm, every figure and the
page, as ``craftmd analyse --page`` writes them. The loop resamples one cell or one comparison at a time
(``for b in range(B): idx = rng.choice(n, n); stat = scores[idx].mean()``); running it over
all of them would take many minutes, so it is timed on K cells and K comparisons spread
over the set and extrapolated to the full count (printed as such). Without --releases,
out/releases and out/data (as `make leaderboard` leaves them) are used, else the releases
are built and ingested into a temporary folder first (not timed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from craftmd.analysis import runner
from craftmd.analysis.bootstrap import DEFAULT_B
from craftmd.analysis.page import write_page
from craftmd.analysis.tables import analyse, prepared_connection
from craftmd.release import find_releases


def _prepare(tmp: Path) -> tuple[Path, Path]:
    from craftmd.dataset_builder.build import build_dataset
    from craftmd.generation.ingest import ingest
    from craftmd.source import Source

    src = Source()
    data, releases = tmp / "data", tmp / "releases"
    print("preparing: build + ingest (not timed) ...", file=sys.stderr)
    build_dataset(src, data, progress=False)
    ingest(src, data, releases, progress=False)
    return releases, data


def _loop_items(releases: Path, data: Path, k: int):
    """K cells and K paired comparisons (case score vectors), spread evenly over all of them."""
    con = prepared_connection(find_releases(releases), data)
    cg = pl.from_arrow(runner.run(con, "case_groups")).with_columns((pl.col("n_correct") / pl.col("n_trials")).alias("score"))
    keys = ["release", "grader", "setting", "format", "with_image", "group_by", "group"]
    cells = cg.group_by(keys, maintain_order=True).agg(pl.col("case_position"), pl.col("score"))
    comps = pl.from_arrow(runner.run(con, "comparisons")).filter(pl.col("family") == "setting")
    n_cells, n_comps_total = cells.height, pl.from_arrow(runner.run(con, "comparisons")).height
    pick = np.linspace(0, cells.height - 1, k).astype(int)
    cell_vecs = [np.asarray(cells["score"][int(i)]) for i in pick]
    lookup = {tuple(r[:7]): np.asarray(r[8]) for r in cells.iter_rows()}
    comp_vecs = []
    for i in np.linspace(0, comps.height - 1, k).astype(int):
        r = comps.row(int(i), named=True)
        a = lookup[(r["model"], r["grader"], r["a"], r["format"], r["with_image"], r["group_by"], r["group"])]
        b = lookup[(r["model"], r["grader"], r["b"], r["format"], r["with_image"], r["group_by"], r["group"])]
        comp_vecs.append((a, b))
    return cell_vecs, comp_vecs, n_cells, n_comps_total


def _loop(cell_vecs, comp_vecs, B: int, seed: int = 0) -> float:
    """Upstream style: one Python loop of B resamples per cell and per comparison."""
    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    for scores in cell_vecs:
        n = len(scores)
        stats = []
        for _ in range(B):
            idx = rng.choice(n, n, replace=True)
            stats.append(scores[idx].mean())
        np.percentile(stats, [2.5, 97.5])
    for a, b in comp_vecs:
        n = len(a)
        obs = a.mean() - b.mean()
        diffs = []
        for _ in range(B):
            idx = rng.choice(n, n, replace=True)
            diffs.append(a[idx].mean() - b[idx].mean())
        (np.sum(np.abs(np.asarray(diffs) - obs) >= abs(obs)) + 1) / (B + 1)
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=Path)
    p.add_argument("--dataset", type=Path)
    p.add_argument("--loop-sample", type=int, default=12, help="cells and comparisons timed in the loop (default 12 each)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        here = Path(__file__).resolve().parent.parent / "out"
        if args.releases and args.dataset:
            releases, data = args.releases, args.dataset
        elif (here / "releases").is_dir() and (here / "data" / "all").is_dir():  # what `make leaderboard` left
            releases, data = here / "releases", here / "data"
        else:
            releases, data = _prepare(tmp)

        t = time.perf_counter()
        a = analyse(releases, data, tmp / "out", B=DEFAULT_B)
        t_page = time.perf_counter()
        write_page(a, tmp / "out")
        vec, page_s = time.perf_counter() - t, time.perf_counter() - t_page
        n_cells, n_tests = a.accuracy.height, a.pvalues.filter(pl.col("test") == "paired-bootstrap").height
        print(
            f"vectorised: every table, figure and the page in {vec:.2f} s  "
            f"({n_cells} cells, {n_tests} paired bootstraps, {a.pvalues.height} p-values, B={DEFAULT_B}; "
            f"sql {a.timings['sql_s']:.2f} s, bootstrap+tests {a.timings['bootstrap_s']:.2f} s, figures {a.timings['figures_s']:.2f} s, page {page_s:.2f} s)"
        )

        cell_vecs, comp_vecs, n_cells_all, _ = _loop_items(releases, data, args.loop_sample)
        loop_s = _loop(cell_vecs, comp_vecs, DEFAULT_B)
        per = loop_s / (len(cell_vecs) + len(comp_vecs))
        loop_total = per * (n_cells_all + n_tests)
        print(
            f"loop:       {loop_s:.2f} s for {len(cell_vecs)} cells + {len(comp_vecs)} comparisons "
            f"-> {loop_total:.0f} s extrapolated to all {n_cells_all} cells + {n_tests} comparisons (bootstrap only)"
        )
        print(f"ratio:      {loop_total / vec:.0f}x (loop bootstrap alone vs the whole vectorised regeneration)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
