"""The leaderboard page (one static HTML file, no external assets) and its markdown twin.

Python builds plain data (dicts and lists of numbers and strings) from a :class:`View`;
the Jinja2 templates in ``cards/`` (``leaderboard.html.j2``, autoescaped, and
``leaderboard.md.j2``) format and escape it. Every figure the prose states is read from
that data. Figures are relative PNGs under ``figures/``.

The page holds a board of a thousand releases: every table with a row per release (a *board*: the leaderboard, the
partial runs, each protocol's table, the per-task boards, the MCQ rules, the history measures, ...) can be sorted by
any column and filtered by a search box, in the page's own few lines of JavaScript, and shows its first
:data:`TOP_ROWS` rows until a reader searches it or asks for all (the others are in the HTML, ``hidden``). The lists
that grow with the square of the board or with its releases times their settings (tests between models, each model's
contrasts, the specialty and dataset tables with a column per model, the release list) hold only the rows of the
releases at the top of their tables (:func:`_top`); every row is in the CSV under ``tables/`` that the page names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl

from craftmd.cards.render import environment

from .view import FORMAT_LABELS, MCQ_PRIMARY, SETTING_LABELS, SETTING_NOTES, UPSTREAM_SETTINGS, View, describe_protocol

LEAD = ("multiturn", "frq")
#: the four-choice MCQ shown next to free response
MCQ = "mcq4"
#: an audit table longer than this folds away
FOLD_ROWS = 12
#: A board shows its first TOP_ROWS rows until a reader searches it or asks for all; lists of pairs and of each
#: release's settings, and the tables with a column per release, hold only the rows of the first TOP_ROWS releases of
#: each board (:func:`_top`). Far above the six upstream releases: their page hides nothing.
TOP_ROWS = 20


# -- the data the templates show -----------------------------------------------------------------


def _acc(r: dict | None) -> dict | None:
    """An accuracy cell: the point estimate, its 95 % CI and its cases."""
    if not r:
        return None
    return {"accuracy": r["accuracy"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "n_cases": r["n_cases"]}


def _release(v: View, m: str) -> dict:
    return {"id": m, "display": v.display(m), "model": v.release_info[m]["model"], "kind": v.kind(m)}


def _row(v: View, m: str, rank: int | None = None) -> dict:
    """A release's row of the board (or of the partial runs): its cell in each of the board's columns (:attr:`View.columns`,
    the leading one first)."""
    lead = v.cell(m, *LEAD) or v.cell(m, "vignette", MCQ) or {}
    return {
        **_release(v, m),
        "rank": rank,
        "cells": [_acc(v.column(m, c)) for c in v.columns],
        "n_cases": lead.get("n_cases"),
        "coverage": v.coverage.get(m, 0),
        "frq_grader": v.grader_for(m, "frq") or "none",
        "self_graded": sorted(v.self_graded.get(m, ())),
    }


def _headline(v: View) -> dict | None:
    """The lead box: the best complete release's conversational FRQ, against its vignette FRQ and MCQ."""
    if not v.models:
        return None
    best = v.models[0]
    return {
        "display": v.display(best),
        "lead": _acc(v.cell(best, *LEAD)),
        "vignette_frq": _acc(v.cell(best, "vignette", "frq")),
        "vignette_mcq": _acc(v.cell(best, "vignette", MCQ)),
    }


def _missing(v: View) -> dict | None:
    st = v.a.answer_status
    if st.height == 0:
        return None
    agg = st.group_by("model").agg(pl.col("n_answers", "n_ok", "n_missing", "n_non_text", "n_failed").sum()).sort("model")
    bad = agg.filter(pl.col("n_ok") < pl.col("n_answers"))
    return {
        "rows": [
            {"display": v.display(r["model"]), **{k: r[k] for k in ("n_answers", "n_missing", "n_non_text", "n_failed")}}
            for r in bad.iter_rows(named=True)
        ]
    }


def _top(v: View) -> set[str]:
    """The releases at the top of the page's boards: the first :data:`TOP_ROWS` of the ranked board, of the partial
    runs, of each other protocol's table, of the self-reported ones and of the image releases. A list of pairs or of a
    release's settings shows the rows of these releases alone (all of them on a board of up to TOP_ROWS releases)."""
    lists = [v.models, v.partial, v.self_reported, v.image_models, *(g["models"] for g in v.other_protocols)]
    return {m for ms in lists for m in ms[:TOP_ROWS]}


def _cut(shown: int, total: int, table: str) -> dict | None:
    """What a list that holds only the top releases' rows left out (None: nothing): the releases it shows, of how many,
    and the CSV that holds every row."""
    return {"shown": shown, "total": total, "table": table} if total > shown else None


