"""A thin runner for the named SQL files in ``analysis/sql``.

:func:`connect` opens an in-memory DuckDB with the releases and the dataset as views; :func:`run` executes ``sql/<name>.sql`` and returns an arrow table; :func:`materialize`
keeps a query's result as a table of that name, for later queries to read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from importlib import resources
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from craftmd import CraftMDError
from craftmd.dataset import config_file
from craftmd.release import CLAIM_PREFIX, MAX_TRIALS, Release, natural_key, read_release

from .board import Board, protocol_key

SQL_DIR = Path(str(resources.files("craftmd.analysis") / "sql"))
#: Families of at most this many models test every pair of them (the six upstream releases keep every pair); larger
#: ones test each model against its neighbours in the ranking and against the leader (``sql/comparisons``).
ALL_PAIRS_UP_TO = 8
#: DuckDB's memory for one connection: past it, a materialised table spills to a private temporary folder, removed with
#: the connection. The tables that grow with the board (trial grades, case scores and groups) are made a few releases at
#: a time (:func:`keep`) and read from their kept files, so the board's size no longer sets what a query holds.
MEMORY_LIMIT = "1GB"
#: DuckDB's allocator hands its freed memory back to the system after a task that held more than this (its default,
#: 128 MiB, keeps up to that much of every query's memory after it, for each of its threads), with its background
#: threads returning the rest: at 1,000 releases that is half a gigabyte the analysis would hold while it resamples.
ALLOCATOR_FLUSH = "16MB"
#: The release tables DuckDB reads from disk itself (:func:`_union`).
FROM_DISK = ("conversations", "scores")


def query_names(folder: Path | None = None) -> list[str]:
    """The queries' names (of the analysis, or of a task's ``folder``); ``_macros.sql`` is not one (it defines the table
    macros every connection has)."""
    return sorted(p.stem for p in (folder or SQL_DIR).glob("*.sql") if not p.stem.startswith("_"))


def sql_text(name: str, folder: Path | None = None) -> str:
    """The text of query ``name``: ``sql/<name>.sql`` of the analysis, or of a task's ``folder`` of SQL files."""
    path = (folder or SQL_DIR) / f"{name}.sql"
    if name.startswith("_") or not path.exists():
        raise CraftMDError(f"no analysis query named {name!r}; known: {', '.join(query_names(folder))}")
    return path.read_text()


