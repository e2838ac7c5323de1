"""Offline FRQ grader: agreement with the recorded GPT-4 grader-AI, and grading speed.

Uses the built dataset and upstream releases of ``make leaderboard`` (``out/data``,
``out/releases``) when they are there, else builds and ingests them into a temporary
folder first (a few minutes). Then:

1. times the offline grader over every recorded FRQ answer of the upstream releases
   (about 200,000; grading only, answers already in memory; goal: under 20 s on 2 cores),
2. adds the offline grader's rows to copies of the releases and prints the agreement
   table (accuracy and Cohen's kappa vs ``upstream-gpt4``, per model and setting, training
   and held-out cases; goal: held-out kappa >= 0.85),
3. prints how often the offline extraction (step 1: single / multiple / none) agrees with
   the recorded grader-AI's, by split, and the confusion table on training cases.

    .venv/bin/python bench/bench_grading.py [--data out/data] [--releases out/releases]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from craftmd.release import find_releases
from craftmd.analysis.agreement.graders import agreement_record, grader_agreement_audit
from craftmd.scoring.measured import AGREEMENT_RECORD as RECORD
from craftmd.scoring.scorers import load_cases
from craftmd.scoring.score import score_release
from craftmd.scoring.offline import OfflineGrader
from craftmd.source import Source

ROOT = Path(__file__).resolve().parents[1]
SPEED_GOAL_S = 20.0
KAPPA_GOAL = 0.85


def prepare(data: Path, releases: Path, tmp: Path) -> tuple[Path, Path]:
    if (data / "all").is_dir() and releases.is_dir() and any(releases.glob("*/manifest.json")):
        return data, releases
    from craftmd.dataset_builder.build import build_dataset
    from craftmd.generation.ingest import ingest

    print(f"no dataset/releases at {data}, {releases}: building into {tmp}", file=sys.stderr)
    src = Source()
    build_dataset(src, tmp / "data", progress=False)
    ingest(src, tmp / "data", tmp / "releases", progress=False)
    return tmp / "data", tmp / "releases"


def extraction_agreement(releases: Path, data: Path) -> None:
    """Step 1 alone: how often the offline extraction's kind (single/multiple/none) is the recorded grader-AI's."""
    from craftmd.dataset import load_config
    from craftmd.scoring.measured import held_out

    src = dict(load_config(data, "all").select("case_id", "source").iter_rows())
    keys = ["case_id", "trial", "setting", "with_image"]
    frames = []
    for r in find_releases(releases):
        g = r.verdicts(format="frq", with_image=False)
        ref = g.filter(pl.col("grader") == "upstream-gpt4").select(*keys, pl.col("resolved_kind").alias("recorded"))
        off = g.filter(pl.col("grader") == "offline").select(*keys, pl.col("resolved_kind").alias("offline"))
        frames.append(ref.join(off, on=keys))
    df = pl.concat(frames)
    df = df.with_columns(split=pl.Series(["held-out" if held_out(c, src.get(c)) else "train" for c in df["case_id"]]))
    share = df.group_by("split").agg(n=pl.len(), kind_agreement=(pl.col("recorded") == pl.col("offline")).mean().round(4))
    print("extraction (step 1) agreement with the recorded grader-AI, by split:")
    print(share.sort("split", descending=True))
    print("training cases, recorded kind (rows) x offline kind (columns):")
    train = df.filter(pl.col("split") == "train")
    print(train.pivot(on="offline", index="recorded", values="offline", aggregate_function="len").fill_null(0).sort("recorded"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "out" / "data")
    ap.add_argument("--releases", type=Path, default=ROOT / "out" / "releases")
    ap.add_argument("--write-record", action="store_true",
                    help="store the overall figures in scoring/data/offline_agreement.json (after a table change)")  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data, releases = prepare(args.data, args.releases, tmp)
        upstream = [r for r in find_releases(releases) if r.manifest.kind == "upstream"]
        cases, _ = load_cases(data)
        pairs = []
        for r in upstream:
            a = pl.from_arrow(r.table("answers")).filter(pl.col("format") == "frq")
            pairs += [(resp, cases[(c, w)][1]) for c, w, resp in a.select("case_id", "with_image", "response").iter_rows()]
        t0 = time.perf_counter()
        grader = OfflineGrader()
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_correct = sum(grader.grade(resp, ans).correct for resp, ans in pairs)
        grade_s = time.perf_counter() - t0
        print(f"offline grader: {len(pairs):,} recorded FRQ answers graded in {grade_s:.1f} s "
              f"(+{load_s:.2f} s loading the table; {n_correct:,} correct); goal < {SPEED_GOAL_S:.0f} s: "
              f"{'met' if grade_s + load_s < SPEED_GOAL_S else 'NOT met'}")  # fmt: skip

        copies = tmp / "graded"
        copies.mkdir()
        t0 = time.perf_counter()
        for r in upstream:
            shutil.copytree(r.path, copies / r.path.name)
            score_release(copies / r.path.name, data, ["offline"], progress=False, force=True)
        print(
            f"score_release (offline) over {len(upstream)} releases incl. reading/writing parquet: {time.perf_counter() - t0:.1f} s"
        )
        audit = grader_agreement_audit(copies, data, Source())
        t = audit["tables"][0]
        df = pl.DataFrame([dict(zip(t["columns"], row)) for row in t["rows"]], infer_schema_length=None)
        with pl.Config(tbl_rows=200, tbl_cols=10, tbl_width_chars=140, tbl_hide_dataframe_shape=True):
            print(df.filter(pl.col("setting") == "all").sort("split", "model", descending=[True, False]))
            print(df.filter(pl.col("setting") != "all").sort("split", "model", "setting", descending=[True, False, False]))
        if len(audit["tables"]) > 1:
            t = audit["tables"][1]
            print(t["name"] + ":")
            with pl.Config(tbl_cols=10, tbl_width_chars=160, tbl_hide_dataframe_shape=True):
                print(pl.DataFrame([dict(zip(t["columns"], row)) for row in t["rows"]]))
        extraction_agreement(copies, data)
        if args.write_record:
            rec = agreement_record(audit)
            RECORD.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
            print(f"wrote {RECORD}")
        held = df.filter((pl.col("model") == "all text models") & (pl.col("split") == "held-out")).row(0, named=True)
        print(f"held-out kappa {held['kappa']} (goal >= {KAPPA_GOAL}): {'met' if held['kappa'] >= KAPPA_GOAL else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
