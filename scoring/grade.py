"""Answer scoring's shared ground: the dataset's answer keys, and grading answer rows with answer scorers.

The answer scorers (``paper``, ``strict``, ``offline``, ``llm:<provider/model>``, a task's own)
are those of the registry in :mod:`craftmd.scoring.scorers`, and ``craftmd score``
(:func:`craftmd.scoring.score.score_release`) runs them on a release. Every answer row of a
scored format gets a score row: a missing or non-text answer scores 0 (``resolved_kind`` none),
a grader call that failed scores nothing (null value, status ``error``, the reason in its detail)
and is never counted as a verdict. Each scorer's record holds its identity (rule version, or
table and rules hashes, or the model, prompts and sampling) and the inputs it graded
(:func:`craftmd.scoring.scorers.grading_inputs`: the answers file's and the dataset's hashes).

An LLM grader never grades its own model (same model, or the family the run record names)
unless allowed (``--allow-self``); then its record says ``self_graded`` and the board does not
take its figure (:func:`craftmd.scoring.scorers.self_graders`).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from craftmd import CraftMDError
from craftmd.scoring.scorers import MCQ_RULES, Context, ScoreRows, check_answer_cases, check_scorers, get_scorer


def grade_answers(
    answers: pl.DataFrame,
    dataset_dir: Path | str,
    graders: list[str],
    *,
    base_url: str | None = None,
    cache=None,
    progress: bool = True,
) -> tuple[pa.Table, dict]:
    """Grade answer rows (the release's answers schema) that are in no release yet (a submission's) ->
    (scores table, per-scorer record without its inputs)."""
    graders = check_scorers(graders)
    ctx = Context(Path(dataset_dir), base_url=base_url, cache=cache, progress=progress)
    check_answer_cases(answers, ctx)
    out = ScoreRows()
    records: dict[str, dict] = {}
    for g in graders:
        scorer = get_scorer(g)
        if scorer.unit != "answer":
            raise CraftMDError(f"scorer {g} does not grade answers")
        rows = answers.filter(pl.col("format").is_in(scorer.formats)).to_dicts()
        counts = scorer.score(rows, ctx, out)
        records[g] = dict(scorer.record(), **counts)
    return out.table(), records


def grader_identity(grader: str) -> dict | None:
    """What a release records about a deterministic grader (None for an LLM grader)."""
    return get_scorer(grader).identity()


__all__ = ["grade_answers", "grader_identity", "MCQ_RULES"]