def _lit(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _union(
    con: duckdb.DuckDBPyConnection, releases: list[Release], table: str, columns: list[tuple[str, str]] | None = None
) -> str | None:
    """Every release's ``table`` with a ``release`` column: the answers (and a task's own small tables) as the release
    has already read them (its file read once in the command: :meth:`craftmd.release.Release.table`), registered with
    ``con``; the conversations and the scores (the bulk of a release, their text in columns most queries never read)
    read from disk by DuckDB, only the columns a query needs, so that a board's memory stays bounded. ``columns``
    (name, type), for a table read from disk: exactly those, in that order, null where a release's file lacks one (a
    part of a board then has the whole board's columns: :func:`keep`)."""
    parts = []
    for i, r in enumerate(releases):
        if not r.has(table):
            continue
        if table in FROM_DISK:
            path = r.path / f"{table}.parquet"
            cols = "*"
            if columns is not None:
                has = set(pq.read_schema(path).names)
                cols = ", ".join(f'"{c}"' if c in has else f'null::{t} as "{c}"' for c, t in columns if c != "release")
            parts.append(f"select {_lit(Path(r.id))} as release, {cols} from read_parquet({_lit(path)})")
            continue
        con.register(f"{table}__{i}", r.table(table))
        parts.append(f"select {_lit(Path(r.id))} as release, * from {table}__{i}")
    return " union all by name ".join(parts) if parts else None


def _answers_view(con: duckdb.DuckDBPyConnection, releases: list[Release]) -> None:
    """The ``answers`` view: these releases' answers (:func:`_union`); none: no rows, in the answers' columns."""
    from craftmd.release import ANSWERS_SCHEMA

    body = _union(con, releases, "answers")
    if body is None:
        con.register("answers__none", ANSWERS_SCHEMA.empty_table().add_column(0, "release", pa.array([], pa.string())))
        body = "select * from answers__none"
    con.execute(f"create or replace view answers as {body}")


def _open() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB held to :data:`MEMORY_LIMIT`, spilling into a temporary folder of its own, its allocator
    giving memory back as :data:`ALLOCATOR_FLUSH` says."""
    con = duckdb.connect(":memory:")
    spill = tempfile.mkdtemp(prefix="craftmd-duckdb-")
    weakref.finalize(con, shutil.rmtree, spill, True)
    con.execute(f"set temp_directory = {_lit(Path(spill))}")
    con.execute(f"set memory_limit = '{MEMORY_LIMIT}'")
    con.execute(f"set allocator_flush_threshold = '{ALLOCATOR_FLUSH}'")
    con.execute("set allocator_background_threads = true")
    return con


def let_go(con: duckdb.DuckDBPyConnection) -> None:
    """Give back what DuckDB's worker threads kept of their tasks' memory: they keep it until they end, whatever
    :data:`ALLOCATOR_FLUSH` says (0.3 GB after a board of 200's per-release queries), so they are ended and started
    again (``threads`` set to 1 and back). Called after a step of large queries, before the analysis holds arrays of
    its own."""
    n = int(con.sql("select current_setting('threads')").fetchall()[0][0])
    con.execute("set threads = 1")
    con.execute(f"set threads = {n}")


def connect(
    releases: list[Release] | Path | str,
    dataset_dir: Path | str,
    threads: int | None = None,
    all_pairs: bool = False,
    answers: list[Release] | None = None,
    scores_columns: list[tuple[str, str]] | None = None,
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the releases and the dataset registered as views. ``all_pairs``: the comparisons test
    every pair of models, whatever the board's size (else every pair only up to :data:`ALL_PAIRS_UP_TO` models).
    ``answers``: the releases whose answers the ``answers`` view holds (default: every one). ``scores_columns``: the
    ``scores`` view's columns (name, type; default: those of the releases' files, by name), for a connection over a
    part of a board (:func:`keep`).

    :func:`connect` opens an in-memory DuckDB and registers the inputs as views, by name:

    * ``releases``: one row per release (``release``, ``kind``, ``model``, ``display``, ``task``, ``prompt_set``,
      ``protocol``: :func:`protocol_key`, null when unknown);
    * ``answers``, ``conversations``, ``scores``: every release's parquet, with a ``release`` column
      (``scores`` unions the releases' variant keys by name, and leaves out claims: scorer ``claimed:<name>``);
      ``grades`` (``sql/grades.sql``): the
      ``correct`` scores of answers, one row per answer and grader, the shape the accuracy queries read;
      ``score_rows``: every score with its variant keys folded into one text column ``variant``;
    * ``cases``: the built dataset's case metadata (``case_id``, ``with_image``, ``source``,
      ``specialty``, ``single_dx``): the ``all`` config, plus ``nejm_image`` (``with_image`` true);
    * ``setting_order``: the settings the releases' tasks test against each other
      (:attr:`craftmd.tasks.Task.paired_settings`), in their order, the tasks by name;
    * ``pair_options``: which pairs of models ``sql/comparisons`` tests (``all_pairs``, ``all_pairs_up_to``:
      :data:`ALL_PAIRS_UP_TO`; see :func:`connect`);
    * ``sample_order``: every sample id of the dataset with its position in natural order
      (``case_9`` before ``case_10``); ids are opaque, this is the only order they have;
    * the table macros of ``sql/_macros.sql`` (McNemar's counts per case and per pair).
    """
    if not isinstance(releases, list):
        releases = list(Board.read(releases))
    if not releases:
        raise CraftMDError("no releases to analyse")
    con = _open()
    if threads:
        con.execute(f"set threads = {int(threads)}")
    _releases_view(con, releases)
    tasks = {r.manifest.task: r.task for r in releases}
    paired = list(dict.fromkeys(s for name in sorted(tasks) for s in tasks[name].paired_settings))
    order = pa.table({"setting": pa.array(paired, pa.string()), "position": pa.array(range(len(paired)), pa.int64())})
    con.register("setting_order_arrow", order)
    con.execute("create view setting_order as select * from setting_order_arrow")
    con.execute(f"create view pair_options as select {bool(all_pairs)} as all_pairs, {int(ALL_PAIRS_UP_TO)} as all_pairs_up_to")
    _answers_view(con, releases if answers is None else answers)
    for table in ("scores", "conversations"):
        body = _union(con, releases, table, scores_columns if table == "scores" else None)
        if body is None and table == "scores":
            raise CraftMDError("no release has scores.parquet; score the releases first (craftmd score)")
        claim = f"starts_with(scorer, '{CLAIM_PREFIX}')"  # a claim (an ingested log's word) is no score
        if body is not None and table == "scores" and con.sql(f"select 1 from ({body}) where {claim} limit 1").fetchall():
            body = (
                f"select * from ({body}) where not {claim}"  # (only then: the views of a board without claims stay as they were)
            )
        if body is not None:
            con.execute(f"create view {table} as {body}")
    con.execute((SQL_DIR / "_macros.sql").read_text())
    con.execute(f"create view grades as {sql_text('grades')}")
    con.execute(f"create view score_rows as {_score_rows_sql(con)}")
    con.execute(f"create view cases as {_cases_sql(dataset_dir)}")
    ids = sorted(set(con.sql("select distinct case_id from cases").fetchnumpy()["case_id"].tolist()), key=natural_key)
    con.register("sample_order_arrow", pa.table({"case_id": ids, "position": pa.array(range(len(ids)), pa.int32())}))
    con.execute("create view sample_order as select * from sample_order_arrow")
    return con


def _releases_view(con, releases: list[Release]) -> None:
    rel = pa.table(
        {
            "release": [r.id for r in releases],
            "kind": [r.manifest.kind for r in releases],
            "model": [r.manifest.model for r in releases],
            "display": [r.display for r in releases],
            "task": [r.manifest.task for r in releases],
            "prompt_set": [(r.manifest.prompt_set or {}).get("name") for r in releases],
            "protocol": [protocol_key(r) for r in releases],
        }
    )
    con.register("releases_arrow", rel)
    con.execute("create view releases as select * from releases_arrow")


def _score_rows_sql(con) -> str:
    """Every score with its variant keys folded into one text column (``setting=multiturn, format=frq``)."""
    from craftmd.release import SCORE_COLUMNS

    cols = [r[0] for r in con.execute("describe scores").fetchall()]
    keys = [c for c in cols if c not in SCORE_COLUMNS.names and c != "release"]
    parts = [f'case when "{k}" is not null then \'{k}=\' || "{k}"::varchar end' for k in keys]
    variant = f"concat_ws(', ', {', '.join(parts)})" if parts else "''"
    return f"select release, case_id, trial, {variant} as variant, scorer, metric, value, status from scores"


def _cases_sql(dataset_dir: Path | str) -> str:
    text = config_file(dataset_dir, "all")
    if not text.exists():
        raise CraftMDError(f"{dataset_dir}: no config 'all' (expected {text}); run `craftmd build` first")
    import pyarrow.parquet as pq

    has_history = "history" in pq.read_schema(text).names  # a dataset without it has no complexity groups
    words = "len(regexp_extract_all(coalesce(history, ''), '\\S+'))::integer" if has_history else "null::integer"
    parts = [
        "select case_id, false as with_image, source, specialty, single_dx::boolean as single_dx, "
        f"{words} as history_words "
        f"from read_parquet({_lit(text)})"
    ]
    nejm = config_file(dataset_dir, "nejm_image")
    if nejm.exists():
        parts.append(
            "select case_id, true as with_image, source, specialty::varchar as specialty, null::boolean as single_dx, "
            "null::integer as history_words "
            f"from read_parquet({_lit(nejm)})"
        )
    return " union all ".join(parts)


def connect_tables(releases: list[Release], tables: dict[str, str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB over some releases' own tables, without a dataset: ``releases`` (as in
    :func:`connect`) and, for each ``view: table`` of ``tables``, a view of every release's
    ``table.parquet`` with a ``release`` column (a view over none, when no release has it, is left out).
    The patient-led encounters' queries read their releases this way (their cases are not CRAFT-MD's)."""
    con = _open()
    _releases_view(con, releases)
    for view, table in tables.items():
        body = _union(con, releases, table)
        if body is not None:
            con.execute(f"create view {view} as {body}")
    return con


def run(con: duckdb.DuckDBPyConnection, name: str, folder: Path | None = None) -> pa.Table:
    """Run ``sql/<name>.sql`` (of a task's ``folder`` of SQL files, when given) and return its result (a
    :data:`PER_RELEASE` query that :func:`keep` made: its view, in the order the query gives)."""
    text = sql_text(name, folder)
    made = "select 1 from duckdb_views() where view_name = $1"
    if name in PER_RELEASE and con.execute(made, [name]).fetchall():
        text = f"select * from {name} order by {text.rsplit(chr(10) + 'order by ', 1)[1]}"
    try:
        return con.sql(text).to_arrow_table()
    except duckdb.Error as exc:
        raise CraftMDError(f"analysis query {name}.sql failed: {exc}") from None


def by_release(con: duckdb.DuckDBPyConnection, name: str, batch_rows: int = 262_144):
    """Table or view ``name`` of :func:`keep` (ordered by ``release`` first) as one polars frame per release, read in
    batches, so that only one release's rows (and a batch) are held at a time, however large the board."""
    import polars as pl

    if name not in PER_RELEASE:
        raise CraftMDError(f"by_release reads the per-release queries ({', '.join(PER_RELEASE)}), not {name!r}")
    try:
        reader = con.sql(f"select * from {name}").to_arrow_reader(batch_rows)
    except duckdb.Error as exc:
        raise CraftMDError(f"analysis query {name}.sql failed: {exc}") from None
    held: list[pl.DataFrame] = []  # the current release's rows so far
    for batch in reader:
        for part in pl.from_arrow(batch).partition_by("release", maintain_order=True):
            if held and held[0]["release"][0] != part["release"][0]:
                yield pl.concat(held)
                held = []
            held.append(part)
    if held:
        yield pl.concat(held)


def materialize(con: duckdb.DuckDBPyConnection, name: str, folder: Path | None = None) -> None:
    """Keep ``sql/<name>.sql``'s result (of a task's ``folder`` of SQL files, when given) as table ``name`` for the
    queries that read it."""
    try:
        con.execute(f"create or replace temp table {name} as {sql_text(name, folder)}")
    except duckdb.Error as exc:
        raise CraftMDError(f"analysis query {name}.sql failed: {exc}") from None


#: The queries whose rows for one release read only that release and the dataset, with the column that names the
#: release, in the order they are made (each may read those before it): trial grades to case scores and groups, the
#: metrics' and the history's case scores, the paired tests within one model (between its settings, formats, with and
#: without the image) and the MCQ rules' gap. :func:`keep` makes each a table or view of its name, kept per release
#: when the analysis keeps them (:class:`Kept`); :func:`run` reads it in its query's order.
PER_RELEASE = {
    "answer_status": "model",
    "case_scores": "release",
    "history_trials": "release",
    "case_groups": "release",
    "metric_case_scores": "release",
    "history_case_scores": "release",
    "setting_comparisons": "model",
    "more_comparisons": "model",
    "mcq_rule_gap": "model",
}
#: Of those, the ones that read score columns a board may not have (only the history scorer's scores have them): made
#: only when the scores have every one (analysis.history reads them only then).
_NEEDS = {"history_trials": ("conversation", "with_image"), "history_case_scores": ("conversation", "with_image")}

#: Pairs of models whose counts one query computes (:func:`model_comparisons`).
PAIRS_AT_ONCE = 16


def model_comparisons(con: duckdb.DuckDBPyConnection, kept: Kept) -> None:
    """``model_comparisons`` (``sql/model_comparisons.sql``) for the pairs of ``sql/tested_pairs.sql``, after
    :func:`keep`. A pair's rows are kept too, in one file (:attr:`Kept.PAIRS`), keyed by a digest of its
    two releases' (:meth:`Kept.names`) and the settings, formats, graders and image flags it is tested in: an analysis
    computes only the pairs whose key the earlier one did not keep (a new release's, and those the new ranking tests
    in other families) and reads back the others."""
    materialize(con, "tested_pairs")
    import polars as pl

    family = ["grader", "setting", "format", "with_image"]
    tested = pl.from_arrow(con.sql("select * from tested_pairs").to_arrow_table())
    keys = {}
    for (a, b), rows in tested.group_by("a", "b", maintain_order=True):
        h = hashlib.blake2b(kept.digests[a] + kept.digests[b], digest_size=16)
        h.update(repr(sorted(rows.select(family).iter_rows())).encode())
        keys[(a, b)] = h.digest()
    pair_keys = pl.DataFrame(
        {"a": [k[0] for k in keys], "b": [k[1] for k in keys], "pair_key": list(keys.values())},
        schema={"a": pl.String, "b": pl.String, "pair_key": pl.Binary},
    )
    old = kept.read_pairs(set(keys.values()))
    done = set(old["pair_key"].to_list()) if old is not None else set()
    missing = pair_keys.filter(~pl.col("pair_key").is_in(list(done)))
    new = _count_pairs(con, tested.join(missing, on=["a", "b"], how="semi", maintain_order="left"), pair_keys, kept)
    if old is not None and old.schema != new.schema:  # kept in another shape: every pair counted again
        old, done, new = None, set(), _count_pairs(con, tested, pair_keys, kept)
    new = new if old is None else pl.concat([old, new])
    order = ["a", "b", *family, "group_by", "group"]
    rows = new.sort(order)
    kept.counts["pairs_read_back"] += len(done)
    kept.counts["pairs_computed"] += len(keys) - len(done)
    kept.write_pairs(rows)
    del tested, old, new, rows  # (read from the kept file: the frames are not held while the rest is analysed)
    pairs = _lit(kept.out / kept.PAIRS)
    con.execute(f"create or replace temp view model_comparisons as select * exclude (pair_key) from read_parquet({pairs})")


def _count_pairs(con: duckdb.DuckDBPyConnection, tested, pair_keys, kept: Kept):
    """``sql/model_comparisons.sql``'s rows for the pairs of ``tested`` (rows of ``sql/tested_pairs.sql``), a few
    pairs at a time (memory follows them), each row with its pair's key (``pair_keys``). Each few pairs read the case
    scores of their own releases alone (``kept``'s files): the time follows the pairs, not the pairs times the board."""
    import polars as pl

    pairs = tested.select("a", "b").unique(maintain_order=True)
    made = []
    try:
        for start in range(0, max(pairs.height, 1), PAIRS_AT_ONCE):
            few = pairs.slice(start, PAIRS_AT_ONCE)
            chunk = tested.join(few, on=["a", "b"], how="semi", maintain_order="left")
            ids = sorted(set(few["a"].to_list()) | set(few["b"].to_list()), key=str.encode) or kept.ids  # (none: no rows)
            _view(con, "case_scores", [kept.path("case_scores", r) for r in ids])
            con.register("pairs_to_test_arrow", chunk.to_arrow())
            # a table, not the registered frame: DuckDB knows its size and joins the few pairs to the case scores first
            con.execute("create or replace temp table pairs_to_test as select * from pairs_to_test_arrow")
            con.unregister("pairs_to_test_arrow")
            made.append(pl.from_arrow(run(con, "model_comparisons")))
    finally:  # the board's case scores again
        _view(con, "case_scores", [kept.path("case_scores", r) for r in kept.ids])
    return pl.concat(made).join(pair_keys, on=["a", "b"], how="left", maintain_order="left")


def _check_trials(con: duckdb.DuckDBPyConnection) -> None:
    """A trial numbered outside 0..MAX_TRIALS-1 (the case scores' bit masks hold that many) is refused in one line."""
    bad = con.sql(
        f"select release, min(trial), max(trial) from trial_grades group by release "
        f"having min(trial) < 0 or max(trial) >= {MAX_TRIALS} order by release"
    ).fetchall()
    if bad:  # written by hand: every craftmd writer keeps trials to 0..MAX_TRIALS-1 (craftmd.release.check_trials)
        r, lo, hi = bad[0]
        raise CraftMDError(
            f"release {r}: trial {lo if lo < 0 else hi} is out of range: trials are numbered 0..{MAX_TRIALS - 1}; "
            "remove it from the releases folder"
        )


class Kept:
    """The :data:`PER_RELEASE` queries' rows, one parquet file per query and release, so that an analysis of a board
    that gained a release runs them for that release alone and reads every other release's back.

    A file's name is a digest of what its rows read: the release's run record (its id, and the sha256 of each of its
    files), the dataset's case files, the board's score columns (names and types: the answers' are fixed), every analysis query's
    text, this module and the craftmd version. A file found under its name holds the rows the query gives; anything
    else is computed again. ``out``: the folder this analysis keeps its files in (every one it read, and only those);
    ``previous``: an earlier analysis's (read back, by hard link where the file system allows)."""

    def __init__(self, out: Path | str, previous: Path | str | None, dataset_dir: Path | str | None):
        from craftmd import __version__

        self.out, self.previous = Path(out), Path(previous) if previous is not None else None
        h = hashlib.blake2b(f"craftmd {__version__}".encode(), digest_size=16)
        for f in [*sorted(SQL_DIR.glob("*.sql")), Path(__file__)]:
            h.update(f"\0{f.name}\0".encode() + f.read_bytes())
        for config in ("all", "nejm_image") if dataset_dir is not None else ():  # (None: nothing read back)
            path = config_file(dataset_dir, config)
            h.update(f"\0{config}\0".encode() + (path.read_bytes() if path.exists() else b""))
        self._code_and_data = h.digest()
        self.counts = {"read_back": 0, "computed": 0, "pairs_read_back": 0, "pairs_computed": 0}
        self.digests: dict[str, bytes] = {}  # release id -> the digest its files' names carry
        self.files: dict[str, dict[str, str]] = {}  # query -> release id -> its file's name (:meth:`names`)
        self.ids: list[str] = []  # the board's release ids, in DuckDB's order of text (:func:`keep`)

    def names(self, board: list[tuple[str, str]], releases: list[Release]) -> None:
        """Name each query's file of each of ``releases`` on a board of these score columns (name, type): :attr:`files`
        (query -> release id -> its file's name), :attr:`ids` (the releases, in their order) and :attr:`digests`."""
        columns = repr(board).encode()
        out: dict[str, dict[str, str]] = {}
        for r in releases:
            h = hashlib.blake2b(self._code_and_data + columns, digest_size=16)
            h.update((r.path / "manifest.json").read_bytes())
            self.digests[r.id] = h.digest()
            for name in PER_RELEASE:
                out.setdefault(name, {})[r.id] = f"{name}-{h.hexdigest()}.parquet"
        self.files, self.ids = out, [r.id for r in releases]

    def path(self, name: str, release: str) -> Path:
        """Where query ``name``'s rows of ``release`` are kept (after :meth:`names`)."""
        return self.out / self.files[name][release]

    def derived(self, name: str, release: str, made_by: tuple[str, ...], *settings, suffix: str = ".parquet") -> str:
        """The name of a file of rows derived from ``release``'s kept files alone, by this package's analysis modules
        ``made_by`` (file names) with ``settings`` (by ``repr``): a digest of those, so that such rows are read back
        (:meth:`found`) while none of them changed, and made again, under a new name, when one did."""
        h = hashlib.blake2b(self.digests[release], digest_size=16)
        h.update(_code_of(made_by))
        h.update(repr(settings).encode())
        return f"{name}-{h.hexdigest()}{suffix}"

    #: The file that keeps the pairs of models' counts (:func:`model_comparisons`), beside the releases' files.
    PAIRS = "model_pairs.parquet"

    def read_pairs(self, keys: set[bytes]):
        """The kept pairs' rows whose key is one of ``keys`` (a polars frame), or None: none kept, or unreadable."""
        import polars as pl

        path = self.previous / self.PAIRS if self.previous is not None else None
        if path is None or not _readable(path):
            return None
        try:
            rows = pl.read_parquet(path)
            return rows.filter(pl.col("pair_key").is_in(list(keys)))
        except (pl.exceptions.PolarsError, OSError):
            return None

    def write_pairs(self, rows) -> None:
        """Keep ``rows`` (every pair this analysis read or computed) for the next analysis."""
        self.out.mkdir(parents=True, exist_ok=True)
        rows.write_parquet(self.out / self.PAIRS)

    def found(self, file: str, readable=None) -> bool:
        """Whether ``file`` is kept in :attr:`out`, first linked (or copied) from :attr:`previous` when only it has it
        (``readable(path)``: whether a file is whole; default: a parquet file whose footer reads)."""
        readable = readable or _readable
        here = self.out / file
        if readable(here):
            return True
        there = self.previous / file if self.previous is not None else None
        if there is None or not readable(there):
            return False
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            os.link(there, here)
        except OSError:
            shutil.copyfile(there, here)
        return True


@lru_cache(maxsize=None)
def _code_of(modules: tuple[str, ...]) -> bytes:
    """A digest of the analysis modules ``modules`` (file names beside this one)."""
    h = hashlib.blake2b(digest_size=16)
    for m in modules:
        h.update(f"\0{m}\0".encode() + (Path(__file__).parent / m).read_bytes())
    return h.digest()


#: Releases computed together by :func:`keep` (in a connection of their own, dropped before the next): memory follows
#: the batch, not the board (two workers with six releases each held about 0.7 GB apiece; with three, 100 releases'
#: queries took the same time and the analysis with its workers peaked 0.35 GB lower).
KEEP_BATCH = 3
#: Releases computed from which :func:`keep` runs its batches in the worker processes it is given: fewer leave little
#: memory behind, and a worker's round trip cost the six upstream releases a tenth of their analysis's time.
APART_FROM = 24
#: Releases computed from which :func:`keep` shows a progress bar.
PROGRESS_FROM = 12


def _progress(batches: list, n: int):
    """The batches (or their futures), with a progress bar on a board large enough to wait for."""
    if n < PROGRESS_FROM:
        return batches
    import sys

    from tqdm import tqdm

    return tqdm(batches, desc="case scores per release", unit="batch", leave=False, file=sys.stderr)


def _readable(path: Path) -> bool:
    """Whether ``path`` is a parquet file whose footer reads (a damaged kept file is computed again, never read)."""
    try:
        return path.is_file() and pq.read_metadata(path).num_columns > 0
    except (pa.ArrowException, OSError):
        return False


def _write_each(con: duckdb.DuckDBPyConnection, name: str, paths: dict[str, Path]) -> None:
    """``sql/<name>.sql``'s rows, one parquet file per release of ``paths`` (an empty one for a release without rows),
    each written whole (a ``.part`` renamed)."""
    import polars as pl

    column = PER_RELEASE[name]
    try:
        rows = pl.from_arrow(con.sql(sql_text(name)).to_arrow_table())
    except duckdb.Error as exc:
        raise CraftMDError(f"analysis query {name}.sql failed: {exc}") from None
    runs = rows.select(pl.col(column).rle()).unnest(column)  # the release's rows together (most queries order so)
    if runs["value"].n_unique() == runs.height:  # slices of the one frame, not copies
        starts = [0, *runs["len"].cum_sum().to_list()]
        each = {(v,): rows.slice(starts[i], n) for i, (n, v) in enumerate(runs.iter_rows())}
    else:
        each = rows.partition_by(column, maintain_order=True, as_dict=True)
    for rid, path in paths.items():
        part = path.with_name(path.name + ".part")
        each.get((rid,), rows.clear()).write_parquet(part)
        os.replace(part, path)


def keep(
    con: duckdb.DuckDBPyConnection, releases: list[Release], dataset_dir: Path | str, kept: Kept | None = None, workers=None
) -> Kept:
    """Every :data:`PER_RELEASE` query (that the board's scores can answer) as a view of its name in ``con``: over the
    releases' files of ``kept`` (without it: files kept for this connection alone, in a temporary folder removed with
    it), in the order of the release ids (the queries order their rows by release first, so the view reads in the
    order the whole query gives). A release whose file is missing is computed first, a few releases at a time
    (:data:`KEEP_BATCH`), each batch in a connection of its own that has the whole board's score columns, as many
    batches side by side as there are CPUs (a batch's rows depend on it alone: the files are the same bytes either
    way). ``workers`` (:class:`.draw.Workers`, with processes), from :data:`APART_FROM` releases to compute: the
    batches run in them, and the workers are renewed afterwards, so that what DuckDB's and polars' allocators keep of
    the batches' memory is given back with their processes (else in threads of this process, which keeps it). Returns
    the :class:`Kept`."""
    board = [(c, t) for c, t, *_ in con.execute("describe scores").fetchall()]  # the board's score columns
    names = [n for n in PER_RELEASE if set(_NEEDS.get(n, ())) <= {c for c, _ in board}]
    if kept is None:  # kept for this connection alone, in a temporary folder removed with it
        folder = tempfile.mkdtemp(prefix="craftmd-kept-")
        weakref.finalize(con, shutil.rmtree, folder, True)
        kept = Kept(folder, None, None)
    releases = sorted(releases, key=lambda r: r.id.encode())  # DuckDB's order of text: its bytes
    kept.names(board, releases)
    todo = [r for r in releases if not all(kept.found(kept.files[name][r.id]) for name in names)]
    kept.counts["read_back"] += len(releases) - len(todo)
    kept.counts["computed"] += len(todo)
    kept.out.mkdir(parents=True, exist_ok=True)
    apart = workers is not None and workers.apart and len(todo) >= APART_FROM
    batches = [todo[i : i + KEEP_BATCH] for i in range(0, len(todo), KEEP_BATCH)]
    jobs = [
        (
            [os.path.abspath(r.path) for r in batch] if apart else batch,  # a worker opens the releases by their paths
            os.path.abspath(dataset_dir),
            board,
            {name: {r.id: os.path.abspath(kept.path(name, r.id)) for r in batch} for name in names},
        )
        for batch in batches
    ]
    from craftmd import cpus

    with contextlib.ExitStack() as stack:
        if apart:
            submit = workers.submit
        else:  # DuckDB's threads wait on each other's small steps: batches side by side
            submit = stack.enter_context(ThreadPoolExecutor(max(1, min(cpus(), len(jobs))))).submit
        done = [submit(_keep_batch, *job) for job in jobs]
        try:
            for future in _progress(done, len(todo)):
                future.result()
        finally:  # a failed batch: the others are not started (what they wrote, each file whole, is kept)
            for future in done:
                future.cancel()
    if apart:
        workers.renew()
    for name in names:
        _view(con, name, [kept.path(name, r.id) for r in releases])
    return kept


def _keep_batch(batch: list[Release] | list[str], dataset_dir: str, board: list[tuple[str, str]], paths: dict) -> None:
    """:func:`keep`'s work for one batch of releases (or their folders, opened here: in a worker process, checked
    against their run records as this process's are): each query of ``paths`` (query -> release id -> file, in
    :data:`PER_RELEASE`'s order), its rows written to its files, in a connection of its own."""
    batch = [r if isinstance(r, Release) else read_release(r) for r in batch]
    part = connect(batch, dataset_dir, scores_columns=board)
    try:
        materialize(part, "case_membership")
        materialize(part, "trial_grades")
        _check_trials(part)
        for name, ours in paths.items():
            _write_each(part, name, {rid: Path(p) for rid, p in ours.items()})
            _view(part, name, [ours[r.id] for r in batch])  # what the batch's next queries read
    finally:
        part.close()


def _view(con: duckdb.DuckDBPyConnection, name: str, paths: list[Path]) -> None:
    """Temporary view ``name`` over the kept files ``paths``, in that order."""
    con.execute(f"create or replace temp view {name} as select * from read_parquet([{', '.join(map(_lit, paths))}])")


__all__ = [
    "connect",
    "connect_tables",
    "run",
    "by_release",
    "materialize",
    "keep",
    "model_comparisons",
    "let_go",
    "Kept",
    "query_names",
    "sql_text",
]
