"""A board per task: each model's row in each task it ran, under one name across tasks.

The name is the run record's ``model`` (``provider/model``, or upstream's name), so a model that ran several tasks has
one row in each task's board under the same name. Each task declares its headline measures and reads them from the
analysis' tables, never recomputed (:attr:`craftmd.tasks.Analysis.measures` and ``board``, in the task's folder).

Each row names its release's protocol (``protocol``: :meth:`craftmd.release.Protocol.key`): a task's board ranks
together only the releases of its reference protocol (:func:`.view.task_references`); each other protocol is a table
of its own, headed by why it is not comparable, in words.

Written to ``tables/boards.csv`` only when a release of a task that is not the main board's was analysed.
"""

from __future__ import annotations

import polars as pl

from craftmd import CraftMDError
from craftmd.tasks import in_order

COLUMNS = ["task", "model", "release", "display", "measure", "value", "ci_low", "ci_high", "n_cases", "n_failed", "protocol"]


def task_boards(a) -> pl.DataFrame:
    """Every task's rows (:attr:`craftmd.tasks.Analysis.board`), the tasks in the registry's order."""
    from .view import View

    v = View.of(a)
    info = {r["release"]: r for r in a.releases.iter_rows(named=True)}
    rows = []
    for task in in_order(info[r]["task"] for r in info):
        declared = {m.name for m in task.analysis.measures}
        for row in task.analysis.board(a, v) if task.analysis.board is not None else ():
            rel = row["release"]
            if row["measure"] not in declared:  # a column is declared once, in the task's Analysis.measures
                raise CraftMDError(f"task {task.name!r}: its board gives the measure {row['measure']!r}, which its "
                                   f"Analysis.measures does not declare ({', '.join(sorted(declared)) or 'none'})")  # fmt: skip
            rows.append({"task": task.name, "model": info[rel]["model"], "release": rel, "display": info[rel]["display"],
                         "measure": row["measure"], "value": row["value"], "ci_low": row.get("ci_low"), "ci_high": row.get("ci_high"),
                         "n_cases": row.get("n_cases"), "n_failed": row.get("n_failed"), "protocol": info[rel]["protocol"]})  # fmt: skip
    order = {t.name: i for i, t in enumerate(in_order(info[r]["task"] for r in info))}
    schema = {"task": pl.String, "model": pl.String, "release": pl.String, "display": pl.String, "measure": pl.String,
              "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "n_cases": pl.Int64, "n_failed": pl.Int64,
              "protocol": pl.String}  # fmt: skip
    df = pl.DataFrame(rows, schema=schema)
    return (df.with_columns(pl.col("task").replace_strict(order, default=len(order), return_dtype=pl.Int64).alias("_t"))
            .sort("_t", "model", "release", "measure").drop("_t"))  # fmt: skip


def page_section(a) -> list[dict] | None:
    """One board per task and protocol with its measures as columns and a row per model (best first by the first
    measure): the task's reference protocol first, then each other protocol, headed by why it is not comparable."""
    from .view import View, protocol_groups, task_references

    b = getattr(a, "boards", None)
    if b is None or b.height == 0:
        return None
    refs = task_references(a)
    out = []
    for task in in_order(b["task"].to_list()):
        sel = b.filter(pl.col("task") == task.name)
        keys = dict(sel.select("release", "protocol").iter_rows())
        label = task.analysis.label or task.name
        whom = "the paper's runs" if task.analysis.main and View.of(a).reference_is_paper else "the ranked runs"
        groups = [(refs.get(task.name), label)] + [
            (k, f"{label}: not comparable with {whom} ({'; '.join(why)})")
            for k, why in protocol_groups(keys, refs.get(task.name))
        ]
        for key, heading in groups:
            board = _board(sel.filter(pl.col("protocol").eq_missing(key)), task, heading)
            if board is not None:
                out.append(board)
    return out


def _board(sel: pl.DataFrame, task, label: str) -> dict | None:
    """One table of a task's board: ``sel``'s rows (one protocol's), a row per release; its columns the task's declared
    measures (:attr:`craftmd.tasks.Analysis.measures`) that have a value here, in their order; best first by the first."""
    if sel.height == 0:
        return None
    present = set(sel["measure"].to_list())
    measures = [m for m in task.analysis.measures if m.name in present]
    rows = []
    for (rel,), g in sel.group_by("release", maintain_order=True):  # keyed by release id; its names are labels
        got = {r["measure"]: r for r in g.iter_rows(named=True)}
        first = g.row(0, named=True)
        rows.append(
            {"model": first["model"], "release": rel, "display": first["display"], "cells": [got.get(m.name) for m in measures]}
        )
    lead = lambda r: (r["cells"][0] or {}).get("value")  # noqa: E731
    rows.sort(key=lambda r: (lead(r) is None, -(lead(r) or 0), r["model"], r["release"]))
    return {"task": task.name, "label": label, "measures": [m.label for m in measures], "percent": [m.percent for m in measures],
            "rows": rows}  # fmt: skip


__all__ = ["task_boards", "page_section", "COLUMNS"]
