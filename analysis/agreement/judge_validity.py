"""The rubric judge against the CRAFT-MD dermatologists: do its information-gathering and diagnosis dimensions
separate the conversations they said yes to from those they said no to?

The conversations are the ones the dermatologists rated (upstream's validation sheets, read as
:func:`craftmd.analysis.agreement.history_validity.history_validity` reads them), each judged as a diagnosis encounter by the
given judge(s) on :data:`DIMENSIONS`. Labels are their resolved answers to Q1 (one most likely diagnosis
can be reached from the conversation, ``doctor_one_dx``) and Q2 (the conversation covers the vignette's
key history, ``doctor_history``). For each judged dimension, and for two composites (the mean of the
information-gathering dimensions, the mean of the diagnosis dimensions), the ROC AUC for each label with
its 95 % case-bootstrap CI (:func:`craftmd.agreement.auc_ci`); a conversation whose score failed is
left out of that measure and counted. The history metrics' own AUCs for Q2 (from ``history_validity``) are
shown beside them, over the same labels.
"""

from __future__ import annotations

import statistics

from craftmd.agreement import auc_ci
from craftmd.scoring.judge import COMMITTEE, Judge, JudgeSpec, Unit, transcript
from craftmd.scoring.rubric import load_catalog

from .expert import dermatologists_sheets
from .history_validity import history_validity
from .review import resolve

#: Rubric categories and dimensions read as information gathering / as diagnosis.
GATHERING = ("review of symptoms", "clinical_reasoning.inferential_symptom_recognition", "clinical_reasoning.symptom_severity_assessment",
             "adaptive_dialogue.question_management")  # fmt: skip
DIAGNOSIS = ("differential diagnosis", "final diagnosis", "clinical_reasoning.diagnostic_reasoning")
DIMENSIONS = GATHERING + DIAGNOSIS
#: The two composite measures: the mean of a conversation's valid scores over these dimensions.
COMPOSITES = {"mean of information-gathering dimensions": GATHERING, "mean of diagnosis dimensions": DIAGNOSIS}
QUESTIONS = {"doctor_one_dx": "Q1", "doctor_history": "Q2"}
AUDIT_ID = "judge_validity"
TABLE = "ROC AUC for the dermatologists' labels"


def page_measures() -> list[str]:
    """The judge's measures the page shows: every information-gathering and diagnosis dimension, then the composites."""
    return [d.id for d in load_catalog().select(list(DIMENSIONS))] + list(COMPOSITES)


def rated_units(dataset_dir, source) -> tuple[list[Unit], dict]:
    """The conversations the dermatologists rated, as judge units, and their resolved labels ((unit, question) -> dict)."""
    inp = dermatologists_sheets(source)
    units = []
    for uid, unit in sorted(inp.units.items()):
        if uid not in inp.conversations:
            continue
        roles, contents = inp.conversations[uid]
        text = transcript([{"role": r, "content": c} for r, c in zip(roles, contents)])
        units.append(Unit(unit.case_id, 0, uid, False, text, "diagnosis", False))
    return units, resolve(inp)


def judge_validity(dataset_dir, source, spec: JudgeSpec, *, B: int = 2000, seed: int = 14) -> dict:
    """Judge the rated conversations and measure each dimension's AUC for Q1 and Q2 (see the module's doc)."""
    spec.dimensions = list(spec.dimensions or DIMENSIONS)
    judge = Judge(spec)
    units, labels = rated_units(dataset_dir, source)
    states, counts = judge.run(units)
    cat = load_catalog()
    scorer = COMMITTEE if len(states) > 1 else states[0].member.name

    def score(u: Unit, dim: str) -> float | None:
        got = [s.outcomes[(u.key, dim)].score for s in states]
        valid = [g for g in got if g is not None]
        return float(statistics.median_low(valid)) if valid else None

    per_unit = {u.key: {d.id: score(u, d.id) for d in judge.dims} for u in units}

    def composite(u: Unit, ids: set[str]) -> float | None:
        vals = [v for d, v in per_unit[u.key].items() if d in ids and v is not None]
        return sum(vals) / len(vals) if vals else None

    measures = [(d.id, lambda u, d=d.id: per_unit[u.key][d]) for d in judge.dims]
    judged = {d.id for d in judge.dims}
    for name, names in COMPOSITES.items():
        ids = {d.id for d in cat.select(list(names))}
        if ids & judged:
            measures.append((name, lambda u, ids=ids: composite(u, ids)))
    rows = []
    for q, short in QUESTIONS.items():
        for name, fn in measures:
            use, failed = [], 0
            for u in units:
                lab = labels.get((u.conversation, q))
                if lab is None or lab["value"] is None:
                    continue
                v = fn(u)
                if v is None:
                    failed += 1
                    continue
                use.append((v, bool(lab["value"]), u.case_id))
            point, lo, hi = (
                auc_ci([x[0] for x in use], [x[1] for x in use], [x[2] for x in use], B=B, seed=seed)
                if use
                else (None, None, None)
            )
            rows.append({"measure": name, "source": scorer, "question": f"{short} {q}", "n": len(use), "n_yes": sum(x[1] for x in use),
                         "failed": failed, "auc": point, "ci_low": lo, "ci_high": hi})  # fmt: skip
    hist = history_validity(dataset_dir, source, B=B, seed=seed)
    for r in hist["auc"]:
        if r["question"] == "doctor_history" and r["conversations"] == "all resolved":
            rows.append({"measure": r["measure"], "source": "history", "question": "Q2 doctor_history", "n": r["n"], "n_yes": r["n_yes"],
                         "failed": 0, "auc": r["auc"], "ci_low": r["ci_low"], "ci_high": r["ci_high"]})  # fmt: skip
    return {"conversations": len(units), "judges": [s.member.name for s in states], "scorer": scorer, "mode": spec.mode,
            "rows": rows, "requests": counts.requests, "sent": counts.calls, "failures": counts.failures,
            "identity": judge.identity(states[0])}  # fmt: skip


def judge_validity_audit(res: dict, *, B: int = 2000, seed: int = 14) -> dict:
    """The audit dict (the page's shape) of :func:`judge_validity`'s result."""

    def r4(x):
        return None if x is None else round(x, 4)

    cols = ["measure", "source", "question", "n", "n_yes", "failed", "auc", "ci_low", "ci_high"]
    return {
        "id": AUDIT_ID,
        "title": "The rubric judge against the dermatologists",
        "description": (
            f"The conversations the CRAFT-MD dermatologists rated, judged by {', '.join(res['judges'])} ({res['mode']} mode) on the "
            "rubric's information-gathering and diagnosis dimensions; each dimension's ROC AUC for the resolved Q1 (one most likely "
            "diagnosis can be reached) and Q2 (the key history is covered) labels, with 95 % case-bootstrap CIs "
            f"({B:,} resamples, seed {seed}), next to the history metrics' AUCs for Q2. Failed judge scores are left out and counted."
        ),
        "tables": [
            {
                "name": TABLE,
                "columns": cols,
                "rows": [[r4(r[c]) if c in ("auc", "ci_low", "ci_high") else r[c] for c in cols] for r in res["rows"]],
            }
        ],
        "figures": [],
        "data": {"judges": res["judges"], "scorer": res["scorer"], "mode": res["mode"]},
    }


__all__ = [
    "judge_validity",
    "judge_validity_audit",
    "rated_units",
    "page_measures",
    "DIMENSIONS",
    "GATHERING",
    "DIAGNOSIS",
    "COMPOSITES",
    "AUDIT_ID",
]
