"""The review's figures: each conversation's resolved label (the only rating, the agreed one, or the tie-breaker's),
inter-rater agreement, shares of yes, expert vs grader (:mod:`craftmd.agreement`'s statistics), the labels as scores
rows and McNemar's test between models."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from craftmd import CraftMDError
from craftmd.agreement import kappa, spearman_test

from .records import EXPERTS, CaseCount, ReviewInput, load_questions, questions_sha256


def _pct(num: int, den: int) -> float | None:
    return round(100.0 * num / den, 2) if den else None


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else round(float(x), nd)


def resolve(inp: ReviewInput) -> dict[tuple[str, str], dict]:
    """(unit, question) -> {value, how, ratings}: how = single | agreed | tiebreak | unresolved."""
    by: dict[tuple[str, str], dict[str, bool]] = defaultdict(dict)
    for r in inp.ratings:
        by[(r.unit, r.question)][r.rater] = r.value
    out = {}
    a_b = inp.primary
    for key, vals in by.items():
        prim = [vals[r] for r in a_b if r in vals]
        if not prim:
            continue  # tie-break answers alone never make a label (validation refuses them)
        if len(prim) == 1:
            out[key] = {"value": prim[0], "how": "single", "ratings": vals}
        elif prim[0] == prim[1]:
            out[key] = {"value": prim[0], "how": "agreed", "ratings": vals}
        else:
            tb = next((vals[r] for r in inp.tiebreak if r in vals), None)
            out[key] = {"value": tb, "how": "tiebreak" if tb is not None else "unresolved", "ratings": vals}
    return out


def grader_count_agreement(expert: list[int], grader: list[int], trials: int = 5) -> dict:
    """Agreement of per-case counts of correct trials (expert vs grader), the paper's figure.

    ``agreement`` = 1 − Σ|grader − expert| / (trials × cases): the share of trials on which the
    two agree when trials are matched so that agreement is greatest — the only per-trial
    agreement the counts determine (the dermatologists recorded a count, not which trials).
    Also: the share of cases with equal counts, and Spearman's rho of the counts (scipy).
    """
    n = len(expert)
    if n == 0:
        return {"cases": 0, "agreement": None, "count_equal": None, "spearman_rho": None, "spearman_p": None}
    e, g = np.asarray(expert), np.asarray(grader)
    diff = int(np.abs(e - g).sum())
    rho, p = spearman_test(e, g)
    return {
        "cases": n,
        "trials": trials * n,
        "trial_disagreements": diff,
        "agreement": round(1.0 - diff / (trials * n), 6),
        "agreement_pct": _pct(trials * n - diff, trials * n),
        "count_equal": round(float((e == g).mean()), 6),
        "count_equal_pct": _pct(int((e == g).sum()), n),
        "spearman_rho": _r(rho, 6),
        "spearman_p": _r(p, 12),
        "expert_accuracy_pct": _pct(int(e.sum()), trials * n),
        "grader_accuracy_pct": _pct(int(g.sum()), trials * n),
    }


def counts_agreement(counts: list[CaseCount], case_labels: dict[tuple[str, int], dict]) -> dict:
    """A grader's per-trial verdicts (``case_labels``: (case_id, trial) -> {"correct": …}) against the
    experts' counts of correct trials, over the cases the experts scored (:func:`grader_count_agreement`)."""
    scored = [c for c in counts if c.expert_correct is not None]
    missing = [(c.case_id, t) for c in scored for t in range(5) if (c.case_id, t) not in case_labels]
    if missing:
        raise CraftMDError(f"no grader verdict for {missing[0][0]} trial {missing[0][1]} (and {len(missing) - 1} more)")
    grader_counts = [sum(bool(case_labels[(c.case_id, t)]["correct"]) for t in range(5)) for c in scored]
    return grader_count_agreement([c.expert_correct for c in scored], grader_counts)


def summarise(inp: ReviewInput, case_labels: dict[tuple[str, int], dict] | None = None) -> dict:
    """Every figure of the review: inter-rater agreement, shares, expert vs grader.

    ``case_labels`` maps (case_id, trial) to {"correct": bool, "extracted": str | None}: the
    grader's per-trial verdicts for upstream's grader-validation counts.
    """
    qtext = {q["id"]: q["text"] for q in load_questions()["questions"]}
    res = resolve(inp)
    models = sorted({u.model for u in inp.units.values()})
    questions = [q for q in qtext if any(k[1] == q for k in res)]
    out: dict = {
        "files": inp.files,
        "raters": {"primary": inp.primary, "tiebreak": inp.tiebreak},
        "questions": {q: qtext[q] for q in questions},
        "questions_sha256": questions_sha256(),
        "conversations": len({k[0] for k in res}),
        "interrater": _interrater(inp, res, questions, models),
        "shares": _shares(inp, res, questions, models),
    }
    expert = _grader_vs_expert(inp, res)
    if expert:
        out["grader_vs_expert"] = expert
    if inp.counts:
        out["grader_counts"] = _grader_counts(inp, case_labels)
    return out


