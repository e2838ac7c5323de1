"""What the AgentClinic task brings to an analysis (:data:`ANALYSIS`): its tables, its page section and its row on the
board per task, read from every release of the task, scored or not, over their own tables
(:func:`craftmd.analysis.runner.connect_tables`; ``sql/`` beside this file).

* ``agentclinic_measures`` — per release and measure, the mean over cases with a 95 % case-bootstrap CI: diagnostic
  accuracy by the moderator and by the package's offline grader beside it, their agreement (the share of conversations
  both scored on which they agree; Cohen's kappa beside it), the tests requested per case, the doctor's messages used,
  and the share of conversations that ran out of budget. A conversation whose call failed is counted (``n_failed``),
  never measured; a score that could not be made likewise.
* ``agentclinic_bias_tests`` — each release run with a doctor or patient bias against the release of the same doctor
  and protocol without one: the moderator's accuracy of each over the cases both scored, their difference (paired by
  case) with a bootstrap CI and p-value, Holm-adjusted within each unbiased release's family of tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from craftmd.tasks.base import Analysis, Measure

TASK = "agentclinic"
SQL = Path(__file__).parent / "sql"
MODERATOR, OFFLINE = "agentclinic-moderator", "agentclinic-offline"
#: measure -> (case-level numerator column, denominator column, what a case needs to count: its denominator > 0)
MEASURES = {
    "moderator_accuracy": ("moderator_correct", "moderator_n"),
    "offline_accuracy": ("offline_correct", "offline_n"),
    "agreement": ("both_agree", "both_n"),
    "tests_per_case": ("tests_requested", "n_ok"),
    "questions_used": ("questions_used", "n_ok"),
    "out_of_budget": ("out_of_budget", "n_ok"),
}
MEASURE_COLUMNS = ["model", "case_set", "budget", "doctor_bias", "patient_bias", "measure", "n_cases", "n_failed", "value",
                   "ci_low", "ci_high"]  # fmt: skip
BIAS_COLUMNS = ["model", "baseline", "role", "bias", "n_cases", "accuracy", "baseline_accuracy", "diff", "ci_low", "ci_high",
                "p_value", "p_adjusted"]  # fmt: skip
EMPTY_SCORES = (
    "create view osce_scores as select null::varchar as release, null::varchar as case_id, null::smallint as trial, "
    "null::varchar as scorer, null::varchar as metric, null::double as value, null::varchar as status where false"
)


def _options(release) -> dict:
    return (release.manifest.notes or {}).get("options") or {}


def case_scores(releases) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``sql/agentclinic_case_scores`` and ``sql/agentclinic_verdicts`` (the conversations both scorers scored) over
    ``releases`` (those of this task)."""
    from craftmd.analysis import runner

    con = runner.connect_tables(releases, {"osce": "osce", "osce_scores": "scores"})
    if not con.execute("select 1 from duckdb_views() where view_name = 'osce_scores'").fetchall():
        con.execute(EMPTY_SCORES)  # no release scored yet: its measures of the protocol alone
    runner.materialize(con, "agentclinic_verdicts", SQL)  # computed once: agentclinic_case_scores reads it too
    cases = pl.from_arrow(runner.run(con, "agentclinic_case_scores", SQL))
    verdicts = pl.from_arrow(con.sql("select * from agentclinic_verdicts order by release, case_id, trial").to_arrow_table())
    both = pl.col("moderator").is_not_null() & pl.col("offline").is_not_null()  # the conversations both scored
    return cases.with_columns((pl.col("n_trials") - pl.col("n_failed")).alias("n_ok")), verdicts.filter(both)


def _bootstrap(vectors: list[np.ndarray], B: int, seed: int) -> list[tuple[float, float, np.ndarray]]:
    """Per vector of case values: its mean, and its 95 % percentile interval, from one resampling of the cases each (the
    float path of :class:`craftmd.analysis.bootstrap.Resampler`: the same bytes anywhere); and the resampled sums."""
    from craftmd.analysis.bootstrap import Resampler

    R = Resampler(B=B, seed=seed)
    handles = [R.add(v, exact=False) for v in vectors]
    R.run()
    out = []
    for v, h in zip(vectors, handles):
        lo, hi = R.quantiles(h)
        out.append((lo / len(v), hi / len(v), R.resampled(h)))
    return out