def _specialty(v: View) -> list[dict]:
    """One table per setting and format (FRQ first): a row per specialty, its cases and the cell of each of the board's
    first :data:`TOP_ROWS` models (every model's in ``tables/accuracy.csv``)."""
    shown = v.models[:TOP_ROWS]
    tables = []
    for fmt in ("frq", MCQ):
        for s in UPSTREAM_SETTINGS:
            tables.append(
                {
                    "key": f"{s}-{fmt}",
                    "label": f"{SETTING_LABELS[s]} · {FORMAT_LABELS[fmt]}",
                    "selected": (s, fmt) == LEAD,
                    "rows": [
                        {
                            "specialty": sp,
                            "n_cases": v.n_cases(sp),
                            "cells": [_acc(v.cell(m, s, fmt, group_by="specialty", group=sp)) for m in shown],
                        }
                        for sp in v.specialties
                    ],
                }
            )
    return tables


def _by_dataset(v: View) -> list[dict]:
    """Multi-turn FRQ / vignette MCQ per source dataset and on the single-diagnosis subset, for the board's first
    :data:`TOP_ROWS` models (a column each; every model's in ``tables/accuracy.csv``)."""
    shown = v.models[:TOP_ROWS]
    datasets = v.groups("dataset")
    groups = [("dataset", d, d) for d in datasets] + [("single_dx", "all", "single-diagnosis subset")]
    groups += [("single_dx", d, f"{d}, single-diagnosis") for d in datasets]
    rows = []
    for gb, g, label in groups:
        cells = [(v.cell(m, *LEAD, group_by=gb, group=g), v.cell(m, "vignette", MCQ, group_by=gb, group=g)) for m in shown]
        if not any(lead for lead, _ in cells):
            continue
        rows.append(
            {
                "label": label,
                "n_cases": v.group_size(gb, g),
                "cells": [
                    {"lead": lead["accuracy"] if lead else None, "mcq": mcq["accuracy"] if mcq else None} for lead, mcq in cells
                ],
            }
        )
    return rows


def _mcq_rules(v: View) -> dict:
    """``paper`` vs ``strict`` per model and setting, and the answers that name several choices."""
    g = v.a.mcq_rule_gap
    sums = g.group_by("model").agg(pl.col("n_answers", "names_several", "paper_credits_several").sum()) if g.height else g
    gap = {m: r for m, *r in sums.select("model", "n_answers", "names_several", "paper_credits_several").iter_rows()}
    rows, worst, worst_gap, any_higher = [], None, 0.0, False
    for m in (m for m in v.models if v.cell(m, "vignette", MCQ, grader="strict")):
        settings = []
        for s in UPSTREAM_SETTINGS:
            p, q = v.cell(m, s, MCQ, grader="paper"), v.cell(m, s, MCQ, grader="strict")
            d = (q["accuracy"] - p["accuracy"]) if p and q else None
            settings.append({"paper": p["accuracy"] if p else None, "strict": q["accuracy"] if q else None, "delta": d})
            if d is not None and -d > worst_gap:
                worst, worst_gap = m, -d
            any_higher = any_higher or (d is not None and d > 0)
        n_answers, several, credited = gap.get(m, (0, 0, 0))
        rows.append(
            {
                "display": v.display(m),
                "settings": settings,
                "n_answers": int(n_answers or 0),
                "several": int(several or 0),
                "credited": int(credited or 0),
            }
        )
    return {
        "rows": rows,
        "largest_gap": {"display": v.display(worst), "gap": worst_gap} if worst else None,
        "strict_higher": any_higher,
    }


def _answer_order(v: View) -> list[dict]:
    """A model's MCQ accuracy with its options shuffled against in upstream's order, per pair of releases, grader,
    setting and format (``tables/order_tests.csv``, :mod:`.answer_order`); empty when no model has runs in both orders
    (the page then shows nothing of it)."""
    t = getattr(v.a, "order_tests", None)
    if t is None:
        return []
    return [{**r, "display": v.display(r["upstream_release"]), "setting": SETTING_LABELS.get(r["setting"], r["setting"]),
             "format": FORMAT_LABELS.get(r["format"], r["format"])} for r in t.to_dicts()]  # fmt: skip


