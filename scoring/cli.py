"""Subcommands of craftmd.scoring (registered by craftmd.commands.cli): grade, grader-agreement, validate,
plus the audits' meld and review (helper E's :mod:`craftmd.commands.audits`).

Each handler parses nothing itself and calls one function of the room.
"""

from __future__ import annotations

from craftmd.commands.cli import add_dataset_argument, add_quiet_argument, add_source_argument, command


def _grade(args):
    """grade a release's answers (MCQ rules, offline FRQ grader, LLM grader-AI)

    Add or replace graders' rows in RELEASE/scores.parquet (written atomically; the release's conversations,
    answers and run record are never rewritten). Graders: paper and strict (the two MCQ rules, on mcq4 and
    mcq_many), offline (the offline FRQ grader, no model needed), llm:PROVIDER/MODEL (the paper's two-step
    grader-AI, e.g. llm:openai/gpt-4o or llm:vllm/Qwen/Qwen2.5-7B-Instruct). Missing answers grade as wrong; a
    failed grader call scores nothing (status error, with its reason) and is never counted as a verdict. An
    LLM grader never grades its own model unless --allow-self-grading.
    """
    from craftmd.scoring.grade import grade_cli

    return grade_cli(args)


def _validate(args):
    """check a submission file (JSONL or parquet) without grading it

    Check every row of SUBMISSION against the submission schema (craftmd score --schema) and the dataset:
    UTF-8, JSON, required fields and types, known case/setting/format, no duplicates, response size. Lists
    every problem (up to 20) with its line; exit status 2 when there is any. Reports the cases left unanswered
    (they would be scored as wrong).
    """
    from craftmd.scoring.submission import validate_cli

    return validate_cli(args)


def _agreement(args):
    """write the audit: offline FRQ grader vs the recorded GPT-4 grader-AI (kappa per model and setting)

    Compare the offline grader's FRQ grades with the recorded upstream-gpt4 labels in every release under
    --releases that has both (grade them first: craftmd grade REL --grader offline), per model, setting and
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
    g = command(sub, "grade", _grade)
    g.add_argument("release", help="release folder (has manifest.json and answers.parquet)")
    add_dataset_argument(g)
    g.add_argument("--grader", action="append", required=True, metavar="NAME",
                   help="paper | strict | offline | llm:PROVIDER/MODEL (repeatable)")  # fmt: skip
    g.add_argument("--base-url", help="OpenAI-compatible server for the LLM grader (e.g. a vllm serve endpoint)")
    g.add_argument("--cache", help="request cache (SQLite) for the LLM grader; reruns answer from it")
    g.add_argument("--allow-self-grading", action="store_true",
                   help="let an LLM grader grade its own model's answers (recorded as self_graded; never ranked by)")
    add_quiet_argument(g)

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
    register_grading(sub)
    from craftmd.commands.audits import register_audits  # meld, review (helper E)

    register_audits(sub)
