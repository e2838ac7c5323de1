"""MedPI's rubric on the board: profiles by category and meta-category, per model, with case-bootstrap CIs
(:func:`rubric`), their tables (:func:`write_tables`) and figures (:func:`write_figures`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from craftmd.scoring.judge import RUBRIC_METRICS, standing_scorer

from .escape import csv_safe
from .bootstrap import DEFAULT_B, DEFAULT_SEED, Resampler

CONVERSATION = ["case_id", "trial", "conversation", "with_image"]
COLUMNS = ["model", "scorer", "level", "group", "n_cases", "n_conversations", "n_failed", "mean", "ci_low", "ci_high"]


@dataclass
class Rubric:
    table: pl.DataFrame  # COLUMNS: one row per model, level (meta_category | category) and group
    raw: pl.DataFrame  # model, scorer, score (1..4 or "failed"), n, share
    B: int = DEFAULT_B
    seed: int = DEFAULT_SEED
    scores: pl.DataFrame | None = None  # judge_scores(): every dimension score read (by_encounter reads it)
    extras: dict | None = None  # analysis.judges.judge_extras(): flags, evidence found, sampled rationales
    detail: pl.DataFrame | None = None  # detail_table(): per dimension (MedPI's Appendix E) and per ACGME competency
    unsupported: str = "count"  # whether scores without found evidence (label no_evidence) count ("count") or not ("drop")
    sensitivity: dict | None = None  # craftmd judge-sensitivity's result for the releases folder, when present
    display: dict | None = None  # release id -> its display name: the tables' ``model`` is the release id, text says this

    def name(self, release: str) -> str:
        """What text (a figure's label, the page) calls ``release``."""
        return (self.display or {}).get(release, release)


#: What the profiles do with a valid score none of whose evidence quotes is in the transcript (label ``no_evidence``).
UNSUPPORTED = ("count", "drop")


def judge_scores(releases, unsupported: str = "count", prefer: str = "auto") -> pl.DataFrame:
    """Every release's rubric scores of its chosen scorer, with the catalog's category and meta-category; with
    ``unsupported="drop"``, scores labelled ``no_evidence`` are left out (counted nowhere, as if never asked). Whose scores:
    :func:`craftmd.scoring.judge.standing_scorer` (``prefer``); column ``kind`` says judge, calibrated judge or human."""
    import pyarrow.parquet as pq

    from craftmd.release import SCORES_FILE
    from craftmd.scoring.rubric import load_catalog

    cat = load_catalog().by_id()
    frames = []
    for r in releases:
        path = r.path / SCORES_FILE
        if not path.exists() or "dimension" not in pq.read_schema(path).names:  # never judged: its scores are not read
            continue
        t, _ = r.scores_with_records()
        df = pl.from_arrow(t).filter(pl.col("metric").is_in(RUBRIC_METRICS))
        pairs = set(df.select("scorer", "metric").unique().iter_rows()) if df.height else set()
        from craftmd.scoring.judge import CALIBRATED, CALIBRATED_METRIC

        if (CALIBRATED, CALIBRATED_METRIC) in pairs and prefer in ("auto", "calibrated"):
            from .agreement.calibration import current

            if not current(r, r.scorer_records().get(CALIBRATED) or {}):  # the judge re-judged since: its calibration is stale
                import sys

                print(
                    f"warning: release {r.id}: its calibrated judge was made from other judge scores than it holds now; "
                    "not shown (craftmd judge-calibrate apply again)",
                    file=sys.stderr,
                )
                pairs.discard((CALIBRATED, CALIBRATED_METRIC))
        got = standing_scorer(pairs, prefer) if pairs else None
        if got is None:
            continue
        scorer, metric, kind = got
        df = df.filter(pl.col("scorer") == scorer, pl.col("metric") == metric).with_columns(pl.lit(kind).alias("kind"))
        if unsupported == "drop":
            from craftmd.scoring.judge import NO_EVIDENCE

            df = df.filter(pl.col("label").is_null() | (pl.col("label") != NO_EVIDENCE))
        df = df.select(*CONVERSATION, "dimension", "scorer", "kind", "value", "status")
        frames.append(df.with_columns(pl.lit(r.id).alias("model")))  # keyed by release: two may share a display name
    if not frames:
        return pl.DataFrame(schema={"model": pl.String, **{c: pl.String for c in CONVERSATION}, "dimension": pl.String,
                                    "scorer": pl.String, "kind": pl.String, "value": pl.Float64, "status": pl.String,
                                    "category": pl.String, "meta_category": pl.String})  # fmt: skip
    df = pl.concat(frames, how="diagonal_relaxed")
    unknown = set(df["dimension"].unique().to_list()) - set(cat)
    if unknown:
        from craftmd import CraftMDError

        raise CraftMDError(f"rubric scores name dimensions not in the catalog: {sorted(unknown)[:5]}")
    return df.with_columns(pl.col("dimension").replace_strict({k: d.category for k, d in cat.items()}).alias("category"),
                           pl.col("dimension").replace_strict({k: d.meta_category for k, d in cat.items()}).alias("meta_category"))  # fmt: skip


def conversation_scores(df: pl.DataFrame) -> pl.DataFrame:
    """Per conversation: its category scores and meta-category scores on 0–100 (``level``, ``group``, ``value``)."""
    ok = df.filter(pl.col("status") == "ok").with_columns((100.0 * (pl.col("value") - 1.0) / 3.0).alias("value"))
    key = ["model", "scorer", *CONVERSATION]
    cats = ok.group_by([*key, "meta_category", "category"]).agg(pl.col("value").mean())
    metas = cats.group_by([*key, "meta_category"]).agg(pl.col("value").mean())
    return pl.concat([
        cats.select(*key, pl.lit("category").alias("level"), pl.col("category").alias("group"), "value"),
        metas.select(*key, pl.lit("meta_category").alias("level"), pl.col("meta_category").alias("group"), "value"),
    ])  # fmt: skip


def rubric(releases, *, B: int = DEFAULT_B, seed: int = DEFAULT_SEED, unsupported: str = "count", prefer: str = "auto") -> Rubric:
    """From each release's rubric rows of one scorer (:func:`craftmd.scoring.judge.standing_scorer`, ``prefer``): the
    calibrated judge (``judge-calibrated``) where there is one, else the committee's median (``judge-committee``), else the
    release's judge (the first by name), else the experts' imported ratings (``experts``, marked human) — each valid 1–4
    score is put on the 0–100 scale (``100 (s - 1) / 3``); with ``unsupported="drop"`` a judge's scores without found
    evidence (label ``no_evidence``) are left out. Per conversation, a **category**
    score is the mean of its valid dimension scores, and a **meta-category** score the mean of its
    categories' scores (each category counts once, whatever its number of dimensions); a conversation
    with no valid score in a group has no value there. Per model, a group's figure is the mean over cases
    of each case's mean over its conversations, with a 95 % case-bootstrap CI (:mod:`.bootstrap`'s float
    path, the same draws as every other metric). Failed scores are counted beside (``n_failed``), never
    folded in. ``raw`` counts the 1–4 scores (and failures) per model: the paper's Figure 4."""
    if unsupported not in UNSUPPORTED:
        from craftmd import CraftMDError

        raise CraftMDError(f"--unsupported {unsupported!r}: one of {', '.join(UNSUPPORTED)}")
    df = judge_scores(releases, unsupported, prefer)
    conv = conversation_scores(df)
    cases = conv.group_by("model", "scorer", "level", "group", "case_id").agg(pl.col("value").mean(), pl.len().alias("n_conv"))
    failed = pl.concat([
        df.filter(pl.col("status") != "ok").group_by("model", "scorer", pl.col("category").alias("group")).agg(pl.len().alias("n_failed"))
          .with_columns(pl.lit("category").alias("level")),
        df.filter(pl.col("status") != "ok").group_by("model", "scorer", pl.col("meta_category").alias("group")).agg(pl.len().alias("n_failed"))
          .with_columns(pl.lit("meta_category").alias("level")),
    ]).select("model", "scorer", "level", "group", "n_failed")  # fmt: skip
    R = Resampler(B=B, seed=seed)
    cells = []
    for (model, scorer, level, group), g in cases.sort("model", "scorer", "level", "group", "case_id").group_by(
            ["model", "scorer", "level", "group"], maintain_order=True):  # fmt: skip
        v = g["value"].to_numpy()
        cells.append(((model, scorer, level, group), R.add(v, exact=False), float(v.mean()), int(g["n_conv"].sum())))
    if cells:
        R.run()
    rows = []
    for (model, scorer, level, group), h, mean, n_conv in cells:
        n = R.n(h)
        lo, hi = R.quantiles(h)
        rows.append({"model": model, "scorer": scorer, "level": level, "group": group, "n_cases": n, "n_conversations": n_conv,
                     "mean": round(mean, 4), "ci_low": round(lo / n, 4), "ci_high": round(hi / n, 4)})  # fmt: skip
    schema = {"model": pl.String, "scorer": pl.String, "level": pl.String, "group": pl.String, "n_cases": pl.Int64,
              "n_conversations": pl.Int64, "mean": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64}  # fmt: skip
    table = pl.DataFrame(rows, schema=schema).join(failed, on=["model", "scorer", "level", "group"], how="full", coalesce=True)
    table = table.with_columns(
        pl.col("n_failed").fill_null(0), pl.col("n_cases").fill_null(0), pl.col("n_conversations").fill_null(0)
    )
    table = table.select(COLUMNS).sort("model", "level", "group")
    raw = (df.with_columns(pl.when(pl.col("status") == "ok").then(pl.col("value").round(0).cast(pl.Int64).cast(pl.String)).otherwise(pl.lit("failed"))
                           .alias("score"))
             .group_by("model", "scorer", "score").agg(pl.len().alias("n"))
             .with_columns((pl.col("n") / pl.col("n").sum().over("model")).round(6).alias("share"))
             .sort("model", "score"))  # fmt: skip
    from .judges import judge_extras

    return Rubric(
        table,
        raw,
        B,
        seed,
        df,
        judge_extras(releases) if table.height else None,
        detail_table(df, B, seed),
        unsupported,
        display={r.id: r.display for r in releases},
    )


DETAIL_COLUMNS = ["model", "scorer", "level", "group", "competency", "n_cases", "n_conversations", "mean", "ci_low", "ci_high"]


def detail_table(df: pl.DataFrame, B: int = DEFAULT_B, seed: int = DEFAULT_SEED) -> pl.DataFrame:
    """Per model, each dimension's score (``level`` dimension: MedPI's Appendix E) and each ACGME core competency's
    (``level`` competency: per conversation the mean of its valid dimension scores in that competency), on 0–100: the
    mean over cases of each case's mean over its conversations, with a 95 % case-bootstrap CI; ``competency`` gives a
    dimension's competency (:func:`craftmd.scoring.rubric.acgme`)."""
    from craftmd.scoring.rubric import acgme

    schema = {"model": pl.String, "scorer": pl.String, "level": pl.String, "group": pl.String, "competency": pl.String, "n_cases": pl.Int64,
              "n_conversations": pl.Int64, "mean": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64}  # fmt: skip
    if df.height == 0:
        return pl.DataFrame(schema=schema)
    m = acgme()
    ok = df.filter(pl.col("status") == "ok").with_columns((100.0 * (pl.col("value") - 1.0) / 3.0).alias("value"),
                                                          pl.col("dimension").replace_strict(m["of"]).alias("competency"))  # fmt: skip
    key = ["model", "scorer", *CONVERSATION]
    conv = pl.concat([
        ok.select(*key, pl.lit("dimension").alias("level"), pl.col("dimension").alias("group"), "competency", "value"),
        ok.group_by([*key, "competency"]).agg(pl.col("value").mean())
          .select(*key, pl.lit("competency").alias("level"), pl.col("competency").alias("group"), "competency", "value"),
    ])  # fmt: skip
    cases = conv.group_by("model", "scorer", "level", "group", "competency", "case_id").agg(
        pl.col("value").mean(), pl.len().alias("n_conv")
    )
    R = Resampler(B=B, seed=seed)
    cells = []
    for k, g in cases.sort("model", "scorer", "level", "group", "case_id").group_by(["model", "scorer", "level", "group", "competency"],
                                                                                      maintain_order=True):  # fmt: skip
        v = g["value"].to_numpy()
        cells.append((k, R.add(v, exact=False), float(v.mean()), int(g["n_conv"].sum())))
    if cells:
        R.run()
    rows = []
    for (model, scorer, level, group, comp), h, mean, n_conv in cells:
        n = R.n(h)
        lo, hi = R.quantiles(h)
        rows.append({"model": model, "scorer": scorer, "level": level, "group": group, "competency": comp, "n_cases": n,
                     "n_conversations": n_conv, "mean": round(mean, 4), "ci_low": round(lo / n, 4), "ci_high": round(hi / n, 4)})  # fmt: skip
    return pl.DataFrame(rows, schema=schema).sort("model", "level", "group")


def packet_cells(dataset_dir) -> pl.DataFrame | None:
    """case_id, reason, objective of a built medpi folder's packets (None without a folder or its packets config)."""
    if dataset_dir is None:
        return None
    import pyarrow.parquet as pq

    from craftmd.dataset import config_file

    path = config_file(dataset_dir, "packets")
    if not path.exists():
        return None
    return pl.from_arrow(pq.read_table(path, columns=["case_id", "reason", "objective"]))


def by_encounter(r: Rubric | None, packets: pl.DataFrame | None) -> pl.DataFrame:
    """MedPI's view by encounter: per model, a conversation's overall score (the mean of its meta-category scores, each
    meta-category once) averaged over cases with a 95 % case-bootstrap CI, overall (``level`` all), per encounter
    reason, per objective and per reason × objective (the paper's heat map); failed dimension scores counted beside.
    Empty without packets (they give each case's reason and objective) or judged conversations."""
    schema = {"model": pl.String, "scorer": pl.String, "level": pl.String, "reason": pl.String, "objective": pl.String,
              "n_cases": pl.Int64, "n_conversations": pl.Int64, "n_failed": pl.Int64, "mean": pl.Float64, "ci_low": pl.Float64,
              "ci_high": pl.Float64}  # fmt: skip
    if packets is None or r is None or r.scores is None or r.scores.height == 0:
        return pl.DataFrame(schema=schema)
    df = r.scores.join(packets, on="case_id", how="inner")
    conv = conversation_scores(df).filter(pl.col("level") == "meta_category")
    key = ["model", "scorer", *CONVERSATION]
    overall = conv.group_by(key).agg(pl.col("value").mean()).join(packets, on="case_id")
    failed = df.filter(pl.col("status") != "ok")
    levels = {"all": [], "reason": ["reason"], "objective": ["objective"], "reason_objective": ["reason", "objective"]}
    R = Resampler(B=r.B, seed=r.seed)
    cells, fails = [], {}
    for level, by in levels.items():
        cases = overall.group_by("model", "scorer", *by, "case_id").agg(pl.col("value").mean(), pl.len().alias("n_conv"))
        for k, g in cases.sort("model", "scorer", *by, "case_id").group_by(["model", "scorer", *by], maintain_order=True):
            v = g["value"].to_numpy()
            cells.append(((level, *k), by, R.add(v, exact=False), float(v.mean()), int(g["n_conv"].sum())))
        for k, g in failed.group_by(["model", "scorer", *by]):
            fails[(level, *k)] = g.height
    if cells:
        R.run()
    rows = []
    seen = set()
    for key_, by, h, mean, n_conv in cells:
        lo, hi = R.quantiles(h)
        n = R.n(h)
        level, model, scorer, *vals = key_
        at = dict(zip(by, vals))
        seen.add(key_)
        rows.append({"model": model, "scorer": scorer, "level": level, "reason": at.get("reason"), "objective": at.get("objective"),
                     "n_cases": n, "n_conversations": n_conv, "n_failed": fails.get(key_, 0), "mean": round(mean, 4),
                     "ci_low": round(lo / n, 4), "ci_high": round(hi / n, 4)})  # fmt: skip
    for key_, nf in fails.items():  # cells where nothing could be scored still show their failures
        if key_ not in seen:
            level, model, scorer, *vals = key_
            at = dict(zip(levels[level], vals))
            rows.append({"model": model, "scorer": scorer, "level": level, "reason": at.get("reason"), "objective": at.get("objective"),
                         "n_cases": 0, "n_conversations": 0, "n_failed": nf, "mean": None, "ci_low": None, "ci_high": None})  # fmt: skip
    order = {lv: i for i, lv in enumerate(levels)}
    return (pl.DataFrame(rows, schema=schema).with_columns(pl.col("level").replace_strict(order, return_dtype=pl.Int64).alias("_o"))
            .sort("model", "scorer", "_o", "reason", "objective", nulls_last=False).drop("_o"))  # fmt: skip


def write_tables(r: Rubric, out: Path) -> list[Path]:
    """Written to ``tables/rubric.csv`` and ``tables/rubric_raw.csv``, ``tables/rubric_detail.csv`` (every dimension, the
    paper's Appendix E, and every ACGME core competency, per model with case-bootstrap CIs: :func:`detail_table`) and the
    judges' flags and evidence (:mod:`.judges`); figures ``rubric_meta.png`` (the meta-category profile, the paper's
    Figure 2), ``rubric_categories.png`` (the category heat map, Figure 3), ``rubric_dimensions.png`` (every dimension)
    and ``rubric_raw.png`` (the raw score distribution, Figure 4)."""
    tables = Path(out) / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    paths = [tables / "rubric.csv", tables / "rubric_raw.csv"]
    csv_safe(r.table).write_csv(paths[0])
    csv_safe(r.raw).write_csv(paths[1])
    if r.detail is not None and r.detail.height:  # per dimension (Appendix E) and per ACGME competency
        paths.append(tables / "rubric_detail.csv")
        csv_safe(r.detail).write_csv(paths[-1])
    if r.sensitivity:  # the drift of the profiles under other judge settings (craftmd judge-sensitivity)
        paths.append(tables / "judge_sensitivity.csv")
        csv_safe(pl.DataFrame(r.sensitivity["rows"], infer_schema_length=None)).write_csv(paths[-1])
    if r.extras:  # flags (when the judges were asked for them) and the evidence found
        from .judges import TABLES

        for name in TABLES:
            if name != "judge_evidence" and r.extras["judge_flags"].height == 0:
                continue
            paths.append(tables / f"{name}.csv")
            csv_safe(r.extras[name]).write_csv(paths[-1])
    return paths


def write_figures(r: Rubric, out: Path) -> list[Path]:
    """The meta-category profile, the category heat map and the raw score distribution (none when nothing was judged)."""
    if r.table.height == 0:
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    models = sorted(r.table["model"].unique().to_list(), key=lambda m: (r.name(m), m))
    paths = [
        _meta_figure(r, models, out),
        _category_figure(r, models, out),
        _dimension_figure(r, models, out),
        _raw_figure(r, models, out),
    ]
    return [p for p in paths if p is not None]


def _meta_figure(r: Rubric, models: list[str], out: Path) -> Path:
    """The meta-category profile: each model's mean per meta-category with its 95% CI."""
    from craftmd.scoring.rubric import META_CATEGORIES

    from .figures import _save, plt

    meta = r.table.filter(pl.col("level") == "meta_category", pl.col("mean").is_not_null())
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(len(models), 1)
    x = np.arange(len(META_CATEGORIES))
    for j, m in enumerate(models):
        rows = {
            g: (mu, lo, hi)
            for g, mu, lo, hi in meta.filter(pl.col("model") == m).select("group", "mean", "ci_low", "ci_high").iter_rows()
        }
        mu = [rows[g][0] if g in rows else np.nan for g in META_CATEGORIES]
        err = [
            [rows[g][0] - rows[g][1] if g in rows else 0 for g in META_CATEGORIES],
            [rows[g][2] - rows[g][0] if g in rows else 0 for g in META_CATEGORIES],
        ]
        ax.bar(
            x + (j - (len(models) - 1) / 2) * width, mu, width, yerr=err, capsize=2, label=r.name(m), error_kw={"elinewidth": 0.8}
        )
    ax.set_xticks(x, [textwrap.fill(g, 14) for g in META_CATEGORIES], fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_ylabel("normalised score (0-100)")
    ax.legend(fontsize=7, frameon=False)
    ax.set_title("Rubric profile by meta-category (95% case-bootstrap CI)", fontsize=10, loc="left")
    fig.tight_layout()
    return _save(fig, out / "rubric_meta.png")


def _category_figure(r: Rubric, models: list[str], out: Path) -> Path:
    """The category heat map: models x categories."""
    from craftmd.scoring.rubric import load_catalog

    from .figures import _save, plt

    cats = list(load_catalog().categories)
    cat = r.table.filter(pl.col("level") == "category")
    grid = np.full((len(models), len(cats)), np.nan)
    for m, g, mu in cat.select("model", "group", "mean").iter_rows():
        if mu is not None:
            grid[models.index(m), cats.index(g)] = mu
    fig, ax = plt.subplots(figsize=(12, 3.2 + 0.45 * len(models)))
    im = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(cats)), cats, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(models)), [r.name(m) for m in models], fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.02)
    ax.set_title("Rubric categories (normalised 0-100; blank: not judged)", fontsize=10, loc="left")
    fig.tight_layout()
    return _save(fig, out / "rubric_categories.png")


