"""``craftmd submit``: a submission file in, a scored release and its report out.

The scoring room validates and grades the submission into a release
(:func:`craftmd.scoring.submission.submit`); the analysis room reads that release and
reports its accuracy (:func:`craftmd.analysis.report.submission_report`). This module,
on the shared ground above both rooms, runs the two in order and puts the results in
place together: ``OUT/submission-<model>/``, ``OUT/scores.json`` and ``OUT/scores.csv``
appear all at once or not at all.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import polars as pl

from craftmd import CraftMDError
from craftmd.cli import add_dataset_argument, add_quiet_argument, command


def score_submission(
    path: Path | str,
    dataset_dir: Path | str,
    model: str,
    out_dir: Path | str,
    *,
    B: int | None = None,
    overwrite: bool = False,
    **grading,
) -> dict:
    """Validate, grade and score a submission. Writes ``OUT/<release>/`` and ``OUT/scores.{json,csv}``.

    ``grading`` goes to :func:`craftmd.scoring.submission.submit` (graders, config, base_url,
    cache, progress). Returns the report (also written as ``scores.json``).
    """
    from craftmd.analysis.report import submission_report
    from craftmd.scoring.submission import _slug, submit

    out_dir = Path(out_dir)
    final = out_dir / f"submission-{_slug(model)}"
    if (final.exists() or (out_dir / "scores.json").exists()) and not overwrite:
        raise CraftMDError(f"{final} exists (pass --overwrite to replace it)")
    made = [p for p in (out_dir, *out_dir.parents) if not p.exists()]  # removed again if nothing comes of it
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".score-", dir=out_dir))
    done = False
    try:
        rel_path, v, records = submit(path, dataset_dir, model, stage, **grading)
        report = submission_report(stage, dataset_dir, rel_path.name, v.summary(), records, B=B)
        (stage / "scores.json").write_text(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        pl.DataFrame(report["accuracy"]).write_csv(stage / "scores.csv")
        if final.exists():
            shutil.rmtree(final)
        rel_path.replace(final)
        (stage / "scores.json").replace(out_dir / "scores.json")
        (stage / "scores.csv").replace(out_dir / "scores.csv")
        done = True
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if not done:  # a refused submission leaves nothing behind, not even the folders made for it
            for p in made:
                if p.is_dir() and not any(p.iterdir()):
                    p.rmdir()
    return report


def _submit(args) -> int:
    """validate, grade and score a submission into a release and a scores file

    Validate SUBMISSION (nothing is written if it fails), grade it (default graders: paper and strict for MCQ
    answers, offline for FRQ; --grader to choose), and write OUT/submission-<model>/ (a release of kind
    submission, its grades in scores.parquet; copy it into the releases folder to show it on the leaderboard)
    and the report OUT/scores.json / scores.csv (accuracy with 95% bootstrap CIs per setting, format, grader
    and specialty, with each grader's measured reliability). Unanswered cases are scored as wrong. --schema
    prints the submission format's JSON Schema.
    """
    from craftmd.scoring.submission import schema_text

    if args.schema:
        print(schema_text(), end="")
        return 0
    if not (args.submission and args.dataset and args.model and args.out):
        raise CraftMDError("craftmd submit needs SUBMISSION --dataset DIR --model NAME --out DIR (or --schema)")
    report = score_submission(
        args.submission, args.dataset, args.model, args.out, graders=args.grader, config=args.config,
        base_url=args.base_url, cache=args.cache, progress=not args.quiet, overwrite=args.overwrite,
    )  # fmt: skip
    s = report["submission"]
    print(f"scored {s['rows']} answers ({s['missing_answers']} missing, scored wrong) -> {Path(args.out) / report['release']}")
    for r in report["accuracy"]:
        if r.get("group_by") == "all":
            print(f"  {r['format']:8s} {r['grader']:14s} {r['setting']:12s} {r['accuracy']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]")
    return 0


def register(sub) -> None:
    s = command(sub, "submit", _submit)
    s.add_argument("submission", nargs="?", help="submission file (.jsonl or .parquet)")
    s.add_argument("--schema", action="store_true", help="print the submission JSON Schema and exit")
    add_dataset_argument(s, required=False)
    s.add_argument("--model", help="name of the submitted model (e.g. acme/med-7b)")
    s.add_argument("--out", help="output folder")
    s.add_argument("--config", default="all", help="dataset config the submission answers (default: all)")
    s.add_argument("--grader", action="append", metavar="NAME", help="paper | strict | offline | llm:PROVIDER/MODEL (repeatable)")
    s.add_argument("--base-url", help="OpenAI-compatible server for an LLM grader")
    s.add_argument("--cache", help="request cache (SQLite) for an LLM grader")
    s.add_argument("--overwrite", action="store_true", help="replace an earlier result in --out")
    add_quiet_argument(s)


__all__ = ["score_submission", "register"]
