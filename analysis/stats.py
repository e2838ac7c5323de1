"""Accuracy with bootstrap CIs and paired tests, from the named queries' results.

SQL does the grouping and counting (``case_groups``, ``accuracy``, ``comparisons``);
this module adds what SQL does not do well: the bootstrap (:mod:`.bootstrap`),
McNemar's test (statsmodels) and the Holm-Bonferroni adjustment (statsmodels).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable
from contextlib import contextmanager
from functools import lru_cache

import numpy as np
import polars as pl

from craftmd import CraftMDError
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests

from .bootstrap import DEFAULT_B, DEFAULT_SEED, Memo, Resampler, paired_p, scale

CELL = ["release", "grader", "setting", "format", "with_image", "group_by", "group"]
#: A model's cell of a results table and its number of cases: the leading columns of the accuracy and test tables.
CELL_COLUMNS = ["model", "setting", "format", "grader", "group_by", "group", "n_cases"]
ACCURACY_COLUMNS = [
    *CELL_COLUMNS,
    "accuracy",
    "ci_low",
    "ci_high",
    "with_image",
    "kind",
]
PVALUE_COLUMNS = [
    "model",
    "format",
    "grader",
    "group_by",
    "group",
    "a",
    "b",
    "diff",
    "p_value",
    "p_adjusted",
    "test",
    "family",
    "setting",
    "with_image",
    "n_cases",
]
#: A Holm family: one kind of comparison in one cell, of one protocol's releases (the comparisons' ``protocol``).
FAMILY = ["family", "protocol", "model", "setting", "format", "grader", "with_image", "group_by", "group", "test"]
DECIMALS = 6
#: McNemar's exact (binomial) test below this many discordant pairs, chi-square with continuity correction above.
MCNEMAR_EXACT_BELOW = 25
#: McNemar runs on these groups (the bootstrap runs on every group): overall, per dataset, single-diagnosis.
MCNEMAR_GROUPS = ("all", "dataset", "single_dx")


@lru_cache(maxsize=None)
def mcnemar_p(n10: int, n01: int) -> float:
    """McNemar's test on the discordant pairs (the only cells the statistic uses): exact (binomial) below
    :data:`MCNEMAR_EXACT_BELOW` discordant pairs, chi-square with continuity correction above."""
    if n10 + n01 == 0:
        return 1.0
    res = mcnemar([[0, n10], [n01, 0]], exact=n10 + n01 < MCNEMAR_EXACT_BELOW, correction=True)
    return float(res.pvalue)


def _cells(case_groups: pl.DataFrame) -> tuple[dict[tuple, tuple[np.ndarray, np.ndarray]], int]:
    """Cell key -> (case positions, integer case scores) and the scale ``L`` (scores = numerators / L)."""
    # sql/case_groups orders its rows by cell: a cell is a run of rows, found where a key column changes (no hash
    # table over the board's rows)
    changed = (
        case_groups.select(pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift()) for c in CELL])).to_series().to_numpy()
    )
    if len(changed):
        changed[0] = True
    starts = np.flatnonzero(changed)
    sizes = np.diff([*starts.tolist(), case_groups.height])
    n_trials = case_groups["n_trials"].to_numpy()
    L = scale(n_trials)
    num = _numerators(n_trials, case_groups["n_correct"].to_numpy(), L)
    return _runs(case_groups[starts].select(CELL).iter_rows(), sizes, case_groups["case_position"].to_numpy(), num), L


def cells_of(con, batch_rows: int = 1 << 20) -> tuple[dict[tuple, tuple[np.ndarray, np.ndarray]], int]:
    """:func:`_cells` of the connection's ``case_groups`` (the cells' keys with their sizes: the rows are in cell order,
    a cell's rows are the next ``n``), its rows read ``batch_rows`` at a time into two integer arrays, so the board's
    rows never stand in memory as text nor as more than those two."""
    quoted = ", ".join(f'"{c}"' for c in CELL)
    found = con.sql(
        f"select {quoted}, count(*) as n, max(case_position) as last from case_groups group by all order by all"
    ).fetchall()
    sizes = np.array([r[-2] for r in found], dtype=np.int64)
    L = scale(con.sql("select distinct n_trials from case_groups").fetchnumpy()["n_trials"])
    total = int(sizes.sum())
    positions = np.empty(total, _num_type(max((r[-1] for r in found), default=0)))
    num = np.empty(total, _num_type(L))
    at = 0
    for batch in con.sql("select case_position, n_trials, n_correct from case_groups").to_arrow_reader(batch_rows):
        p, t, c = (batch.column(i).to_numpy(zero_copy_only=False) for i in range(3))
        if at + len(p) <= total:
            positions[at : at + len(p)], num[at : at + len(p)] = p, _numerators(t, c, L)
        at += len(p)
    if at != total:
        raise CraftMDError("case_groups: its rows do not follow its cells")  # (cannot happen: one table, one order)
    return _runs((r[:-2] for r in found), sizes, positions, num), L


def _num_type(top: int):
    """The narrowest integer type of 16, 32 or 64 bits that holds the integers from ``-top`` to ``top`` (the numerators
    of scale ``L`` are at most ``L`` each, and the differences of two of them as large; case positions): at 1,000
    releases the cells hold 85 million of each, 16 bits each where they fit."""
    return np.int16 if top < 2**15 else np.int32 if top < 2**31 else np.int64


def _numerators(n_trials: np.ndarray, n_correct: np.ndarray, L: int) -> np.ndarray:
    """Each case's score on the scale ``L``: ``n_correct / n_trials * L``, an integer (``L`` is a multiple of every
    trial count)."""
    return (n_correct.astype(np.int64) * (L // n_trials.astype(np.int64))).astype(_num_type(L))


def _runs(keys, sizes: np.ndarray, positions: np.ndarray, num: np.ndarray) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Consecutive runs of ``sizes`` rows, one per key: (positions, numerators), views of the two arrays. The keys share
    their values (one object for each release id, grader, setting ...: a board of 1,000 has 250,000 cells' keys, 100 MB
    with a copy of each name in each)."""
    out, start, same = {}, 0, {}
    for key, size in zip(keys, sizes.tolist()):
        out[tuple(same.setdefault(v, v) for v in key)] = (positions[start : start + size], num[start : start + size])
        start += size
    return out