def _dimension_figure(r: Rubric, models: list[str], out: Path) -> Path | None:
    """MedPI's Appendix E as a heat map: dimensions (rows, by category) x models (None without dimension rows)."""
    from craftmd.scoring.rubric import load_catalog

    from .figures import _save, plt

    dims = r.detail.filter(pl.col("level") == "dimension") if r.detail is not None else None
    if dims is None or not dims.height:
        return None
    ids = [d.id for d in load_catalog().dimensions if d.id in set(dims["group"].to_list())]
    grid = np.full((len(ids), len(models)), np.nan)
    for m, g, mu in dims.select("model", "group", "mean").iter_rows():
        grid[ids.index(g), models.index(m)] = mu
    fig, ax = plt.subplots(figsize=(3 + 0.9 * len(models), 1.5 + 0.16 * len(ids)))
    im = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    ax.set_yticks(range(len(ids)), [i.replace("_", " ") for i in ids], fontsize=5)
    ax.set_xticks(range(len(models)), [r.name(m) for m in models], rotation=45, ha="right", fontsize=7)
    fig.colorbar(im, ax=ax, fraction=0.04)
    ax.set_title("Rubric dimensions (normalised 0-100; blank: not judged)", fontsize=9, loc="left")
    fig.tight_layout()
    return _save(fig, out / "rubric_dimensions.png")