def _interrater(inp: ReviewInput, res: dict, questions: list[str], models: list[str]) -> list[dict]:
    """Inter-rater agreement of the two primary raters, per question × model, pooled over each and over both."""
    inter = []
    if len(inp.primary) != 2:
        return inter
    a, b = inp.primary
    for q in [*questions, None]:
        for m in [None, *models]:
            pairs = [
                (v["ratings"][a], v["ratings"][b], v["how"])
                for (u, qq), v in sorted(res.items())
                if (q is None or qq == q) and (m is None or inp.units[u].model == m) and a in v["ratings"] and b in v["ratings"]
            ]
            if not pairs:
                continue
            xa, xb = [p[0] for p in pairs], [p[1] for p in pairs]
            agree = sum(p[0] == p[1] for p in pairs)
            inter.append({
                "question": q or "all", "model": m or "all", "n": len(pairs),
                "agreement_pct": _pct(agree, len(pairs)), "kappa": _r(kappa(xa, xb)),
                "disagreements": len(pairs) - agree,
                "tiebroken": sum(p[2] == "tiebreak" for p in pairs),
                "unresolved": sum(p[2] == "unresolved" for p in pairs),
            })  # fmt: skip
    return inter


def _shares(inp: ReviewInput, res: dict, questions: list[str], models: list[str]) -> list[dict]:
    """Shares of yes among resolved labels, per model (and all) and question, and per primary rater."""
    shares = []
    for m in [*models, None]:
        for q in questions:
            cells = [(u, v) for (u, qq), v in sorted(res.items()) if qq == q and (m is None or inp.units[u].model == m)]
            resolved = [v["value"] for _, v in cells if v["value"] is not None]
            row = {
                "model": m or "all", "question": q, "n": len(resolved), "yes": sum(resolved),
                "share_pct": _pct(sum(resolved), len(resolved)), "unresolved": len(cells) - len(resolved),
            }  # fmt: skip
            for r in inp.primary:
                own = [v["ratings"][r] for _, v in cells if r in v["ratings"]]
                row[f"share_pct[{r}]"] = _pct(sum(own), len(own))
                row[f"n[{r}]"] = len(own)
            shares.append(row)
    return shares


def _grader_vs_expert(inp: ReviewInput, res: dict) -> dict | None:
    """Expert vs grader per conversation (our sheets): the resolved ``grader_equivalent`` label against the grader's
    verdict; None when no conversation has both."""
    pairs = [
        (v["value"], inp.grader_labels[u]) for (u, q), v in sorted(res.items())
        if q == "grader_equivalent" and v["value"] is not None and inp.grader_labels.get(u) is not None
    ]  # fmt: skip
    if not pairs:
        return None
    e = [p[0] for p in pairs]
    g = [p[1] for p in pairs]
    agree = sum(x == y for x, y in pairs)
    rho = spearman_test(np.array(e, float), np.array(g, float)) if len(set(e)) > 1 and len(set(g)) > 1 else None
    return {
        "grader": sorted(inp.grader_names),
        "conversations": len(pairs),
        "agreement_pct": _pct(agree, len(pairs)),
        "kappa": _r(kappa(e, g)),
        "spearman_rho": _r(rho[0]) if rho is not None else None,
        "spearman_p": _r(rho[1], 12) if rho is not None else None,
        "expert_correct_pct": _pct(sum(e), len(e)),
        "grader_correct_pct": _pct(sum(g), len(g)),
    }


def _grader_counts(inp: ReviewInput, case_labels: dict[tuple[str, int], dict] | None) -> dict:
    """Upstream's grader validation: the grader's per-trial verdicts against the dermatologists' per-case counts."""
    if case_labels is None:
        raise CraftMDError("upstream's grader validation needs the grader's per-trial verdicts (a release or the source)")
    scored = [c for c in inp.counts if c.expert_correct is not None]
    stats = counts_agreement(inp.counts, case_labels)
    same = sum(
        (case_labels.get((c.case_id, t), {}).get("extracted") or "") == (c.extracted[t] or "")
        for c in inp.counts for t in range(5)
    )  # fmt: skip
    stats.update({
        "cases_in_sheet": len(inp.counts),
        "cases_unscored": len(inp.counts) - len(scored),
        "extracted_matching_grader": same,
        "extracted_total": 5 * len(inp.counts),
        "definition": "1 - sum over scored cases of |grader's correct trials - dermatologist's count| / (5 x cases)",
    })  # fmt: skip
    return stats


