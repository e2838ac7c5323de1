"""Writing a review's results: the leaderboard audit of its figures, and its JSON with the ratings as a scores table
beside it; the release's grader verdicts the figures are compared with."""

from __future__ import annotations

import json
from pathlib import Path

from craftmd import CraftMDError
from craftmd.atomic import atomic_write_files, json_bytes

from .records import EXPERTS

#: The audit's tables of lists: (results key, table name, column -> field).
_LISTED = (
    ("interrater", "Inter-rater agreement (first two raters)",
     {"question": "question", "model": "model", "both rated": "n", "agreement %": "agreement_pct", "Cohen's kappa": "kappa",
      "disagreements": "disagreements", "tie-broken": "tiebroken", "unresolved": "unresolved"}),
    ("shares", "Share answered yes (after tie-breaks)",
     {"model": "model", "question": "question", "conversations": "n", "yes": "yes", "share %": "share_pct", "unresolved": "unresolved"}),
)  # fmt: skip
#: The audit's tables of figures: (results key, table name).
_FIGURES = (
    ("grader_vs_expert", "Grader-AI vs experts (per conversation)"),
    ("grader_counts", "Grader-AI vs dermatologists (correct trials per case, 0–5)"),
)


def review_audit(results: dict, *, audit_id: str = "expert-review", title: str = "Expert review", intro: str = "") -> dict:
    """The audit dict (leaderboard) of :func:`summarise`'s results."""
    tables = []
    for key, name, columns in _LISTED:  # rows of results[key], one column per field
        if results.get(key):
            tables.append(
                {"name": name, "columns": list(columns), "rows": [[r[f] for f in columns.values()] for r in results[key]]}
            )
    for key, name in _FIGURES:  # one row per figure of results[key]
        if results.get(key):
            rows = [[k, ", ".join(v) if isinstance(v, list) else v] for k, v in results[key].items()]
            tables.append({"name": name, "columns": ["metric", "value"], "rows": rows})
    qs = "; ".join(f"{k}: {v}" for k, v in results.get("questions", {}).items())
    desc = "\n\n".join(x for x in (intro, f"Questions — {qs}" if qs else "") if x)
    return {"id": audit_id, "title": title, "description": desc, "tables": tables, "figures": [], "data": results}


def release_labels_by_grader(release_dir, setting: str = "vignette", fmt: str = "frq") -> dict[str, dict]:
    """grader -> (case_id, trial) -> {correct, extracted}, for every grader of a release's text grades: made here or a
    claim, never scores no one checked (:func:`craftmd.scoring.score.check_standing`: a release from elsewhere is
    settled by ``craftmd score`` first)."""
    from craftmd.release import read_release
    from craftmd.scoring.score import check_standing

    rel = read_release(release_dir)
    check_standing([rel])
    g = rel.verdicts(setting=setting, format=fmt, with_image=False)

    def extracted(r) -> str | None:  # the grader's raw extraction where its detail keeps it ("none", "multiple")
        try:
            d = json.loads(r["detail"]) if r["detail"] else {}
        except json.JSONDecodeError:
            d = {}
        x = d.get("extracted_ans") if isinstance(d, dict) else None
        return x if isinstance(x, str) else r["resolved"]

    out: dict[str, dict] = {}
    for r in g.iter_rows(named=True):
        if r["status"] != "ok":  # a grade that could not be produced is no verdict: left out, never counted wrong
            continue
        out.setdefault(r["grader"], {})[(r["case_id"], int(r["trial"]))] = {
            "correct": bool(r["correct"]),
            "extracted": extracted(r),
        }
    return out


def release_case_labels(release_dir, grader: str = "upstream-gpt4", setting: str = "vignette", fmt: str = "frq") -> dict:
    """(case_id, trial) -> {correct, extracted} from a release's grades by ``grader``."""
    labels = release_labels_by_grader(release_dir, setting, fmt).get(grader)
    if not labels:
        raise CraftMDError(f"release {Path(release_dir).name}: no {setting}/{fmt} grades by grader {grader!r}")
    return labels


def write_results(out: Path, audit: dict, table) -> Path:
    """Write ``<out>/<id>.json`` and the ratings as a scores table ``<out>/<id>.scores.parquet`` (each atomically; validated before)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{audit['id']}.json"
    return write_with_scores(
        path, audit, table, {EXPERTS: {"review": audit["id"], "questions": sorted(set(table.column("question").to_pylist()))}}
    )


def write_with_scores(path: Path, results: dict, table, records: dict) -> Path:
    """Write ``results`` (JSON) to ``path`` and ``table`` as a scores table beside it (``<stem>.scores.parquet``), each
    atomically; the table is validated (:func:`craftmd.release.encode_scores`) before either is written."""
    from craftmd.release import encode_scores

    path = Path(path)
    data = encode_scores(table, records)
    atomic_write_files({path.with_name(f"{path.stem}.scores.parquet"): data, path: json_bytes(results)})  # both, or neither
    return path