def _measures(v: View) -> list[dict]:
    """Every metric besides accuracy (tables/metrics.csv), one table per metric; runs covering fewer cases than
    the board (partial runs) are left out here, as from every comparison, and stay in the CSV."""
    from craftmd.metrics import metric

    out = []
    # the history and rubric sections show these (all are in the CSV)
    mt = v.a.metrics.filter(pl.col("scorer") != "history", pl.col("metric") != "rubric_score")
    order = {m: i for i, m in enumerate(v.models + v.partial + v.image_models)}
    for name in mt["metric"].unique(maintain_order=True).to_list():
        if name == "rubric_score":  # its own section (analysis.rubric), by category and meta-category
            continue
        d = metric(name)
        rows = [
            r
            for r in mt.filter(pl.col("metric") == name).to_dicts()
            if r["model"] not in v.partial and r["model"] not in v.self_reported and r["model"] not in v.apart
        ]  # partial runs, self-reported, other protocols: in the CSV only
        rows.sort(key=lambda r: (order.get(r["model"], len(order)), r["model"], r["scorer"], r["variant"]))
        if rows:
            out.append({
                "metric": name, "description": d.description, "kind": d.kind, "better": "higher" if d.higher_is_better else "lower",
                "rows": [{**r, "display": v.display(r["model"])} for r in rows],
            })  # fmt: skip
    return out


#: The history section's columns: metric, heading, digits.
HISTORY_COLUMNS = (
    ("patient_info_recall", "Info recall", 3), ("patient_info_precision", "Info precision", 3),
    ("patient_fact_recall", "Fact recall", 3), ("doctor_turns", "Doctor turns", 1), ("doctor_words_per_turn", "Words / doctor turn", 1),
    ("patient_words_per_turn", "Words / patient turn", 1), ("question_similarity_rouge1", "Question similarity (R-1)", 3),
    ("question_similarity_rougeL", "Question similarity (R-L)", 3),
)  # fmt: skip
#: The validity audit's measure names of the metrics shown (standard conversations: the reference is the vignette).
VALIDITY_MEASURES = {"patient_info_recall": "patient_info_recall (vs vignette)", "patient_fact_recall": "patient_fact_recall"}


def _audit_table(audits: list[dict], audit_id: str, name_prefix: str) -> list[dict]:
    """An audit table's rows as dicts (empty when the audit or table is absent)."""
    for a in audits:
        if a.get("id") == audit_id:
            for t in a.get("tables", []):
                if str(t.get("name", "")).startswith(name_prefix):
                    return [dict(zip(t["columns"], r)) for r in t.get("rows", [])]
    return []


def _judge_validity(audits: list[dict]) -> dict | None:
    """The rubric judge's information-gathering and diagnosis measures against the dermatologists' Q2 and Q1 labels
    (the judge-validity audit, ``craftmd judge --validity``): per measure, both AUCs with their CIs, and the judge's name."""
    from craftmd.analysis.agreement.judge_validity import AUDIT_ID, TABLE, page_measures

    rows = [r for r in _audit_table(audits, AUDIT_ID, TABLE) if r.get("source") != "history"]
    if not rows:
        return None
    data = next((a.get("data") or {} for a in audits if a.get("id") == AUDIT_ID), {})
    judges = data.get("judges") or sorted({r["source"] for r in rows})
    by = {(r["measure"], str(r["question"]).split()[0]): r for r in rows}
    shown = [
        {"measure": m, "q2": by.get((m, "Q2")), "q1": by.get((m, "Q1"))}
        for m in page_measures()
        if (m, "Q2") in by or (m, "Q1") in by
    ]
    label = ", ".join(j.removeprefix("judge:") for j in judges)
    return {"judge": label, "rows": shown} if shown else None


def _validity(audits: list[dict]) -> tuple[list[dict], dict | None]:
    """Agreement with the dermatologists (the history-validity audit), beside the metrics: each metric's ROC AUC, and
    the dermatologists' own question on the doctor's history."""
    auc = _audit_table(audits, "history_validity", "ROC AUC")
    raters = {r["question"]: r for r in _audit_table(audits, "history_validity", "The dermatologists")}
    q2 = raters.get("doctor_history")
    validity = []
    for metric, measure in VALIDITY_MEASURES.items():
        by = {r["conversations"]: r for r in auc if r["measure"] == measure}
        if by:
            both = by.get("rated by both")
            validity.append({
                "metric": metric, "all": by.get("all resolved"), "both": both,
                "as_good": bool(q2 and both and both["auc"] is not None and q2["auc"] is not None and both["auc"] >= q2["auc"]),
            })  # fmt: skip
    return validity, q2


