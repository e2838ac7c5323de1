"""From releases to tables: the analysis only reads releases and writes ``OUT/tables/*.csv``.

:func:`compute` runs the named queries over every graded release; :func:`analyse` also writes
the tables and figures. The main job that builds, ingests and grades before this is
:mod:`craftmd.commands.leaderboard`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from craftmd import CraftMDError, __version__
from craftmd.release import Release

from .escape import csv_safe
from . import runner
from .board import Board
from .bootstrap import DEFAULT_B, DEFAULT_SEED, Memo
from .history import history_tables
from .stats import CELL_COLUMNS, bootstrap_all, cells_of, coded, metric_table

#: The paper's other tests, written beside TABLES when computed (MCQ vs FRQ, image vs none, the experts' McNemar).
MORE_TABLES = ("format_tests", "image_tests", "expert_tests", "published_tests", "order_tests")
TABLES = (
    "accuracy",
    "pvalues",
    "answer_status",
    "mcq_rule_gap",
    "metrics",
    "releases",
    "group_sizes",
    "history_tests",
    "history_by_coverage",
    "history_by_complexity",
)


@dataclass
class Analysis:
    """Everything the page and figures need, as polars frames."""

    accuracy: pl.DataFrame
    pvalues: pl.DataFrame
    answer_status: pl.DataFrame
    mcq_rule_gap: pl.DataFrame
    metrics: pl.DataFrame  # every metric but accuracy's 'correct': mean over cases with 95 % CI (stats.metric_table)
    releases: pl.DataFrame  # release, kind, model, display, notes (JSON text)
    group_sizes: pl.DataFrame  # with_image, group_by, group, n_cases: the dataset's cases in each group (not a release's)
    history_tests: pl.DataFrame  # paired tests between releases on the history metrics (analysis.history)
    history_by_coverage: pl.DataFrame  # FRQ accuracy by quintile of patient_info_recall
    history_by_complexity: pl.DataFrame  # history metrics and FRQ accuracy by tertile of the case history's length
    timings: dict = field(default_factory=dict)
    B: int = DEFAULT_B
    seed: int = DEFAULT_SEED
    rubric: object = None  # the rubric judge's profiles (analysis.rubric.Rubric), when a release was judged
    #: task -> its own tables (name -> frame: craftmd.tasks.Analysis.tables), for each task of the releases that has any
    tasks: dict[str, dict[str, pl.DataFrame]] = field(default_factory=dict)
    boards: pl.DataFrame | None = (
        None  # analysis.boards: each model's headline in each task (only beside another task's releases)
    )
    format_tests: pl.DataFrame | None = None  # four-choice MCQ against FRQ per model and setting (stats.more_tests; format_split)
    image_tests: pl.DataFrame | None = None  # with against without the image, per model, setting, format and grader
    expert_tests: pl.DataFrame | None = (
        None  # McNemar between models on the dermatologists' labels (analysis.published, with a source)
    )
    published_tests: pl.DataFrame | None = None  # the preprint's MCQ-vs-FRQ p-values beside format_tests (analysis.published)
    order_tests: pl.DataFrame | None = None  # shuffled against upstream's answer order, per model (analysis.answer_order)
    all_pairs: bool = False  # every pair of models tested on request (--all-pairs); else as sql/comparisons says
    claims: pl.DataFrame | None = None  # scores claimed by their sender, not computed here (claims_table), when any
    overlap: object = None  # the same cases in two registered tasks (analysis.overlap.Overlap), from the dataset folders
    board: Board | None = None  # the releases read for it, once (analysis.board): ``releases`` is the frame of those shown


@dataclass
class TaskInputs:
    """What a task's tables are made from (:attr:`craftmd.tasks.Analysis.tables`): its releases, the connection over the
    scored releases (None when none has answers), the dataset, the accuracy tables, the rubric, the packets."""

    releases: list[Release]
    con: object
    dataset_dir: Path | str | None
    accuracy: pl.DataFrame | None  # sql/accuracy.sql's rows, before the bootstrap
    acc: pl.DataFrame | None  # with the bootstrap CIs
    rubric: object
    packets: Path | str | None
    B: int
    seed: int


def task_tables(releases: list[Release], inputs: dict) -> dict[str, dict[str, pl.DataFrame]]:
    """Each task's own tables (:attr:`craftmd.tasks.Analysis.tables`) over its releases, the tasks in the registry's order;
    a task whose hook gives no table has none."""
    from craftmd.tasks import in_order

    out = {}
    for task in in_order(r.manifest.task for r in releases):
        if task.analysis.tables is not None:
            mine = [r for r in releases if r.manifest.task == task.name]
            made = task.analysis.tables(TaskInputs(releases=mine, **inputs))
            if made:
                out[task.name] = made
    return out


def prepared_connection(
    releases: list[Release],
    dataset_dir: Path | str,
    *,
    all_pairs: bool = False,
    kept: runner.Kept | None = None,
    workers=None,
):
    """A DuckDB connection with the inputs registered and the shared models made, in order (``all_pairs``:
    :func:`.runner.connect`; ``kept``, ``workers``: the per-release queries' rows kept and read back, and where they
    are computed, :func:`.runner.keep`)."""
    con = runner.connect(releases, dataset_dir, all_pairs=all_pairs, answers=[])
    runner.materialize(con, "case_membership")
    kept = runner.keep(con, releases, dataset_dir, kept, workers)
    runner.model_comparisons(con, kept)
    runner.let_go(con)
    return con


def group_sizes(con) -> pl.DataFrame:
    """How many of the dataset's cases each group holds (``all`` and every group of ``case_membership``).

    Counted from the dataset, never from a release: a release that covers a few cases says
    nothing about how many cases a specialty has.
    """
    members = pl.from_arrow(con.sql('select case_id, with_image, group_by, "group" from case_membership').to_arrow_table())
    cases = pl.from_arrow(con.sql("select distinct case_id, with_image from cases").to_arrow_table())
    everything = cases.with_columns(pl.lit("all").alias("group_by"), pl.lit("all").alias("group"))
    return (
        pl.concat([everything.select(members.columns), members])
        .group_by("with_image", "group_by", "group")
        .agg(pl.col("case_id").n_unique().cast(pl.Int64).alias("n_cases"))
        .sort("with_image", "group_by", "group")
    )


def _empty() -> dict[str, pl.DataFrame]:
    """The answer tasks' tables with no rows (an analysis of patient-led encounters alone)."""
    from .history import COMPLEXITY_COLUMNS, COVERAGE_COLUMNS, TEST_COLUMNS
    from .stats import ACCURACY_COLUMNS, METRIC_COLUMNS, PVALUE_COLUMNS

    def frame(cols, types=None):
        types = types or {}
        return pl.DataFrame(schema={c: types.get(c, pl.String) for c in cols})

    num = {c: pl.Float64 for c in ("accuracy", "ci_low", "ci_high", "diff", "p_value", "p_adjusted", "mean", "p", "p_holm")}
    ints = {c: pl.Int64 for c in ("n_cases", "n_failed", "n_answers", "n_ok", "n_missing", "n_non_text", "n_conversations", "quintile",
                                  "tertile")}  # fmt: skip
    flags = {"with_image": pl.Boolean, "higher_is_better": pl.Boolean}
    types = {**num, **ints, **flags}
    return {
        "accuracy": frame(ACCURACY_COLUMNS, types), "pvalues": frame(PVALUE_COLUMNS, types),
        "answer_status": frame(["model", "setting", "format", "with_image", "n_answers", "n_ok", "n_missing", "n_non_text", "n_failed"], types),
        "mcq_rule_gap": frame(["model", "setting", "n_answers", "paper_correct", "strict_correct", "paper_only", "strict_only",
                               "paper_credits_several", "names_several"], types),
        "metrics": frame(METRIC_COLUMNS, types), "group_sizes": frame(["with_image", "group_by", "group", "n_cases"], types),
        "history_tests": frame(TEST_COLUMNS, types), "history_by_coverage": frame(COVERAGE_COLUMNS, types),
        "history_by_complexity": frame(COMPLEXITY_COLUMNS, types),
    }  # fmt: skip


