"""What CRAFT-MD's diagnosis task brings to an analysis (:data:`ANALYSIS`): its releases are the page's main board
(accuracy by setting and format, the paper's tests and figures: :mod:`craftmd.analysis`), and its headline on the board
per task is the board's leading figure, multi-turn free-response accuracy with the board's FRQ grader."""

from __future__ import annotations

from craftmd.tasks.base import Analysis, Measure


def board(a, v) -> list[dict]:
    """The task's rows on the board per task: each release's multi-turn FRQ accuracy (ranked, partial, or of another
    protocol)."""
    rows = []
    for m in v.models + v.partial + [m for g in v.other_protocols for m in g["models"]]:
        c = v.cell(m, "multiturn", "frq")
        if c:
            rows.append(dict(release=m, measure="frq_accuracy_multiturn", value=c["accuracy"], ci_low=c["ci_low"],
                             ci_high=c["ci_high"], n_cases=c["n_cases"]))  # fmt: skip
    return rows


#: The main board's columns: free response after the multi-turn conversation leads (the paper's recommended measure),
#: then free response in the other settings, then the four-choice MCQ (its ``paper`` rule) in every setting.
COLUMNS = (
    Measure("frq_accuracy_multiturn", "Multi-turn FRQ", setting="multiturn", format="frq"),
    Measure("frq_accuracy_vignette", "Vignette FRQ", setting="vignette", format="frq"),
    Measure("frq_accuracy_singleturn", "Single-turn FRQ", setting="singleturn", format="frq"),
    Measure("frq_accuracy_summarized", "Summarized FRQ", setting="summarized", format="frq"),
    Measure("mcq_accuracy_vignette", "Vignette MCQ", setting="vignette", format="mcq4"),
    Measure("mcq_accuracy_multiturn", "Multi-turn MCQ", setting="multiturn", format="mcq4"),
    Measure("mcq_accuracy_singleturn", "Single-turn MCQ", setting="singleturn", format="mcq4"),
    Measure("mcq_accuracy_summarized", "Summarized MCQ", setting="summarized", format="mcq4"),
)

#: What the diagnosis task brings to an analysis.
ANALYSIS = Analysis(
    main=True,
    measures=(Measure("frq_accuracy_multiturn", "Multi-turn FRQ accuracy"),),
    board=board,
    label="CRAFT-MD diagnosis",
    columns=COLUMNS,
)

__all__ = ["ANALYSIS", "COLUMNS", "board"]
