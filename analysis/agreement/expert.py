"""The paper's expert figures, recomputed from upstream's annotation files (``results/expert_annotations/``) through
the code path of ``craftmd review import``: the dermatologists' ratings of the conversations, and their per-case counts
of the grader's correct trials (the published 93.35 % grader–dermatologist agreement, reproduced exactly).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from craftmd import CraftMDError
from craftmd.atomic import atomic_write_json

from .review.read import _detect, read_review_files
from .review.records import ReviewInput
from .review.statistics import counts_agreement, resolved_table, summarise
from .review.write import release_case_labels, release_labels_by_grader, review_audit, write_results

ANNOTATIONS = "results/expert_annotations/"
#: Rater order: the two dermatologists, then the tie-breaker.
AGENT_FILES = (
    ANNOTATIONS + "validation_clinicalllm_patientai_d1.xlsx",
    ANNOTATIONS + "validation_clinicalllm_patientai_d2.xlsx",
    ANNOTATIONS + "validation_clinicallm_patientai_tiebreak_d3.xlsx",
)
GRADER_FILE = ANNOTATIONS + "validation_graderai.csv"
DATASET_CSV = "data/usmle_and_derm_dataset.csv"
GRADER_RESULTS = "results/gpt4_1106/{case_id}.json"
#: The release whose vignette FRQ answers upstream's grader validation judged (ingested id).
GRADER_VALIDATION_RELEASE = "gpt4_1106"
#: Upstream sheet name -> upstream results folder (release id of the ingested model).
SHEET_RELEASES = {"GPT-4": "gpt4_1106", "GPT-3.5": "gpt3_1106", "LLaMA2": "llama2-7b", "Mistral-v2": "mistral-v2"}
PUBLISHED_GRADER_AGREEMENT_PCT = 93.35


def _dataset_frame(data: bytes):
    import polars as pl

    try:
        return pl.read_csv(io.BytesIO(data), infer_schema_length=0)
    except pl.exceptions.PolarsError as exc:
        raise CraftMDError(f"{DATASET_CSV}: unreadable ({exc})") from None


def upstream_derm_cases(source, data: bytes | None = None) -> list[tuple[str, str]]:
    """(case_id, answer) of the source's Dermatology cases, in file order."""
    import polars as pl

    df = _dataset_frame(data if data is not None else source.read(DATASET_CSV))
    derm = df.filter(pl.col("category") == "Dermatology").select("case_id", "answer")
    return [(c, a) for c, a in derm.iter_rows()]


def upstream_grader_labels(source, case_ids: list[str], files: dict[str, bytes] | None = None) -> dict[tuple[str, int], dict]:
    """(case_id, trial) -> {correct, extracted}: GPT-4's recorded vignette-FRQ verdicts.

    ``files`` may hold the results files already read (path -> bytes); otherwise they are
    read from ``source`` in one pass (one glob, not one pattern per case: matching hundreds
    of patterns against the pin costs more than the pass).
    """
    if files is None:
        files = source.read_files([GRADER_RESULTS.format(case_id="case_*")])
    labels: dict[tuple[str, int], dict] = {}
    for case_id in case_ids:
        path = GRADER_RESULTS.format(case_id=case_id)
        if path not in files:
            raise CraftMDError(f"the source has no {path}")
        try:
            rec = json.loads(files[path])
        except json.JSONDecodeError as exc:
            raise CraftMDError(f"{path}: unreadable JSON ({exc})") from None
        for t in range(5):
            trial = rec.get(f"trial_{t}") or {}
            ev = trial.get("evaluation_vignette_frq")
            ex = trial.get("extracted_ans_vignette_frq")
            labels[(case_id, t)] = {"correct": ev == 1, "extracted": ex if isinstance(ex, str) else None}
    return labels