def resolved_table(inp: ReviewInput):
    """The review as scores rows (metric ``expert_rating``, 1 yes / 0 no): per conversation and question,
    each rater's answer (scorer ``rater:<name>``) and the resolved label (scorer ``experts``; its label says
    how: single, agreed, tiebreak; an unresolved one has status error and no value). Variant keys: the
    reviewed release (``model``), the ``question`` and the sheet's ``review_id``."""
    import pyarrow as pa

    res = resolve(inp)
    cols = {
        k: []
        for k in ("case_id", "trial", "model", "question", "review_id", "scorer", "metric", "value", "label", "detail", "status")
    }

    def add(unit, u, q, scorer, value, label, detail):
        for k, v in (
            ("case_id", unit.case_id),
            ("trial", unit.trial),
            ("model", unit.model),
            ("question", q),
            ("review_id", u),
            ("scorer", scorer),
            ("metric", "expert_rating"),
            ("value", None if value is None else float(value)),
            ("label", label),
            ("detail", detail),
            ("status", "error" if value is None else "ok"),
        ):
            cols[k].append(v)

    for (u, q), v in sorted(res.items()):
        unit = inp.units[u]
        ratings = {k: v["ratings"][k] for k in sorted(v["ratings"])}
        for rater, value in ratings.items():
            add(unit, u, q, f"rater:{rater}", value, None, None)
        add(unit, u, q, EXPERTS, v["value"], v["how"], json.dumps(ratings, sort_keys=True))
    return pa.table(cols)


#: tables/expert_tests.csv: McNemar's test between two reviewed models on the experts' resolved labels.
EXPERT_TEST_COLUMNS = [
    "question",
    "model_a",
    "model_b",
    "n_cases",
    "yes_a",
    "yes_b",
    "n10",
    "n01",
    "diff",
    "p_value",
    "p_adjusted",
    "test",
]


def model_tests(inp: ReviewInput):
    """McNemar's test between every two reviewed models, per question, on the experts' resolved labels (after
    tie-breaks) of the cases both were rated on (the paper's Supplementary Table 18): a case is a pair, ``n10`` the
    cases where model a's conversation got yes and b's no, ``n01`` the reverse; exact below 25 discordant cases, as
    the accuracy tests (:func:`craftmd.analysis.stats.mcnemar_p`). ``diff``: a's share of yes minus b's over the paired
    cases. Holm within each question across its pairs of models. A unit reviewed more than once per case and model
    (several trials) is refused: the pairing would be ambiguous."""
    import polars as pl
    from craftmd.analysis.stats import holm, mcnemar_p

    res = resolve(inp)
    label: dict[tuple[str, str, str], bool] = {}  # (question, model, case_id) -> resolved yes/no
    for (u, q), v in sorted(res.items()):
        if v["value"] is None:
            continue
        unit = inp.units[u]
        key = (q, unit.model, unit.case_id)
        if key in label:
            raise CraftMDError(
                f"model {unit.model!r} was reviewed more than once on {unit.case_id} ({q}): cannot pair models by case"
            )
        label[key] = v["value"]
    rows = []
    for q in sorted({k[0] for k in label}):
        models = sorted({k[1] for k in label if k[0] == q})
        for i, a in enumerate(models):
            for b in models[i + 1 :]:
                cases = sorted({k[2] for k in label if k[:2] == (q, a)} & {k[2] for k in label if k[:2] == (q, b)})
                if not cases:
                    continue
                xa = [label[(q, a, c)] for c in cases]
                xb = [label[(q, b, c)] for c in cases]
                n10 = sum(x and not y for x, y in zip(xa, xb))
                n01 = sum(y and not x for x, y in zip(xa, xb))
                rows.append({"question": q, "model_a": a, "model_b": b, "n_cases": len(cases), "yes_a": sum(xa), "yes_b": sum(xb),
                             "n10": n10, "n01": n01, "diff": round((sum(xa) - sum(xb)) / len(cases), 6),
                             "p_value": mcnemar_p(n10, n01), "test": "mcnemar"})  # fmt: skip
    types = {"question": pl.String, "model_a": pl.String, "model_b": pl.String, "n_cases": pl.Int64, "yes_a": pl.Int64, "yes_b": pl.Int64,
             "n10": pl.Int64, "n01": pl.Int64, "diff": pl.Float64, "p_value": pl.Float64, "test": pl.String}  # fmt: skip
    df = pl.DataFrame(rows, schema=types)
    return df.with_columns(pl.Series("p_adjusted", holm(df, ["question"]), dtype=pl.Float64)).select(EXPERT_TEST_COLUMNS)
