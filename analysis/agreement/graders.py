"""How far the offline FRQ grader agrees with the recorded GPT-4 grader-AI.

Agreement is measured on every recorded FRQ answer of the upstream releases: per model
and setting, the share of answers both graders call the same (accuracy) and Cohen's
kappa (:func:`statsmodels.stats.inter_rater.cohens_kappa`), which corrects for the
agreement that most answers being wrong gives for free.

The held-out set is fixed: every ``derm_private`` case and every other case whose
number is divisible by 5. The synonym table and rules of the offline grader were built
from the other (training) cases only; figures are reported for both parts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from craftmd import CraftMDError
from craftmd.agreement import kappa
from craftmd.atomic import atomic_write_json
from craftmd.scoring.measured import held_out
from craftmd.scoring.offline import SynonymTable, rules_sha256

from ..board import Board
from .expert import GRADER_VALIDATION_RELEASE, graders_vs_dermatologists

REFERENCE = "upstream-gpt4"
GRADER = "offline"
AUDIT_ID = "grader_agreement"


def paired_labels(releases: Board | Path | str, grader: str = GRADER, reference: str = REFERENCE) -> pl.DataFrame:
    """One row per recorded FRQ answer graded by both: model (the release id), case_id, setting, held_out, ref, pred.
    ``releases``: a :class:`craftmd.analysis.board.Board`, or a releases folder (read here). Every release's scores are
    made here or a claim (:func:`craftmd.scoring.score.check_standing`): a grader's labels no one checked are no
    reference and no prediction."""
    from craftmd.scoring.score import check_standing

    board = Board.of(releases)
    check_standing(list(board))
    frames = []
    for rel in board:
        if not rel.has("scores"):
            continue
        g = rel.verdicts(format="frq")
        ref = g.filter(pl.col("grader") == reference).select(
            "case_id", "trial", "setting", "with_image", pl.col("correct").alias("ref")
        )
        pred = g.filter(pl.col("grader") == grader).select(
            "case_id", "trial", "setting", "with_image", pl.col("correct").alias("pred")
        )
        if ref.is_empty() or pred.is_empty():
            continue
        j = ref.join(pred, on=["case_id", "trial", "setting", "with_image"], how="inner")
        frames.append(j.with_columns(model=pl.lit(rel.id)))
    if not frames:
        return pl.DataFrame(schema={"model": pl.Utf8, "case_id": pl.Utf8, "trial": pl.Int16, "setting": pl.Utf8,
                                    "with_image": pl.Boolean, "ref": pl.Boolean, "pred": pl.Boolean, "split": pl.Utf8})  # fmt: skip
    df = pl.concat(frames, how="vertical_relaxed")
    return df


def _split(df: pl.DataFrame, sources: dict[str, tuple[str, str]] | None) -> pl.DataFrame:
    src = sources or {}
    pairs = df.select("case_id", "with_image").iter_rows()
    split, dx = [], []
    for c, w in pairs:
        source, task = (None, None) if w else src.get(c, (None, None))
        split.append("held-out" if held_out(c, source) else "train")
        dx.append(task == "diagnosis")
    return df.with_columns(split=pl.Series(split, dtype=pl.Utf8), diagnosis_question=pl.Series(dx, dtype=pl.Boolean))


def agreement_table(df: pl.DataFrame) -> list[dict]:
    """Rows of model x setting x split (plus 'all' rollups): n, agreement, kappa, rates."""
    rows = []

    def add(model: str, setting: str, split: str, sub: pl.DataFrame) -> None:
        if sub.is_empty():
            return
        a, b = sub["ref"].to_numpy(), sub["pred"].to_numpy()
        k = kappa(a, b)
        rows.append(
            {
                "model": model,
                "setting": setting,
                "split": split,
                "n": sub.height,
                "agreement": round(float(np.mean(a == b)), 4),
                "kappa": None if k is None else round(k, 4),
                "reference_correct": round(float(np.mean(a)), 4),
                "offline_correct": round(float(np.mean(b)), 4),
            }
        )

    models = sorted(df["model"].unique().to_list())
    for split in ("train", "held-out"):
        part = df.filter(pl.col("split") == split)
        text = part.filter(~pl.col("with_image"))
        add("all text models", "all", split, text)
        if "diagnosis_question" in text.columns:
            add("all text models, diagnosis questions", "all", split, text.filter(pl.col("diagnosis_question")))
        for m in models:
            pm = part.filter(pl.col("model") == m)
            add(m, "all", split, pm)
            for s in sorted(pm["setting"].unique().to_list()):
                add(m, s, split, pm.filter(pl.col("setting") == s))
    return rows


def case_sources(dataset_dir: Path | str | None) -> dict[str, tuple[str, str]]:
    if dataset_dir is None:
        return {}
    from craftmd.dataset import load_config

    ds = load_config(dataset_dir, "all").select("case_id", "source", "task_type")
    return {c: (s, t) for c, s, t in ds.iter_rows()}


def dermatologist_rows(releases_dir: Path | str, source) -> dict[str, dict]:
    """grader -> agreement with the dermatologists (upstream's grader validation), for every FRQ
    grader of the GPT-4 release under ``releases_dir``; empty without a source or that release."""
    rel = Path(releases_dir) / GRADER_VALIDATION_RELEASE
    if source is None or not (rel / "manifest.json").exists():
        return {}
    return graders_vs_dermatologists(source, rel)


DERM_COLUMNS = [
    "grader",
    "cases",
    "trials",
    "agreement %",
    "counts equal %",
    "Spearman rho",
    "grader correct %",
    "dermatologists correct %",
]


def _description(rows: list[dict], overall: dict) -> str:
    """The audit's description: how the two graders are compared, and their agreement overall and on diagnoses."""
    desc = (
        "Free-response (FRQ) answers are graded by the paper's GPT-4 grader-AI (recorded upstream, grader "
        "`upstream-gpt4`) and by this package's offline grader (`offline`: normalisation, abbreviations, "
        "synonyms and the subtype rule from a versioned table, no model). The table gives, per model and "
        "setting, how often the two agree and Cohen's kappa (chance-corrected; most answers are wrong, so "
        "raw agreement flatters). The held-out cases (all derm_private cases and every case whose number is "
        "divisible by 5) were not used to build the offline grader's table or rules. "
    )
    if "held-out" in overall:
        h = overall["held-out"]
        desc += f"Held-out, all text models: agreement {h['agreement']:.3f}, kappa {h['kappa']}. "
    if "train" in overall:
        t = overall["train"]
        desc += f"Training: agreement {t['agreement']:.3f}, kappa {t['kappa']}. "
    dq = {r["split"]: r for r in rows if r["model"] == "all text models, diagnosis questions"}
    if "held-out" in dq:
        desc += (
            f"On the questions that ask for a diagnosis (task_type diagnosis) the held-out kappa is {dq['held-out']['kappa']}: "
            "on the others (a test, a treatment, a finding) the recorded grader-AI extracts no diagnosis from a correct "
            "answer and credits a disease the model named instead, which no rule reproduces. "
        )
    desc += (
        "GPT-4V's recorded labels are all 0 (even for exact matches), so its kappa is undefined and it is "
        "left out of the 'all text models' rows."
    )
    return desc


def grader_agreement_audit(releases: Board | Path | str, dataset_dir: Path | str | None = None, source=None) -> dict:
    """The audit dict (id, title, description, tables, figures, data) the leaderboard renders, of ``releases`` (the
    command's :class:`craftmd.analysis.board.Board`, or a releases folder, read here).

    ``dataset_dir`` gives each case's source (the held-out rule needs derm_private); when
    omitted, the built dataset is looked for beside the releases folder (``../data``, as
    ``make leaderboard`` lays them out). With the pinned ``source``, every FRQ grader of the
    GPT-4 release is also compared with the dermatologists' verdicts (a second table).
    """
    board = Board.of(releases)
    releases_dir = board.root
    if dataset_dir is None:
        for cand in (releases_dir.parent / "data",):
            if (cand / "all").is_dir():
                dataset_dir = cand
                break
    if dataset_dir is None:
        raise CraftMDError(
            f"grader agreement: no dataset beside {releases_dir}; pass dataset_dir (the held-out rule needs each case's source)"
        )
    df = paired_labels(board)
    if df.is_empty():
        return {
            "id": AUDIT_ID,
            "title": "FRQ grader agreement: offline grader vs the recorded GPT-4 grader-AI",
            "description": f"Not measured: no release under this folder has both {REFERENCE} and {GRADER} FRQ grades "
            "(grade the upstream releases with `craftmd score RELEASE --scorer offline`).",
            "tables": [],
            "figures": [],
        }
    df = _split(df, case_sources(dataset_dir))
    rows = agreement_table(df)
    cols = ["model", "setting", "split", "n", "agreement", "kappa", "reference_correct", "offline_correct"]
    overall = {r["split"]: r for r in rows if r["model"] == "all text models"}
    desc = _description(rows, overall)
    tables = [{"name": "Agreement per model, setting and split", "columns": cols, "rows": [[r[c] for c in cols] for r in rows]}]
    derm = dermatologist_rows(releases_dir, source)
    if derm:
        tables.append({
            "name": "FRQ graders vs dermatologists (GPT-4's vignette answers, Dermatology cases)",
            "columns": DERM_COLUMNS,
            "rows": [[g, d["cases"], d["trials"], d["agreement_pct"], d["count_equal_pct"], d["spearman_rho"],
                      d["grader_accuracy_pct"], d["expert_accuracy_pct"]] for g, d in sorted(derm.items())],
        })  # fmt: skip
        desc += (
            " Against the dermatologists (upstream's grader validation: per Dermatology case, how many of GPT-4's five "
            "vignette answers a dermatologist judged correct; agreement = 1 − Σ|grader's count − dermatologist's count| / "
            "(5 × cases)): " + "; ".join(f"{g} {d['agreement_pct']} %" for g, d in sorted(derm.items())) + "."
        )
    return {
        "id": AUDIT_ID,
        "title": "FRQ grader agreement: offline grader vs the recorded GPT-4 grader-AI and the dermatologists",
        "description": desc,
        "tables": tables,
        "figures": [],
        "data": {"overall": overall_figures(rows), "dermatologists": derm},
    }


def overall_figures(rows: list[dict]) -> dict:
    """split -> {n, agreement, kappa} of the 'all text models' rows of :func:`agreement_table`."""
    return {r["split"]: {k: r[k] for k in ("n", "agreement", "kappa")} for r in rows if r["model"] == "all text models"}


def agreement_record(audit: dict) -> dict:
    """The overall figures of an agreement audit, tied to the synonym table they were measured with."""
    t = audit["tables"][0]
    rows = [dict(zip(t["columns"], r)) for r in t["rows"]]
    overall = overall_figures(rows)
    per_model = {
        r["model"]: {k: r[k] for k in ("n", "agreement", "kappa")}
        for r in rows
        if r["split"] == "held-out" and r["setting"] == "all" and not r["model"].startswith("all text models")
    }
    return {
        "grader": GRADER,
        "reference": REFERENCE,
        "table_sha256": SynonymTable.load().sha256,
        "rules_sha256": rules_sha256(),
        "overall": overall,
        "held_out_per_model": per_model,
        "dermatologists": {
            g: {k: d[k] for k in ("cases", "trials", "agreement", "count_equal", "spearman_rho")}
            for g, d in sorted((audit.get("data") or {}).get("dermatologists", {}).items())
            if g in (GRADER, REFERENCE)
        },
    }


def write_audit(releases_dir: Path | str, audits_dir: Path | str, dataset_dir: Path | str | None = None, source=None) -> Path:
    audit = grader_agreement_audit(releases_dir, dataset_dir, source)
    return atomic_write_json(Path(audits_dir) / f"{AUDIT_ID}.json", audit)


__all__ = [
    "grader_agreement_audit",
    "write_audit",
    "agreement_table",
    "paired_labels",
    "agreement_record",
    "AUDIT_ID",
    "GRADER",
    "REFERENCE",
]