def _history(v: View, audits: list[dict], top: set[str]) -> dict | None:
    """The "How each doctor takes a history" section: the history metrics per model with CIs, their agreement
    with the dermatologists, paired tests (between the releases of ``top``), coverage against accuracy and complexity
    groups."""
    models = [m for m in v.models if any(v.history_cell(m, metric) for metric, _, _ in HISTORY_COLUMNS)]
    if not models:
        return None
    rows = []
    for m in models:
        cells = []
        for metric, _, digits in HISTORY_COLUMNS:
            r = v.history_cell(m, metric)
            cells.append(
                None
                if r is None or r["mean"] is None
                else {"mean": r["mean"], "lo": r["ci_low"], "hi": r["ci_high"], "digits": digits, "n": r["n_cases"]}
            )
        rows.append({"display": v.display(m), "cells": cells})
    validity, q2 = _validity(audits)
    # paired tests on the coverage metric
    t = v.a.history_tests.filter(
        pl.col("metric") == "patient_info_recall", pl.col("model_a").is_in(models), pl.col("model_b").is_in(models)
    )
    n_pairs = t.height
    t = t.filter(pl.col("model_a").is_in(list(top)), pl.col("model_b").is_in(list(top)))
    tests = [{"a": v.display(r["model_a"]), "b": v.display(r["model_b"]), "diff": r["diff"], "lo": r["ci_low"], "hi": r["ci_high"],
              "p": r["p_holm"], "n": r["n_cases"]} for r in t.iter_rows(named=True)]  # fmt: skip
    n_tests = v.a.history_tests.height
    # coverage against accuracy: lowest and highest quintile per model, with the preferred FRQ grader
    cov = v.a.history_by_coverage
    quintiles: dict[tuple[str, str], list[dict]] = {}
    for r in cov.sort("quintile").iter_rows(named=True):
        quintiles.setdefault((r["model"], r["grader"]), []).append(r)
    coverage = []
    for m in models:
        g = v.grader_for(m, "frq")
        sel = quintiles.get((m, g), []) if g else []
        if sel:
            lo_q, hi_q = sel[0], sel[-1]
            coverage.append({"display": v.display(m), "grader": g, "low": lo_q, "high": hi_q,
                             "gap_high": hi_q["vignette_accuracy"] - hi_q["multiturn_accuracy"]})  # fmt: skip
    edges = cov.unique(["quintile", "recall_low", "recall_high"]).sort("quintile")
    cx = (
        v.a.history_by_complexity.filter(pl.col("measure") == "patient_info_recall")
        .unique(["tertile", "words_low", "words_high"])
        .sort("tertile")
    )
    best = max(rows, key=lambda r: (r["cells"][0] or {}).get("mean", -1))
    return {
        "rows": rows, "columns": [{"metric": c, "label": lbl} for c, lbl, _ in HISTORY_COLUMNS],
        "n_cases": max((c["n"] for r in rows for c in r["cells"][:1] if c), default=0),
        "best": {"display": best["display"], "recall": best["cells"][0]["mean"]} if best["cells"][0] else None,
        "validity": validity, "judge_validity": _judge_validity(audits), "raters": q2, "tests": tests, "n_tests": n_tests, "coverage": coverage,
        "tests_cut": _cut(len(tests), n_pairs, "history_tests.csv"),
        "quintiles": [(r["recall_low"], r["recall_high"]) for r in edges.iter_rows(named=True)],
        "tertiles": [(r["words_low"], r["words_high"]) for r in cx.iter_rows(named=True)],
    }  # fmt: skip


def _rubric(a) -> dict | None:
    from .rubric import page_section

    return page_section(getattr(a, "rubric", None))


def _claims(a) -> list[dict]:
    """The scores claimed by their senders, not computed here (tables/claims.csv), one row each: never ranked."""
    claims = getattr(a, "claims", None)
    return [] if claims is None else claims.to_dicts()


def _overlap(a) -> dict | None:
    """The overlap between benchmarks (:mod:`.overlap`): the rule, the counts per pair of tasks, the tasks not compared."""
    from .overlap import page_section

    return page_section(getattr(a, "overlap", None))


def _other_tasks(a, v: View) -> dict:
    """Each task's own section (:attr:`craftmd.tasks.Analysis.section`: its data, and the templates in its folder that show
    it; none when the task's releases give it nothing to show), in the registry's order, and the board per task."""
    from craftmd.tasks import in_order

    from .boards import page_section as boards_section

    sections = []
    for task in in_order(a.releases["task"].to_list()):
        t = task.analysis
        data = t.section(a, v) if t.section is not None else None
        if data:
            where = f"task:{task.name}/{t.template}"
            sections.append({"data": data, "html": f"{where}.html.j2", "md": f"{where}.md.j2", "nav": t.nav, "anchor": t.anchor})
    return {
        "main_board": bool(v.models or v.partial or v.image_models),
        "task_boards": boards_section(a),
        "task_sections": sections,
    }


