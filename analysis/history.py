"""How each doctor takes a history: the tables behind the page's history section (:func:`history_tables`), from the
``history`` scorer's scores of the standard text conversations (:mod:`craftmd.scoring.history`) and the free-response
grades: paired tests between releases, FRQ accuracy by coverage quintile, and the measures by the history's length.
"""

from __future__ import annotations

import json
from functools import partial
from itertools import islice
from pathlib import Path

import numpy as np
import polars as pl

from . import runner
from .bootstrap import DEFAULT_B, DEFAULT_SEED, Memo, Resampler, paired_p

#: The metrics compared between models (conversation-level, standard text conversations).
HEADLINE = (
    "patient_info_recall", "patient_info_precision", "patient_fact_recall", "doctor_turns", "doctor_words_per_turn",
    "patient_words_per_turn", "question_similarity_rouge1", "question_similarity_rougeL",
)  # fmt: skip
#: The measures of the complexity table's tertiles besides multi-turn accuracy (headline metrics: only theirs are held).
COMPLEXITY_MEASURES = ("patient_info_recall", "patient_fact_recall", "doctor_turns")
QUINTILES = 5
TERTILES = 3
DECIMALS = 6

TEST_COLUMNS = ["metric", "model_a", "model_b", "n_cases", "diff", "ci_low", "ci_high", "p", "p_holm"]
COVERAGE_COLUMNS = ["model", "grader", "quintile", "recall_low", "recall_high", "n_conversations", "n_cases", "recall_mean",
                    "multiturn_accuracy", "multiturn_ci_low", "multiturn_ci_high", "vignette_accuracy", "vignette_ci_low",
                    "vignette_ci_high"]  # fmt: skip
COMPLEXITY_COLUMNS = ["model", "measure", "grader", "tertile", "words_low", "words_high", "n_cases", "mean", "ci_low", "ci_high"]


class _Ratios:
    """Ratios of case-vector sums (a subset's values over its count), resampled with shared draws; what ``memo`` holds
    for the same two vectors is read back instead (:class:`.bootstrap.Memo`). The ratios are resampled
    :data:`RATIOS_AT_ONCE` at a time, as they come (each column's sums are exact, whatever else is resampled with it),
    so a board's vectors are never all held; the resampled ratios are not kept."""

    def __init__(self, B: int, seed: int, memo: Memo | None = None):
        self.B, self.seed = B, seed
        self.memo = memo if memo is not None else Memo()
        self.keys: list[tuple] = []  # in the order they were added
        self.out: dict[tuple, tuple] = {}
        self.memo_keys: dict[tuple, bytes] = {}  # key -> the memo key of its vectors
        self.todo: list[tuple] = []  # (key, memo key, num, den, exact, estimate, count, test): not resampled yet

    def add(self, key: tuple, num: np.ndarray, den: np.ndarray, exact: bool) -> None:
        if den.sum() == 0:
            return
        total, test = float(den.sum()), key[0] == "test"
        est = float(num.sum()) / total
        self.keys.append(key)
        mk = self.memo.key(self.B, self.seed, "ratio", bool(exact), test, num, den)
        self.memo_keys[key] = mk
        if (got := self.memo.get(mk)) is not None:
            self.out[key] = (est, got[0], got[1], got[2] if test else None, total)
            return
        self.todo.append((key, mk, num, den, exact, est, total, test))
        if len(self.todo) >= RATIOS_AT_ONCE:
            self._resample()

    def _resample(self) -> None:
        """Resample the ratios not resampled yet, and let go of their vectors."""
        R = Resampler(B=self.B, seed=self.seed)
        seen: dict[tuple[bytes, bool], int] = {}  # one column per distinct vector (subset counts repeat across measures)

        def column(v: np.ndarray, exact: bool) -> int:
            k = (v.tobytes(), exact)
            if k not in seen:
                seen[k] = R.add(v, exact=exact)
            return seen[k]

        handles = [(column(num, exact), column(den, True)) for _, _, num, den, exact, *_ in self.todo]
        if self.todo:
            R.run()
        for (key, mk, _, _, _, est, total, test), (hn, hd) in zip(self.todo, handles):
            den = R.resampled(hd)
            ratio = np.divide(R.resampled(hn), den, out=np.full(len(den), np.nan), where=den > 0)
            lo, hi = np.nanquantile(ratio, [0.025, 0.975])
            self.out[key] = (est, float(lo), float(hi), paired_p(ratio, est) if test else None, total)
            self.memo.put(mk, self.out[key][1:4])
        self.todo = []

    def results(self) -> dict[tuple, tuple[float, float, float, float | None, float]]:
        """key -> (estimate, CI low, CI high, the paired-bootstrap p-value of a test (key ``("test", ...)``; None for the
        others), the subset's count: the sum of its denominator), in the order they were added."""
        self._resample()
        return {key: self.out[key] for key in self.keys}


