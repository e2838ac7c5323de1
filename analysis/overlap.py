"""The overlap between benchmarks on the board: which cases of two registered tasks are the same case.

Made from the registered tasks' test cases (:mod:`craftmd.overlap`), not from any release: ``tables/overlap.csv`` lists
every pair of same cases, ``tables/overlap_pairs.csv`` counts them per pair of tasks, and the page shows the counts with a
link to the list. A task whose cases are not at hand (not in the dataset folders the analysis reads) is named, with why.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from craftmd import CraftMDError

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
    that holds them. The pairs of same cases are kept (:func:`kept_same_cases`): an analysis of the same cases reads
    them back instead of comparing the texts again."""
    from craftmd.overlap import pair_counts, task_cases

    t0 = time.perf_counter()
    found = task_cases([f for f in folders if f is not None])
    rows = kept_same_cases(found)
    return Overlap(
        pl.DataFrame(rows, schema=CASE_COLUMNS),
        pl.DataFrame(pair_counts(found, rows), schema=PAIR_COLUMNS),
        list(found.texts),
        found.missing,
        time.perf_counter() - t0,
    )


def _kept_path(found) -> Path:
    """Where the pairs of these cases are kept: ``$CRAFTMD_CACHE/overlap/<digest>.json``, the digest of the rule's code
    (:mod:`craftmd.overlap`, :mod:`craftmd.text`) and of every task's name and case texts, in the order compared."""
    import craftmd.overlap
    import craftmd.text
    from craftmd.source import cache_dir

    h = hashlib.blake2b(b"overlap v1", digest_size=20)
    for module in (craftmd.overlap, craftmd.text):
        h.update(b"\0" + Path(module.__file__).read_bytes())
    for task, texts in found.texts.items():
        h.update(f"\0task\0{task}\0{len(texts)}".encode())
        for case, text in texts.items():
            h.update(f"\0{case}\0{len(text)}\0".encode() + text.encode())
    return cache_dir() / "overlap" / f"{h.hexdigest()}.json"


def kept_same_cases(found) -> list[dict]:
    """:func:`craftmd.overlap.same_cases` of ``found``, read back from where an earlier analysis of the same cases kept
    it (:func:`_kept_path`; seconds of comparing texts each time otherwise), else computed and kept. A kept file that
    is unreadable or not rows of :data:`CASE_COLUMNS` is computed again; a cache that cannot be written only costs the
    time."""
    from craftmd.atomic import atomic_write_json, read_regular
    from craftmd.overlap import same_cases

    path = _kept_path(found)
    try:
        rows = json.loads(read_regular(path)) if path.is_file() else None
    except (OSError, ValueError, CraftMDError):
        rows = None
    types = {pl.String: str, pl.Float64: float}
    if isinstance(rows, list) and all(
        isinstance(r, dict) and r.keys() == CASE_COLUMNS.keys() and all(type(r[c]) is types[t] for c, t in CASE_COLUMNS.items())
        for r in rows
    ):
        return rows
    rows = same_cases(found)
    with contextlib.suppress(OSError):
        atomic_write_json(path, rows)
    return rows


def page_section(o: Overlap | None) -> dict | None:
    """The page's section: the rule, the counts per pair of tasks, the tasks not compared (None without an overlap)."""
    from craftmd.overlap import SAME_CASE_DOC

    if o is None:
        return None
    return {"rule": SAME_CASE_DOC, "pairs": o.pairs.to_dicts(), "compared": o.compared, "missing": o.missing,
            "total": o.cases.height}  # fmt: skip


__all__ = ["Overlap", "overlap", "kept_same_cases", "page_section", "CASE_COLUMNS", "PAIR_COLUMNS"]