def _frq_preference() -> list[dict]:
    """The graders whose agreement with people is measured, in the order the board prefers them."""
    from craftmd.scoring.measured import measured_agreement
    from craftmd.scoring.scorers import rank_frq

    measured = measured_agreement()
    return [
        {"grader": g, "agreement": measured[g]["agreement"], "reference": measured[g]["reference"]}
        for g in rank_frq(list(measured))
    ]


def _grader_reliability(v: View, audits: list[dict]) -> list[dict]:
    """Each FRQ grader's measured agreement with the references: the recorded GPT-4 grader-AI (held-out
    answers) and the dermatologists (upstream's grader validation), from the grader-agreement audit."""
    from craftmd.analysis.agreement.graders import AUDIT_ID, GRADER, REFERENCE
    from craftmd.scoring.scorers import rank_frq

    data = next((a.get("data") or {} for a in audits if a.get("id") == AUDIT_ID), {})
    held = (data.get("overall") or {}).get("held-out")
    derm = data.get("dermatologists") or {}
    if not (held or derm):
        return []
    rows = []
    for g in rank_frq(sorted(set(v.frq_graders_all) | set(derm))):
        d = derm.get(g)
        rows.append(
            {
                "grader": g,
                "is_reference": g == REFERENCE,
                "vs_gpt4": ({k: held[k] for k in ("agreement", "kappa", "n")} if g == GRADER and held else None),
                "vs_derm": ({k: d[k] for k in ("agreement_pct", "cases", "trials", "count_equal_pct")} if d else None),
            }
        )
    return rows


def _tests(v: View) -> list[dict]:
    """The headline contrast per model and format, for the board's first :data:`TOP_ROWS` models: vignette minus
    multi-turn, with its Holm-adjusted p-values (every model's in ``tables/pvalues.csv``)."""
    pv = v.a.pvalues.filter(
        pl.col("family") == "setting",
        pl.col("group_by") == "all",
        pl.col("a") == "vignette",
        pl.col("b") == "multiturn",
        pl.col("model").is_in(v.models[:TOP_ROWS]),
    )
    by = {(r["model"], r["format"], r["grader"], r["test"]): r for r in pv.iter_rows(named=True)}
    rows = []
    for m in v.models[:TOP_ROWS]:
        for fmt in ("frq", MCQ):
            g = v.grader_for(m, fmt)
            if g is None:  # no grader stands behind this model's figures (graded only by itself)
                continue
            b, mc = by.get((m, fmt, g, "paired-bootstrap")), by.get((m, fmt, g, "mcnemar"))
            if b:
                rows.append(
                    {
                        "display": v.display(m),
                        "format": FORMAT_LABELS[fmt],
                        "grader": g,
                        "diff": b["diff"],
                        "p_bootstrap": b["p_adjusted"],
                        "p_mcnemar": mc["p_adjusted"] if mc else None,
                    }
                )
    return rows


def _pairs(a) -> dict:
    """Which pairs of models the analysis tested: every pair (on request, or no family larger than
    :data:`.runner.ALL_PAIRS_UP_TO` models), else each model against its neighbours in the ranking and the leader."""
    from .runner import ALL_PAIRS_UP_TO

    protocol = dict(a.releases.select("release", "protocol").iter_rows())  # pairs are tested within one protocol
    fam = (
        a.accuracy.filter(pl.col("group_by") == "all")
        .with_columns(pl.col("model").replace_strict(protocol, default=None, return_dtype=pl.String).alias("protocol"))
        .group_by("protocol", "setting", "format", "grader", "with_image")
        .agg(pl.col("model").n_unique())
    )
    largest = int(fam["model"].max() or 0) if fam.height else 0
    return {
        "every": bool(getattr(a, "all_pairs", False)) or largest <= ALL_PAIRS_UP_TO,
        "requested": bool(getattr(a, "all_pairs", False)),
        "up_to": ALL_PAIRS_UP_TO,
    }