def dermatologists_sheets(source, files: dict[str, bytes] | None = None) -> ReviewInput:
    """The dermatologists' sheets of the conversations they rated (:data:`AGENT_FILES`), read and validated
    by :func:`~craftmd.analysis.agreement.review.read_review_files`: their answers and, per rated
    conversation, what they read (``ReviewInput.conversations``). ``files``: those files already read (path -> bytes)."""
    # ``results/expert_annotations/`` of the pinned source holds ``validation_clinicalllm_patientai_d1.xlsx`` and
    # ``_d2.xlsx`` (two dermatologists' yes/no answers, one sheet per model (GPT-4, GPT-3.5, LLaMA2, Mistral-v2): Q1 "is
    # it possible to reach one most likely diagnosis based on the conversation?", Q2 "does the conversation cover all
    # the key information in the vignette (excluding physical exam and lab results)?", Q3 "is the patient-LLM using
    # medical terminology?"; each rated 30 conversations per model, 15 of them in common),
    # ``validation_clinicallm_patientai_tiebreak_d3.xlsx`` (a third dermatologist where the two disagreed) and
    # ``validation_graderai.csv`` (per Dermatology case, columns ``case_0..case_316`` in the order of
    # ``data/usmle_and_derm_dataset.csv``: the GPT-4 grader's extracted vignette-FRQ answers per trial, the correct
    # answer, and ``dermatologist_accuracy``: how many of the 5 trials a dermatologist judged correct). All go through
    # review.read_review_files and review.summarise with Q1→doctor_one_dx, Q2→doctor_history, Q3→patient_terminology;
    # the grader's per-trial verdicts are the recorded ``evaluation_vignette_frq`` labels of ``results/gpt4_1106``.
    # The published 93.35 % is ``1 − Σ|grader's correct trials − dermatologist's count| / (5 × cases)`` over the 310
    # cases with a count (1,447 of 1,550 trials): review.statistics.grader_count_agreement.
    files = files if files is not None else source.read_files([*AGENT_FILES, DATASET_CSV])
    known = set(_dataset_frame(files[DATASET_CSV])["case_id"].to_list())
    return read_review_files([(p.rsplit("/", 1)[1], files[p]) for p in AGENT_FILES], known_case_ids=known)


def upstream_expert_tests(source, files: dict[str, bytes] | None = None):
    """McNemar's test between every two models on the dermatologists' labels of their conversations (the paper's
    Supplementary Table 18), from the sheets of :func:`dermatologists_sheets` (:func:`~craftmd.analysis.agreement.review.model_tests`)."""
    from .review import model_tests

    return model_tests(dermatologists_sheets(source, files))


def upstream_expert_results(source) -> dict:
    """Every expert figure recomputed from the pinned source (the ``review import`` path)."""
    files = source.read_files([*AGENT_FILES, GRADER_FILE, DATASET_CSV, GRADER_RESULTS.format(case_id="case_*")])
    derm = upstream_derm_cases(source, files[DATASET_CSV])
    known = set(_dataset_frame(files[DATASET_CSV])["case_id"].to_list())
    blobs = [(p.rsplit("/", 1)[1], files[p]) for p in (*AGENT_FILES, GRADER_FILE)]
    inp = read_review_files(blobs, known_case_ids=known, derm_cases=derm)
    labels = upstream_grader_labels(source, [c.case_id for c in inp.counts], files)
    results = summarise(inp, labels)
    results["source"] = source.describe()
    results["sheet_releases"] = SHEET_RELEASES
    results["published"] = {"grader_agreement_pct": PUBLISHED_GRADER_AGREEMENT_PCT}
    return results


def graders_vs_dermatologists(source, release_dir) -> dict[str, dict]:
    """Every FRQ grader of ``release_dir`` (upstream's GPT-4 answers) against the dermatologists' counts.

    Upstream's grader validation (``validation_graderai.csv``) gives, per Dermatology case,
    how many of GPT-4's five vignette-FRQ answers a dermatologist judged correct. Every grader
    that graded those answers (``upstream-gpt4``, ``offline``, ``llm:…``) is compared with
    those counts the paper's way (:func:`craftmd.analysis.agreement.review.counts_agreement`).
    Returns grader -> the figures; empty when the release has no vignette FRQ grades.
    """
    from craftmd.release import read_release

    if not read_release(release_dir).has("scores"):
        return {}
    by_grader = release_labels_by_grader(release_dir)
    if not by_grader:
        return {}
    files = source.read_files([GRADER_FILE, DATASET_CSV])
    inp = read_review_files(
        [(GRADER_FILE.rsplit("/", 1)[1], files[GRADER_FILE])], derm_cases=upstream_derm_cases(source, files[DATASET_CSV])
    )
    out = {}
    for grader, labels in sorted(by_grader.items()):
        try:
            out[grader] = counts_agreement(inp.counts, labels)
        except CraftMDError as exc:
            raise CraftMDError(f"{Path(release_dir).name}: grader {grader!r}: {exc}") from None
    return out


