"""A board per task: each model's row in each task it ran, under one name across tasks.

The name is the run record's ``model`` (``provider/model``, or upstream's name), so a model that ran CRAFT-MD, the
consultation protocol and MedPI's encounters has one row in each task's board under the same name. Each task's
headline measures, read from the analysis' tables (never recomputed):

* ``craftmd`` — multi-turn free-response accuracy with the board's FRQ grader (the page's leading figure);
* ``consultation`` — free-response accuracy after the whole consultation (``consult_100``, the same grader), and the
  share of the bound gap it closes;
* ``encounters`` — the overall rubric score (0–100, the mean of a conversation's meta-category scores), when judged,
  and ``reasonable_closure``: the share of the labelled encounters the closure classifier found reasonably closed
  (:func:`.encounters.reasonable_closure`, the encounters section's figure too; failed labels counted apart).

Each row names its release's protocol (``protocol``: :meth:`craftmd.release.Protocol.key`): a task's board ranks
together only the releases of its reference protocol (:func:`.view.task_references`); each other protocol is a table
of its own, headed by why it is not comparable, in words.

Written to ``tables/boards.csv`` only when a release of a task other than CRAFT-MD was analysed.
"""

from __future__ import annotations

import polars as pl

COLUMNS = ["task", "model", "release", "display", "measure", "value", "ci_low", "ci_high", "n_cases", "n_failed", "protocol"]
TASK_ORDER = ("craftmd", "consultation", "encounters")
LABELS = {
    "frq_accuracy_multiturn": "Multi-turn FRQ accuracy",
    "frq_accuracy_consult_100": "FRQ accuracy after the whole consultation",
    "gap_closed": "Share of the bound gap closed",
    "rubric_overall": "Overall rubric score (0-100)",
    "reasonable_closure": "Reasonably closed (of the labelled encounters)",
}


def task_boards(a) -> pl.DataFrame:
    from .encounters import reasonable_closure
    from .view import View

    v = View(a)
    info = {r["release"]: r for r in a.releases.iter_rows(named=True)}
    rows = []

    def add(task, rel, measure, value, lo=None, hi=None, n=None, failed=None):
        rows.append({"task": task, "model": info[rel]["model"], "release": rel, "display": info[rel]["display"], "measure": measure,
                     "value": value, "ci_low": lo, "ci_high": hi, "n_cases": n, "n_failed": failed,
                     "protocol": info[rel]["protocol"]})  # fmt: skip

    for m in v.models + v.partial + [m for g in v.other_protocols for m in g["models"]]:
        c = v.cell(m, "multiturn", "frq")
        if c:
            add("craftmd", m, "frq_accuracy_multiturn", c["accuracy"], c["ci_low"], c["ci_high"], c["n_cases"])
    ca, gap = a.consultation.get("consult_accuracy"), a.consultation.get("consult_gap")
    for rel in sorted(r for r, i in info.items() if i["task"] == "consultation"):
        g = v.grader_for(rel, "frq")
        if ca is None or g is None:
            continue
        sel = ca.filter(
            pl.col("model") == rel, pl.col("format") == "frq", pl.col("grader") == g, pl.col("setting") == "consult_100"
        )
        if sel.height:
            r = sel.row(0, named=True)
            add("consultation", rel, "frq_accuracy_consult_100", r["accuracy"], r["ci_low"], r["ci_high"], r["n_cases"])
        sel = gap.filter(pl.col("model") == rel, pl.col("format") == "frq", pl.col("grader") == g, pl.col("conversation") == "consult",
                         pl.col("share") == 100)  # fmt: skip
        if sel.height:
            r = sel.row(0, named=True)
            add("consultation", rel, "gap_closed", r["gap_closed"], r["ci_low"], r["ci_high"], r["n_cases"])
    if a.encounters:
        overall = a.encounters["rubric_by_encounter"].filter(pl.col("level") == "all")
        for r in overall.iter_rows(named=True):  # the rubric's tables are keyed by release id
            if r["model"] in info and info[r["model"]]["task"] == "encounters":
                add(
                    "encounters",
                    r["model"],
                    "rubric_overall",
                    r["mean"],
                    r["ci_low"],
                    r["ci_high"],
                    r["n_cases"],
                    r["n_failed"],
                )
        for rel, c in reasonable_closure(a.encounters["encounter_endings"]).items():
            add("encounters", rel, "reasonable_closure", c["share"], None, None, c["n"], c["n_failed"])
    order = {t: i for i, t in enumerate(TASK_ORDER)}
    schema = {"task": pl.String, "model": pl.String, "release": pl.String, "display": pl.String, "measure": pl.String,
              "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "n_cases": pl.Int64, "n_failed": pl.Int64,
              "protocol": pl.String}  # fmt: skip
    df = pl.DataFrame(rows, schema=schema)
    return (df.with_columns(pl.col("task").replace_strict(order, default=len(order), return_dtype=pl.Int64).alias("_t"))
            .sort("_t", "model", "release", "measure").drop("_t"))  # fmt: skip


TASK_LABELS = {"craftmd": "CRAFT-MD diagnosis", "consultation": "Consultation framework", "encounters": "MedPI encounters"}


def page_section(a) -> list[dict] | None:
    """One board per task and protocol with its measures as columns and a row per model (best first by the first
    measure): the task's reference protocol first, then each other protocol, headed by why it is not comparable."""
    from .view import View, protocol_groups, task_references

    b = getattr(a, "boards", None)
    if b is None or b.height == 0:
        return None
    refs = task_references(a)
    out = []
    for task in [t for t in TASK_ORDER if t in set(b["task"].to_list())]:
        sel = b.filter(pl.col("task") == task)
        keys = dict(sel.select("release", "protocol").iter_rows())
        label = TASK_LABELS.get(task, task)
        whom = "the paper's runs" if task == "craftmd" and View(a).reference_is_paper else "the ranked runs"
        groups = [(refs.get(task), label)] + [
            (k, f"{label}: not comparable with {whom} ({'; '.join(why)})") for k, why in protocol_groups(keys, refs.get(task))
        ]
        for key, heading in groups:
            board = _board(sel.filter(pl.col("protocol").eq_missing(key)), task, heading)
            if board is not None:
                out.append(board)
    return out


def _board(sel: pl.DataFrame, task: str, label: str) -> dict | None:
    """One table of a task's board: ``sel``'s rows (one protocol's), best first by the first measure."""
    if sel.height == 0:
        return None
    measures = sel["measure"].unique(maintain_order=True).to_list()
    rows = []
    for (model, rel, display), g in sel.group_by("model", "release", "display", maintain_order=True):
        got = {r["measure"]: r for r in g.iter_rows(named=True)}
        rows.append({"model": model, "release": rel, "display": display, "cells": [got.get(m) for m in measures]})
    first = lambda r: (r["cells"][0] or {}).get("value")  # noqa: E731
    rows.sort(key=lambda r: (first(r) is None, -(first(r) or 0), r["model"]))
    return {"task": task, "label": label, "measures": [LABELS.get(m, m) for m in measures],
            "percent": [m != "rubric_overall" for m in measures], "rows": rows}  # fmt: skip


__all__ = ["task_boards", "page_section", "LABELS", "COLUMNS"]