def compute(
    releases: Board | Path | str,
    dataset_dir: Path | str,
    *,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    packets: Path | str | None = None,
    rubric_options: dict | None = None,
    all_pairs: bool = False,
    memo: Memo | None = None,
    kept: runner.Kept | None = None,
    workers=None,
) -> Analysis:
    """Run the named queries over the releases and add bootstrap CIs and tests. ``releases``: the command's
    :class:`craftmd.analysis.board.Board`, or a releases folder (read once, here). ``packets``: the built medpi folder
    whose packets give each encounter's reason and objective (the rubric by encounter needs it). ``all_pairs``: test
    every pair of models (else every pair only in families of up to :data:`.runner.ALL_PAIRS_UP_TO` models, each model
    against its neighbours in the ranking and the leader in larger ones: ``sql/comparisons``). ``memo``: the intervals
    and p-values of an earlier analysis, read back where their case vectors are the same (:class:`.bootstrap.Memo`);
    ``kept``: the per-release queries' rows, kept and read back the same way (:class:`.runner.Kept`). ``workers``
    (:class:`.draw.Workers`): where the overlap between the tasks' cases is worked out meanwhile (else here)."""
    t0 = time.perf_counter()
    board = Board.of(releases)
    found = list(board.releases)
    from craftmd.scoring.score import check_standing

    check_standing(found)  # every score read is made here or a claim kept apart (craftmd score settles the others)
    releases = [r for r in found if r.has("scores")]
    unscored = [r for r in found if r.task.analysis.unscored]  # analysed before they are scored (their own tables)
    if not releases and not unscored:
        raise CraftMDError(f"no graded release under {board.root}")
    from .draw import Workers
    from .overlap import overlap

    found_overlap = (workers or Workers(1)).submit(overlap, (dataset_dir, packets))  # the dataset's alone
    if not any("answers" in r.task.required_tables for r in releases):  # no answers to analyse (patient-led encounters)
        return _with_overlap(_without_answers(unscored, packets, B, seed, t0, rubric_options, board), found_overlap)
    con = prepared_connection(releases, dataset_dir, all_pairs=all_pairs, kept=kept, workers=workers)
    accuracy = pl.from_arrow(runner.run(con, "accuracy"))
    comparisons = coded(runner.run(con, "comparisons"))
    more = pl.from_arrow(runner.run(con, "more_comparisons"))
    status = pl.from_arrow(runner.run(con, "answer_status"))
    gap = pl.from_arrow(runner.run(con, "mcq_rule_gap"))
    sizes = group_sizes(con)
    t1 = time.perf_counter()
    cells = cells_of(con)
    runner.let_go(con)
    digests = kept.digests if kept is not None else None  # each release's kept case scores: the memo's first key
    acc, pv, more_pv = bootstrap_all(cells, accuracy, comparisons, more, B=B, seed=seed, memo=memo, digests=digests)
    del comparisons, more  # (the tests' inputs, not held while the other tables are made)
    by_release = None if kept is not None else runner.by_release(con, "metric_case_scores")
    metrics = metric_table(by_release, B=B, seed=seed, memo=memo, kept=kept)
    hist = history_tables(con, B=B, seed=seed, memo=memo, kept=kept)
    t2 = time.perf_counter()
    from .rubric import rubric

    judged = rubric(releases, B=B, seed=seed, **(rubric_options or {}))
    _with_sensitivity(judged, board.root)
    t3 = time.perf_counter()
    judged = judged if judged.table.height else None
    shown = sorted({r.id: r for r in [*releases, *unscored]}.values(), key=lambda r: r.id)
    tasks = task_tables(shown, dict(con=con, dataset_dir=dataset_dir, accuracy=accuracy, acc=acc, rubric=judged, packets=packets,
                                    B=B, seed=seed))  # fmt: skip
    a = Analysis(acc, pv, status, gap, metrics, Board.frame(shown), sizes, hist["history_tests"], hist["history_by_coverage"],
                 hist["history_by_complexity"], {"sql_s": t1 - t0, "bootstrap_s": t2 - t1, "rubric_s": t3 - t2,
                 "tasks_s": time.perf_counter() - t3}, B, seed, judged, tasks)  # fmt: skip
    a.format_tests, a.image_tests = format_split(more_pv)
    from .answer_order import order_tests

    a.order_tests = order_tests(con, B=B, seed=seed)
    a.all_pairs = all_pairs
    a.claims = claims_table(found)
    a.board = board
    return _with_overlap(_with_boards(a), found_overlap)