def _raw_figure(r: Rubric, models: list[str], out: Path) -> Path:
    """The raw 1-4 score distribution per model (failed: no valid score)."""
    from .figures import _save, plt

    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(models) + 2), 3.5))
    levels = ["1", "2", "3", "4", "failed"]
    colors = {"1": "#d7191c", "2": "#fdae61", "3": "#a6d96a", "4": "#1a9641", "failed": "#999999"}
    bottom = np.zeros(len(models))
    for s in levels:
        share = [dict(r.raw.filter(pl.col("model") == m).select("score", "share").iter_rows()).get(s, 0.0) for m in models]
        ax.bar(range(len(models)), share, bottom=bottom, color=colors[s], label=s)
        bottom += np.array(share)
    ax.set_xticks(range(len(models)), [r.name(m) for m in models], fontsize=8)
    ax.set_ylabel("share of dimension scores")
    ax.set_ylim(0, 1.18)
    ax.legend(fontsize=7, frameon=False, ncol=5, loc="upper center")
    ax.set_title("Raw 1-4 scores per model (failed: no valid score)", fontsize=10, loc="left")
    fig.tight_layout()
    return _save(fig, out / "rubric_raw.png")


def page_section(r: Rubric | None) -> dict | None:
    """What the page shows: the meta-category profile per model, failures counted."""
    if r is None or r.table.height == 0:
        return None
    from craftmd.scoring.rubric import META_CATEGORIES

    meta = r.table.filter(pl.col("level") == "meta_category")
    rows = []
    for m in sorted(meta["model"].unique().to_list(), key=lambda m: (r.name(m), m)):
        got = {
            g: (mu, lo, hi)
            for g, mu, lo, hi in meta.filter(pl.col("model") == m).select("group", "mean", "ci_low", "ci_high").iter_rows()
        }
        failed = int(r.raw.filter(pl.col("model") == m, pl.col("score") == "failed")["n"].sum())
        total = int(r.raw.filter(pl.col("model") == m)["n"].sum())
        kinds = (
            r.scores.filter(pl.col("model") == m)["kind"].unique().to_list()
            if r.scores is not None and "kind" in r.scores.columns
            else []
        )
        rows.append({"model": r.name(m), "release": m, "scorer": meta.filter(pl.col("model") == m)["scorer"][0], "kind": kinds[0] if len(kinds) == 1 else "judge",
                     "failed": failed, "total": total,
                     "cells": [None if got.get(g, (None,))[0] is None else
                               f"{got[g][0]:.0f} ({got[g][1]:.0f}–{got[g][2]:.0f})" for g in META_CATEGORIES]})  # fmt: skip
    from .judges import page_section as judges_section

    from craftmd.scoring.rubric import acgme

    comps = acgme()["competencies"]
    detail = r.detail if r.detail is not None else pl.DataFrame(schema={c: pl.String for c in DETAIL_COLUMNS})
    comp_rows = []
    for m in sorted(detail["model"].unique().to_list(), key=lambda m: (r.name(m), m)):
        got = {g: (mu, lo, hi) for g, mu, lo, hi in detail.filter(pl.col("model") == m, pl.col("level") == "competency")
               .select("group", "mean", "ci_low", "ci_high").iter_rows()}  # fmt: skip
        comp_rows.append(
            {
                "model": r.name(m),
                "release": m,
                "cells": [f"{got[c][0]:.0f} ({got[c][1]:.0f}–{got[c][2]:.0f})" if c in got else None for c in comps],
            }
        )
    dim_rows = [{"dimension": x["group"], "competency": comps[x["competency"]], "model": r.name(x["model"]), "mean": x["mean"], "ci_low": x["ci_low"],
                 "ci_high": x["ci_high"], "n_cases": x["n_cases"]} for x in detail.filter(pl.col("level") == "dimension").to_dicts()]  # fmt: skip
    return {"meta_categories": list(META_CATEGORIES), "rows": rows, "B": r.B, "seed": r.seed, "judges": judges_section(r.extras, r.name),
            "sensitivity": None if not r.sensitivity else {
                "rows": [{**x, "model": r.name(x["model"]), "release": x["model"]} for x in r.sensitivity["rows"] if x["level"] == "overall"],
                "kendall_tau": r.sensitivity["kendall_tau"],
                "n": r.sensitivity["n"], "other_judge": r.sensitivity["other_judge"]},
            "competencies": list(comps.values()), "competency_rows": comp_rows, "dimension_rows": dim_rows,
            "unsupported": r.unsupported}  # fmt: skip


__all__ = ["rubric", "judge_scores", "conversation_scores", "write_tables", "write_figures", "page_section", "Rubric"]