#: Ratios resampled together by :class:`_Ratios` (their sums held at once: at most twice as many columns of B).
RATIOS_AT_ONCE = 1024


def _round(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), DECIMALS)


def tertiles(values: np.ndarray) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
    """Each value's third (1, 2, 3; cut at the values' 1/3 and 2/3 quantiles, a value on a cut going up) and each
    third's range of values (thirds with no value left out)."""
    edges = np.quantile(values, np.linspace(0, 1, TERTILES + 1)[1:-1])
    tertile = np.searchsorted(edges, values, side="right") + 1
    return tertile, {
        t: (int(values[tertile == t].min()), int(values[tertile == t].max()))
        for t in range(1, TERTILES + 1)
        if (tertile == t).any()
    }


def history_tables(
    con, *, B: int = DEFAULT_B, seed: int = DEFAULT_SEED, memo: Memo | None = None, kept=None
) -> dict[str, pl.DataFrame]:
    """The three tables, from a prepared connection (:func:`craftmd.analysis.tables.prepared_connection`);
    empty tables when no release has history scores.

    * ``history_tests`` — every pair of text releases on each headline history metric (on a board of more than
      :data:`.runner.ALL_PAIRS_UP_TO` releases, each against its neighbours in that metric's ranking and the leader,
      unless ``--all-pairs``): the mean over their common cases of the per-case difference (each case's mean over its
      trials), with a 95 % case-bootstrap CI and a two-sided paired-bootstrap p-value, Holm-adjusted over all pairs
      and metrics of one protocol (``statsmodels``; releases of two protocols are never paired nor in one family).
    * ``history_by_coverage`` — the conversations cut into quintiles of ``patient_info_recall`` (cut points from every
      release's conversations together, so a quintile means the same coverage for every model), and per release, FRQ
      grader and quintile: the share of those conversations whose multi-turn answer was right, beside the share whose
      vignette answer (same case, same trial; the whole vignette shown) was right. Where multi-turn accuracy stays
      below vignette accuracy at high coverage, the doctor heard the information and did not use it; where it climbs
      to it, what was missing was the asking.
    * ``history_by_complexity`` — the text cases cut into tertiles of their history's length (words of the dataset's
      ``history``: what a patient can tell), and per release and tertile: the mean coverage, doctor turns and
      multi-turn FRQ accuracy (per grader) — the framework's complexity analysis.

    Every interval resamples cases (a case's conversations together), with the one resample matrix of
    :mod:`craftmd.analysis.bootstrap` for the dataset's text cases: a statistic over a subset of cases is a ratio of
    two resampled sums (the subset's values, and its count), so subsets and pairs share the draws and the sums stay
    exact (integers; continuous values on the fixed-point grid).

    ``kept`` (:class:`.runner.Kept`): each release's rows of the coverage and complexity tables are kept beside its case
    scores, under its kept files' digest, how many of its trials fall below each coverage cut point, this code's and
    ``B`` and the seed, and read back while those are unchanged (:func:`_kept_rows`): its trials are then not read. A
    new release moves the pooled cut points; a release none of whose conversations changes quintile has its rows read
    back with the new cut points, one whose conversations do is read again (where recall values are dense, as in the
    upstream runs, a move crosses a value of nearly every release). The tests between releases are made every time (a
    new release changes the ranking, and the memo holds their results)."""
    cols = {r[0] for r in con.execute("describe scores").fetchall()}
    empty = {
        "history_tests": pl.DataFrame(schema=dict.fromkeys(TEST_COLUMNS, pl.String)),
        "history_by_coverage": pl.DataFrame(schema=dict.fromkeys(COVERAGE_COLUMNS, pl.String)),
        "history_by_complexity": pl.DataFrame(schema=dict.fromkeys(COMPLEXITY_COLUMNS, pl.String)),
    }
    if not {"conversation", "with_image"} <= cols:
        return empty
    cases = pl.from_arrow(con.sql("select case_id, history_words from cases where not with_image").to_arrow_table())
    if cases.height == 0:
        return empty
    from craftmd.release import natural_key

    ids = sorted(cases["case_id"].to_list(), key=natural_key)
    positions = pl.DataFrame({"case_id": ids, "pos": np.arange(len(ids))})
    vector, has = partial(_vector, len(ids)), partial(_has, len(ids))
    # per release and headline metric: each case's mean over its trials, as a vector over the dataset's text cases, and
    # which cases it has (the case scores read one release at a time; the other metrics' are never held: at 1,000
    # releases, 20 metrics' vectors would be half a gigabyte)
    means: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    scored = False
    for per_case in runner.by_release(con, "history_case_scores"):
        scored = scored or per_case.height > 0
        per_case = per_case.filter(pl.col("metric").is_in(HEADLINE)).join(positions, on="case_id", maintain_order="left")
        for (rel, met), g in per_case.group_by("release", "metric", maintain_order=True):
            means[(rel, met)] = (vector(g["pos"], (g["value_sum"] / g["n_trials"]).to_numpy()), has(g["pos"]))
    if not scored:
        return empty
    ratios = _Ratios(B, seed, memo)
    protocol = _add_tests(con, ratios, means)
    edges, bins, multiturn = _coverage_edges(con, kept), {}, []
    below = _below(con, edges) if kept is not None else {}
    found = _kept_rows(kept, below, ratios.memo, B, seed)  # release -> its coverage and complexity rows, read back
    if kept is None:
        per_release = runner.by_release(con, "history_trials")  # the trials one release at a time
    else:
        per_release = (pl.read_parquet(kept.path("history_trials", rid)) for rid in kept.ids if rid not in found)
    for trials in _together(per_release):
        trials = trials.join(positions, on="case_id", maintain_order="left")
        multiturn += _add_coverage(ratios, trials, edges, bins, vector, has)
    made = {key: value for key, value in means.items() if key[0] not in found}
    t_range = _add_complexity(ratios, cases.join(positions, on="case_id", maintain_order="left"), made, multiturn, vector)
    res = ratios.results()
    coverage, complexity = _coverage_rows(res, bins, edges), _complexity_rows(res, t_range)
    if kept is not None:
        _keep_rows(kept, found, coverage, complexity, ratios.memo_keys, (below, B, seed))
    for rows in found.values():
        coverage += [{**row, **_quintile_range(row["quintile"], edges)} for row in rows["coverage"]]
        complexity += rows["complexity"]
    return {"history_tests": _tests_frame(res, protocol), "history_by_coverage": _coverage_frame(coverage),
            "history_by_complexity": _complexity_frame(complexity)}  # fmt: skip