def _with_overlap(a: Analysis, found) -> Analysis:
    """The overlap between the registered tasks' test cases, read from the analysis's dataset folders (:mod:`.overlap`;
    ``found``: its future)."""
    a.overlap = found.result()
    a.timings["overlap_s"] = a.overlap.seconds
    return a


#: The columns of tables/format_tests.csv and tables/image_tests.csv.
FORMAT_TEST_COLUMNS = [
    "model",
    "setting",
    "with_image",
    "group_by",
    "group",
    "mcq_grader",
    "frq_grader",
    "n_cases",
    "diff",
    "p_value",
    "p_adjusted",
    "test",
]
IMAGE_TEST_COLUMNS = [
    *CELL_COLUMNS,
    "diff",
    "p_value",
    "p_adjusted",
    "test",
]


def format_split(more: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``stats.more_tests``' rows as two tables: four-choice MCQ against FRQ (``diff`` = MCQ - FRQ; the paper's
    Supplementary Table 3) and with against without the image (``diff`` = with - without; Supplementary Table 21)."""
    fmt = more.filter(pl.col("family") == "format").rename(
        {"image_a": "with_image", "grader_a": "mcq_grader", "grader_b": "frq_grader"}
    )
    img = more.filter(pl.col("family") == "image").rename({"format_a": "format", "grader_a": "grader"})
    return fmt.select(FORMAT_TEST_COLUMNS), img.select(IMAGE_TEST_COLUMNS)


def _with_sensitivity(judged, releases_dir) -> None:
    """The judge-sensitivity result of the releases folder (craftmd judge-sensitivity), beside the rubric, when present."""
    if judged.table.height:
        from craftmd.analysis.agreement.judge_sensitivity import read_sensitivity

        judged.sensitivity = read_sensitivity(releases_dir)


def _without_answers(
    releases, packets, B: int, seed: int, t0: float, rubric_options: dict | None = None, board: Board | None = None
) -> Analysis:
    """An analysis of releases without answers (patient-led encounters alone): the rubric and their tasks' own tables."""
    from .rubric import rubric

    judged = rubric([r for r in releases if r.has("scores")], B=B, seed=seed, **(rubric_options or {}))
    if board is not None:
        _with_sensitivity(judged, board.root)
    judged = judged if judged.table.height else None
    e = _empty()
    tasks = task_tables(releases, dict(con=None, dataset_dir=None, accuracy=None, acc=None, rubric=judged, packets=packets, B=B,
                                       seed=seed))  # fmt: skip
    a = Analysis(e["accuracy"], e["pvalues"], e["answer_status"], e["mcq_rule_gap"], e["metrics"], Board.frame(releases),
                 e["group_sizes"], e["history_tests"], e["history_by_coverage"], e["history_by_complexity"],
                 {"sql_s": time.perf_counter() - t0, "bootstrap_s": 0.0}, B, seed, judged, tasks)  # fmt: skip
    a.claims = claims_table(releases)
    a.board = board
    return _with_boards(a)


