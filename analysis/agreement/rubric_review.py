"""The expert-review loop for the rubric: 1–4 ratings of sampled conversations × dimensions out
(:func:`export_rubric_review`), back in (:func:`import_rubric_review`), and the experts' agreement with each other and
with the judge; the ratings go into releases as a scorer (:class:`PeopleRatings`, written by ``craftmd score``'s writer:
analysis only reads releases).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import statistics
from pathlib import Path

import numpy as np

from craftmd import CraftMDError
from craftmd.agreement import krippendorff_alpha, spearman, weighted_kappa
from craftmd.atomic import atomic_write_bytes
from craftmd.scoring.judge import METRIC as JUDGE_METRIC
from craftmd.scoring.judge import pick_scorer, read_units
from craftmd.scoring.rubric import applicable, load_catalog
from craftmd.scoring.scorers import Scorer, ScorerResult

from .review.records import EXPERTS
from .review.sample import _stratum_rng
from .review.sheets import keyed_workbook_bytes
from .review.write import write_with_scores

FORMAT = "craftmd-rubric-review"
VERSION = 1
RATERS = ("r1", "r2")
METRIC = "expert_rubric_rating"  # scorers rater:<name>, and the yes/no review's EXPERTS for the resolved rating
REVIEW_COLUMNS = ["review_id", "release", "case_id", "trial", "conversation", "with_image", "dimension", "question", "scores"]
KEY_COLUMNS = ["review_id", "dimension", "judge", "judge_score"]
INSTRUCTIONS = ("Read the conversation (sheet 'conversations', by review_id) and rate the doctor on each row's aspect from 1 "
                "(clearly deficient) to 4 (exemplary), as the row's scores describe; use your rater column (r1 for the first rater, "
                "r2 for the second) and leave the other alone. Leave a cell blank only if you cannot rate it.")  # fmt: skip


def sample_rows(
    releases, n: int, seed: int, dimensions: list[str] | None = None, dataset_dir=None
) -> tuple[list[dict], list[dict], list[dict]]:
    """(review rows, conversation rows, key rows) of ``n`` judged conversations per release."""
    cat = load_catalog()
    dims = cat.select(dimensions)
    review, convs, keys = [], [], []
    for rel in releases:
        t, _ = rel.scores_with_records()
        judged = (
            [] if t is None or "dimension" not in t.column_names else [r for r in t.to_pylist() if r["metric"] == JUDGE_METRIC]
        )
        scorer = pick_scorer(sorted({r["scorer"] for r in judged}))
        score = {(r["case_id"], r["trial"], r["conversation"], r["with_image"], r["dimension"]): r["value"]
                 for r in judged if r["scorer"] == scorer}  # fmt: skip
        judged_convs = {k[:4] for k in score}
        # a release no judge scored is sampled whole: its experts' ratings stand in the judge's place (key: no judge score)
        units = [
            u
            for u in read_units(rel, dataset_dir)
            if not u.failed and (scorer is None or (u.case_id, u.trial, u.conversation, u.with_image) in judged_convs)
        ]
        pick = sorted(_stratum_rng(seed, rel.id).choice(len(units), size=min(n, len(units)), replace=False).tolist())
        for i in pick:
            u = units[i]
            rid = f"{rel.id}:{u.case_id}:{u.trial}:{u.conversation}:{int(u.with_image)}"
            convs.append({"review_id": rid, "transcript": u.transcript})
            for d in applicable(dims, u.objective):
                review.append({"review_id": rid, "release": rel.id, "case_id": u.case_id, "trial": u.trial, "conversation": u.conversation,
                               "with_image": u.with_image, "dimension": d.id, "question": d.description,
                               "scores": " | ".join(f"{i}: {a}" for i, a in enumerate(d.anchors, 1))})  # fmt: skip
                s = score.get((u.case_id, u.trial, u.conversation, u.with_image, d.id))
                keys.append({"review_id": rid, "dimension": d.id, "judge": scorer, "judge_score": None if s is None else int(s)})
    return review, convs, keys


def build_workbook(review: list[dict], convs: list[dict], keys: list[dict], meta: dict) -> bytes:
    from openpyxl import Workbook
    from openpyxl.styles import Alignment, Font
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.datavalidation import DataValidation

    wb = Workbook()
    wb.properties.creator = "craftmd"
    wb.properties.created = wb.properties.modified = dt.datetime(2000, 1, 1)
    ins = wb.active
    ins.title = "instructions"
    ins.append(["format", FORMAT, VERSION])
    ins.append(["instructions", INSTRUCTIONS])
    for k in sorted(meta):
        ins.append([k, json.dumps(meta[k], sort_keys=True)])
    ws = wb.create_sheet("review")
    header = REVIEW_COLUMNS + list(RATERS)
    ws.append(header)
    for c in ws[1]:
        c.font = Font(bold=True)
    for r in review:
        ws.append([r[c] for c in REVIEW_COLUMNS] + [None] * len(RATERS))
    if review:
        dv = DataValidation(type="list", formula1='"1,2,3,4"', allow_blank=True, showErrorMessage=True, errorTitle="1 to 4",
                            error="Rate from 1 (clearly deficient) to 4 (exemplary).")  # fmt: skip
        for j in range(len(REVIEW_COLUMNS) + 1, len(header) + 1):
            letter = get_column_letter(j)
            dv.add(f"{letter}2:{letter}{len(review) + 1}")
        ws.add_data_validation(dv)
    for name, width in (("question", 60), ("scores", 90), ("review_id", 30)):
        ws.column_dimensions[get_column_letter(header.index(name) + 1)].width = width
    ws.freeze_panes = "B2"
    cs = wb.create_sheet("conversations")
    cs.append(["review_id", "transcript"])
    for c in convs:
        cs.append([c["review_id"], c["transcript"]])
        cs.cell(cs.max_row, 2).alignment = Alignment(wrap_text=True, vertical="top")
    cs.column_dimensions["B"].width = 120
    ds = wb.create_sheet("dimensions")
    ds.append(["id", "category", "meta_category", "objectives", "description", "1", "2", "3", "4"])
    for d in load_catalog().dimensions:
        ds.append([d.id, d.category, d.meta_category, ", ".join(d.objectives), d.description, *d.anchors])
    return keyed_workbook_bytes(wb, keys, KEY_COLUMNS, "key")


def export_rubric_review(
    release_dirs, out, *, n: int, seed: int, dimensions: list[str] | None = None, dataset_dir=None, overwrite: bool = False
) -> Path:
    """Write the review workbook of ``n`` judged conversations per release to ``out`` (an .xlsx).

    ``export_rubric_review`` samples ``n`` judged conversations per release (seeded, failed conversations left
    out; a release no judge scored is sampled from all its conversations, for people to rate in the judge's place) into an .xlsx workbook (deterministic bytes, as :mod:`craftmd.analysis.agreement.review` writes them): sheet
    ``review`` has one row per conversation × dimension with the dimension's question and anchors and one
    column per rater (``r1``, ``r2``; a 1–4 drop-down), sheet ``conversations`` the transcripts, sheet
    ``dimensions`` the catalog rows, and a hidden ``key`` sheet the judge's score (raters answer blind)."""
    from craftmd.release import read_release

    out = Path(out)
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    if n < 1:
        raise CraftMDError("--n must be at least 1")
    from craftmd.scoring.score import check_standing

    releases = [read_release(p) for p in release_dirs]
    check_standing(releases)  # the key holds the judge's scores: made here, never a claim
    review, convs, keys = sample_rows(releases, n, seed, dimensions, dataset_dir)

    meta = {"seed": seed, "n": n, "catalog": load_catalog().record(), "releases": sorted(r.id for r in releases)}
    atomic_write_bytes(out, build_workbook(review, convs, keys, meta), overwrite=overwrite)  # or made meanwhile: refused
    return out


# -- in ---------------------------------------------------------------------------------------------


def review_files(paths) -> list[tuple[str, bytes]]:
    """The filled-in review workbooks' names and bytes; an unreadable one is one line."""
    files = []
    for p in paths:
        try:
            files.append((Path(p).name, Path(p).read_bytes()))
        except OSError as exc:
            raise CraftMDError(f"{p}: cannot read ({exc.strerror})") from None
    return files


def _level(v) -> int | None:
    """A cell's rating 1-4 (a whole number, typed or as text), else None."""
    try:
        level = int(str(v).strip()) if not isinstance(v, float) or v.is_integer() else None
    except ValueError:
        return None
    return level if level in (1, 2, 3, 4) and not isinstance(v, bool) else None


def _key(name: str, wb, problems: list[str]) -> dict:
    """The key sheet: (review_id, dimension) -> (judge, the judge's score 1-4 or None), each row checked."""
    judge: dict = {}
    for i, row in enumerate(wb["key"].iter_rows(min_row=2, values_only=True), 2):
        row = tuple(row) + (None,) * (len(KEY_COLUMNS) - len(row))
        rid, dim, _, score = row[: len(KEY_COLUMNS)]
        if (rid, dim) in judge:
            problems.append(f"{name}: key row {i}: {rid} / {dim} is there twice")
        elif score is not None and _level(score) is None:
            problems.append(f"{name}: key row {i}: the judge's score {score!r} is not 1-4")
        judge[(rid, dim)] = None if score is None else _level(score)
    return judge


def _formulas(data: bytes, cols: dict) -> dict[tuple[int, str], str]:
    """The rating cells holding a formula, (row, rater) -> its text: a formula's value is not in the file openpyxl
    writes, so read for values alone it would be a blank, a rating lost without a word."""
    from openpyxl import load_workbook

    wb = load_workbook(io.BytesIO(data), read_only=True, data_only=False)
    out = {}
    for i, row in enumerate(wb["review"].iter_rows(min_row=2, values_only=True), 2):
        for rater, j in cols.items():
            v = row[j] if j < len(row) else None
            if isinstance(v, str) and v.startswith("="):
                out[(i, rater)] = v
    return out


def read_ratings(files: list[tuple[str, bytes]], units: dict | None = None) -> tuple[dict, dict]:
    """Filled-in workbooks -> (ratings: (review_id, dimension) -> {rater: 1..4}, judge: (review_id, dimension) -> score or None).
    Every problem is collected; one CraftMDError lists them (file, row, column) and nothing is returned. ``units``, when
    given, is filled with review_id -> the row's release, case_id, trial, conversation and with_image.

    A row is bound to what was exported: its review id (which names its release, case, trial, conversation and image
    flag) must be in the key sheet, its other columns those its id names, and its release one the workbook was
    exported from; a row given twice, a rater column the sheet was not exported with, a formula for a rating and a
    judge's score that is not 1-4 are problems, never guessed at."""
    from openpyxl import load_workbook
    from openpyxl.utils import get_column_letter

    known = set(load_catalog().by_id())
    problems: list[str] = []
    ratings: dict = {}
    judge: dict = {}
    for name, data in files:
        try:
            wb = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one problem line
            problems.append(f"{name}: not an .xlsx workbook ({type(exc).__name__})")
            continue
        if "instructions" not in wb.sheetnames or next(wb["instructions"].iter_rows(max_row=1, values_only=True))[:2] != (
            "format",
            FORMAT,
        ):
            problems.append(f"{name}: not a rubric review workbook (craftmd judge-review export)")
            continue
        lost = [s for s in ("review", "key") if s not in wb.sheetnames]
        if lost:
            problems.append(f"{name}: no {' or '.join(lost)} sheet (export the workbook again: craftmd judge-review export)")
            continue
        exported = _meta(wb).get("releases")
        keys = _key(name, wb, problems)
        judge.update(keys)
        rows = list(wb["review"].iter_rows(values_only=True))
        header = list(rows[0]) if rows else []
        cols = {r: header.index(r) for r in RATERS if r in header}
        extra = [(j, h) for j, h in enumerate(header) if h is not None and h not in REVIEW_COLUMNS and h not in RATERS]
        for j, h in extra:
            problems.append(
                f"{name}: review!{get_column_letter(j + 1)}1: a column {h!r} the sheet was not exported with "
                f"(its raters are {', '.join(RATERS)}: a third rater rates in a sheet of their own)"
            )
        formulas = _formulas(data, cols)
        seen: dict = {}
        for i, row in enumerate(rows[1:], 2):
            row = tuple(row) + (None,) * (len(header) - len(row))
            rid, dim = row[0], row[REVIEW_COLUMNS.index("dimension")]
            unit = {k: row[REVIEW_COLUMNS.index(k)] for k in ("release", "case_id", "trial", "conversation", "with_image")}
            if dim not in known:
                problems.append(f"{name}: review row {i}: unknown dimension {dim!r}")
                continue
            if (rid, dim) not in keys:
                problems.append(f"{name}: review row {i}: {rid} / {dim} is not in the key sheet")
                continue
            if (rid, dim) in seen:
                problems.append(f"{name}: review row {i}: {rid} / {dim} is row {seen[(rid, dim)]} again")
                continue
            seen[(rid, dim)] = i
            named = f"{unit['release']}:{unit['case_id']}:{unit['trial']}:{unit['conversation']}:{int(bool(unit['with_image']))}"
            if named != rid or (exported is not None and unit["release"] not in exported):
                problems.append(
                    f"{name}: review row {i}: its release, case, trial, conversation or image flag is not the one its "
                    f"review id {rid} was exported with"
                )
                continue
            if units is not None:
                units[rid] = unit
            for rater, j in cols.items():
                if (i, rater) in formulas:
                    problems.append(
                        f"{name}: review!{get_column_letter(j + 1)}{i}: a formula ({formulas[(i, rater)][:40]}), not a rating 1-4"
                    )
                    continue
                v = row[j]
                if v is None or (isinstance(v, str) and not v.strip()):
                    continue
                level = _level(v)
                if level is None:
                    problems.append(f"{name}: review!{get_column_letter(j + 1)}{i}: {v!r} is not a rating 1-4")
                    continue
                if rater in ratings.get((rid, dim), {}):
                    problems.append(f"{name}: review row {i}: {rid} / {dim} is rated by {rater} in another file too")
                    continue
                ratings.setdefault((rid, dim), {})[rater] = level
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise CraftMDError(f"{len(problems)} problem(s) in the review files: {shown}")
    return ratings, judge


def _meta(wb) -> dict:
    """The instructions sheet's recorded fields (key -> its JSON value; a value that is not JSON is left out)."""
    out = {}
    for row in wb["instructions"].iter_rows(min_row=2, values_only=True):
        if len(row) >= 2 and isinstance(row[0], str) and isinstance(row[1], str):
            try:
                out[row[0]] = json.loads(row[1])
            except ValueError:
                continue
    return out


def _figures(pairs_r: list[tuple], pairs_j: list[tuple], matrix: list[list]) -> dict:

    out = {}
    for who, pairs in (("experts", pairs_r), ("experts_vs_judge", pairs_j)):
        a, b = [p[0] for p in pairs], [p[1] for p in pairs]
        mat = [[p[0] for p in pairs], [p[1] for p in pairs]]
        out[who] = {"n": len(pairs), "weighted_kappa": weighted_kappa(a, b), "spearman": spearman(a, b),
                    "alpha_ordinal": krippendorff_alpha(mat, "ordinal", (1, 2, 3, 4)) if pairs else None}  # fmt: skip
    if matrix:
        out["experts"]["alpha_ordinal"] = krippendorff_alpha(np.array(matrix, float).T, "ordinal", (1, 2, 3, 4))
    return out


def agreement(ratings: dict, judge: dict, *, B: int = 1000, seed: int = 15) -> list[dict]:
    """Per dimension and pooled ('all'): the experts' agreement and theirs with the judge, each with a 95 % CI
    (bootstrap over conversations)."""
    raters = sorted(
        {r for v in ratings.values() for r in v}, key=lambda r: (r not in RATERS, RATERS.index(r) if r in RATERS else 0, r)
    )
    first2 = raters[:2]
    items = []
    for (rid, dim), vals in sorted(ratings.items()):
        resolved = statistics.median_low(list(vals.values()))
        items.append({"review_id": rid, "dimension": dim, "pair": tuple(vals[r] for r in first2) if len(first2) == 2 and all(r in vals for r in first2) else None,
                      "judge": (resolved, judge[(rid, dim)]) if judge.get((rid, dim)) is not None else None,
                      "row": [vals.get(r, np.nan) for r in raters]})  # fmt: skip
    out = []
    groups = [("all", items)] + [(d, [i for i in items if i["dimension"] == d]) for d in sorted({i["dimension"] for i in items})]
    for name, its in groups:

        def stat(sel):
            return _figures(
                [i["pair"] for i in sel if i["pair"]], [i["judge"] for i in sel if i["judge"]], [i["row"] for i in sel]
            )

        point = stat(its)
        convs = sorted({i["review_id"] for i in its})
        by_conv = {c: [i for i in its if i["review_id"] == c] for c in convs}
        rng = np.random.default_rng([seed, len(convs)])
        draws = {(w, k): [] for w in ("experts", "experts_vs_judge") for k in ("weighted_kappa", "spearman", "alpha_ordinal")}
        for _ in range(B):
            sel = [i for j in rng.integers(0, len(convs), len(convs)) for i in by_conv[convs[j]]]
            f = stat(sel)
            for (w, k), lst in draws.items():
                if f[w][k] is not None:
                    lst.append(f[w][k])
        row = {"dimension": name}
        for w in ("experts", "experts_vs_judge"):
            row[f"{w}_n"] = point[w]["n"]
            for k in ("weighted_kappa", "alpha_ordinal", "spearman"):
                v, lst = point[w][k], draws[(w, k)]
                row[f"{w}_{k}"] = None if v is None else round(v, 4)
                row[f"{w}_{k}_ci"] = (
                    [round(float(np.percentile(lst, 2.5)), 4), round(float(np.percentile(lst, 97.5)), 4)] if lst else None
                )
        out.append(row)
    return out


def import_rubric_review(paths: list[Path | str], out: Path | str, *, B: int = 1000, seed: int = 15) -> Path:
    """Read filled-in review workbooks and write the agreement figures (JSON) to ``out``.

    ``import_rubric_review`` reads filled-in workbooks; every problem (a rating that is not 1–4, an unknown
    review id or dimension, a row without its key) is collected with its file, row and column, and nothing is
    computed if there is one. Per dimension, and pooled over dimensions, it reports with 95 % CIs (a bootstrap
    over conversations, seeded):

    * the experts' agreement with each other: the first two raters' quadratic-weighted kappa and Spearman's rho,
      Krippendorff's ordinal alpha over all raters;
    * the experts' agreement with the judge: the experts' resolved rating (the lower median of their ratings)
      against the judge's score, by the same three figures.

    The ratings themselves go beside the JSON as a scores table (``<stem>.scores.parquet``, as the yes/no review's
    :func:`craftmd.analysis.agreement.review.write_with_scores` writes it): metric ``expert_rubric_rating`` (1–4), scorer
    ``rater:<name>`` per rater and ``experts`` for the resolved rating (its label says how: single, agreed,
    median_low), variant keys ``release``, ``conversation``, ``with_image`` and ``dimension`` as the judge's rows."""
    files = review_files(paths)
    units: dict = {}
    ratings, judge = read_ratings(files, units)
    if not ratings:
        raise CraftMDError("the review files hold no rating")
    rows = agreement(ratings, judge, B=B, seed=seed)

    raters = sorted({r for v in ratings.values() for r in v})
    records = {f"rater:{r}": {"review": FORMAT, "version": VERSION, "rater": r} for r in raters}
    records[EXPERTS] = {"review": FORMAT, "version": VERSION, "raters": raters, "resolution": "median_low",
                        "catalog": load_catalog().record()}  # fmt: skip
    results = {"format": FORMAT, "version": VERSION, "ratings": sum(len(v) for v in ratings.values()), "B": B, "seed": seed,
               "agreement": rows}  # fmt: skip
    return write_with_scores(Path(out), results, rating_rows(ratings, units), records)


def rating_rows(ratings: dict, units: dict):
    """The ratings as scores rows: per conversation and dimension each rater's (scorer ``rater:<name>``) and the
    resolved one (scorer ``experts``, the lower median; label single, agreed or median_low; detail the ratings)."""
    import pyarrow as pa

    cols: dict[str, list] = {k: [] for k in ("case_id", "trial", "release", "conversation", "with_image", "dimension", "scorer", "metric",
                                             "value", "label", "detail", "status")}  # fmt: skip

    def add(u: dict, dim: str, scorer: str, value: int, label: str | None, detail: str | None) -> None:
        for k, v in (("case_id", u["case_id"]), ("trial", int(u["trial"])), ("release", u["release"]), ("conversation", u["conversation"]),
                     ("with_image", bool(u["with_image"])), ("dimension", dim), ("scorer", scorer), ("metric", METRIC),
                     ("value", float(value)), ("label", label), ("detail", detail), ("status", "ok")):  # fmt: skip
            cols[k].append(v)

    for (rid, dim), vals in sorted(ratings.items()):
        u = units[rid]
        for rater in sorted(vals):
            add(u, dim, f"rater:{rater}", vals[rater], None, None)
        how = "single" if len(vals) == 1 else "agreed" if len(set(vals.values())) == 1 else "median_low"
        add(
            u,
            dim,
            EXPERTS,
            statistics.median_low(list(vals.values())),
            how,
            json.dumps(dict(sorted(vals.items())), sort_keys=True),
        )
    return pa.table(cols)


def people_ratings(paths: list[Path | str], releases_dir: Path | str) -> tuple[PeopleRatings, list]:
    """Filled-in workbooks' ratings as a scorer for the rated releases under ``releases_dir`` (:class:`PeopleRatings`),
    and those releases; ``craftmd judge-review import --into`` runs it through ``craftmd score``'s writer
    (:func:`craftmd.scoring.score.score_with`). Every rated release and conversation must be there; a problem is one line
    and no release is changed."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ..board import Board

    files = review_files(paths)
    units: dict = {}
    ratings, _ = read_ratings(files, units)
    if not ratings:
        raise CraftMDError("the review files hold no rating")
    found = {r.id: r for r in Board.read(releases_dir)}
    table = rating_rows(ratings, units)
    rated, by_release = [], {}
    for rid in sorted(set(table.column("release").to_pylist())):
        rel = found.get(rid)
        if rel is None:
            raise CraftMDError(f"the review files rate release {rid}, which is not under {releases_dir}")
        mine = table.filter(pc.equal(table.column("release"), rid)).drop_columns(["release"])
        have = {tuple(x.values()) for x in pq.read_table(rel.path / "conversations.parquet",
                                                           columns=["case_id", "trial", "conversation", "with_image"]).to_pylist()}  # fmt: skip
        keys = {(x["case_id"], x["trial"], x["conversation"], x["with_image"]) for x in mine.to_pylist()}
        if keys - have:
            raise CraftMDError(
                f"release {rid}: the review files rate conversation(s) it does not hold: {sorted(keys - have)[:2]}"
            )
        rated.append(rel)
        by_release[rid] = mine
    raters = sorted({r for v in ratings.values() for r in v})
    records = {f"rater:{r}": {"review": FORMAT, "version": VERSION, "rater": r} for r in raters}
    records[EXPERTS] = {
        "review": FORMAT,
        "version": VERSION,
        "raters": raters,
        "resolution": "median_low",
        "catalog": load_catalog().record(),
    }
    return PeopleRatings(by_release, records), rated


class PeopleRatings(Scorer):
    """People's ratings in a judge's place (scorers ``rater:<name>`` and ``experts``, metric ``expert_rubric_rating``): the
    rows :func:`rating_rows` makes of the workbooks, per rated release, where the board reads them marked human."""

    unit = "conversation"
    metrics = (METRIC,)
    about = "experts' 1-4 ratings of the rubric's dimensions, from filled-in review workbooks (craftmd judge-review)"

    def __init__(self, by_release: dict, records: dict):
        self.name, self.by_release, self.records = EXPERTS, by_release, records

    def writes(self) -> tuple[str, ...]:
        return tuple(self.records)

    def check(self, release, ctx) -> None:
        if release.id not in self.by_release:
            raise CraftMDError(f"release {release.id}: the review files rate none of its conversations")

    def run(self, release, ctx) -> ScorerResult:
        self.check(release, ctx)
        mine = self.by_release[release.id]
        here = set(mine.column("scorer").to_pylist())
        records = {k: v for k, v in self.records.items() if k in here}
        return ScorerResult(mine, records, {"release": release.id, "ratings": mine.num_rows})


__all__ = [
    "export_rubric_review",
    "import_rubric_review",
    "people_ratings",
    "PeopleRatings",
    "read_ratings",
    "rating_rows",
    "agreement",
    "sample_rows",
]