#: Releases whose trials are read and cut into quintiles together (:func:`_together`), and whose conversations are told
#: apart together (:func:`_coverage_edges`): at 1,000 releases, 8 take the time 32 took (16.5 s for the history
#: tables) and hold a third of their memory (90 MB against 250).
RELEASES_AT_ONCE = 8


def _chunks(items, n: int | None = None):
    """``items`` in lists of ``n`` (default :data:`RELEASES_AT_ONCE`), in order."""
    items = iter(items)
    while chunk := list(islice(items, n or RELEASES_AT_ONCE)):
        yield chunk


def _together(frames, n: int | None = None):
    """``frames`` (one release's rows each, in order), ``n`` at a time (default :data:`RELEASES_AT_ONCE`) as one frame:
    polars groups and cuts many releases' rows in one step in less time than it takes one release's at a time; each
    release's rows keep their order and their groups their own, so every vector is the same."""
    for chunk in _chunks(frames, n):
        yield pl.concat(chunk)


def _below(con, edges: np.ndarray) -> dict[str, tuple[int, ...]]:
    """Release -> how many of its trials' rows have a recall below each cut point of ``edges``: with its trials (which
    its kept files' digest fixes), these say which quintile each of its conversations falls in."""
    if len(edges) == 0:
        return {}
    counts = ", ".join(f"count(*) filter (where recall < ${j + 1})" for j in range(len(edges)))
    found = con.execute(f"select release, {counts} from history_trials group by release", [float(e) for e in edges])
    return {rid: tuple(n) for rid, *n in found.fetchall()}