def measures(releases, cases: pl.DataFrame, B: int, seed: int) -> pl.DataFrame:
    """``agentclinic_measures``: per release and measure (:data:`MEASURES`), the mean over cases of each case's value
    (its numerator over its denominator; a case whose denominator is 0 is not counted), with a case-bootstrap CI."""
    rows, vectors = [], []
    for r in sorted(releases, key=lambda r: r.id):
        mine, o = cases.filter(pl.col("release") == r.id), _options(r)
        for name, (num, den) in MEASURES.items():
            used = mine.filter(pl.col(den) > 0)
            failed = int(mine["n_failed"].sum()) + (int((mine["n_ok"] - mine[den]).sum()) if den != "n_ok" else 0)
            row = {"model": r.id, "case_set": o.get("case_set"), "budget": o.get("budget"), "doctor_bias": o.get("doctor_bias"),
                   "patient_bias": o.get("patient_bias"), "measure": name, "n_cases": used.height, "n_failed": failed,
                   "value": None, "ci_low": None, "ci_high": None}  # fmt: skip
            if used.height:
                vectors.append((len(rows), (used[num] / used[den]).to_numpy().astype(np.float64)))
            rows.append(row)
    for (i, v), (lo, hi, _) in zip(vectors, _bootstrap([v for _, v in vectors], B, seed)):
        rows[i].update(value=round(float(np.rint(v * 1e9).sum() / 1e9 / len(v)), 9), ci_low=round(lo, 9), ci_high=round(hi, 9))
    schema = {"model": pl.String, "case_set": pl.String, "budget": pl.Int64, "doctor_bias": pl.String, "patient_bias": pl.String,
              "measure": pl.String, "n_cases": pl.Int64, "n_failed": pl.Int64, "value": pl.Float64, "ci_low": pl.Float64,
              "ci_high": pl.Float64}  # fmt: skip
    return pl.DataFrame(rows, schema=schema).select(MEASURE_COLUMNS)


def kappas(verdicts: pl.DataFrame) -> dict[str, float | None]:
    """release -> Cohen's kappa of the moderator's and the offline grader's verdicts on the conversations both scored."""
    from craftmd.agreement import kappa

    return {
        rel: kappa(g["moderator"].to_numpy() == 1, g["offline"].to_numpy() == 1)
        for (rel,), g in verdicts.group_by("release", maintain_order=True)
    }


def _unbiased_protocol(release) -> str | None:
    """The release's protocol with its biases left out (None: unknown): what a biased run and its baseline share."""
    from craftmd.release import protocol_of

    p = protocol_of(release.manifest)
    if p is None:
        return None
    opts = {k: v for k, v in p.options.items() if k not in ("doctor_bias", "patient_bias")}
    return p.model_copy(update={"options": opts}).key()


def bias_tests(releases, cases: pl.DataFrame, B: int, seed: int) -> pl.DataFrame:
    """``agentclinic_bias_tests``: each biased release against the unbiased release of the same doctor and protocol (the
    first by release id where there are several), paired over the cases both have a moderator's score for."""
    from craftmd.analysis.bootstrap import paired_p
    from craftmd.analysis.stats import holm_of

    def acc(rel: str) -> dict[str, float]:
        g = cases.filter(pl.col("release") == rel, pl.col("moderator_n") > 0)
        return dict(zip(g["case_id"], (g["moderator_correct"] / g["moderator_n"]).to_list()))

    by_id = sorted(releases, key=lambda r: r.id)
    tests = []
    for r in by_id:
        o = _options(r)
        biased = [(role, o.get(f"{role}_bias")) for role in ("doctor", "patient") if o.get(f"{role}_bias") not in (None, "none")]
        key = _unbiased_protocol(r)
        if not biased or key is None:
            continue
        base = next((b for b in by_id if b.manifest.model == r.manifest.model and _unbiased_protocol(b) == key
                     and _options(b).get("doctor_bias") == "none" and _options(b).get("patient_bias") == "none"), None)  # fmt: skip
        if base is None:
            continue
        a, b = acc(r.id), acc(base.id)
        shared = sorted(set(a) & set(b))
        if not shared:
            continue
        diff = np.array([a[c] - b[c] for c in shared], dtype=np.float64)
        role, bias = biased[0] if len(biased) == 1 else ("both", "+".join(x for _, x in biased))
        tests.append({"model": r.id, "baseline": base.id, "role": role, "bias": bias, "n_cases": len(shared),
                      "accuracy": float(np.mean([a[c] for c in shared])), "baseline_accuracy": float(np.mean([b[c] for c in shared])),
                      "_diff": diff})  # fmt: skip
    if tests:
        for t, (lo, hi, sums) in zip(tests, _bootstrap([t["_diff"] for t in tests], B, seed)):
            observed = float(np.rint(t["_diff"] * 1e9).sum() / 1e9)
            t.update(diff=round(observed / t["n_cases"], 9), ci_low=round(lo, 9), ci_high=round(hi, 9),
                     p_value=paired_p(sums, observed) if observed else 1.0)  # fmt: skip
        families: dict[str, list[int]] = {}
        for i, t in enumerate(tests):
            families.setdefault(t["baseline"], []).append(i)
        for idx, adj in zip(
            families.values(), holm_of([np.array([tests[i]["p_value"] for i in idx]) for idx in families.values()])
        ):
            for i, p in zip(idx, adj):
                tests[i]["p_adjusted"] = float(p)
    schema = {"model": pl.String, "baseline": pl.String, "role": pl.String, "bias": pl.String, "n_cases": pl.Int64,
              "accuracy": pl.Float64, "baseline_accuracy": pl.Float64, "diff": pl.Float64, "ci_low": pl.Float64,
              "ci_high": pl.Float64, "p_value": pl.Float64, "p_adjusted": pl.Float64}  # fmt: skip
    rows = [{k: t.get(k) for k in BIAS_COLUMNS} for t in tests]
    return pl.DataFrame(rows, schema=schema).select(BIAS_COLUMNS)