def _paper_tests(v: View, top: set[str]) -> dict | None:
    """The paper's other tests: four-choice MCQ against FRQ per model and setting (``tables/format_tests.csv``), the
    preprint's p-values beside them, with against without the image (``tables/image_tests.csv``) and McNemar between
    models on the dermatologists' labels (``tables/expert_tests.csv``); None when there is none of them. The tests of
    one model's settings are those of the releases at the top of their boards (``top``): all in the CSVs."""
    a = v.a
    ft, it, et, pt = (getattr(a, k, None) for k in ("format_tests", "image_tests", "expert_tests", "published_tests"))
    fmt_rows = []
    if ft is not None and ft.height:
        shown = [m for m in v.models if m in top]
        sel = ft.filter(
            pl.col("model").is_in(shown), pl.col("mcq_grader") == MCQ_PRIMARY, ~pl.col("with_image"), pl.col("group_by") == "all"
        )
        tested = {(r["model"], r["frq_grader"], r["setting"], r["test"]): r for r in sel.iter_rows(named=True)}  # fmt: skip
        for m in shown:
            g = v.grader_for(m, "frq")
            if g is None:
                continue
            by = {(s, t): r for (mm, gg, s, t), r in tested.items() if mm == m and gg == g}
            for s in UPSTREAM_SETTINGS:
                b, mc = by.get((s, "paired-bootstrap")), by.get((s, "mcnemar"))
                if b:
                    fmt_rows.append({"display": v.display(m), "setting": SETTING_LABELS[s], "grader": g, "mcq": _acc(v.cell(m, s, MCQ)),
                                     "frq": _acc(v.cell(m, s, "frq")), "diff": b["diff"], "p_bootstrap": b["p_adjusted"],
                                     "p_mcnemar": mc["p_adjusted"] if mc else None})  # fmt: skip
    img_rows = []
    if it is not None and it.height:
        sel = it.filter(pl.col("group_by") == "all", pl.col("model").is_in(list(top)))
        by = {(r["model"], r["setting"], r["format"], r["grader"], r["test"]): r for r in sel.iter_rows(named=True)}
        for (m, s, f, g, t), r in by.items():
            if t != "paired-bootstrap":
                continue
            mc = by.get((m, s, f, g, "mcnemar"))
            img_rows.append({"display": v.display(m), "setting": SETTING_LABELS.get(s, s), "format": FORMAT_LABELS.get(f, f), "grader": g,
                             "n_cases": r["n_cases"], "diff": r["diff"], "p_bootstrap": r["p_adjusted"],
                             "p_mcnemar": mc["p_adjusted"] if mc else None})  # fmt: skip
    published = pt.to_dicts() if pt is not None and pt.height else []
    experts = et.to_dicts() if et is not None and et.height else []
    if not (fmt_rows or img_rows or v.image_models or experts):
        return None
    tested = set(ft.filter(pl.col("group_by") == "all")["model"].to_list()) & set(v.models) if ft is not None else set()
    imaged = set(it.filter(pl.col("group_by") == "all")["model"].to_list()) if it is not None else set()
    cut = {"format": _cut(len(tested & top), len(tested), "format_tests.csv"),
           "image": _cut(len(imaged & top), len(imaged), "image_tests.csv")}  # fmt: skip
    return {"format": fmt_rows, "image": img_rows, "image_models": [v.display(m) for m in v.image_models[:TOP_ROWS]],
            "image_models_more": max(0, len(v.image_models) - TOP_ROWS), "published": published, "cut": cut,
            "published_same": [r for r in published if r["same_p"]], "published_differ": [r for r in published if r["same_p"] is False],
            "experts": experts}  # fmt: skip


def _human(v: View) -> dict:
    """The dermatologists' accuracy as the paper reports it (quoted, not recomputed: the source holds no answers of
    theirs), beside each ranked model's vignette MCQ and FRQ on the two dermatology datasets."""
    from .published import DERMATOLOGISTS_REPORTED

    datasets = [d for d in ("derm_public", "derm_private") if d in v.groups("dataset")]
    rows = [{"display": v.display(m), "cells": [{"mcq": _acc(v.cell(m, "vignette", MCQ, group_by="dataset", group=d)),
                                                 "frq": _acc(v.cell(m, "vignette", "frq", group_by="dataset", group=d))} for d in datasets]}
            for m in v.models]  # fmt: skip
    return {
        "mcq": DERMATOLOGISTS_REPORTED["mcq4"],
        "frq": DERMATOLOGISTS_REPORTED["frq"],
        "datasets": datasets,
        "sizes": [v.group_size("dataset", d) for d in datasets],
        "rows": rows if datasets else [],
    }