def _with_boards(a: Analysis) -> Analysis:
    """Beside the releases of a task that is not the main board's, the board per task (:mod:`.boards`); the main board's
    tasks alone have their own board only."""
    from .view import main_tasks

    if set(a.releases["task"].to_list()) - {t.name for t in main_tasks(a)}:
        from .boards import task_boards

        a.boards = task_boards(a)
    return a


#: The columns of tables/claims.csv.
CLAIM_COLUMNS = ["release", "display", "scorer", "metric", "n_scores", "n_ok", "mean", "reported_by", "scored_by", "run_record"]


def claims_table(releases: list[Release]) -> pl.DataFrame | None:
    """The scores the releases hold as claims (scorer ``claimed:<name>``: an inspect log's word, or scores that came with
    the release and only a model could compute again, :func:`craftmd.scoring.score.sender_claims`): per release, claimed
    scorer and metric, how many, how many ok and their mean, who reported them and which model the claim says scored
    them, and what the release's run record says made it. Never ranked, never tested; None when no release holds one."""
    from craftmd.release import CLAIM_PREFIX
    from craftmd.scoring.score import CLAIM, standing

    rows = []
    for r in releases:
        names = [n for n, s in standing(r).items() if s == CLAIM]
        if not names:
            continue
        table, records = r.scores_with_records()
        df = pl.from_arrow(table.select(["scorer", "metric", "value", "status"])).filter(pl.col("scorer").is_in(names))
        made = r.manifest.producer.get("name") or r.manifest.kind
        run = f"{r.id}/manifest.json: {made}" + (f", git {r.manifest.git_revision[:12]}" if r.manifest.git_revision else "")
        for (scorer, metric), g in df.group_by("scorer", "metric", maintain_order=True):
            rec = records.get(scorer) or {}
            ok = g.filter(pl.col("status") == "ok")
            rows.append({"release": r.id, "display": r.display, "scorer": scorer.removeprefix(CLAIM_PREFIX), "metric": metric,
                         "n_scores": g.height, "n_ok": ok.height, "mean": ok["value"].mean() if ok.height else None,
                         "reported_by": str(rec.get("reported_by") or "not said"), "scored_by": str(rec.get("model") or ""),
                         "run_record": run})  # fmt: skip
    if not rows:
        return None
    schema = {c: pl.String for c in CLAIM_COLUMNS} | {"n_scores": pl.Int64, "n_ok": pl.Int64, "mean": pl.Float64}
    return pl.DataFrame(rows, schema=schema).sort("release", "scorer", "metric")