def bootstrap_tables(
    case_groups: pl.DataFrame,
    accuracy: pl.DataFrame,
    comparisons: pl.DataFrame,
    *,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(accuracy with CIs, p-values)``: see the module doc and :data:`ACCURACY_COLUMNS`, :data:`PVALUE_COLUMNS`."""
    acc, pv, _ = bootstrap_all(_cells(case_groups), accuracy, comparisons, None, B=B, seed=seed)
    return acc, pv


def _paired(cells: dict, ka: tuple, kb: tuple) -> tuple[np.ndarray, bool] | None:
    """The per-case differences of cells ``ka`` and ``kb`` over the cases both have, and whether those are all of
    either's cases in one order (then the resampled sums of a - b are a's minus b's); None when either cell is absent or
    they share no case."""
    if ka not in cells or kb not in cells:
        return None
    (ca, na), (cb, nb) = cells[ka], cells[kb]
    if len(ca) == len(cb) and np.array_equal(ca, cb):
        return na - nb, True
    _, ia, ib = np.intersect1d(ca, cb, assume_unique=True, return_indices=True)  # paired on common cases
    if len(ia) == 0:
        return None
    return na[ia] - nb[ib], False


def bootstrap_all(
    cells: tuple[dict, int],
    accuracy: pl.DataFrame,
    comparisons: pl.DataFrame,
    more: pl.DataFrame | None,
    *,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    memo: Memo | None = None,
    digests: dict[str, bytes] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame | None]:
    """:func:`bootstrap_tables` of the ``cells`` (:func:`cells_of` a prepared connection) and, in the same resampling run, the tests of ``more`` (``sql/more_comparisons``:
    MCQ against FRQ, image against none; :func:`more_tests`), or None when ``more`` is None. Batching them with the
    accuracy cells costs only their columns: every resample matrix is drawn once per group size.

    The work goes one unit at a time (one group, grader, format and image flag; the tests of ``more``, one group and
    model): the resampled sums of its cells are held, turned into intervals and p-values, and dropped, so memory
    follows the unit and never the whole board (the numbers do not depend on it: each column's sums are exact). With
    a ``memo`` (:class:`.bootstrap.Memo`), an interval or p-value it holds for the same case vector is read back, and
    only the rest is resampled. ``digests``: release id -> the digest its kept case scores are filed under
    (:class:`.runner.Kept`). A result is then kept under two keys: its release(s)' digests and its cell(s), and its case
    vector(s) as before (:meth:`.bootstrap.Memo.put`'s ``alias``). The first is looked up first: for a release whose
    kept files did not change nothing is digested or paired again; the second still finds a group's results that a
    change elsewhere (a dataset's) left as they were. The ``cells`` dict is emptied once every unit is resampled."""
    cells, L = cells
    work = _work_units(cells, comparisons, more)
    rows = (comparisons.height, more.height if more is not None else 0)
    ci, tested = _run_units(work, cells, L, B, seed, memo if memo is not None else Memo(), digests or {}, rows)
    del work
    cells.clear()  # (its arrays let go of before the tables are made: a third of a gigabyte at 1,000 releases)
    more_pv = more_tests(more, tested[1], L) if more is not None else None
    with_ci = _accuracy_with_ci(accuracy, ci)
    del ci  # (its keys and intervals let go of before the p-value table is made, the analysis's peak)
    return with_ci, _pvalues(comparisons, tested[0], L), more_pv


def _work_units(cells: dict, comp: pl.DataFrame, more: pl.DataFrame | None) -> dict[tuple, tuple[list, list]]:
    """unit -> (its cells' keys, its tests: (table, row index, cell a, cell b)). A test's cell keys are the cells' own
    key objects where the cell exists (a board's tests are read as rows of the frames, never as one dict a row)."""
    # The units of work: a cell's own unit (its group, grader, format and image flag: every release and setting of
    # them) holds the comparisons between its settings and between its models; the tests of ``more`` cross formats,
    # graders and image flags of one model, so they go by group and model, resampling their sides there again.
    work: dict[tuple, tuple[list, list]] = {}  # unit -> (its cells' keys, its tests: (table, row index, cell a, cell b))
    known = {key: key for key in cells}

    def unit(key: tuple) -> tuple:
        return (key[5], key[6], key[1], key[3], key[4])

    for key in cells:
        work.setdefault(unit(key), ([], []))[0].append(key)
    columns = ["family", "model", "setting", "grader", "format", "with_image", "group_by", "group", "a", "b"]
    for i, (family, model, setting, *rest, a, b) in enumerate(comp.select(columns).iter_rows()):
        grader, fmt, image, group_by, group = rest
        if family == "setting":
            ka, kb = (model, grader, a, fmt, image, group_by, group), (model, grader, b, fmt, image, group_by, group)
        else:
            ka, kb = (a, grader, setting, fmt, image, group_by, group), (b, grader, setting, fmt, image, group_by, group)
        ka, kb = known.get(ka, ka), known.get(kb, kb)
        work.setdefault(unit(ka), ([], []))[1].append((0, i, ka, kb))
    columns = ["model", "setting", "grader_a", "format_a", "image_a", "grader_b", "format_b", "image_b", "group_by", "group"]
    rows = more.select(columns).iter_rows() if more is not None else ()
    for i, (model, setting, grader_a, format_a, image_a, grader_b, format_b, image_b, group_by, group) in enumerate(rows):
        ka = (model, grader_a, setting, format_a, image_a, group_by, group)
        kb = (model, grader_b, setting, format_b, image_b, group_by, group)
        ka, kb = known.get(ka, ka), known.get(kb, kb)
        work.setdefault((group_by, group, "more", model), ([], []))[1].append((1, i, ka, kb))
    return work


class Tested:
    """The paired bootstraps of a table of tests, by row: each tested row's observed sum of differences, its number of
    cases and its p-value, in three arrays (a board of 1,000 tests about 900,000 rows: 25 MB, where a dict of tuples
    held 200)."""

    def __init__(self, rows: int):
        self.done = np.zeros(rows, bool)
        self.obs, self.n, self.p = np.zeros(rows, np.int64), np.zeros(rows, np.int64), np.zeros(rows)

    def put(self, i: int, obs: int, n: int, p: float) -> None:
        self.done[i], self.obs[i], self.n[i], self.p[i] = True, obs, n, p

    def __contains__(self, i: int) -> bool:
        return bool(self.done[i])

    def __getitem__(self, i: int) -> tuple[int, int, float]:
        return int(self.obs[i]), int(self.n[i]), float(self.p[i])


def _run_units(
    work: dict, cells: dict, L: int, B: int, seed: int, memo: Memo, digests: dict[str, bytes], rows: tuple[int, int]
) -> tuple[dict, tuple["Tested", "Tested"]]:
    """Resample unit by unit: each cell's CI (key -> (low, high)) and each test's (observed sum, n, p-value) per table
    (:class:`Tested`, of ``rows`` rows each); what ``memo`` holds is read back, what it lacks is resampled and put in it
    (keyed as :func:`bootstrap_all` says)."""
    ci: dict[tuple, tuple[float, float]] = {}
    tested = (Tested(rows[0]), Tested(rows[1]))  # per table: row index -> (observed sum, n, p-value)
    # each release's digest keys begin alike (the release's kept files): that part digested once a release
    mean_of = {rid: memo.begun(B, seed, "mean of", L, d) for rid, d in digests.items()}
    paired_of = {rid: memo.begun(B, seed, "paired of", d) for rid, d in digests.items()}
    digest_of = {rid: Memo.encoded(d) for rid, d in digests.items()}
    encoded: dict[tuple, bytes] = {}  # a cell key's tail -> its part of a key (every release's cells share the tails)

    def tail(key: tuple) -> bytes:
        if (got := encoded.get(key[1:])) is None:
            got = encoded[key[1:]] = Memo.encoded(key[1:])
        return got

    for u in sorted(work, key=str):  # a group's units together: its resample matrices are drawn once
        keys, tests = work[u]
        R = Resampler(B=B, seed=seed)
        handles: dict[tuple, int] = {}

        def handle(k: tuple) -> int:
            if k not in handles:
                handles[k] = R.add(cells[k][1])
            return handles[k]

        intervals = []  # (cell key, vector key, digest key or None): the unit's own cells whose interval is not in the memo
        for key in keys:
            begun = mean_of.get(key[0])
            dk = None if begun is None else memo.then_encoded(begun, tail(key))
            got = memo.get_via(dk) if dk is not None else None
            mk = None  # the vector key: made only when the digest key finds nothing
            if got is None:
                mk = memo.key(B, seed, "mean", L, cells[key][1])
                if (got := memo.get(mk)) is not None and dk is not None:
                    memo.put(dk, got, alias=mk)
            if got is not None:
                ci[key] = (got[0], got[1])
            else:
                handle(key)
                intervals.append((key, mk, dk))
        # (table, row index, vector key, digest key or None, observed sum, n, handle a, handle b); b None: a is the difference
        pairs = []
        for t, i, ka, kb in tests:
            begun, db = paired_of.get(ka[0]), digest_of.get(kb[0])
            dk = None if begun is None or db is None else memo.then_encoded(begun, tail(ka) + db + tail(kb))
            if dk is not None and (got := memo.get_via(dk)) is not None:  # (p, observed sum, n): nothing paired again
                tested[t].put(i, int(got[1]), int(got[2]), got[0])
                continue
            if (paired := _paired(cells, ka, kb)) is None:
                continue
            d, same = paired
            mk = memo.key(B, seed, "paired", d)
            if (got := memo.get(mk)) is not None:
                tested[t].put(i, int(d.sum()), len(d), got[0])
                if dk is not None:
                    memo.put(dk, (got[0], int(d.sum()), len(d)), alias=mk)
            else:
                hs = (handle(ka), handle(kb)) if same else (R.add(d), None)
                pairs.append((t, i, mk, dk, int(d.sum()), len(d), *hs))
        if not intervals and not pairs:
            continue
        R.run()
        for key, mk, dk in intervals:
            h = handles[key]
            a, b = R.quantiles(h)
            ci[key] = (a / (R.n(h) * L), b / (R.n(h) * L))
            memo.put(mk, ci[key])
            if dk is not None:
                memo.put(dk, ci[key], alias=mk)
        for t, i, mk, dk, obs, n, ha, hb in pairs:
            sums = R.resampled(ha) if hb is None else R.resampled(ha) - R.resampled(hb)
            p = paired_p(sums, obs)
            tested[t].put(i, obs, n, p)
            memo.put(mk, (p,))
            if dk is not None:
                memo.put(dk, (p, obs, n), alias=mk)
    return ci, tested


def _accuracy_with_ci(accuracy: pl.DataFrame, ci: dict) -> pl.DataFrame:
    """The accuracy table with its CIs, rounded and sorted."""
    lo, hi = [], []
    for key in accuracy.select(["model", "grader", "setting", "format", "with_image", "group_by", "group"]).iter_rows():
        a, b = ci[key]
        lo.append(a)
        hi.append(b)
    acc = accuracy.with_columns(
        pl.Series("ci_low", lo, dtype=pl.Float64), pl.Series("ci_high", hi, dtype=pl.Float64)
    ).with_columns(pl.col("accuracy", "ci_low", "ci_high").round(DECIMALS))
    return acc.select(ACCURACY_COLUMNS).sort(["model", "format", "grader", "setting", "with_image", "group_by", "group"])


def _pvalues(comp: pl.DataFrame, tested: Tested, L: int) -> pl.DataFrame:
    """P-values: paired bootstrap and McNemar (after its paired bootstrap, in the groups of :data:`MCNEMAR_GROUPS`), in
    the comparisons' order, Holm within each family (:data:`FAMILY`: never across protocols).

    The table is one gather of the comparisons' rows (a tested row once, or twice where McNemar follows) with its
    numbers beside them, and Holm's families are numbered on the comparisons, not on the table's text: at 1,000
    releases the comparisons hold 900,000 rows, and frames of them made, filtered, joined and sorted in turn held
    1.5 GB more than the table."""
    if "protocol" not in comp.columns:
        raise CraftMDError("comparisons: no protocol column (each test's protocol keeps Holm's families apart)")
    tested_rows = np.flatnonzero(tested.done)
    both = comp["group_by"].is_in(MCNEMAR_GROUPS).to_numpy()[tested_rows]
    src = np.repeat(tested_rows, 1 + both)  # each table row's comparison
    k = np.ones(len(src), bool)  # McNemar's row (after the bootstrap's of the same comparison)
    k[np.cumsum(1 + both) - (1 + both)] = False
    boot = src[~k]
    mc = src[k]
    n10, n01, n_trials = (comp[c].to_numpy().astype(np.int64) for c in ("n10", "n01", "n_trials"))
    n_cases = np.empty(len(src), np.int64)
    n_cases[~k] = tested.n[boot]
    n_cases[k] = comp["n_cases"].to_numpy()[mc]
    diff = np.empty(len(src))
    diff[~k] = _rounded(tested.obs[boot], tested.n[boot] * L)
    discordant = list(zip(n10[mc].tolist(), n01[mc].tolist(), n_trials[mc].tolist()))
    diff[k] = [round((x - y) / t, DECIMALS) if t else 0.0 for x, y, t in discordant]
    p_value = np.empty(len(src))
    p_value[~k] = tested.p[boot]
    p_value[k] = [min(mcnemar_p(x, y), 1.0) for x, y, _ in discordant]
    family = _family_codes(comp, FAMILY[:-1])[src] * 2 + k  # FAMILY's last column: the test
    pv = comp.select(c for c in PVALUE_COLUMNS if c in comp.columns and c != "n_cases")[src]
    return pv.with_columns(
        pl.col(pl.Categorical).cast(pl.String),  # (comparisons read as codes: :func:`coded`)
        pl.Series("n_cases", n_cases),
        pl.Series("diff", diff),
        pl.Series("p_value", p_value),
        pl.Series("p_adjusted", holm_coded(p_value, family)),
        pl.Series("test", ["paired-bootstrap", "mcnemar"], pl.String).gather(k.astype(np.uint32)),  # (no array of text)
    ).select(PVALUE_COLUMNS)


#: Rows :func:`_rounded` turns into Python numbers at a time.
ROUNDED_AT_ONCE = 65_536


def _rounded(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``round(num / den, DECIMALS)`` of each row of two integer vectors, as Python divides and rounds (the quotient
    correctly rounded, then to the nearest decimal: not numpy's scaled rounding), :data:`ROUNDED_AT_ONCE` rows at a
    time (the 900,000 tests of a board of 1,000 as lists of Python numbers held 0.1 GB)."""
    out = np.empty(len(num))
    for i in range(0, len(num), ROUNDED_AT_ONCE):
        part = slice(i, i + ROUNDED_AT_ONCE)
        out[part] = [round(x / y, DECIMALS) for x, y in zip(num[part].tolist(), den[part].tolist())]
    return out


def coded(table) -> pl.DataFrame:
    """A query's rows (an Arrow table) as a polars frame whose text columns are categorical: the comparisons of a board
    of 1,000 repeat a few hundred names in 900,000 rows, 360 MB as text and a fifth of that as codes. The other columns
    are copied: a column taken as it is would hold its batch, the text included, as long as the frame lives."""
    import pyarrow as pa

    text = (pa.types.is_string, pa.types.is_large_string)
    columns = [c.dictionary_encode() if any(t(c.type) for t in text) else c.combine_chunks() for c in table.columns]
    return pl.from_arrow(pa.Table.from_arrays(columns, names=table.column_names))


#: The columns of the MCQ-vs-FRQ and image tests (:func:`more_tests`): side a and side b are cells of one model in one
#: setting (format, grader, image flag each).
MORE_KEY = [
    "family",
    "model",
    "setting",
    "format_a",
    "grader_a",
    "image_a",
    "format_b",
    "grader_b",
    "image_b",
    "group_by",
    "group",
]
MORE_COLUMNS = [*MORE_KEY, "n_cases", "diff", "p_value", "p_adjusted", "test"]


def holm(pv: pl.DataFrame, family: list[str]) -> np.ndarray:
    """Holm-adjusted p-values within each family (rows sharing the ``family`` columns)."""
    return holm_coded(pv["p_value"].to_numpy(), _family_codes(pv, family))


def _family_codes(frame: pl.DataFrame, columns: list[str]) -> np.ndarray:
    """A number for each row, the same where the rows hold the same ``columns`` (nulls equal to nulls)."""
    if frame.height == 0:
        return np.zeros(0, np.int64)
    return frame.select(pl.struct(columns).rank("dense")).to_series().to_numpy().astype(np.int64)


def holm_coded(p_values: np.ndarray, family: np.ndarray) -> np.ndarray:
    """Holm-adjusted ``p_values`` within each family: the rows of one number in ``family`` (:func:`holm_of` of each,
    its p-values in row order)."""
    adjusted = np.empty(len(p_values))
    order = np.argsort(family, kind="stable")
    cuts = np.flatnonzero(np.diff(family[order])) + 1
    runs = np.split(order, cuts) if len(order) else []
    for idx, adj in zip(runs, holm_of([p_values[idx] for idx in runs])):
        adjusted[idx] = adj
    return adjusted


def holm_of(families: list[np.ndarray]) -> list[np.ndarray]:
    """statsmodels' Holm-adjusted p-values of each family of p-values. statsmodels' Holm calls ``gc.collect()`` after
    every family (a hint to free its temporary arrays, which reference counting frees anyway): a full collection of
    the analysis's heap, 0.2-0.5 ms each, a minute for the 135,000 families of a board of 1,000. It is a no-op while
    these run (:func:`_collect_later`)."""
    with _collect_later():
        return [multipletests(p, method="holm")[1] for p in families]


@contextmanager
def _collect_later():
    """``gc.collect`` a no-op inside (this process's collector still runs on its own thresholds), restored after."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect


def more_tests(more: pl.DataFrame, tested: Tested, L: int) -> pl.DataFrame:
    """The paired bootstrap (difference a - b, over the cases both sides have) and McNemar's test (discordant trial
    pairs) of every row of ``sql/more_comparisons`` (``tested``: row index -> the paired bootstrap's observed sum,
    cases and p-value, from :func:`bootstrap_all`); Holm within each family of one model, pair of sides and group,
    across its settings (:data:`MORE_COLUMNS`). ``diff``: the paired bootstrap's difference in accuracy over cases,
    McNemar's (n10 - n01) / paired trials."""
    rows = []
    for i, r in enumerate(more.to_dicts()):
        if i not in tested:
            continue
        obs, n, p_boot = tested[i]
        base = {k: r[k] for k in MORE_KEY}
        rows.append({**base, "n_cases": n, "diff": round(obs / (n * L), DECIMALS), "p_value": p_boot, "test": "paired-bootstrap"})
        n10, n01 = r["n10"], r["n01"]
        trial_diff = round((n10 - n01) / r["n_trials"], DECIMALS) if r["n_trials"] else 0.0
        rows.append(
            {**base, "n_cases": r["n_cases"], "diff": trial_diff, "p_value": min(mcnemar_p(n10, n01), 1.0), "test": "mcnemar"}
        )
    schema = {k: (pl.Boolean if k.startswith("image_") else pl.String) for k in MORE_KEY}
    schema.update({"n_cases": pl.Int64, "diff": pl.Float64, "p_value": pl.Float64, "test": pl.String})
    pv = pl.DataFrame(rows, schema=schema)
    family = [k for k in MORE_KEY if k != "setting"] + ["test"]
    return pv.with_columns(pl.Series("p_adjusted", holm(pv, family))).select(MORE_COLUMNS)  # in the query's order


METRIC_COLUMNS = [
    "model",
    "scorer",
    "metric",
    "variant",
    "kind",
    "higher_is_better",
    "n_cases",
    "n_failed",
    "mean",
    "ci_low",
    "ci_high",
]
FLOAT_DECIMALS = 10


#: The metric table's columns and types, and the memo key of each row's interval (:func:`_metric_rows`; kept beside a
#: release's case scores, :func:`_kept_metric_rows`).
_METRIC_SCHEMA = {"model": pl.String, "scorer": pl.String, "metric": pl.String, "variant": pl.String, "kind": pl.String,
                  "higher_is_better": pl.Boolean, "n_cases": pl.Int64, "n_failed": pl.Int64, "mean": pl.Float64,
                  "ci_low": pl.Float64, "ci_high": pl.Float64, "memo_key": pl.Binary}  # fmt: skip


def metric_table(
    case_scores: pl.DataFrame | Iterable[pl.DataFrame] | None,
    *,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    memo: Memo | None = None,
    kept=None,
) -> pl.DataFrame:
    """Every metric other than ``correct`` (``sql/metric_case_scores``; its rows, or an iterable of one frame per
    release: :func:`.runner.by_release`): per release, scorer, metric and variant, the mean over cases of each case's
    mean over trials, with a 95 % case-bootstrap CI.

    Binary and ordinal metrics take the exact-integer path (a case's value sum scaled by the
    least common multiple of the cell's trial counts); continuous metrics the float path. A
    case whose every score failed has no value: it is counted in ``n_failed``, not in the mean. ``memo``: as in
    :func:`bootstrap_all`. ``kept`` (:class:`.runner.Kept`, instead of ``case_scores``): each release's case scores
    are read from its kept file, and its rows are kept beside it and read back while neither its kept files nor this
    code changed (:func:`_kept_metric_rows`)."""
    memo = memo if memo is not None else Memo()
    key = ["release", "scorer", "metric", "variant"]
    if kept is not None:
        per_release = (_kept_metric_rows(kept, rid, key, B, seed, memo) for rid in kept.ids)
    else:
        parts = case_scores.partition_by("release", maintain_order=True) if isinstance(case_scores, pl.DataFrame) else case_scores
        per_release = (_metric_rows(of_release, key, B, seed, memo) for of_release in parts)
    rows = [row for made in per_release for row in made]  # one release at a time: memory follows it, not the board
    return pl.DataFrame(rows, schema=_METRIC_SCHEMA).select(METRIC_COLUMNS).sort("model", "scorer", "metric", "variant")


def _kept_metric_rows(kept, rid: str, key: list[str], B: int, seed: int, memo: Memo) -> list[dict]:
    """Release ``rid``'s metric rows: read back from the file kept under its kept files' digest, this code's, ``B`` and
    the seed, where the metrics they name are declared as they were (kind, direction) and the memo holds each row's
    interval (it is marked used, as a full analysis uses it); else made from its kept case scores, and kept."""
    from craftmd.metrics import metric

    name = kept.derived("metric_rows", rid, ("stats.py", "bootstrap.py"), B, seed)
    if kept.found(name):
        try:
            got = pl.read_parquet(kept.out / name)
            rows = got.to_dicts() if got.schema == pl.Schema(_METRIC_SCHEMA) else None
        except (pl.exceptions.PolarsError, OSError):
            rows = None
        if rows is not None and all(
            (metric(r["metric"]).kind, metric(r["metric"]).higher_is_better) == (r["kind"], r["higher_is_better"])
            and (r["memo_key"] is None or memo.get(r["memo_key"]) is not None)
            for r in rows
        ):
            return rows
    rows = _metric_rows(pl.read_parquet(kept.path("metric_case_scores", rid)), key, B, seed, memo)
    part = kept.out / f"{name}.part"
    pl.DataFrame(rows, schema=_METRIC_SCHEMA).write_parquet(part)
    os.replace(part, kept.out / name)
    return rows


def _metric_rows(of_release: pl.DataFrame, key: list[str], B: int, seed: int, memo: Memo) -> list[dict]:
    """:func:`metric_table`'s rows of one release's cells (those where nothing could be scored with their failures),
    each with the memo key of its interval."""
    from craftmd.metrics import metric

    failed = of_release.group_by(key, maintain_order=True).agg(pl.col("n_failed").sum())
    n_failed = {tuple(r[:4]): r[4] for r in failed.iter_rows()}
    rows = []
    R = Resampler(B=B, seed=seed)
    mine = []
    for k, g in of_release.filter(pl.col("n_trials") > 0).group_by(key, maintain_order=True):
        m = metric(k[2])
        n_trials = g["n_trials"].to_numpy()
        sums = g["value_sum"].to_numpy()
        exact = m.kind != "continuous" and np.all(np.mod(sums, 1) == 0)
        if exact:
            L = scale(n_trials)
            v = (np.rint(sums).astype(np.int64) * (L // n_trials)).astype(np.int64)
        else:
            L, v = 1, sums / n_trials
        mk = memo.key(B, seed, "sum", bool(exact), v)
        got = memo.get(mk)
        mine.append((k, m, mk, got if got is not None else R.add(v, exact=exact), float(v.sum()), L, len(v)))
    R.run()  # (nothing to do when the memo held every cell)
    for k, m, mk, h, total, L, n in mine:
        if isinstance(h, tuple):
            lo, hi = h[0], h[1]
        else:
            lo, hi = R.quantiles(h)
            memo.put(mk, (lo, hi))
        d = DECIMALS if L > 1 or m.kind != "continuous" else FLOAT_DECIMALS
        rows.append({
            "model": k[0], "scorer": k[1], "metric": k[2], "variant": k[3], "kind": m.kind,
            "higher_is_better": m.higher_is_better, "n_cases": n, "n_failed": int(n_failed.get(tuple(k), 0)),
            "mean": round(total / (n * L), d), "ci_low": round(lo / (n * L), d), "ci_high": round(hi / (n * L), d),
            "memo_key": mk,
        })  # fmt: skip
    done = {tuple(c[0]) for c in mine}  # the cells with a value
    for k, nf in n_failed.items():  # cells where nothing could be scored still show their failures
        if k not in done:
            m = metric(k[2])
            rows.append({"model": k[0], "scorer": k[1], "metric": k[2], "variant": k[3], "kind": m.kind,
                         "higher_is_better": m.higher_is_better, "n_cases": 0, "n_failed": int(nf),
                         "mean": None, "ci_low": None, "ci_high": None, "memo_key": None})  # fmt: skip
    return rows


__all__ = [
    "bootstrap_tables",
    "cells_of",
    "bootstrap_all",
    "coded",
    "more_tests",
    "mcnemar_p",
    "holm",
    "metric_table",
    "MORE_COLUMNS",
    "ACCURACY_COLUMNS",
    "PVALUE_COLUMNS",
    "METRIC_COLUMNS",
]
