"""``craftmd validate SUBMISSION``: a submission file checked against its schema and the dataset, without grading."""

from __future__ import annotations

from craftmd.commands.cli import command


def _validate(args):
    """check a submission file (JSONL or parquet) without grading it

    Check every row of SUBMISSION against the submission schema (craftmd submit --schema) and the dataset:
    UTF-8, JSON, required fields and types, known case/setting/format, no duplicates, response size. Lists
    every problem (up to 20) with its line; exit status 2 when there is any. Reports the cases left unanswered
    (they would be scored as wrong).
    """
    from craftmd.scoring.submission import validate_cli

    return validate_cli(args)


def register(sub) -> None:
    """Add ``craftmd validate`` to the `craftmd` parser."""
    v = command(sub, "validate", _validate)
    v.add_argument("submission", help="submission file (.jsonl or .parquet)")
    v.add_argument("--dataset", required=True, help="built dataset folder (craftmd build --out)")
    v.add_argument("--config", default="all", help="dataset config the submission answers (default: all)")


__all__ = ["register"]