def write_tables(a: Analysis, out: Path) -> list[Path]:
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TABLES:
        df = getattr(a, name)
        if name == "releases":
            df = df.drop("notes", "counts", "source", "scorers", "task", "protocol")
        path = tables / f"{name}.csv"
        csv_safe(df).write_csv(path)
        written.append(path)
    from .view import protocol_table

    path = tables / "protocols.csv"  # each release's protocol and why it is not ranked with the board's, in words
    csv_safe(protocol_table(a)).write_csv(path)
    written.append(path)
    if a.rubric is not None:
        from .rubric import write_tables as write_rubric_tables

        written += write_rubric_tables(a.rubric, out)
    more = {name: getattr(a, name) for name in MORE_TABLES if getattr(a, name, None) is not None}  # the paper's other tests
    if a.overlap is not None:  # the same cases in two tasks: every pair, and the counts per pair of tasks
        more |= {"overlap": a.overlap.cases, "overlap_pairs": a.overlap.pairs}
    apart = {name: df for name, df in (("boards", a.boards), ("claims", a.claims)) if df is not None}
    own = {name: df for tables in a.tasks.values() for name, df in tables.items()}
    for name, df in {**own, **apart, **more}.items():
        path = tables / f"{name}.csv"  # the other tasks' tables: written only when such releases were analysed
        csv_safe(df).write_csv(path)
        written.append(path)
    return written


#: What an analysis (or leaderboard) folder holds: an existing --out is replaced only when it has one of these.
OWNS = ("tables", "index.html")
#: Inside an analysis folder: what a later analysis into the same folder reads back (never published: a dot folder).
CACHE = ".cache"


