"""The history metrics against the dermatologists (issue #14, part 2): do the deterministic metrics of
:mod:`craftmd.scoring.history` say what the CRAFT-MD dermatologists said?

On the conversations the dermatologists rated (upstream's validation sheets, read by
:func:`craftmd.analysis.agreement.expert.dermatologists_sheets`), each metric's ROC AUC for their resolved
labels with a case-bootstrap CI, and the raters' own agreement; :func:`history_validity_audit` is the
leaderboard's audit of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from craftmd.agreement import auc, auc_ci, kappa
from craftmd.dataset import config_file, load_config
from craftmd.scoring.history import Reference, score_conversation, split_turns, words

from .expert import dermatologists_sheets
from .review import resolve

#: A patient word counts as medical vocabulary when it is one of these or ends with one of :data:`MEDICAL_SUFFIXES`
#: (a fixed list written from the usual Greek and Latin roots of clinical terms, not from the ratings).
MEDICAL_WORDS = frozenset(
    """lesion lesions papule papules macule macules plaque plaques pustule pustules vesicle vesicles nodule nodules bulla
    bullae erythema erythematous pruritus pruritic dyspnea dysuria hematuria edema lymphadenopathy alopecia urticaria
    eczema psoriasis vitiligo melanoma carcinoma tachycardia bradycardia hypertension hypotension diabetes mellitus
    syncope vertigo nausea emesis diarrhea constipation malaise fatigue febrile afebrile pyrexia myalgia arthralgia
    erythematous hyperpigmentation hypopigmentation scaling desquamation ulcer ulceration ulcers atrophy sclerosis
    biopsy histopathology diagnosis diagnosed prognosis chronic acute bilateral unilateral lateral medial proximal distal
    dorsal ventral anterior posterior inferior superior cutaneous subcutaneous dermal epidermal systemic topical oral
    intravenous steroid steroids corticosteroid corticosteroids antibiotic antibiotics antifungal antiviral
    immunosuppressed immunocompromised abdominal thoracic cervical inguinal axillary genital perianal periorbital
    hepatomegaly splenomegaly jaundice icterus cyanosis pallor petechiae purpura ecchymosis hemoptysis hematemesis
    polyuria polydipsia dysphagia odynophagia orthopnea paresthesia paresthesias photophobia photosensitivity""".split()
)
MEDICAL_SUFFIXES = ("itis", "osis", "oses", "emia", "aemia", "oma", "omas", "ectomy", "otomy", "ostomy", "algia", "opathy",
                    "pathy", "plasia", "plasty", "scopy", "ectasia", "penia", "cytosis", "uria", "rrhea", "rrhoea", "megaly",
                    "iasis", "trophy", "genic", "ptysis", "pnea", "phagia", "derma", "dermal", "cardia", "emesis")  # fmt: skip


def medical_share(text: str) -> float | None:
    """Share of ``text``'s words (rouge words, unstemmed) that are medical vocabulary; None without words."""
    ws = [w for w in words(text) if not w.isdigit()]
    if not ws:
        return None
    return sum(w in MEDICAL_WORDS or (len(w) > 5 and w.endswith(MEDICAL_SUFFIXES)) for w in ws) / len(ws)


def rater_agreement(inp, question: str = "doctor_history") -> dict:
    """The first two dermatologists on ``question`` over the conversations both rated: n, % agreement, Cohen's kappa
    (:func:`craftmd.agreement.kappa`), and the second's yes/no read as a score of the first's (its AUC)."""
    r1, r2 = inp.primary
    by: dict = {}
    for r in inp.ratings:
        if r.question == question and r.rater in (r1, r2):
            by.setdefault(r.unit, {})[r.rater] = r.value
    both = sorted(u for u, v in by.items() if len(v) == 2)
    a = np.array([by[u][r1] for u in both], bool)
    b = np.array([by[u][r2] for u in both], bool)
    return {"n": len(both), "agreement": float((a == b).mean()) if both else None, "kappa": kappa(a, b),
            "auc": auc(b[a].astype(float).tolist(), b[~a].astype(float).tolist())}  # fmt: skip