def _rows_file(kept, rid: str, below: dict[str, tuple[int, ...]], B: int, seed: int) -> str:
    """The name release ``rid``'s coverage and complexity rows are kept under (:func:`_kept_rows`; ``below``:
    :func:`_below`)."""
    return kept.derived("history_rows", rid, ("history.py", "bootstrap.py"), below.get(rid, ()), B, seed, suffix=".json")


def _kept_rows(kept, below: dict[str, tuple[int, ...]], memo: Memo, B: int, seed: int) -> dict[str, dict]:
    """Each release's coverage and complexity rows that ``kept`` holds for it as it is now (:func:`_rows_file`) and whose
    intervals the memo holds (marked used, as a full analysis uses them); a damaged file is left to be made again. A
    coverage row is kept without its quintile's range (:data:`RANGE`: :func:`history_tables` gives it the board's
    cut points)."""
    found: dict[str, dict] = {}
    for rid in kept.ids if kept is not None else ():
        name = _rows_file(kept, rid, below, B, seed)
        rows = _json_rows(kept.out / name) if kept.found(name, Path.is_file) else None  # (checked once, below)
        if rows is not None and all(memo.get(bytes.fromhex(k)) is not None for k in rows["memo"]):
            found[rid] = rows
    return found


def _json_rows(path: Path) -> dict | None:
    """A release's kept history rows at ``path``: a JSON object of the two tables' rows (each with the table's
    columns, but a coverage row without its quintile's :data:`RANGE`, which the board's cut points give) and the memo
    keys of their intervals (hex digests); None for anything else (made again)."""
    try:
        rows = json.loads(path.read_bytes())
        whole = (
            isinstance(rows, dict)
            and all(isinstance(rows.get(k), list) for k in ("coverage", "complexity", "memo"))
            and all(isinstance(r, dict) and r.keys() == set(COVERAGE_COLUMNS) - set(RANGE) for r in rows["coverage"])
            and all(isinstance(r, dict) and r.keys() == set(COMPLEXITY_COLUMNS) for r in rows["complexity"])
            and all(isinstance(k, str) and len(bytes.fromhex(k)) == 16 for k in rows["memo"])
        )
    except (OSError, ValueError, RecursionError):
        return None
    return rows if whole else None


