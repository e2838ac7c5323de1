"""The overlap between benchmarks on the board: which cases of two registered tasks are the same case.

Made from the registered tasks' test cases (:mod:`craftmd.overlap`), not from any release: ``tables/overlap.csv`` lists
every pair of same cases, ``tables/overlap_pairs.csv`` counts them per pair of tasks, and the page shows the counts with a
link to the list. A task whose cases are not at hand (not in the dataset folders the analysis reads) is named, with why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import polars as pl

#: The columns of tables/overlap.csv (one row per pair of same cases) and tables/overlap_pairs.csv (one per pair of tasks).
CASE_COLUMNS = {"task_a": pl.String, "case_a": pl.String, "task_b": pl.String, "case_b": pl.String, "similarity": pl.Float64,
                "share_a": pl.Float64, "share_b": pl.Float64}  # fmt: skip
PAIR_COLUMNS = {"task_a": pl.String, "task_b": pl.String, "cases_a": pl.Int64, "cases_b": pl.Int64, "same_dataset": pl.Boolean,
                "pairs": pl.Int64, "cases_a_shared": pl.Int64, "cases_b_shared": pl.Int64}  # fmt: skip


@dataclass
class Overlap:
    cases: pl.DataFrame  # tables/overlap.csv
    pairs: pl.DataFrame  # tables/overlap_pairs.csv
    compared: list[str]  # the tasks whose cases were compared, in the registry's order
    missing: dict[str, str] = field(default_factory=dict)  # the tasks not compared, with why
    seconds: float = 0.0


def overlap(folders) -> Overlap:
    """The overlap between the registered tasks' test cases, each task's read from the first of ``folders`` (None skipped)
    that holds them."""
    from craftmd.overlap import pair_counts, same_cases, task_cases

    t0 = time.perf_counter()
    found = task_cases([f for f in folders if f is not None])
    rows = same_cases(found)
    return Overlap(
        pl.DataFrame(rows, schema=CASE_COLUMNS),
        pl.DataFrame(pair_counts(found, rows), schema=PAIR_COLUMNS),
        list(found.texts),
        found.missing,
        time.perf_counter() - t0,
    )


def page_section(o: Overlap | None) -> dict | None:
    """The page's section: the rule, the counts per pair of tasks, the tasks not compared (None without an overlap)."""
    from craftmd.overlap import SAME_CASE_DOC

    if o is None:
        return None
    return {"rule": SAME_CASE_DOC, "pairs": o.pairs.to_dicts(), "compared": o.compared, "missing": o.missing,
            "total": o.cases.height}  # fmt: skip


__all__ = ["Overlap", "overlap", "page_section", "CASE_COLUMNS", "PAIR_COLUMNS"]