def agentclinic_tables(releases, B: int, seed: int) -> dict[str, pl.DataFrame]:
    """The task's tables over the ``agentclinic`` releases among ``releases``; ``{}`` when there is none."""
    mine = [r for r in releases if r.manifest.task == TASK]
    if not mine:
        return {}
    cases, verdicts = case_scores(mine)
    table = measures(mine, cases, B, seed)
    k = kappas(verdicts)
    table = table.with_columns(
        pl.col("model").replace_strict(k, default=None, return_dtype=pl.Float64).alias("kappa")
    ).with_columns(pl.when(pl.col("measure") == "agreement").then(pl.col("kappa")).otherwise(None).alias("kappa"))
    return {"agentclinic_measures": table, "agentclinic_bias_tests": bias_tests(mine, cases, B, seed)}


def tables(inputs) -> dict[str, pl.DataFrame]:
    """The task's tables from an analysis' inputs (:class:`craftmd.analysis.tables.TaskInputs`)."""
    return agentclinic_tables(inputs.releases, inputs.B, inputs.seed)


def page_section(a, v) -> dict | None:
    """What the page's AgentClinic section shows (None without an AgentClinic release)."""
    t = a.tasks.get(TASK)
    if not t:
        return None
    m = t["agentclinic_measures"]
    rows = []
    for rel in sorted(set(m["model"].to_list()), key=v.display):
        mine = {r["measure"]: r for r in m.filter(pl.col("model") == rel).iter_rows(named=True)}
        first = next(iter(mine.values()))
        rows.append({"release": rel, "display": v.display(rel), "case_set": first["case_set"], "budget": first["budget"],
                     "doctor_bias": first["doctor_bias"], "patient_bias": first["patient_bias"],
                     "cells": [mine.get(name) for name in MEASURES], "kappa": mine["agreement"]["kappa"]})  # fmt: skip
    tests = [dict(r, display=v.display(r["model"]), baseline_display=v.display(r["baseline"]))
             for r in t["agentclinic_bias_tests"].iter_rows(named=True)]  # fmt: skip
    labels = {x.name: (x.label, x.percent) for x in ANALYSIS.measures}
    return {"rows": rows, "measures": [labels[n][0] for n in MEASURES], "percent": [labels[n][1] for n in MEASURES],
            "tests": tests}  # fmt: skip


def board(a, v) -> list[dict]:
    """The task's rows on the board per task: each release's measures (:data:`MEASURES`) with their CIs."""
    t = a.tasks.get(TASK)
    if not t:
        return []
    return [dict(release=r["model"], measure=r["measure"], value=r["value"], ci_low=r["ci_low"], ci_high=r["ci_high"],
                 n_cases=r["n_cases"], n_failed=r["n_failed"]) for r in t["agentclinic_measures"].iter_rows(named=True)]  # fmt: skip


#: What the AgentClinic task brings to an analysis.
ANALYSIS = Analysis(
    unscored=True,
    tables=tables,
    section=page_section,
    template="section",
    nav="AgentClinic",
    anchor="agentclinic",
    measures=(
        Measure("moderator_accuracy", "Accuracy (moderator)"),
        Measure("offline_accuracy", "Accuracy (offline grader)"),
        Measure("agreement", "Moderator and offline grader agree"),
        Measure("tests_per_case", "Tests requested per case", percent=False),
        Measure("questions_used", "Messages used", percent=False),
        Measure("out_of_budget", "Ran out of budget"),
    ),
    board=board,
    label="AgentClinic OSCE (this package's protocol and prompts: not comparable with AgentClinic's published numbers)",
)

__all__ = ["ANALYSIS", "agentclinic_tables", "measures", "bias_tests", "case_scores", "MEASURES", "TASK"]
