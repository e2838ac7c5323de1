"""``craftmd submit``: a submission file in, a scored release and its report out.

Scoring grades the submission into a release (:func:`craftmd.scoring.submission.submit`), analysis reports its
accuracy (:func:`craftmd.analysis.report.submission_report`); :func:`score_submission` runs the two and puts
``OUT/submission-<model>-<hash>/``, ``OUT/scores.json`` and ``OUT/scores.csv`` in place all at once or not at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from craftmd import CraftMDError
from craftmd.atomic import atomic_dir, check_writable
from craftmd.commands.cli import add_dataset_argument, add_quiet_argument, command
from craftmd.commands.serving import add_serve_arguments

#: What a score folder holds: an existing --out is replaced (with --overwrite) only when it has it.
OWNS = ("scores.json",)
#: ... and everything it may hold: an --out with anything else in it is never replaced.
HOLDS = ("scores.json", "scores.csv", "submission-*")


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

    ``OUT`` holds one submission's result and is replaced whole (:func:`craftmd.atomic.atomic_dir`):
    an existing one only with ``overwrite``, and only when it is an earlier result (it has a
    ``scores.json``).

    ``grading`` goes to :func:`craftmd.scoring.submission.submit` (graders, config, base_url,
    cache, progress). Returns the report (also written as ``scores.json``).
    """
    from craftmd.analysis.report import submission_report
    from craftmd.scoring.submission import _slug, submit

    out_dir = Path(out_dir)
    _slug(model)  # a name it cannot make a release folder of (over 120 characters, control characters): one line, before grading
    check_writable(out_dir, overwrite=overwrite, owns=OWNS, holds=HOLDS)  # before validating and grading
    made = [p for p in (out_dir.parent, *out_dir.parent.parents) if not p.exists()]  # removed again if nothing comes of it
    done = False
    try:
        with atomic_dir(
            out_dir, overwrite=overwrite, owns=OWNS, holds=HOLDS
        ) as stage:  # checked again at the swap: two runs never replace each other
            rel_path, v, records = submit(path, dataset_dir, model, stage, **grading)
            report = submission_report(stage, dataset_dir, rel_path.name, v.summary(), records, B=B)
            (stage / "scores.json").write_text(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
            pl.DataFrame(report["accuracy"]).write_csv(stage / "scores.csv")
        done = True
    finally:
        if not done:  # a refused submission leaves nothing behind, not even the folders made for it
            for p in made:
                if p.is_dir() and not any(p.iterdir()):
                    p.rmdir()
    return report


def _submit(args) -> int:
    """validate, grade and score a submission into a release and a scores file

    Validate SUBMISSION (nothing is written if it fails), grade it (default graders: paper and strict for MCQ
    answers, offline for FRQ; --grader to choose), and write OUT/submission-<model>-<hash>/ (a release of kind
    submission, its grades in scores.parquet; copy it into the releases folder to show it on the leaderboard)
    and the report OUT/scores.json / scores.csv (accuracy with 95% bootstrap CIs per setting, format, grader
    and specialty, with each grader's measured reliability). OUT holds one submission's result and is
    replaced whole, only with --overwrite. Unanswered cases are scored as wrong. Answers in conversational
    settings (multiturn, singleturn, summarized, ...) without --conversations are shown on the leaderboard as
    self-reported, never ranked. --schema prints the submission format's JSON Schema.
    """
    from craftmd.commands.serving import logs_folder, served_scorers, serving
    from craftmd.scoring.submission import schema_text

    if args.schema:
        print(schema_text(), end="")
        return 0
    if not (args.submission and args.dataset and args.model and args.out):
        raise CraftMDError("craftmd submit needs SUBMISSION --dataset DIR --model NAME --out DIR (or --schema)")
    served, graders = served_scorers(args, args.grader, logs_folder(args.out, "submit"))
    with serving(served):
        report = score_submission(
            args.submission, args.dataset, args.model, args.out, graders=graders, config=args.config,
            base_url=args.base_url, cache=args.cache, progress=not args.quiet, overwrite=args.overwrite,
            conversations=args.conversations, protocol=args.protocol,
        )  # fmt: skip
    from craftmd.release import read_release

    rel = Path(args.out) / report["release"]
    counts = read_release(rel).manifest.counts
    missing = counts.get("answers_by_status", {}).get("missing", 0)
    empty = missing - counts.get("missing_answers", 0)
    print(
        f"scored {counts['answers']} answers: {counts['answers'] - missing} answered, {missing} missing and scored wrong "
        f"({counts.get('missing_answers', 0)} not in the submission, {empty} with an empty response) -> {rel}"
    )
    for r in report["accuracy"]:
        if r.get("group_by") == "all":
            print(
                f"  {r['format']:8s} {r['grader']:14s} {r['setting']:12s} {r['accuracy']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
            )
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
    add_serve_arguments(s, "grader (an llm: grader's model; grader-2, ... for more)", "OUT.submit-servers/ beside OUT")
    s.add_argument(
        "--conversations",
        metavar="FILE",
        help="the conversations behind the answers (parquet, the release's "
        "conversations.parquet schema), checked like a release's; without them, answers in conversational settings "
        "are listed on the leaderboard as self-reported, not ranked",
    )
    s.add_argument(
        "--protocol",
        metavar="FILE",
        help="the protocol the answers were made by (JSON: task, version, prompt_set, roles, answer_rules, trials); "
        "without it the submission's protocol is unknown and the leaderboard lists it apart from the paper's runs",
    )
    s.add_argument("--overwrite", action="store_true", help="replace an earlier result in --out")
    add_quiet_argument(s)


__all__ = ["score_submission", "register"]
