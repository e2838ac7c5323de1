"""A submission's report: its accuracy with 95 % bootstrap CIs, next to each grader's measured reliability.

Reads one scored release (like every analysis, it never writes releases) and returns the
dict that ``craftmd submit`` writes as ``scores.json`` / ``scores.csv``.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .bootstrap import DEFAULT_B


def submission_report(
    releases_dir: Path | str, dataset_dir: Path | str, release_id: str, summary: dict, records: dict, *, B: int | None = None
) -> dict:
    """Accuracy per setting, format, grader and specialty of ``release_id`` (a folder under ``releases_dir``)."""
    from .tables import compute

    a = compute(releases_dir, dataset_dir, B=B or DEFAULT_B)
    acc = a.accuracy.filter(pl.col("model") == release_id).sort("format", "grader", "setting", "with_image", "group_by", "group")
    return {
        "release": release_id,
        "submission": summary,
        "graders": records,
        "grader_reliability": {g: reliability(g) for g in records},
        "bootstrap": {"B": a.B, "seed": a.seed, "unit": "case"},
        "accuracy": acc.to_dicts(),
    }


def reliability(grader: str) -> str:
    """One sentence: how far a grader's verdicts can be trusted, from its measured agreements."""
    if grader in ("paper", "strict"):
        return "MCQ rule (deterministic; see craftmd.scoring.mcq)"
    if grader == "offline":
        from craftmd.scoring.measured import recorded_agreement

        rec = recorded_agreement()
        if rec is None:
            return "offline FRQ grader: agreement with the recorded GPT-4 grader-AI not measured for this table version"
        h = rec["overall"]["held-out"]
        text = (f"offline FRQ grader: on held-out upstream answers it agrees with the recorded GPT-4 grader-AI on "
                f"{h['agreement']:.1%} of {h['n']:,} answers, Cohen's kappa {h['kappa']:.3f}")  # fmt: skip
        derm = rec.get("dermatologists", {})
        if "offline" in derm:
            d = derm["offline"]
            text += (f"; against the dermatologists' verdicts on GPT-4's vignette answers ({d['cases']} Dermatology cases x 5 trials) "
                     f"{d['agreement']:.1%}")  # fmt: skip
            if "upstream-gpt4" in derm:
                text += f" (the GPT-4 grader-AI: {derm['upstream-gpt4']['agreement']:.1%})"
        return text
    return "LLM grader-AI: the paper's two-step prompt; its agreement is not measured here"


__all__ = ["submission_report", "reliability"]
