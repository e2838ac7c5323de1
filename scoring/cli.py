"""Subcommands of craftmd.scoring (registered by craftmd.commands.cli): score (:mod:`craftmd.scoring.score`),
grader-agreement, validate, plus the audits' meld and review (:mod:`craftmd.commands.audits`).

Each handler parses nothing itself and calls one function of the room.
"""

from __future__ import annotations

from craftmd.commands.cli import add_dataset_argument, add_source_argument, command


def _validate(args):
    """check a submission file (JSONL or parquet) without grading it

    Check every row of SUBMISSION against the submission schema (craftmd submit --schema) and the dataset:
    UTF-8, JSON, required fields and types, known case/setting/format, no duplicates, response size. Lists
    every problem (up to 20) with its line; exit status 2 when there is any. Reports the cases left unanswered
    (they would be scored as wrong).
    """
    from craftmd.scoring.submission import validate_cli

    return validate_cli(args)


def _agreement(args):
    """write the audit: offline FRQ grader vs the recorded GPT-4 grader-AI (kappa per model and setting)

    Compare the offline grader's FRQ grades with the recorded upstream-gpt4 labels in every release under
    --releases that has both (grade them first: craftmd score REL --scorer offline), per model, setting and
    split (training vs the fixed held-out cases), and write OUT/grader_agreement.json, an audit the
    leaderboard page renders. With the pinned source (the default), every FRQ grader of the GPT-4 release
    (gpt4_1106) is also compared with the dermatologists' verdicts of upstream's grader validation.
    """
    from craftmd.analysis.agreement.graders import write_audit
    from craftmd.source import Source

    source = None if args.no_source else Source(args.source)
    print(write_audit(args.releases, args.out, args.dataset, source))
    return 0


def register_grading(sub) -> None:
    a = command(sub, "grader-agreement", _agreement)
    a.add_argument("--releases", required=True, help="folder of releases")
    add_dataset_argument(a, help="built dataset folder (the held-out rule needs each case's source)")
    a.add_argument("--out", required=True, help="audits folder")
    add_source_argument(a)
    a.add_argument("--no-source", action="store_true", help="skip the comparison with the dermatologists (needs the source)")

    v = command(sub, "validate", _validate)
    v.add_argument("submission", help="submission file (.jsonl or .parquet)")
    v.add_argument("--dataset", required=True, help="built dataset folder (craftmd build --out)")
    v.add_argument("--config", default="all", help="dataset config the submission answers (default: all)")


def register(sub) -> None:
    """Add this room's subcommands to the `craftmd` parser."""
    from craftmd.scoring.score import register as register_score

    register_score(sub)
    register_grading(sub)
    from craftmd.commands.audits import register_audits  # meld, review (helper E)

    register_audits(sub)