def analyse(
    releases: Board | Path | str,
    dataset_dir: Path | str,
    out_dir: Path | str,
    *,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    figures: bool = True,
    packets: Path | str | None = None,
    rubric_options: dict | None = None,
    all_pairs: bool = False,
    previous: Path | str | None = None,
) -> Analysis:
    """Tables (and figures) of every graded release (and every encounters release) of ``releases`` (the command's
    :class:`craftmd.analysis.board.Board`, or a releases folder, read once) into ``out_dir``.

    ``out_dir`` is written into as it is: the callers (``craftmd analyse``, ``craftmd leaderboard``)
    pass the temporary sibling of :func:`craftmd.atomic.atomic_dir`, so their output appears whole.

    ``previous``: the folder an earlier analysis wrote (the ``--out`` being replaced). Its ``.cache`` gives back every
    interval and p-value whose case vectors are unchanged (:class:`.bootstrap.Memo`), every release's case scores whose
    inputs are unchanged (:class:`.runner.Kept`), and its figures when their
    inputs (every table written, the releases, this code) are byte for byte the same; the output is the same bytes a
    full analysis writes. ``out_dir/.cache`` keeps this analysis's for the next."""
    out = Path(out_dir)
    cache = Path(previous) / CACHE if previous is not None else None
    memo = Memo.load(cache / "resamples.parquet" if cache else None)
    kept = runner.Kept(out / CACHE / "queries", cache / "queries" if cache else None, dataset_dir)
    from .bootstrap import blas_threads
    from .draw import Workers, draw_all

    with Workers() as workers, blas_threads(1):  # the processes of the per-release queries and the figures, started now
        workers.warm()
        a = compute(
            releases, dataset_dir, B=B, seed=seed, packets=packets, rubric_options=rubric_options, all_pairs=all_pairs,
            memo=memo, kept=kept, workers=workers,
        )  # fmt: skip
        memo.save(out / CACHE / "resamples.parquet")
        a.timings["memo"] = memo.counts()
        a.timings["kept"] = dict(kept.counts)
        write_tables(a, out)
        if figures:
            t = time.perf_counter()
            digest = _figure_inputs(a, out)
            if cache is not None and _read(cache / "figures.sha256") == digest and (Path(previous) / "figures").is_dir():
                shutil.copytree(Path(previous) / "figures", out / "figures")
            else:
                draw_all(a, out / "figures", workers)
            (out / CACHE / "figures.sha256").write_text(digest)
            a.timings["figures_s"] = time.perf_counter() - t
    return a


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def _figure_inputs(a: Analysis, out: Path) -> str:
    """A digest of what the figures are drawn from: every table written under ``out/tables``, the releases (their
    notes too), and the code that draws them (this package's analysis modules, matplotlib's version)."""
    import matplotlib

    h = hashlib.sha256(f"craftmd {__version__}; matplotlib {matplotlib.__version__}".encode())
    for f in [*sorted(Path(__file__).parent.glob("*.py")), *sorted((out / "tables").glob("*.csv"))]:
        h.update(f"\0{f.name}\0".encode())
        h.update(f.read_bytes())
    h.update(a.releases.write_csv().encode())
    return h.hexdigest()


# -- audits ------------------------------------------------------------------------------------


def read_audits(audits_dir: Path | None) -> list[dict]:
    """Every ``*.json`` audit dict in ``audits_dir`` (sorted by file name)."""
    if audits_dir is None or not Path(audits_dir).is_dir():
        return []
    audits = []
    for f in sorted(Path(audits_dir).glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise CraftMDError(f"{f}: not valid JSON ({exc})") from None
        if not isinstance(d, dict) or not {"id", "title"} <= d.keys():
            raise CraftMDError(f"{f}: an audit needs at least 'id' and 'title'")
        d.setdefault("description", "")
        d.setdefault("tables", [])
        d.setdefault("figures", [])
        d["_dir"] = str(Path(audits_dir).resolve())
        audits.append(d)
    return audits


__all__ = ["analyse", "compute", "write_tables", "read_audits", "prepared_connection", "Analysis"]
