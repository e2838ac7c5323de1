"""The rubric judge calibrated against people (MedPI §3.8): a monotone map from the judge's 1–4 score to the experts'
rating per dimension (:func:`calibrate`, measured out of sample), applied to releases as scorer ``judge-calibrated``
(:class:`CalibratedJudge`, run and written by ``craftmd score``'s writer: analysis only reads releases).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from craftmd import CraftMDError
from craftmd.scoring.scorers import Scorer, ScorerResult

FORMAT = "craftmd-judge-calibration"
VERSION = 1
MIN_RATINGS = 30
BY = ("dimension", "category")


def read_pairs(paths) -> tuple[list[dict], str]:
    """Filled-in review workbooks -> (pairs: review_id, dimension, judge, judge_score, expert; the ratings' sha256). A
    malformed sheet is the one-line error of :func:`craftmd.analysis.agreement.rubric_review.read_ratings`."""
    from openpyxl import load_workbook

    from craftmd.analysis.agreement.rubric_review import read_ratings, review_files

    files = review_files(paths)
    ratings, judge = read_ratings(files)
    names = set()
    import io

    for _, data in files:  # the judge each key sheet names (one judge per calibration)
        wb = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
        names |= {row[2] for row in wb["key"].iter_rows(min_row=2, values_only=True) if row[2]}
    if len(names) > 1:
        raise CraftMDError(
            f"the review files were scored by several judges ({', '.join(sorted(names))}); calibrate one judge at a time"
        )
    who = next(iter(names), None)
    if who is None:  # a calibration is of one judge, named: it is applied to that judge's scores only
        raise CraftMDError("the review files' key sheets name no judge; export them again (craftmd judge-review export)")
    pairs = [{"review_id": rid, "dimension": dim, "judge": who, "judge_score": judge[(rid, dim)],
              "expert": statistics.median_low(list(v.values()))}
             for (rid, dim), v in sorted(ratings.items()) if judge.get((rid, dim)) is not None]  # fmt: skip
    digest = hashlib.sha256(json.dumps([[p["review_id"], p["dimension"], p["judge_score"], sorted(ratings[(p["review_id"], p["dimension"])].items())]
                                        for p in pairs]).encode()).hexdigest()  # fmt: skip
    return pairs, digest


def fit_map(x, y) -> dict[int, float]:
    """The isotonic map level -> calibrated value, for the judge levels 1..4 (unseen levels interpolated, then clipped)."""
    from scipy.optimize import isotonic_regression

    x, y = np.asarray(x, int), np.asarray(y, float)
    levels = np.unique(x)
    means = np.array([y[x == v].mean() for v in levels])
    weights = np.array([(x == v).sum() for v in levels], float)
    fitted = isotonic_regression(means, weights=weights, increasing=True).x
    return {lv: round(float(np.interp(lv, levels, fitted)), 6) for lv in (1, 2, 3, 4)}


def group_of(dimension: str, by: str) -> str:
    from craftmd.scoring.rubric import load_catalog

    return dimension if by == "dimension" else load_catalog().by_id()[dimension].category


def _figures(pred, human) -> dict:
    from craftmd.agreement import weighted_kappa

    pred, human = np.asarray(pred, float), np.asarray(human, float)
    k = weighted_kappa(np.clip(np.rint(pred), 1, 4).astype(int).tolist(), human.astype(int).tolist())
    return {"bias_points": float(np.mean(pred - human) * 100.0 / 3.0), "weighted_kappa": None if k is None else float(k)}


def held_out(pairs: list[dict], by: str, folds: int, seed: int, B: int) -> dict:
    """Cross-validated predictions (folds over conversations) and the before/after figures with 95 % CIs."""
    convs = sorted({p["review_id"] for p in pairs})
    if len(convs) < folds:
        raise CraftMDError(f"{len(convs)} rated conversation(s): fewer than --folds {folds}")
    order = np.random.default_rng([seed, len(convs)]).permutation(len(convs))
    fold = {convs[j]: i % folds for i, j in enumerate(order)}
    pred = np.empty(len(pairs))
    for f in range(folds):
        train = [p for p in pairs if fold[p["review_id"]] != f]
        maps: dict[str, dict] = {}
        for g in sorted({group_of(p["dimension"], by) for p in train}):
            sel = [p for p in train if group_of(p["dimension"], by) == g]
            maps[g] = fit_map([p["judge_score"] for p in sel], [p["expert"] for p in sel])
        for i, p in enumerate(pairs):
            if fold[p["review_id"]] == f:
                m = maps.get(group_of(p["dimension"], by))
                pred[i] = m[p["judge_score"]] if m else p["judge_score"]
    judge = np.array([p["judge_score"] for p in pairs], float)
    human = np.array([p["expert"] for p in pairs], float)
    out = {}
    idx_by_conv = {c: [i for i, p in enumerate(pairs) if p["review_id"] == c] for c in convs}
    rng = np.random.default_rng([seed, B])
    draws = [np.concatenate([idx_by_conv[convs[j]] for j in rng.integers(0, len(convs), len(convs))]) for _ in range(B)]
    for name, x in (("before", judge), ("after", pred)):
        point = _figures(x, human)
        row = {}
        for k, v in point.items():
            boot = [f[k] for f in (_figures(x[d], human[d]) for d in draws) if f[k] is not None]
            row[k] = None if v is None else round(v, 4)
            row[f"{k}_ci"] = (
                [round(float(np.percentile(boot, 2.5)), 4), round(float(np.percentile(boot, 97.5)), 4)] if boot else None
            )
        out[name] = row
    return out


def calibrate(
    paths,
    out,
    *,
    by: str = "dimension",
    min_ratings: int = MIN_RATINGS,
    folds: int = 5,
    seed: int = 15,
    B: int = 1000,
    overwrite: bool = False,
) -> dict:
    """Fit the judge's calibration from review workbooks and write it (JSON) to ``out``; returns what was written.

    MedPI recalibrates its judges against expert ratings (§3.8). From filled-in review workbooks (``craftmd judge-review
    export``, then rated), each rated conversation × dimension gives a pair: the judge's score (the workbook's hidden key)
    and the experts' resolved rating (the lower median of their ratings, as ``judge-review import``). Per dimension (or per
    category, ``by="category"``), an **isotonic regression** of the rating on the judge's score is fitted: the non-decreasing
    map that is closest in squared error, by the pool-adjacent-violators algorithm of ``scipy.optimize.isotonic_regression``
    (the same fit as scikit-learn's ``IsotonicRegression`` with ``out_of_bounds="clip"``: a judge level not seen in the
    fit takes the linear interpolation of its seen neighbours, and the nearest seen value beyond them).

    How much it helps is measured out of sample: conversations are split into ``folds`` (seeded), each fold's pairs are
    predicted by maps fitted on the others, and the held-out predictions are compared with the experts **before** (the
    judge's own score) and **after** (the calibrated one): the quadratic-weighted kappa (the calibrated score rounded to a
    level) and the mean bias in points on the 0–100 scale (``100 (judge − expert) / 3`` averaged), each with a 95 % CI (a
    bootstrap over conversations). Every group needs at least ``min_ratings`` pairs (30 by default): fewer is a one-line
    error and nothing is written."""
    from craftmd.atomic import atomic_write_json

    if by not in BY:
        raise CraftMDError(f"--by {by!r}: one of {', '.join(BY)}")
    if folds < 2:
        raise CraftMDError("--folds must be at least 2")
    out = Path(out)
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    pairs, digest = read_pairs(paths)
    if not pairs:
        raise CraftMDError("the review files hold no rating of a judged conversation × dimension: nothing to calibrate")
    n: dict[str, int] = {}
    for p in pairs:
        g = group_of(p["dimension"], by)
        n[g] = n.get(g, 0) + 1
    few = sorted(g for g, k in n.items() if k < min_ratings)
    if few:
        raise CraftMDError(
            f"too few ratings to calibrate: {len(few)} {by}(s) with fewer than {min_ratings} rated pairs "
            f"({', '.join(f'{g}: {n[g]}' for g in few[:4])}{' …' if len(few) > 4 else ''}); rate more or pass --by category"
        )
    maps = {g: fit_map([p["judge_score"] for p in pairs if group_of(p["dimension"], by) == g],
                       [p["expert"] for p in pairs if group_of(p["dimension"], by) == g]) for g in sorted(n)}  # fmt: skip
    result = {"format": FORMAT, "version": VERSION, "method": "isotonic (scipy.optimize.isotonic_regression, clipped)", "by": by,
              "judge": pairs[0]["judge"], "ratings_sha256": digest, "pairs": len(pairs), "n": dict(sorted(n.items())),
              "maps": {g: {str(k): v for k, v in m.items()} for g, m in maps.items()}, "folds": folds, "seed": seed, "B": B,
              "held_out": held_out(pairs, by, folds, seed, B), "min_ratings": min_ratings}  # fmt: skip
    atomic_write_json(out, result)
    return result


#: The most bytes a calibration file may hold (a few maps and figures).
MAX_CALIBRATION_BYTES = 1 << 20
LEVELS = ("1", "2", "3", "4")


class _Calibration(BaseModel):
    """What :func:`calibrate` writes, checked where a calibration file enters (:func:`read_calibration`): the judge it
    was fitted to, named; each map from the judge's levels 1-4 to finite ratings 1-4, non-decreasing (an isotonic fit)
    and not one value for every level (a map that says nothing of the judge's score)."""

    model_config = ConfigDict(extra="ignore")  # checks what it names; the file keeps its other keys

    format: Literal["craftmd-judge-calibration"]
    version: Literal[1]
    by: Literal["dimension", "category"]
    judge: str = Field(min_length=1)
    ratings_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    pairs: int = Field(ge=1)
    maps: dict[str, dict[str, float]] = Field(min_length=1)
    held_out: dict

    @field_validator("maps")
    @classmethod
    def _monotone(cls, maps: dict) -> dict:
        for g, m in maps.items():
            if sorted(m) != list(LEVELS):
                raise ValueError(f"the map of {g!r} maps {sorted(m)}, not the judge's levels 1-4")
            v = [m[k] for k in LEVELS]
            if not all(math.isfinite(x) and 1 <= x <= 4 for x in v):
                raise ValueError(f"the map of {g!r} sends a level outside the ratings 1-4")
            if any(a > b for a, b in zip(v, v[1:])):
                raise ValueError(f"the map of {g!r} is not non-decreasing (an isotonic fit is)")
            if v[0] == v[-1]:
                raise ValueError(f"the map of {g!r} sends every level to {v[0]:g} (it says nothing of the judge's score)")
        return maps


def read_calibration(path) -> tuple[dict, str]:
    """A calibration file (:func:`calibrate`), bounded and checked (:class:`_Calibration`); its sha256. Its held-out
    figures are its sender's claims (made from ratings not here): an applied calibration's record keeps them as such."""
    from craftmd.atomic import read_regular

    data = read_regular(path, MAX_CALIBRATION_BYTES)
    try:
        cal = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CraftMDError(f"{path}: not a readable calibration ({type(exc).__name__})") from None
    if not isinstance(cal, dict) or cal.get("format") != FORMAT:
        raise CraftMDError(f"{path}: not a judge calibration (craftmd judge-calibrate fit)")
    try:
        _Calibration.model_validate(cal)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "the file"
        raise CraftMDError(f"{path}: not a judge calibration: {loc}: {first['msg'].removeprefix('Value error, ')}") from None
    return cal, hashlib.sha256(data).hexdigest()


def judge_scores_sha256(rows: list[dict]) -> str:
    """A digest of a judge's rubric rows (key, value, status): the calibrated judge's record keeps the one it was made from,
    so scores re-judged since are seen (:func:`current`)."""
    key = sorted(
        (r["case_id"], r["trial"], r["conversation"], bool(r["with_image"]), r["dimension"], r["value"], r["status"])
        for r in rows
    )
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def current(release, record: dict) -> bool:
    """Whether a release's calibrated judge was made from its judge's present scores."""
    from craftmd.scoring.judge import METRIC

    t, _ = release.scores_with_records()
    rows = [r for r in t.to_pylist() if r["metric"] == METRIC and r["scorer"] == record.get("judge")] if t is not None else []
    return bool(rows) and record.get("judge_scores_sha256") == judge_scores_sha256(rows)


def _calibrated_columns(mine: list[dict], judge: str, cal: dict) -> dict[str, list]:
    """The calibrated judge's score rows (as columns) from the judge's: each score mapped by its group's map, the judge's
    score in ``detail``; a failed score stays an error."""
    from craftmd.scoring.judge import CALIBRATED, CALIBRATED_METRIC

    cols = {
        k: []
        for k in (
            "case_id",
            "trial",
            "conversation",
            "with_image",
            "dimension",
            "scorer",
            "metric",
            "value",
            "label",
            "detail",
            "status",
        )
    }
    for r in mine:
        m = cal["maps"][group_of(r["dimension"], cal["by"])]
        ok = r["status"] == "ok" and r["value"] is not None
        detail = {"judge": judge, "judge_score": r["value"]} if ok else {"judge": judge, "error": "the judge's score failed"}
        for k, v in (("case_id", r["case_id"]), ("trial", r["trial"]), ("conversation", r["conversation"]), ("with_image", r["with_image"]),
                     ("dimension", r["dimension"]), ("scorer", CALIBRATED), ("metric", CALIBRATED_METRIC),
                     ("value", float(m[str(int(r["value"]))]) if ok else None), ("label", None),
                     ("detail", json.dumps(detail, sort_keys=True)), ("status", "ok" if ok else "error")):  # fmt: skip
            cols[k].append(v)
    return cols


def calibrated_judge(path) -> "CalibratedJudge":
    """The calibrated judge of the fitted maps at ``path`` (:func:`calibrate`'s file), as a scorer: ``craftmd judge-calibrate
    apply`` runs it on releases through ``craftmd score``'s writer (:func:`craftmd.scoring.score.score_with`)."""
    cal, sha = read_calibration(path)
    return CalibratedJudge(cal, sha)


class CalibratedJudge(Scorer):
    """Scorer ``judge-calibrated`` (metric ``rubric_score_calibrated``, continuous 1–4, the judge's score in ``detail``):
    a release's judge scores mapped by a fitted calibration; its record names the calibration and the ratings' sha256, and
    the board shows it in the judge's place (``craftmd analyse --rubric-scorer``). A release not judged, judged by another
    judge than the calibration's, or with a judged dimension the calibration has no map for is refused in one line
    (:meth:`check`, before anything is written)."""

    unit = "conversation"
    about = "the rubric judge's scores mapped by a calibration against experts' ratings (craftmd judge-calibrate)"

    def __init__(self, cal: dict, sha: str):
        from craftmd.scoring.judge import CALIBRATED, CALIBRATED_METRIC

        self.name, self.metrics, self.cal, self.sha = CALIBRATED, (CALIBRATED_METRIC,), cal, sha

    def judged(self, release) -> tuple[str, list[dict]]:
        """The release's standing judge and its rubric rows (one line when it cannot be calibrated)."""
        from craftmd.scoring.judge import METRIC, pick_scorer

        t, _ = release.scores_with_records()
        rows = [] if t is None or "dimension" not in t.column_names else [r for r in t.to_pylist() if r["metric"] == METRIC]
        judge = pick_scorer(sorted({r["scorer"] for r in rows}))
        if judge is None:
            raise CraftMDError(f"release {release.id}: not judged; nothing to calibrate")
        if judge != self.cal["judge"]:  # a calibration is of its judge alone
            raise CraftMDError(f"release {release.id}: judged by {judge}, the calibration is of {self.cal['judge']}")
        mine = [r for r in rows if r["scorer"] == judge]
        missing = sorted({group_of(r["dimension"], self.cal["by"]) for r in mine} - set(self.cal["maps"]))
        if missing:
            raise CraftMDError(
                f"release {release.id}: no calibration for {self.cal['by']}(s) {missing[:4]}{' …' if len(missing) > 4 else ''} "
                "(calibrate with ratings of them, or --by category)"
            )
        return judge, mine

    def check(self, release, ctx) -> None:
        self.judged(release)

    def run(self, release, ctx) -> ScorerResult:
        import pyarrow as pa

        judge, mine = self.judged(release)
        cal = self.cal  # the file's held-out figures, made from ratings not here, are kept as its claims (held_out_claimed)
        record = {"method": "isotonic", "version": VERSION, "judge": judge, "judge_scores_sha256": judge_scores_sha256(mine),
                  "by": cal["by"], "calibration_sha256": self.sha,
                  "ratings_sha256": cal["ratings_sha256"], "pairs": cal["pairs"], "held_out_claimed": cal["held_out"]}  # fmt: skip
        summary = {"release": release.id, "judge": judge, "scores": len(mine)}
        return ScorerResult(pa.table(_calibrated_columns(mine, judge, cal)), {self.name: record}, summary)


__all__ = [
    "calibrate",
    "calibrated_judge",
    "CalibratedJudge",
    "current",
    "judge_scores_sha256",
    "read_pairs",
    "fit_map",
    "held_out",
    "MIN_RATINGS",
    "FORMAT",
]
