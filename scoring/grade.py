"""Answer scoring's shared ground: the dataset's answer keys, and grading answer rows with answer scorers.

The answer scorers (``paper``, ``strict``, ``offline``, ``llm:<provider/model>``, a task's own)
are those of the registry in :mod:`craftmd.scoring.scorers`, and ``craftmd score``
(:func:`craftmd.scoring.score.score_release`) runs them on a release. Every answer row of a
scored format gets a score row: a missing or non-text answer scores 0 (``resolved_kind`` none),
a grader call that failed scores nothing (null value, status ``error``, the reason in its detail)
and is never counted as a verdict. Each scorer's record holds its identity (rule version, or
table and rules hashes, or the model, prompts and sampling) and the inputs it graded
(:func:`grading_inputs`: the answers file's and the dataset's hashes).

An LLM grader never grades its own model (same model, or the family the run record names)
unless allowed (``--allow-self``); then its record says ``self_graded`` and the board does not
take its figure (:func:`self_graders`).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from craftmd import CraftMDError
from craftmd.dataset import config_file, dataset_fingerprint, load_config
from craftmd.scoring.scorers import MCQ_RULES, Context, ScoreRows, check_scorers, get_scorer, grades_itself

def load_cases(dataset_dir: Path | str) -> tuple[dict[tuple[str, bool], tuple[list[str], str, str | None]], list[str]]:
    """``{(case_id, with_image): (choices, answer, paper_answer)}`` and the many-choice option list.

    ``paper_answer`` is the key the ``paper`` MCQ rule matches (upstream's recorded
    ``correct_ans``, verbatim); ``strict`` and the FRQ graders use ``answer``. NEJM image
    cases have no choices and no paper key.
    """
    cases: dict[tuple[str, bool], tuple[list[str], str, str | None]] = {}
    ds = load_config(dataset_dir, "all")
    if "paper_answer" not in ds.columns:
        raise CraftMDError(f"{dataset_dir}: the dataset has no paper_answer column (built by an older craftmd); rebuild it with craftmd build")
    for cid, ch, ans, key in ds.select("case_id", "choices", "answer", "paper_answer").iter_rows():
        cases[(cid, False)] = (list(ch or []), ans, key)
    if config_file(dataset_dir, "nejm_image").exists():
        nj = pl.read_parquet(config_file(dataset_dir, "nejm_image"), columns=["case_id", "answer"])
        for cid, ans in nj.iter_rows():
            cases[(cid, True)] = ([], ans, None)
    many: list[str] = []
    if config_file(dataset_dir, "diagnoses").exists():
        many = load_config(dataset_dir, "diagnoses")["diagnosis"].to_list()
    return cases, many


def check_answer_cases(answers: pl.DataFrame, ctx: Context) -> None:
    """A one-line error when an answer's case is not in the dataset."""
    unknown = sorted({c for c, w in answers.select("case_id", "with_image").iter_rows() if (c, w) not in ctx.cases})
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise CraftMDError(f"answer for case {unknown[0]}{more} not in the dataset at {ctx.dataset_dir}")


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


#: The dataset configs grading reads.
READS = ("all", "nejm_image", "diagnoses")


def dataset_inputs(dataset_dir: Path | str) -> dict:
    """The dataset part of what a grade depends on (the answers' hash is added where they are written)."""
    return {"dataset_sha256": dataset_fingerprint(dataset_dir, READS)}


def grading_inputs(manifest, dataset_dir: Path | str) -> dict:
    """What a grade depends on besides the grader: the release's answers file and the dataset."""
    return {"answers_sha256": manifest.files["answers.parquet"]["sha256"], **dataset_inputs(dataset_dir)}


def self_graders(manifest, graders: list[str]) -> list[str]:
    """Those of ``graders`` that would grade the release's own model."""
    doctor = (manifest.roles.get("doctor") or {})
    fam = doctor.get("family")
    models = {manifest.model, doctor.get("model") or manifest.model}
    return [g for g in graders if any(grades_itself(g, m, fam) for m in models)]


__all__ = ["grade_answers", "check_answer_cases", "load_cases", "grader_identity", "grading_inputs", "dataset_inputs", "self_graders", "MCQ_RULES"]