#: The paper's other figures (analysis.paper_figures): file, alt text, caption; the page shows those that were drawn.
PAPER_FIGURES = (
    ("settings_tests.png", "Accuracy by setting per model with significance brackets",
     "Nature Medicine 2025, Fig. 2, with its brackets: per model, the vignette against each conversational setting; Holm-adjusted paired-bootstrap p-values (ns, * < 0.05, ** < 0.01, *** < 0.001)."),
    ("single_dx.png", "Accuracy by setting on the single-diagnosis subset with significance brackets",
     "Nature Medicine 2025, Extended Data Fig. 5: the single-diagnosis subset, the Derm-Public and Derm-Private vignettes whose dermatologists found one most likely diagnosis (dataset column single_dx). It holds no MedQA case: the dermatologists labelled only the two dermatology datasets."),
    ("mcq_vs_frq.png", "Four-choice MCQ against FRQ per model and setting with significance brackets",
     "Four-choice MCQ (paper rule) against free response (each model's FRQ grader), per setting (Nature Medicine 2025, Supplementary Table 3)."),
    ("vision.png", "FRQ accuracy on the image cases per setting, with and without the image",
     "The image cases (Nature Medicine 2025, Fig. 4): with the image and, where a release has them, without it, bracketed by the paired tests (Nature Medicine 2025, Supplementary Table 21)."),
    ("exam.png", "The exam settings beside the vignette and the multi-turn conversation",
     "The physical exam, as the preprint (medRxiv 2024) tested it: exam findings alone against the vignette (its Fig. 2c and 3d; upstream's results/statistics/fig2c_stats.tsv, fig3d_stats.tsv), the conversation without them against the multi-turn conversation (its Fig. 4c; fig4c_stats.tsv), and with them added (no published counterpart in those tables)."),
)  # fmt: skip


def _paper_figures(out: Path | None) -> list[dict]:
    if out is None:
        return []
    return [
        {"src": f"figures/{f}", "alt": alt, "caption": cap}
        for f, alt, cap in PAPER_FIGURES
        if (Path(out) / "figures" / f).is_file()
    ]


def _audit(a: dict) -> dict:
    """An audit's prose, tables and figures (each figure with the file it is copied from)."""
    figures = []
    base = Path(a.get("_dir", "."))
    for fig in a.get("figures", []):
        src = (base / fig).resolve()
        rel = Path("figures") / "audits" / str(a["id"]) / src.name
        figures.append({"name": str(fig), "src": rel.as_posix(), "file": str(src) if src.is_file() else None})
    return {
        "id": str(a["id"]),
        "title": str(a["title"]),
        "paragraphs": [p.strip() for p in str(a.get("description", "")).split("\n\n") if p.strip()],
        "tables": [
            {
                "name": t.get("name") or "Table",
                "columns": [str(c) for c in t.get("columns", [])],
                "rows": [list(r) for r in t.get("rows", [])],
            }
            for t in a.get("tables", [])
        ],
        "figures": figures,
    }


def _copy_audit_figures(ctx: dict, out: Path) -> None:
    for a in ctx["audits"]:
        for f in a["figures"]:
            if f["file"]:
                (out / f["src"]).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f["file"], out / f["src"])


def _trials_per_case(v: View) -> int | None:
    """The trials each case has on the board, when every ranked release has the same whole number of them."""
    st = v.a.answer_status.filter(
        ~pl.col("with_image"), pl.col("setting") == LEAD[0], pl.col("format") == LEAD[1], pl.col("model").is_in(v.models)
    )
    ratios = {n / v.board_cases for n in st["n_answers"].to_list()} if v.board_cases else set()
    if len(ratios) == 1 and (t := ratios.pop()).is_integer():
        return int(t)
    return None


def _image_rows(v: View) -> list[dict]:
    """The image table: the releases of its protocol first, then each other one with why it is not comparable."""
    rows = []
    for m in sorted(v.image_models, key=lambda m: (m in v.image_apart, m)):
        apart = "; ".join(v.image_apart.get(m, []))
        for g in v.frq_graders_all:
            for s in UPSTREAM_SETTINGS:
                r = v.cell(m, s, "frq", grader=g, with_image=True)
                if r:
                    rows.append(
                        {"display": v.display(m), "setting": SETTING_LABELS[s], "grader": g, "cell": _acc(r), "apart": apart}
                    )
    return rows


def _release_notes(v: View, m: str) -> str:
    """An image release's notes on coverage and grading (prose written at ingest)."""
    if m not in v.image_models:
        return ""
    n = v.notes(m)
    return " ".join(str(n[k]) for k in ("coverage", "mcq", "frq_labels") if k in n)