def _keep_rows(kept, found: dict, coverage: list[dict], complexity: list[dict], memo_keys: dict[tuple, bytes], named) -> None:
    """Keep each release's coverage and complexity rows made now (not ``found``), with the memo keys of their
    intervals, written whole (``named``: :func:`_rows_file`'s counts below the cut points, ``B`` and seed)."""
    from craftmd.atomic import atomic_write_json

    mine: dict[str, dict] = {}
    for table, rows in (("coverage", coverage), ("complexity", complexity)):
        for row in rows:  # (a coverage row without its quintile's range: the next board's cut points give it)
            row = {k: v for k, v in row.items() if k not in RANGE}
            mine.setdefault(row["model"], {"coverage": [], "complexity": [], "memo": []})[table].append(row)
    for key, mk in memo_keys.items():
        if key[0] in ("mt", "vg", "cx") and key[1] in mine:
            mine[key[1]]["memo"].append(mk.hex())
    for rid in kept.ids:  # (a release without rows has a file of none: its trials are not read again either)
        if rid not in found:
            rows = mine.get(rid) or {"coverage": [], "complexity": [], "memo": []}
            atomic_write_json(kept.out / _rows_file(kept, rid, *named), rows)


def _vector(n: int, at: pl.Series, values) -> np.ndarray:
    """``values`` at the case positions ``at`` of a vector over the dataset's ``n`` text cases (0 elsewhere)."""
    v = np.zeros(n)
    v[at.to_numpy()] = values
    return v


def _has(n: int, at: pl.Series) -> np.ndarray:
    """Which of the dataset's ``n`` text cases are at the case positions ``at`` (a bool vector: an eighth of the 0-1
    floats the ratios read, :func:`_share`)."""
    v = np.zeros(n, bool)
    v[at.to_numpy()] = True
    return v