def upstream_expert_audit(source, results: dict | None = None) -> dict:
    """The audit dict of the recomputed expert figures (for the leaderboard); ``results`` if already computed."""
    res = results if results is not None else upstream_expert_results(source)
    gc = res["grader_counts"]
    kappa = {r["question"]: r["kappa"] for r in res["interrater"] if r["model"] == "all"}
    share = {(r["model"], r["question"]): r["share_pct"] for r in res["shares"]}
    models = sorted({r["model"] for r in res["shares"] if r["model"] != "all"})
    intro = (
        f"Recomputed from the dermatologists' annotations published with CRAFT-MD (commit {res['source']['commit'][:12]}). "
        f"\n\nGrader-AI vs dermatologists: {gc['agreement_pct']} % agreement over {gc['cases']} dermatology cases × 5 trials "
        f"(vignette, free response; published {PUBLISHED_GRADER_AGREEMENT_PCT} %), defined as 1 − Σ|grader's correct trials − "
        f"dermatologist's count| / (5 × cases); counts equal in {gc['count_equal_pct']} % of cases; Spearman ρ = {gc['spearman_rho']}. "
        f"\n\nConversations (two dermatologists, 15 shared per model, a third breaking ties): "
        + "; ".join(
            f"{m}: one diagnosis possible {share.get((m, 'doctor_one_dx'))} %, key history covered "
            f"{share.get((m, 'doctor_history'))} %, patient-AI used medical terms {share.get((m, 'patient_terminology'))} %"
            for m in models
        )
        + ".\n\nInter-rater Cohen's kappa (first vs second dermatologist, 60 shared conversations): "
        + ", ".join(f"{q} {k}" for q, k in kappa.items())
        + ". Upstream's sheets ask no separate question on the patient-AI's completeness or grounding; "
        "Q2 (key information covered) measures the completeness of the conversation as a whole."
    )
    return review_audit(res, audit_id="expert-upstream", title="Expert validation (paper's annotations, recomputed)", intro=intro)


def write_upstream_expert_audit(source, audits_dir) -> Path:
    """Write ``<audits_dir>/expert-upstream.json`` (what ``craftmd review upstream --out`` does)."""
    audit = upstream_expert_audit(source)
    d = Path(audits_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{audit['id']}.json"
    atomic_write_json(path, audit)
    return path


def import_review(
    files: list,
    out,
    *,
    dataset_dir=None,
    release=None,
    grader: str = "upstream-gpt4",
    source=None,
    audit_id: str = "expert-review",
) -> Path:
    """Validate the filled-in sheets, compute every figure, write them to ``out``; returns the JSON path."""
    from craftmd.dataset import load_config

    blobs = []
    for f in files:
        p = Path(f)
        if not p.is_file():
            raise CraftMDError(f"{p}: no such file")
        blobs.append((str(p), p.read_bytes()))
    known = None
    if dataset_dir is not None:
        known = set(load_config(dataset_dir, "all")["case_id"].to_list())
    needs_source = any(_detect(n, d)[0] == "upstream-grader" for n, d in blobs)
    derm = src = None
    if needs_source:
        from craftmd.source import Source

        src = source if source is not None else Source()
        derm = upstream_derm_cases(src)  # validate the sheets before the long read of the grader's results
    inp = read_review_files(blobs, known_case_ids=known, derm_cases=derm)
    labels = None
    if inp.counts:
        if release is not None:
            labels = release_case_labels(release, grader)
        else:
            labels = upstream_grader_labels(src, [c.case_id for c in inp.counts])
    results = summarise(inp, labels)
    audit = review_audit(results, audit_id=audit_id, title="Expert review of agents and grader")
    return write_results(Path(out), audit, resolved_table(inp))


__all__ = [
    "dermatologists_sheets",
    "upstream_expert_tests",
    "import_review",
    "graders_vs_dermatologists",
    "upstream_expert_audit",
    "upstream_expert_results",
    "upstream_derm_cases",
    "upstream_grader_labels",
    "write_upstream_expert_audit",
]
