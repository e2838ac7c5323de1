"""The consultation framework's results: the tables behind the page's consultation section (:func:`consultation_tables`),
the section, its figures and the task's row on the board per task (:data:`ANALYSIS`: what the task brings to an analysis).

A consultation release poses every case in two bounds (the whole vignette; the patient's initial request alone) and
after 20–100 % of the rounds of four conversation kinds; its accuracy cells are CRAFT-MD's (same graders, same case
resampling). Every table is empty when no consultation release was analysed (and then not written).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from craftmd.analysis import runner
from craftmd.analysis.bootstrap import DEFAULT_B, DEFAULT_SEED, Resampler, scale
from craftmd.analysis.history import _Ratios, _round, tertiles
from craftmd.metrics import metric
from craftmd.tasks.base import Analysis, Measure

TASK = "consultation"
#: Its queries (``sql/<name>.sql`` beside this file).
SQL = Path(__file__).parent / "sql"
TABLES = (
    "consult_accuracy",
    "consult_rounds",
    "consult_oracle",
    "consult_gap",
    "consult_complexity",
    "consult_tests",
    "consult_dialogue",
    "consult_f1_rounds",
)
#: ``consult_dialogue``'s measures, in the order of the framework's tables (Table 2's turns, length, coverage; Table 3's
#: diversity), with the page's labels; a measure whose range (:mod:`craftmd.metrics`) is 0 to 1 is a share, shown as a
#: percentage.
DIALOGUE_MEASURES = {
    "doctor_turns": "Turns",
    "doctor_words_per_turn": "Doctor words/turn",
    "patient_words_per_turn": "Patient words/turn",
    "doctor_key_recall": "Doctor recall",
    "doctor_key_precision": "Doctor precision",
    "doctor_key_f1": "Doctor F1",
    "patient_value_recall": "Patient recall",
    "patient_value_precision": "Patient precision",
    "patient_value_f1": "Patient F1",
    "question_similarity_rouge1": "Query sim. R-1",
    "question_similarity_rouge2": "Query sim. R-2",
    "question_similarity_rougeL": "Query sim. R-L",
}
#: The settings the complexity analysis shows.
COMPLEXITY_SETTINGS = ("upper", "lower", "consult_100", "oracle_direct_100")

GAP_COLUMNS = ["model", "format", "grader", "conversation", "share", "n_cases", "accuracy", "upper", "lower", "gap_closed", "ci_low",
               "ci_high"]  # fmt: skip


def gap_table(cases: pl.DataFrame, *, B: int = DEFAULT_B, seed: int = DEFAULT_SEED) -> pl.DataFrame:
    """``(consult − lower) / (upper − lower)`` per cell of ``sql/consult_gap_cases``: the sums over the paired cases of
    each case's accuracy (its correct trials over its trials), and the same ratio of the resampled sums; a resample
    whose gap is empty is left out of the interval; a cell whose bounds do not differ has no value."""
    key = ["release", "grader", "format", "conversation", "share"]
    R = Resampler(B=B, seed=seed)
    cells = []
    for k, g in cases.group_by(key, maintain_order=True):
        trials = np.concatenate([g[c].to_numpy() for c in ("n_trials", "upper_trials", "lower_trials")])
        L = scale(trials)
        c, u, lo = (g[n].to_numpy().astype(np.int64) * (L // g[t].to_numpy().astype(np.int64))
                    for n, t in (("n_correct", "n_trials"), ("upper_correct", "upper_trials"), ("lower_correct", "lower_trials")))  # fmt: skip
        cells.append(
            (k, R.add(c - lo), R.add(u - lo), int((c - lo).sum()), int((u - lo).sum()), c.sum(), u.sum(), lo.sum(), L, g.height)
        )
    if cells:
        R.run()
    rows = []
    for k, hn, hd, num, den, c, u, lo, L, n in cells:
        ratio = None
        ci = (None, None)
        if den != 0:
            ratio = num / den
            d = R.resampled(hd)
            r = np.divide(R.resampled(hn), d, out=np.full(len(d), np.nan), where=d != 0)
            if np.isfinite(r).any():
                ci = tuple(np.nanquantile(r, [0.025, 0.975]))
        rows.append({"model": k[0], "format": k[2], "grader": k[1], "conversation": k[3], "share": k[4], "n_cases": n,
                     "accuracy": _round(c / (n * L)), "upper": _round(u / (n * L)), "lower": _round(lo / (n * L)),
                     "gap_closed": _round(ratio), "ci_low": _round(ci[0]), "ci_high": _round(ci[1])})  # fmt: skip
    schema = {"model": pl.String, "format": pl.String, "grader": pl.String, "conversation": pl.String, "share": pl.Int32,
              "n_cases": pl.Int64, **{c: pl.Float64 for c in GAP_COLUMNS[6:]}}  # fmt: skip
    return pl.DataFrame(rows, schema=schema).sort("model", "format", "grader", "conversation", "share")


def _items(con, dataset_dir) -> pl.DataFrame | None:
    """case_id, position (the cases' natural order), n_items: the dataset's extracted key-value items per case
    (``keyinfo`` rows with status ok); None when the dataset has no keyinfo config."""
    import pyarrow.parquet as pq

    from craftmd.dataset import config_file
    from craftmd.keyinfo import CONFIG

    path = config_file(dataset_dir, CONFIG)
    if not path.exists():
        return None
    t = pl.from_arrow(pq.read_table(path, columns=["case_id", "items", "status"]))
    t = t.filter(pl.col("status") == "ok").select("case_id", pl.col("items").list.len().cast(pl.Int64).alias("n_items"))
    order = pl.from_arrow(con.sql("select case_id, position from sample_order").to_arrow_table())
    return t.join(order, on="case_id").sort("position")


def complexity_table(
    con, dataset_dir, case_groups: pl.DataFrame, *, B: int = DEFAULT_B, seed: int = DEFAULT_SEED
) -> pl.DataFrame:
    """Accuracy per third of the cases by their number of key-value items (cut points from the dataset's cases
    with items: the framework's "three equal parts"), per release, format, grader and :data:`COMPLEXITY_SETTINGS`;
    each case's accuracy resampled over the cases with items (a part's figure is a ratio of resampled sums)."""
    schema = {"model": pl.String, "format": pl.String, "grader": pl.String, "setting": pl.String, "tertile": pl.Int64,
              "items_low": pl.Int64, "items_high": pl.Int64, "n_cases": pl.Int64, "accuracy": pl.Float64, "ci_low": pl.Float64,
              "ci_high": pl.Float64}  # fmt: skip
    items = _items(con, dataset_dir)
    if items is None or items.height == 0:
        return pl.DataFrame(schema=schema)
    counts = items["n_items"].to_numpy()
    tertile, t_range = tertiles(counts)
    index = {p: i for i, p in enumerate(items["position"].to_list())}
    n = items.height
    sel = case_groups.filter(pl.col("group_by") == "all", ~pl.col("with_image"), pl.col("setting").is_in(COMPLEXITY_SETTINGS))
    ratios = _Ratios(B, seed)
    for (rel, grader, setting, fmt), g in sel.group_by("release", "grader", "setting", "format", maintain_order=True):
        at = [index.get(p) for p in g["case_position"].to_list()]
        keep = np.array([i is not None for i in at])
        if not keep.any():
            continue
        pos = np.array([i for i in at if i is not None])
        frac, has = np.zeros(n), np.zeros(n)
        frac[pos] = (g["n_correct"].to_numpy() / g["n_trials"].to_numpy())[keep]
        has[pos] = 1.0
        for t in t_range:
            part = has * (tertile == t)
            ratios.add((rel, fmt, grader, setting, t), frac * part, part, exact=False)
    rows = []
    for (rel, fmt, grader, setting, t), (est, lo, hi, _, n_t) in ratios.results().items():
        rows.append({"model": rel, "format": fmt, "grader": grader, "setting": setting, "tertile": t, "items_low": t_range[t][0],
                     "items_high": t_range[t][1], "n_cases": int(n_t), "accuracy": _round(est), "ci_low": _round(lo),
                     "ci_high": _round(hi)})  # fmt: skip
    order = {s: i for i, s in enumerate(COMPLEXITY_SETTINGS)}
    return (pl.DataFrame(rows, schema=schema).with_columns(pl.col("setting").replace_strict(order, return_dtype=pl.Int64).alias("_o"))
            .sort("model", "format", "grader", "_o", "tertile").drop("_o"))  # fmt: skip


MEASURE_COLUMNS = {
    "model": pl.String,
    "doctor_prompt": pl.String,
    "conversation": pl.String,
    "metric": pl.String,
    "n_cases": pl.Int64,
    "mean": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
}
SHARE_COLUMNS = {
    "model": pl.String,
    "doctor_prompt": pl.String,
    "conversation": pl.String,
    "who": pl.String,
    "share": pl.Int32,
    "n_cases": pl.Int64,
    "f1": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
}


def doctor_prompts(con, releases: list[str]) -> dict[str, str]:
    """Each release's doctor (``short``, ``long`` or ``other``), from its run record's prompt set."""
    from craftmd.tasks import get_task

    labels = dict(get_task("consultation").prompt_labels)
    rows = con.sql("select release, prompt_set from releases").fetchall()
    return {r: labels.get(p, "other") for r, p in rows if r in releases}


def measure_tables(
    con, releases: list[str], *, B: int = DEFAULT_B, seed: int = DEFAULT_SEED
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``consult_dialogue`` and ``consult_f1_rounds`` from the releases' ``keyinfo`` scores (empty without them): per release,
    conversation kind and metric, the mean over cases of each case's mean over its trials, with a case-bootstrap CI (the
    cases that have the metric, resampled over every case with a score)."""
    from craftmd.release import natural_key
    from craftmd.scoring.keyinfo import SHARE_METRICS

    empty = pl.DataFrame(schema=MEASURE_COLUMNS), pl.DataFrame(schema=SHARE_COLUMNS)
    cols = {r[0] for r in con.execute("describe scores").fetchall()}
    if "conversation" not in cols:
        return empty
    wanted = (*DIALOGUE_MEASURES, *SHARE_METRICS)
    listed = ", ".join(f"'{m}'" for m in wanted)
    rel = ", ".join("'" + r.replace("'", "''") + "'" for r in releases)
    sc = pl.from_arrow(con.sql(f"select release, case_id, trial, conversation, metric, value from scores where scorer = 'keyinfo' "
                               f"and status = 'ok' and value is not null and metric in ({listed}) and release in ({rel})").to_arrow_table())  # fmt: skip
    if sc.height == 0:
        return empty
    ids = sorted(sc["case_id"].unique().to_list(), key=natural_key)
    pos = {c: i for i, c in enumerate(ids)}
    per = (sc.group_by("release", "conversation", "metric", "case_id").agg(pl.col("value").mean().alias("v"))
           .with_columns(pl.col("case_id").replace_strict(pos, return_dtype=pl.Int64).alias("pos"))
           .sort("release", "conversation", "metric", "pos"))  # fmt: skip
    ratios = _Ratios(B, seed)
    for (r, conv, met), g in per.group_by("release", "conversation", "metric", maintain_order=True):
        v, has = np.zeros(len(ids)), np.zeros(len(ids))
        v[g["pos"].to_numpy()] = g["v"].to_numpy()
        has[g["pos"].to_numpy()] = 1.0
        ratios.add((r, conv, met), v, has, exact=False)
    doctors = doctor_prompts(con, releases)
    order = {c: i for i, c in enumerate(("consult", "oracle_direct", "oracle_random", "oracle_reverse"))}
    measures, shares = [], []
    for (r, conv, met), (est, lo, hi, _, n) in ratios.results().items():
        base = {"model": r, "doctor_prompt": doctors.get(r, "other"), "conversation": conv, "n_cases": int(n)}
        if met in SHARE_METRICS:
            who, _, p = met.rpartition("_f1_at_")
            shares.append({**base, "who": "doctor" if who == "doctor_key" else "patient", "share": int(p), "f1": _round(est),
                           "ci_low": _round(lo), "ci_high": _round(hi)})  # fmt: skip
        else:
            measures.append({**base, "metric": met, "mean": _round(est), "ci_low": _round(lo), "ci_high": _round(hi)})
    mo = {m: i for i, m in enumerate(DIALOGUE_MEASURES)}
    key = lambda r: (r["model"], order.get(r["conversation"], 9), r["conversation"])  # noqa: E731
    measures.sort(key=lambda r: (*key(r), mo[r["metric"]]))
    shares.sort(key=lambda r: (*key(r), r["who"], r["share"]))
    return (pl.DataFrame(measures, schema=MEASURE_COLUMNS) if measures else empty[0],
            pl.DataFrame(shares, schema=SHARE_COLUMNS) if shares else empty[1])  # fmt: skip


def consultation_tables(
    con,
    dataset_dir,
    accuracy: pl.DataFrame,
    accuracy_ci: pl.DataFrame,
    *,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
) -> dict[str, pl.DataFrame]:
    """The six tables from a prepared connection (:func:`craftmd.analysis.tables.prepared_connection`, its
    ``case_groups`` materialised), the ``accuracy`` query's result and the accuracy with CIs; ``{}`` without a consultation release.

    A consultation release (:mod:`craftmd.tasks.consultation`) poses every case in two bounds (``upper``: the whole
    vignette; ``lower``: the patient's initial request alone) and after 20–100 % of the rounds of four conversation
    kinds (the doctor's ``consult`` and the order oracle's ``oracle_direct`` / ``oracle_random`` / ``oracle_reverse``),
    its accuracy cells bootstrapped as CRAFT-MD's (:func:`craftmd.analysis.stats.bootstrap_tables`):

    * ``consult_accuracy`` — every setting's accuracy with its 95 % case-bootstrap CI (``sql/consult_accuracy.sql``);
    * ``consult_rounds`` — accuracy against the share of rounds, the two bounds beside (``sql/consult_rounds.sql``);
    * ``consult_oracle`` — the three oracle orders per share, and each one's difference from the direct order;
    * ``consult_gap`` — the share of the bound gap a conversation closes, ``(consult − lower) / (upper − lower)``, on
      the cases posed in all three, a ratio of case sums with a CI from the same resampled cases
      (``sql/consult_gap_cases.sql``);
    * ``consult_complexity`` — the cases cut into three equal parts by their number of key-value items (the dataset's
      ``keyinfo`` config), accuracy per part with CIs;
    * ``consult_tests`` — paired tests (bootstrap and McNemar, Holm within each family, :mod:`.stats`) between
      releases in each setting and between a release's settings (``sql/consult_comparisons.sql``);
    * ``consult_dialogue`` and ``consult_f1_rounds`` (:func:`measure_tables`) — the framework's Tables 2 and 3 and its
      Figure 5's F1 curves per release and conversation kind, from the ``keyinfo`` scorer; ``doctor_prompt`` names the
      release's doctor (``short``: ``consult-v1``; ``long``: ``consult-long-v1``)."""
    releases = con.sql(f"select release from releases where task = '{TASK}'").fetchnumpy()["release"].tolist()
    if not releases:
        return {}
    from craftmd.analysis.stats import bootstrap_tables

    con.register("accuracy_ci_arrow", accuracy_ci.to_arrow())
    con.execute("create or replace temp view accuracy_ci as select * from accuracy_ci_arrow")
    runner.materialize(con, "consult_accuracy", SQL)
    out = {name: pl.from_arrow(runner.run(con, name, SQL)) for name in ("consult_accuracy", "consult_rounds", "consult_oracle")}
    out["consult_gap"] = gap_table(pl.from_arrow(runner.run(con, "consult_gap_cases", SQL)), B=B, seed=seed)
    groups = pl.from_arrow(  # the consultation releases' rows only, in the table's (cell) order
        con.sql(
            "select * from case_groups where group_by = 'all' and list_contains(?, release)", params=[releases]
        ).to_arrow_table()
    )
    out["consult_complexity"] = complexity_table(con, dataset_dir, groups, B=B, seed=seed)
    comparisons = pl.from_arrow(runner.run(con, "consult_comparisons", SQL))
    _, tests = bootstrap_tables(
        groups, accuracy.filter(pl.col("model").is_in(releases), pl.col("group_by") == "all"), comparisons, B=B, seed=seed
    )
    out["consult_tests"] = tests.drop("group_by", "group")
    out["consult_dialogue"], out["consult_f1_rounds"] = measure_tables(con, releases, B=B, seed=seed)
    return {name: out[name] for name in TABLES}


def tables(inputs) -> dict[str, pl.DataFrame]:
    """The task's tables from an analysis' inputs (:class:`craftmd.analysis.tables.TaskInputs`)."""
    return consultation_tables(inputs.con, inputs.dataset_dir, inputs.accuracy, inputs.acc, B=inputs.B, seed=inputs.seed)


# -- the page and figures ------------------------------------------------------------------------


def _fmt_graders(v, rel: str) -> list[tuple[str, str]]:
    """(format, grader) the page shows for a release: free response with the board's FRQ grader, the MCQ's paper rule."""
    out = []
    g = v.grader_for(rel, "frq")
    if g:
        out.append(("frq", g))
    out.append(("mcq4", v.grader_for(rel, "mcq4")))
    return out


def _test_rows(t: dict, v) -> list[dict]:
    """The section's tests: each paired bootstrap of a model's own grader (between settings, or between models at the
    consultation) with its McNemar p-value beside it."""
    tests = []
    pv = t["consult_tests"].filter(pl.col("test") == "paired-bootstrap")
    for r in pv.iter_rows(named=True):
        fg = dict(_fmt_graders(v, r["model"] or r["a"]))
        if fg.get(r["format"]) != r["grader"] or (r["family"] == "model" and r["setting"] != "consult_100"):
            continue
        mc = t["consult_tests"].filter(pl.col("test") == "mcnemar", pl.col("family") == r["family"], pl.col("a") == r["a"], pl.col("b") == r["b"],
                                       pl.col("format") == r["format"], pl.col("grader") == r["grader"],
                                       pl.col("model").eq_missing(r["model"]), pl.col("setting").eq_missing(r["setting"]))  # fmt: skip
        who = v.display(r["model"]) if r["family"] == "setting" else r["setting"]
        a_, b_ = (r["a"], r["b"]) if r["family"] == "setting" else (v.display(r["a"]), v.display(r["b"]))
        tests.append({"family": r["family"], "who": who, "a": a_, "b": b_, "format": v.format_label(r["format"]), "grader": r["grader"],
                      "diff": r["diff"], "n": r["n_cases"], "p": r["p_adjusted"], "p_mcnemar": mc["p_adjusted"][0] if mc.height else None})  # fmt: skip
    return tests


def page_section(a, v) -> dict | None:
    """What the page's consultation section shows (None without a consultation release)."""
    t = a.tasks.get(TASK)
    if not t or t["consult_accuracy"].height == 0:
        return None
    acc = {(r["model"], r["format"], r["grader"], r["setting"]): r for r in t["consult_accuracy"].iter_rows(named=True)}
    gap = {
        (r["model"], r["format"], r["grader"], r["conversation"], r["share"]): r for r in t["consult_gap"].iter_rows(named=True)
    }
    releases = sorted(t["consult_accuracy"]["model"].unique().to_list(), key=lambda m: v.display(m))
    cell = lambda r: None if r is None else {k: r[k] for k in ("accuracy", "ci_low", "ci_high", "n_cases")}  # noqa: E731
    rows, oracle, complexity = [], [], []
    cx = t["consult_complexity"]
    tertiles = cx.unique(["tertile", "items_low", "items_high"]).sort("tertile").select("items_low", "items_high").rows()
    for m in releases:
        for fmt, g in _fmt_graders(v, m):
            get = lambda s: cell(acc.get((m, fmt, g, s)))  # noqa: E731
            gp = gap.get((m, fmt, g, "consult", 100))
            rows.append({"display": v.display(m), "format": v.format_label(fmt), "grader": g, "lower": get("lower"), "consult": get("consult_100"),
                         "upper": get("upper"), "gap": None if gp is None or gp["gap_closed"] is None else
                         {"value": gp["gap_closed"], "ci_low": gp["ci_low"], "ci_high": gp["ci_high"], "n_cases": gp["n_cases"]}})  # fmt: skip
            oracle.append({"display": v.display(m), "format": v.format_label(fmt), "grader": g,
                           "cells": [get(f"oracle_{o}_{p}") for o in ("direct", "random", "reverse") for p in (20, 100)]})  # fmt: skip
            sel = cx.filter(
                pl.col("model") == m, pl.col("format") == fmt, pl.col("grader") == g, pl.col("setting") == "consult_100"
            )
            if sel.height:
                by = {r["tertile"]: r for r in sel.iter_rows(named=True)}
                complexity.append(
                    {
                        "display": v.display(m),
                        "format": v.format_label(fmt),
                        "grader": g,
                        "cells": [cell(by.get(i)) for i in range(1, len(tertiles) + 1)],
                    }
                )
    tests = _test_rows(t, v)
    lead = [r for r in rows if r["format"] == v.format_label("frq") and r["consult"]] or [r for r in rows if r["consult"]]
    best = max(lead, key=lambda r: r["consult"]["accuracy"]) if lead else None
    # what failed before the consultation could run: the cases without key-value information (posed in the upper bound only)
    no_keyinfo = [
        {"display": v.display(m), "n": len(v.counts(m).get("no_keyinfo") or []), "cases": v.counts(m).get("cases")}
        for m in releases
        if v.counts(m).get("no_keyinfo")
    ]
    return {"rows": rows, "best": best, "oracle": [r for r in oracle if any(r["cells"])], "oracle_shares": [20, 100],
            "complexity": complexity, "tertiles": tertiles, "tests": tests, "n_tests": t["consult_tests"].height,
            "rounds_figure": bool(rounds_panels(t, v)), "no_keyinfo": no_keyinfo,
            **dialogue_section(t, v, releases)}  # fmt: skip


def dialogue_section(t: dict, v, releases: list[str]) -> dict:
    """The page's Table 2/3 and Figure 5 rows: each release's ``consult`` conversations (its doctor prompt named)."""
    dia, f1 = t.get("consult_dialogue"), t.get("consult_f1_rounds")
    if dia is None or dia.height == 0:
        return {"dialogue": [], "measure_labels": [], "f1_rounds": [], "f1_shares": [], "both_doctors": False}
    cell = lambda r, k: None if r is None else {"value": r[k], "ci_low": r["ci_low"], "ci_high": r["ci_high"]}  # noqa: E731
    by = {(r["model"], r["metric"]): r for r in dia.filter(pl.col("conversation") == "consult").iter_rows(named=True)}
    fr = {(r["model"], r["who"], r["share"]): r for r in f1.filter(pl.col("conversation") == "consult").iter_rows(named=True)}
    shares = sorted({k[2] for k in fr})
    rows, curves = [], []
    for m in releases:
        if not any(k[0] == m for k in by):
            continue
        prompt = next(r["doctor_prompt"] for k, r in by.items() if k[0] == m)
        rows.append(
            {
                "display": v.display(m),
                "doctor_prompt": prompt,
                "cells": [(cell(by.get((m, x)), "mean"), metric(x).high == 1) for x in DIALOGUE_MEASURES],
            }
        )
        for who in ("doctor", "patient"):
            if any((m, who, p) in fr for p in shares):
                curves.append(
                    {
                        "display": v.display(m),
                        "doctor_prompt": prompt,
                        "who": who,
                        "cells": [cell(fr.get((m, who, p)), "f1") for p in shares],
                    }
                )
    prompts = {r["doctor_prompt"] for r in rows}
    return {
        "dialogue": rows,
        "measure_labels": list(DIALOGUE_MEASURES.values()),
        "f1_rounds": curves,
        "f1_shares": shares,
        "both_doctors": {"long", "short"} <= prompts,
    }


def rounds_panels(t, v) -> list[tuple[str, str, str]]:
    """The (release, format, grader) panels of ``consult_rounds.png``: those with rounds (none when every case's key-value
    extraction failed, as then no consultation or oracle ran); the figure and the page's reference to it both read this."""
    if not t or t["consult_rounds"].height == 0:
        return []
    rounds = t["consult_rounds"]
    return [(m, fmt, g) for m in sorted(rounds["model"].unique().to_list(), key=v.display) for fmt, g in _fmt_graders(v, m)
            if rounds.filter(pl.col("model") == m, pl.col("format") == fmt, pl.col("grader") == g).height]  # fmt: skip


def write_figures(a, v, out) -> list:
    """``consult_rounds.png``: per release and format, accuracy against the share of rounds for the doctor's
    consultation and the oracle's three orders, with the upper and lower bounds drawn in (the framework's Figures 5-6)."""
    t = a.tasks.get(TASK)
    panels = rounds_panels(t, v)
    if not panels:
        return []
    from craftmd.analysis.figures import _save, plt

    rounds = t["consult_rounds"]
    cols = min(len(panels), 2)
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
    styles = {
        "consult": ("#DD8452", "-"),
        "oracle_direct": ("#4C72B0", "--"),
        "oracle_random": ("#55A868", "--"),
        "oracle_reverse": ("#8172B3", "--"),
    }
    for ax, (m, fmt, g) in zip(axes.flat, panels):
        sel = rounds.filter(pl.col("model") == m, pl.col("format") == fmt, pl.col("grader") == g).sort("conversation", "share")
        for conv, (color, ls) in styles.items():
            c = sel.filter(pl.col("conversation") == conv)
            if c.height:
                x, y = c["share"].to_numpy(), c["accuracy"].to_numpy()
                ax.plot(x, y, ls, color=color, marker="o", ms=3, label=conv.replace("oracle_", "oracle: "))
                if conv == "consult":
                    ax.fill_between(x, c["ci_low"].to_numpy(), c["ci_high"].to_numpy(), color=color, alpha=0.15, lw=0)
        up, lo = sel["upper"][0], sel["lower"][0]
        if up is not None:
            ax.axhline(up, color="#222", lw=1, ls=":", label="upper bound (whole vignette)")
        if lo is not None:
            ax.axhline(lo, color="#999", lw=1, ls=":", label="lower bound (initial request)")
        ax.set_xlim(15, 105)
        ax.set_ylim(0, 1)
        ax.set_xticks([20, 40, 60, 80, 100])
        ax.set_xlabel("share of the rounds shown to the solver (%)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{v.display(m)} · {v.format_label(fmt)} ({g})", fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, frameon=False, loc="lower right")
    fig.suptitle("Accuracy against the share of consultation rounds (95% case-bootstrap band on the consultation)", fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [_save(fig, out / "consult_rounds.png"), *f1_figure(t, v, out)]


def f1_figure(t: dict, v, out) -> list:
    """``consult_f1_rounds.png``: the doctor's and the patient's F1 against the share of rounds of each release's
    consultation, with 95 % case-bootstrap bands (the framework's Figure 5); none without ``consult_f1_rounds`` rows."""
    f1 = t.get("consult_f1_rounds")
    if f1 is None or f1.filter(pl.col("conversation") == "consult").height == 0:
        return []
    from craftmd.analysis.figures import _save, plt

    f1 = f1.filter(pl.col("conversation") == "consult")
    models = sorted(f1["model"].unique().to_list(), key=v.display)
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, who in zip(axes.flat, ("doctor", "patient")):
        for i, m in enumerate(models):
            c = f1.filter(pl.col("model") == m, pl.col("who") == who).sort("share")
            if c.height:
                x = c["share"].to_numpy()
                label = f"{v.display(m)} ({c['doctor_prompt'][0]} doctor)"
                ax.plot(x, c["f1"].to_numpy(), "-", color=colors[i % len(colors)], marker="o", ms=3, label=label)
                ax.fill_between(
                    x, c["ci_low"].to_numpy(), c["ci_high"].to_numpy(), color=colors[i % len(colors)], alpha=0.15, lw=0
                )
        ax.set_xlim(15, 105)
        ax.set_xticks([20, 40, 60, 80, 100])
        ax.set_xlabel("share of the rounds (%)")
        ax.set_ylabel(f"{who} F1 (ROUGE-1)")
        ax.set_title(f"{who.capitalize()}: against the case's {'keys' if who == 'doctor' else 'values'}", fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7, frameon=False, loc="lower right")
    fig.suptitle("Doctor and patient F1 after each share of the consultation's rounds (95% case-bootstrap bands)", fontsize=10)
    fig.tight_layout()
    return [_save(fig, Path(out) / "consult_f1_rounds.png")]


def board(a, v) -> list[dict]:
    """The task's rows on the board per task: each release's free-response accuracy after the whole consultation
    (``consult_100``) and the share of the bound gap it closes, with the board's FRQ grader."""
    t = a.tasks.get(TASK, {})
    ca, gap = t.get("consult_accuracy"), t.get("consult_gap")
    rows = []
    for rel in sorted(r for r, i in v.release_info.items() if i["task"] == TASK):
        g = v.grader_for(rel, "frq")
        if ca is None or g is None:
            continue
        sel = ca.filter(
            pl.col("model") == rel, pl.col("format") == "frq", pl.col("grader") == g, pl.col("setting") == "consult_100"
        )
        if sel.height:
            r = sel.row(0, named=True)
            rows.append(dict(release=rel, measure="frq_accuracy_consult_100", value=r["accuracy"], ci_low=r["ci_low"],
                             ci_high=r["ci_high"], n_cases=r["n_cases"]))  # fmt: skip
        sel = gap.filter(pl.col("model") == rel, pl.col("format") == "frq", pl.col("grader") == g, pl.col("conversation") == "consult",
                         pl.col("share") == 100)  # fmt: skip
        if sel.height:
            r = sel.row(0, named=True)
            rows.append(dict(release=rel, measure="gap_closed", value=r["gap_closed"], ci_low=r["ci_low"], ci_high=r["ci_high"],
                             n_cases=r["n_cases"]))  # fmt: skip
    return rows


#: What the consultation task brings to an analysis.
ANALYSIS = Analysis(
    tables=tables,
    figures=write_figures,
    section=page_section,
    template="section",
    nav="Consultation",
    anchor="consultation",
    measures=(
        Measure("frq_accuracy_consult_100", "FRQ accuracy after the whole consultation"),
        Measure("gap_closed", "Share of the bound gap closed"),
    ),
    board=board,
    label="Consultation framework",
)

__all__ = ["consultation_tables", "gap_table", "complexity_table", "tables", "board", "ANALYSIS", "TABLES", "TASK"]