def history_validity(dataset_dir: Path | str, source, *, B: int = 2000, seed: int = 14) -> dict:
    """Every figure of the validity check: the metrics on the conversations the dermatologists rated, against
    their resolved labels (Q2 key information covered; Q3 the patient uses medical terms), and their own agreement."""
    inp = dermatologists_sheets(source)
    labels = resolve(inp)
    ds = {c: (v, h) for c, v, h in load_config(dataset_dir, "all").select("case_id", "vignette", "history").iter_rows()}
    facts = {}
    if config_file(dataset_dir, "facts").exists():
        facts = {c: f for c, f in load_config(dataset_dir, "facts").select("case_id", "facts").iter_rows()}
    rows = []
    for uid, unit in sorted(inp.units.items()):
        if uid not in inp.conversations or unit.case_id not in ds:
            continue
        roles, contents = inp.conversations[uid]
        vignette, history = ds[unit.case_id]
        by_ref = {}
        for name, text in (("vignette", vignette), ("history", history or vignette)):
            sc = dict((m, v) for m, v, _ in score_conversation(roles, contents, Reference(text, facts.get(unit.case_id))))
            by_ref[name] = sc
        _, patient, _, _ = split_turns(roles, contents)
        rows.append({
            "unit": uid, "model": unit.model, "case_id": unit.case_id,
            "recall_vignette": by_ref["vignette"]["patient_info_recall"], "recall_history": by_ref["history"]["patient_info_recall"],
            "fact_recall": by_ref["vignette"].get("patient_fact_recall"), "medical_share": medical_share("\n".join(patient)),
            **{q: (labels.get((uid, q)) or {}).get("value") for q in ("doctor_history", "patient_terminology")},
            **{f"{q}_how": (labels.get((uid, q)) or {}).get("how") for q in ("doctor_history", "patient_terminology")},
        })  # fmt: skip
    measures = (("patient_info_recall (vs history)", "recall_history", "doctor_history"),
                ("patient_info_recall (vs vignette)", "recall_vignette", "doctor_history"),
                ("patient_fact_recall", "fact_recall", "doctor_history"),
                ("patient medical-word share", "medical_share", "patient_terminology"))  # fmt: skip
    results = []
    for subset, hows in (("all resolved", ("single", "agreed", "tiebreak")), ("rated by both", ("agreed", "tiebreak"))):
        for name, col, q in measures:
            use = [r for r in rows if r[q] is not None and r[col] is not None and r[f"{q}_how"] in hows]
            point, lo, hi = auc_ci([r[col] for r in use], [r[q] for r in use], [r["case_id"] for r in use], B=B, seed=seed)
            results.append({"measure": name, "question": q, "conversations": subset, "n": len(use),
                            "n_yes": sum(r[q] for r in use), "cases": len({r["case_id"] for r in use}),
                            "auc": point, "ci_low": lo, "ci_high": hi})  # fmt: skip
    return {
        "rows": rows,
        "auc": results,
        "raters": {q: rater_agreement(inp, q) for q in ("doctor_history", "patient_terminology")},
    }


def history_validity_audit(
    releases_dir: Path | str | None, dataset_dir: Path | str, source, *, B: int = 2000, seed: int = 14
) -> dict:
    """The audit dict (``craftmd.commands.leaderboard``'s shape) of :func:`history_validity`. ``releases_dir`` is not read: the
    dermatologists' sheets hold the very conversations they rated, and the metrics are computed on those."""

    def r4(x):
        return None if x is None else round(x, 4)

    res = history_validity(dataset_dir, source, B=B, seed=seed)
    q2 = res["raters"]["doctor_history"]
    main = {(r["measure"], r["conversations"]): r for r in res["auc"]}
    best = max((r for r in res["auc"] if r["question"] == "doctor_history" and r["conversations"] == "rated by both" and r["auc"] is not None),
               key=lambda r: r["auc"], default=None)  # fmt: skip
    verdict = (
        "No history metric reaches the dermatologists' agreement with each other"
        if best is None or q2["auc"] is None or best["auc"] < q2["auc"]
        else f"{best['measure']} agrees with the raters at least as well as they agree with each other"
    )
    rv = main[("patient_info_recall (vs history)", "all resolved")]
    description = (
        "Do the deterministic history metrics say what the CRAFT-MD dermatologists said? On the conversations they rated "
        "(upstream's validation sheets; two raters, a third breaking ties), each metric's ROC AUC for the resolved Q2 label "
        "(the conversation covers all key information of the vignette, exam excluded) and a patient medical-word share for Q3 "
        "(the patient-AI uses medical terminology), with 95 % case-bootstrap CIs "
        f"({B:,} resamples, seed {seed}). The two dermatologists agree on Q2 in {100 * q2['agreement']:.0f} % of the {q2['n']} "
        f"conversations both rated (Cohen's kappa {q2['kappa']:.2f}); read as a score of the first, the second's label has an "
        f"AUC of {q2['auc']:.2f}. patient_info_recall (vs history) has an AUC of {rv['auc']:.2f} "
        f"({rv['ci_low']:.2f}–{rv['ci_high']:.2f}) over {rv['n']} conversations. {verdict} on the doubly-rated conversations "
        "(the fairest comparison, and a small one: the CIs are wide)."
    )
    cols = ["measure", "question", "conversations", "n", "n_yes", "cases", "auc", "ci_low", "ci_high"]
    return {
        "id": "history_validity",
        "title": "History metrics against the dermatologists",
        "description": description,
        "tables": [
            {
                "name": "ROC AUC of each metric for the dermatologists' labels",
                "columns": cols,
                "rows": [[r4(r[c]) if c in ("auc", "ci_low", "ci_high") else r[c] for c in cols] for r in res["auc"]],
            },
            {
                "name": "The dermatologists' own agreement (first vs second rater, conversations both rated)",
                "columns": ["question", "n", "agreement", "kappa", "auc"],
                "rows": [[q, d["n"], r4(d["agreement"]), r4(d["kappa"]), r4(d["auc"])] for q, d in res["raters"].items()],
            },
        ],  # fmt: skip
        "figures": [],
    }


__all__ = ["history_validity", "history_validity_audit", "rater_agreement", "medical_share", "MEDICAL_WORDS", "MEDICAL_SUFFIXES"]