def _share(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cases both ``a`` and ``b`` hold, as the 0-1 floats a ratio's denominator is (:class:`_Ratios`)."""
    return np.logical_and(a, b).astype(np.float64)


def _add_tests(con, ratios: _Ratios, means: dict) -> dict[str, str | None]:
    """1. paired tests between releases of one protocol (as sql/tested_pairs pairs models): every pair up to
    ALL_PAIRS_UP_TO releases (or with --all-pairs), else each release against its neighbours in the metric's ranking
    and the leader. Returns each release's protocol (its key; None: unknown)."""
    releases = sorted({r for r, _ in means})
    all_pairs, up_to = con.sql("select all_pairs, all_pairs_up_to from pair_options").fetchall()[0]
    protocol = dict(con.sql("select release, protocol from releases").fetchall())  # null: unknown, paired with none
    for met, group in ((met, g) for met in HEADLINE for g in sorted({protocol.get(r) for r in releases} - {None})):
        have = [r for r in releases if (r, met) in means and protocol.get(r) == group]  # one protocol's releases
        keep = None
        if not all_pairs and len(have) > up_to:
            # (ranked on the fixed-point grid of the float path: equal models tie exactly, and the tie goes to the id)
            ranked = sorted(have, key=lambda r: (-float(np.rint(means[(r, met)][0] * 1e9).sum() / means[(r, met)][1].sum()), r))
            keep = {frozenset(p) for p in zip(ranked, ranked[1:])} | {frozenset((ranked[0], r)) for r in ranked[1:]}
        for i, a in enumerate(have):
            for b in have[i + 1 :]:
                if keep is None or frozenset((a, b)) in keep:
                    (ma, ha), (mb, hb) = means[(a, met)], means[(b, met)]
                    common = _share(ha, hb)
                    ratios.add(("test", met, a, b), (ma - mb) * common, common, exact=False)
    return protocol


def _coverage_edges(con, kept=None) -> np.ndarray:
    """The coverage quintiles' cut points: quantiles of the recall of every release's conversations together (one value
    per release, case and trial; none without trials). With ``kept`` (:class:`.runner.Kept`), the conversations are
    told apart in :data:`RELEASES_AT_ONCE` releases' kept files at a time (a release's are in its own file): one table
    of the board's distinct conversations held 0.6 GB at 1,000 releases."""
    distinct = "select recall, count(*) as n from (select distinct release, case_id, trial, recall from {}) group by recall"
    if kept is None:
        parts = [con.sql(distinct.format("history_trials")).pl()]
    else:
        files = ([str(kept.path("history_trials", rid)) for rid in chunk] for chunk in _chunks(kept.ids))
        parts = [con.sql(distinct.format("read_parquet($1)"), params=[chunk]).pl() for chunk in files]
    # (each recall once, with its count: the same quantiles as the values one by one, in any order)
    found = pl.concat(parts).group_by("recall").agg(pl.col("n").sum()) if parts else pl.DataFrame()
    if found.height == 0:
        return np.array([])
    return np.quantile(np.repeat(found["recall"].to_numpy(), found["n"].to_numpy()), np.linspace(0, 1, QUINTILES + 1)[1:-1])


def _add_coverage(ratios: _Ratios, trials: pl.DataFrame, edges: np.ndarray, bins: dict, vector, has) -> list[tuple]:
    """2. coverage quintiles (pooled cut points ``edges``) x FRQ accuracy, for some releases' ``trials``: each bin's
    counts and mean recall into ``bins``; returned, each grader's multi-turn accuracy per case for the complexity
    tertiles (release, grader, the cases' shares of correct trials, the cases that have trials)."""
    trials = trials.with_columns(
        pl.Series("quintile", np.searchsorted(edges, trials["recall"].to_numpy(), side="right") + 1, pl.Int64)
    )
    per_case = trials.group_by("release", "grader", "quintile", "pos", maintain_order=True).agg(
        pl.len().alias("k"), pl.col("multiturn_correct").fill_null(False).cast(pl.Int64).sum().alias("mt"),
        pl.col("vignette_correct").fill_null(False).cast(pl.Int64).sum().alias("vg"), pl.col("recall").sum().alias("rc"),
    )  # fmt: skip
    for (rel, grader, q), per in per_case.partition_by(
        "release", "grader", "quintile", maintain_order=True, as_dict=True
    ).items():
        den = vector(per["pos"], per["k"].to_numpy())
        ratios.add(("mt", rel, grader, q), vector(per["pos"], per["mt"].to_numpy()), den, exact=True)
        ratios.add(("vg", rel, grader, q), vector(per["pos"], per["vg"].to_numpy()), den, exact=True)
        bins[(rel, grader, q)] = (int(den.sum()), per.height, float(per["rc"].sum() / den.sum()))
    acc = trials.group_by("release", "grader", "pos", maintain_order=True).agg(
        pl.len().alias("k"), pl.col("multiturn_correct").fill_null(False).cast(pl.Int64).sum().alias("mt")
    )
    return [(rel, grader, vector(g["pos"], (g["mt"] / g["k"]).to_numpy()), has(g["pos"]))
            for (rel, grader), g in acc.group_by("release", "grader", maintain_order=True)]  # fmt: skip


def _add_complexity(ratios: _Ratios, cases: pl.DataFrame, means: dict, multiturn: list[tuple], vector) -> dict:
    """3. complexity tertiles of the history's length (the dataset's text cases): tertile -> its words' range
    (``multiturn``: :func:`_add_coverage`'s accuracies per case)."""
    words = vector(cases["pos"], cases["history_words"].fill_null(0).to_numpy())
    tertile, t_range = tertiles(words)
    if cases["history_words"].null_count() == cases.height:  # a dataset without histories has no complexity groups
        t_range = {}
    for (rel, met), (m, has) in means.items():
        if met in COMPLEXITY_MEASURES:
            for t in t_range:
                sel = _share(has, tertile == t)
                ratios.add(("cx", rel, met, None, t), m * sel, sel, exact=False)
    for rel, grader, frac, has in multiturn:
        for t in t_range:
            sel = _share(has, tertile == t)
            ratios.add(("cx", rel, "frq_accuracy_multiturn", grader, t), frac * sel, sel, exact=False)
    return t_range


def _tests_frame(res: dict, protocol: dict[str, str | None]) -> pl.DataFrame:
    """The tests with Holm's adjustment over all pairs and metrics of one protocol (``protocol``: release -> its key;
    a pair's two releases ran one): a family never holds two protocols' tests."""
    tests = []
    for key, (est, lo, hi, p, n_common) in res.items():
        if key[0] != "test":
            continue
        _, met, a, b = key
        tests.append({"metric": met, "model_a": a, "model_b": b, "n_cases": int(n_common), "diff": _round(est),
                      "ci_low": _round(lo), "ci_high": _round(hi), "p": p})  # fmt: skip
    if tests:
        from .stats import holm_of

        families: dict[str | None, list[dict]] = {}
        for t in tests:
            families.setdefault(protocol.get(t["model_a"]), []).append(t)
        groups = list(families.values())
        for group, adj in zip(groups, holm_of([np.array([t["p"] for t in g]) for g in groups])):
            for t, pa_ in zip(group, adj):
                t["p_holm"] = float(pa_)
    return pl.DataFrame(tests, schema={"metric": pl.String, "model_a": pl.String, "model_b": pl.String, "n_cases": pl.Int64,
                                       "diff": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "p": pl.Float64,
                                       "p_holm": pl.Float64}).sort("metric", "model_a", "model_b")  # fmt: skip


def _coverage_rows(res: dict, bins: dict, edges: np.ndarray) -> list[dict]:
    """The coverage table's rows of the releases whose trials were read (``bins``)."""
    cov = []
    for (rel, grader, q), (k, ncases, rmean) in bins.items():
        mt, vg = res.get(("mt", rel, grader, q)), res.get(("vg", rel, grader, q))
        cov.append({"model": rel, "grader": grader, "quintile": q, **_quintile_range(q, edges), "n_conversations": k, "n_cases": ncases, "recall_mean": _round(rmean),
                    "multiturn_accuracy": _round(mt[0]), "multiturn_ci_low": _round(mt[1]), "multiturn_ci_high": _round(mt[2]),
                    "vignette_accuracy": _round(vg[0]), "vignette_ci_low": _round(vg[1]), "vignette_ci_high": _round(vg[2])})  # fmt: skip
    return cov


#: A coverage row's quintile's range of recall: the board's cut points, not the release's (:func:`_quintile_range`).
RANGE = ("recall_low", "recall_high")


def _quintile_range(q: int, edges: np.ndarray) -> dict[str, float | None]:
    """Quintile ``q``'s :data:`RANGE` (its cut points of ``edges``; 0 and 1 at the ends), rounded."""
    low = float(edges[q - 2]) if q > 1 else 0.0
    high = float(edges[q - 1]) if q <= len(edges) else 1.0
    return dict(zip(RANGE, (_round(low), _round(high))))


def _coverage_frame(cov: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(cov, schema={"model": pl.String, "grader": pl.String, "quintile": pl.Int64,
                                     "recall_low": pl.Float64, "recall_high": pl.Float64,
                                     "n_conversations": pl.Int64, "n_cases": pl.Int64, "recall_mean": pl.Float64,
                                     **{c: pl.Float64 for c in COVERAGE_COLUMNS[8:]}}).sort("model", "grader", "quintile")  # fmt: skip


def _complexity_rows(res: dict, t_range: dict) -> list[dict]:
    """The complexity table's rows of the ratios resampled or read back now."""
    cx = []
    for key, (est, lo, hi, _, n_t) in res.items():  # n_t: the tertile's cases that have the measure
        if key[0] != "cx":
            continue
        _, rel, measure, grader, t = key
        cx.append({"model": rel, "measure": measure, "grader": grader, "tertile": t, "words_low": t_range[t][0],
                   "words_high": t_range[t][1], "n_cases": int(n_t), "mean": _round(est), "ci_low": _round(lo), "ci_high": _round(hi)})  # fmt: skip
    return cx


def _complexity_frame(cx: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(cx, schema={"model": pl.String, "measure": pl.String, "grader": pl.String, "tertile": pl.Int64,
                                    "words_low": pl.Int64, "words_high": pl.Int64, "n_cases": pl.Int64,
                                    "mean": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64}
                        ).sort("model", "measure", "grader", "tertile", nulls_last=False)  # fmt: skip


__all__ = ["history_tables", "HEADLINE"]