def context(a, audits: list[dict] | None = None, out: Path | None = None) -> dict:
    """Everything the templates show, as plain data (``out``: the page's folder, whose drawn figures it shows)."""
    v = View.of(a)
    audits = audits or []
    top = _top(v)
    order = _answer_order(v)
    listed = v.models + v.partial + [m for g in v.other_protocols for m in g["models"]] + v.self_reported + v.image_models
    commits = sorted(
        {json.loads(v.release_info[m]["source"]).get("commit") or "" for m in v.models + v.partial + v.image_models} - {""}
    )
    return {
        "B": a.B,
        "seed": a.seed,
        "board_cases": v.board_cases,
        "trials_per_case": _trials_per_case(v),
        "headline": _headline(v),
        "models": [_release(v, m) for m in v.models],
        "top_rows": TOP_ROWS,
        # the tables with a column per model (specialty, source dataset): the board's first TOP_ROWS models
        "column_models": [_release(v, m) for m in v.models[:TOP_ROWS]],
        "columns_cut": _cut(min(TOP_ROWS, len(v.models)), len(v.models), "accuracy.csv"),
        "board": [_row(v, m, i) for i, m in enumerate(v.models, 1)],
        "partial": [_row(v, m) for m in v.partial],
        "self_reported": [_row(v, m) for m in v.self_reported],
        "other_protocols": [
            {"reasons": g["reasons"], "rows": [_row(v, m, i) for i, m in enumerate(g["models"], 1)]} for g in v.other_protocols
        ],
        "reference_is_paper": v.reference_is_paper,
        "columns": [c.label for c in v.columns],
        "settings": [{"id": s, "label": SETTING_LABELS[s], "note": SETTING_NOTES[s]} for s in UPSTREAM_SETTINGS],
        "missing": _missing(v),
        "specialty": _specialty(v),
        "by_dataset": _by_dataset(v),
        "mcq_rules": _mcq_rules(v),
        "answer_order": [r for r in order if r["upstream_release"] in top],  # the releases at the top of their boards
        "answer_order_cut": _cut(sum(r["upstream_release"] in top for r in order), len(order), "order_tests.csv"),
        "frq_graders": v.frq_graders_all,
        "frq_by_grader": [
            {
                "display": v.display(m),
                "cells": [_acc(v.cell(m, *LEAD, grader=g)) for g in v.frq_graders_all],
                "self_graded": [g in v.self_graded.get(m, ()) for g in v.frq_graders_all],
            }
            for m in v.models
        ],
        "frq_preference": _frq_preference(),
        "reliability": _grader_reliability(v, audits),
        "tests": _tests(v),
        "tests_cut": _cut(min(TOP_ROWS, len(v.models)), len(v.models), "pvalues.csv"),
        "pairs": _pairs(a),
        "measures": _measures(v),
        "history": _history(v, audits, top),
        "rubric": _rubric(a),
        "claims": _claims(a),
        **_other_tasks(a, v),
        "overlap": _overlap(a),
        "audits": [_audit(x) for x in audits],
        "fold_rows": FOLD_ROWS,
        "releases": [
            {
                **_release(v, m),
                "notes": _release_notes(v, m),
                "partial": m in v.partial,
                "coverage": v.coverage.get(m, 0),
                "self_reported": m in v.self_reported,
                "protocol": describe_protocol(v.protocol.get(m)),
                "apart": m in v.apart,
            }
            for m in listed
            if m in top
        ],
        "releases_cut": _cut(sum(m in top for m in listed), len(listed), "protocols.csv"),
        "image": _image_rows(v),
        "image_whom": "GPT-4V's recorded run (the paper's)" if v.image_reference_is_paper else "the first releases listed",
        "paper_tests": _paper_tests(v, top),
        "human": _human(v),
        "paper_figures": _paper_figures(out),
        "exam_data": any(
            v.cell(m, s, f) for m in v.models for s in ("exam", "multiturn_no_exam", "multiturn_plus_exam") for f in (MCQ, "frq")
        ),
        "commits": [c[:12] for c in commits],
    }


# -- writers -------------------------------------------------------------------------------------


def render(a, out: Path, audits: list[dict] | None = None) -> str:
    """The page's HTML; the audits' figures are copied under ``out/figures/audits/``."""
    ctx = context(a, audits, Path(out))
    _copy_audit_figures(ctx, Path(out))
    return environment(True).get_template("leaderboard.html.j2").render(ctx)


def markdown(a, audits: list[dict] | None = None) -> str:
    """The page's markdown twin."""
    return environment(False).get_template("leaderboard.md.j2").render(context(a, audits))


def write_page(a, out: Path | str, audits: list[dict] | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    page.write_text(render(a, out, audits))
    (out / "leaderboard.md").write_text(markdown(a, audits))
    return page


__all__ = ["write_page", "render", "markdown", "context"]
