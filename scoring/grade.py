"""Grade a release's answers: add or replace scorers' ``correct`` rows in its ``scores.parquet``.

The scorers (``paper``, ``strict``, ``offline``, ``llm:<provider/model>``) are those of
the registry in :mod:`craftmd.scoring.scorers`. Every answer row of a scored format gets
a score row: a missing or non-text answer scores 0 (``resolved_kind`` none), a grader call
that failed scores nothing (null value, status ``error``, the reason in its detail) and is
never counted as a verdict. Grading writes ``scores.parquet`` beside the release's files
(:func:`craftmd.release.write_scores`) and never rewrites conversations, answers or the run
record. Each scorer's record holds its identity (rule version, or table and rules hashes)
and the inputs it graded (the answers file's and the dataset's hashes); with
``only_stale=True`` a scorer whose record matches both is not run again (``make leaderboard``
re-grades only what changed).

An LLM grader never grades its own model (same model, or the family the run record names)
unless ``allow_self=True``; then its record says ``self_graded`` and the board does not
take its figure.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa

from craftmd import CraftMDError
from craftmd.dataset import config_file, dataset_fingerprint, load_config
from craftmd.release import read_release, write_scores
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


def grade_answers(
    answers: pl.DataFrame,
    dataset_dir: Path | str,
    graders: list[str],
    *,
    base_url: str | None = None,
    cache=None,
    progress: bool = True,
) -> tuple[pa.Table, dict]:
    """Grade answer rows (the release's answers schema) -> (scores table, per-scorer record)."""
    graders = check_scorers(graders)
    cases, many = load_cases(dataset_dir)
    unknown = sorted({c for c, w in answers.select("case_id", "with_image").iter_rows() if (c, w) not in cases})
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise CraftMDError(f"answer for case {unknown[0]}{more} not in the dataset at {dataset_dir}")
    ctx = Context(cases, many, Path(dataset_dir), base_url=base_url, cache=cache, progress=progress)
    out = ScoreRows()
    records: dict[str, dict] = {}
    for g in graders:
        scorer = get_scorer(g)
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


def stale_graders(release_dir: Path | str, dataset_dir: Path | str, graders: list[str]) -> list[str]:
    """Those of ``graders`` whose recorded identity or inputs differ from now (LLM graders: always)."""
    rel = read_release(release_dir)
    recorded = rel.scorer_records()
    inputs = grading_inputs(rel.manifest, dataset_dir)
    stale = []
    for g in check_scorers(graders):
        ident, rec = grader_identity(g), recorded.get(g) or {}
        if ident is None or rec.get("inputs") != inputs or any(rec.get(k) != v for k, v in ident.items()):
            stale.append(g)
    return stale


def self_graders(manifest, graders: list[str]) -> list[str]:
    """Those of ``graders`` that would grade the release's own model."""
    doctor = (manifest.roles.get("doctor") or {})
    fam = doctor.get("family")
    models = {manifest.model, doctor.get("model") or manifest.model}
    return [g for g in graders if any(grades_itself(g, m, fam) for m in models)]


def grade_release(
    release_dir: Path | str,
    dataset_dir: Path | str,
    graders: list[str],
    *,
    base_url: str | None = None,
    cache=None,
    progress: bool = True,
    only_stale: bool = False,
    allow_self: bool = False,
) -> Path:
    """Add (or replace) ``graders``' scores in the release's ``scores.parquet``.

    With ``only_stale``, graders whose recorded identity and inputs are current are
    skipped; when none is left the release is not touched.
    """
    release_dir = Path(release_dir)
    graders = check_scorers(graders)
    if only_stale:
        graders = stale_graders(release_dir, dataset_dir, graders)
        if not graders:
            return release_dir
    rel = read_release(release_dir)
    own = self_graders(rel.manifest, graders)
    if own and not allow_self:
        raise CraftMDError(
            f"grader {own[0]} would grade its own model ({rel.manifest.model}); "
            "pick another grader, or pass --allow-self-grading (the page then marks it and never ranks by it)"
        )
    answers = pl.from_arrow(rel.table("answers"))
    new, records = grade_answers(answers, dataset_dir, graders, base_url=base_url, cache=cache, progress=progress)
    inputs = grading_inputs(rel.manifest, dataset_dir)
    for g in records:
        records[g] = dict(records[g], inputs=inputs, **({"self_graded": True} if g in own else {}))
    write_scores(rel, new, records)
    return release_dir


def grade_cli(args) -> int:
    out = grade_release(args.release, args.dataset, args.grader, base_url=args.base_url, cache=args.cache,
                        progress=not args.quiet, allow_self=args.allow_self_grading)
    print(json.dumps({"release": str(out), "graders": args.grader}))
    return 0


__all__ = ["grade_release", "grade_answers", "load_cases", "stale_graders", "grader_identity", "self_graders", "MCQ_RULES"]
