"""MedPI's patient-led encounters: the tables behind the page's encounters section, the section, its figures and the
task's row on the board per task (:data:`ANALYSIS`: what the task brings to an analysis).

Read from every release of the ``encounters`` task (:mod:`craftmd.tasks.encounters`), judged or not, over their own
tables (:func:`craftmd.analysis.runner.connect_tables`):

* ``encounter_endings`` — how each encounter ended and who closed it, crossed with the closure classifier's label
  (``sql/encounter_endings.sql``); :func:`reasonable_closure` reads the share reasonably closed from it, for the
  section and the board alike;
* ``encounter_length`` — messages per encounter: median, middle 60 %, mean, range (``sql/encounter_length.sql``);
* ``encounter_affect`` — the AI patient's mean valence and arousal per turn, and its strongest emotions
  (``sql/encounter_affect.sql``);
* ``rubric_by_encounter`` — when the encounters were judged and the packets are at hand: the overall rubric score by
  encounter reason, objective and reason × objective with CIs and failure counts (:func:`.rubric.by_encounter`).

Failed encounters, failed emotion steps and failed judge scores are counted, never averaged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from craftmd.analysis import runner
from craftmd.tasks.base import Analysis, Measure

TASK = "encounters"
#: Its queries (``sql/<name>.sql`` beside this file).
SQL = Path(__file__).parent / "sql"
TABLES = ("encounter_endings", "encounter_length", "encounter_affect", "rubric_by_encounter")
VIEWS = {"encounter_conversations": "conversations", "patient_states": "patient_states", "closures": "closures"}


def encounter_tables(releases, packets_dir=None, rubric=None) -> dict[str, pl.DataFrame]:
    """The tables of the ``encounters`` releases among ``releases``; ``{}`` when there is none."""
    mine = [r for r in releases if r.manifest.task == TASK]
    if not mine:
        return {}
    con = runner.connect_tables(mine, VIEWS)
    out = {name: pl.from_arrow(runner.run(con, name, SQL)) for name in TABLES[:3]}
    from craftmd.analysis.rubric import by_encounter, packet_cells

    out["rubric_by_encounter"] = by_encounter(rubric, packet_cells(packets_dir))
    return out


def valid_affect(tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """The affect rows with a valid emotion state (none when every emotion step failed: then no affect figure)."""
    return tables["encounter_affect"].filter(pl.col("n_states") > 0)


def write_figures(tables: dict[str, pl.DataFrame], display: dict[str, str], out: Path) -> list[Path]:
    """``encounter_affect.png`` (valence and arousal per patient turn, per model) and, when the encounters were judged,
    ``rubric_reason_objective.png`` (MedPI's reason × objective heat map, one panel per model)."""
    if not tables:
        return []
    from craftmd.scoring.rubric import OBJECTIVES

    from matplotlib.ticker import MaxNLocator

    from craftmd.analysis.figures import _save, plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    affect = valid_affect(tables)
    if affect.height:  # no valid state (every emotion step failed): no figure, the page says so
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for m in sorted(affect["model"].unique().to_list()):
            g = affect.filter(pl.col("model") == m).sort("turn")
            for ax, col in zip(axes, ("mean_valence", "mean_arousal")):
                ax.plot(g["turn"].to_numpy(), g[col].to_numpy(), marker="o", ms=3, label=display.get(m, m))
        for ax, (title, lim) in zip(axes, (("Valence (-10..10)", (-10, 10)), ("Arousal (0..10)", (0, 10)))):
            ax.set_ylim(*lim)
            ax.set_xlabel("patient turn")
            ax.set_title(title, fontsize=10, loc="left")
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlim(0.5, max(affect["turn"].max() or 1, 1) + 0.5)
        axes[0].axhline(0, color="#888", lw=0.8)
        axes[1].legend(fontsize=7, frameon=False)
        fig.suptitle("The AI patient's affect over the turns (valid emotion steps only)", fontsize=10)
        fig.tight_layout()
        paths.append(_save(fig, out / "encounter_affect.png"))

    cells = tables["rubric_by_encounter"].filter(pl.col("level") == "reason_objective")
    if cells.height:
        models = sorted(cells["model"].unique().to_list())
        reasons = sorted(cells["reason"].unique().to_list())
        objectives = [o for o in OBJECTIVES if o in set(cells["objective"].to_list())]
        fig, axes = plt.subplots(1, len(models), figsize=(3.2 + 1.3 * len(objectives) * len(models), 2.6 + 0.45 * len(reasons)),
                                 squeeze=False, layout="constrained")  # fmt: skip
        for ax, m in zip(axes[0], models):
            grid = np.full((len(reasons), len(objectives)), np.nan)
            for r, o, mu in cells.filter(pl.col("model") == m).select("reason", "objective", "mean").iter_rows():
                if mu is not None:
                    grid[reasons.index(r), objectives.index(o)] = mu
            im = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
            for i in range(len(reasons)):
                for j in range(len(objectives)):
                    if np.isfinite(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(objectives)), [o.replace("_", " ") for o in objectives], rotation=40, ha="right", fontsize=7)
            ax.set_yticks(range(len(reasons)), [r.replace("_", " ") for r in reasons], fontsize=7)
            ax.set_title(m, fontsize=9)
        fig.colorbar(im, ax=axes[0].tolist(), fraction=0.03)
        fig.suptitle("Overall rubric score by reason × objective\n(0-100; blank: not judged)", fontsize=10)
        paths.append(_save(fig, out / "rubric_reason_objective.png"))
    return paths


__all__ = [
    "encounter_tables",
    "write_figures",
    "reasonable_closure",
    "page_section",
    "tables",
    "board",
    "ANALYSIS",
    "TABLES",
    "TASK",
]


ENDED_ORDER = ("doctor_closed", "patient_closed", "max_messages", "refusal", "error")
CLOSURE_ORDER = ("reasonable", "not_reasonable", "failed", "missing")


def reasonable_closure(endings: pl.DataFrame) -> dict[str, dict]:
    """The metric ``reasonable_closure`` (:mod:`craftmd.metrics`) per release, from ``encounter_endings``: the share
    of the encounters the closure classifier labelled that it found reasonably closed. Its denominator is the
    labelled encounters, whoever or whatever ended them (MedPI labels every conversation, truncated ones included);
    a label that failed or is missing is no verdict on the doctor: counted apart (``n_failed``), never in the share.

    release -> {n (every encounter), labelled, reasonable, n_failed, share (None when nothing was labelled)}."""
    out = {}
    for rel in sorted(set(endings["model"].to_list())):
        e = endings.filter(pl.col("model") == rel)
        count = {k: int(e.filter(pl.col("closure") == k)["n"].sum()) for k in CLOSURE_ORDER}
        n, labelled = int(e["n"].sum()), count["reasonable"] + count["not_reasonable"]
        out[rel] = {"n": n, "labelled": labelled, "reasonable": count["reasonable"], "n_failed": n - labelled,
                    "share": round(count["reasonable"] / labelled, 6) if labelled else None}  # fmt: skip
    return out


def page_section(a, v) -> dict | None:
    """What the page's encounters section shows (None without an encounters release)."""
    t = a.tasks.get(TASK)
    if not t:
        return None
    ends, length, affect = t["encounter_endings"], t["encounter_length"], t["encounter_affect"]
    releases = sorted(set(ends["model"].to_list()), key=v.display)
    closed = reasonable_closure(ends)
    rows = []
    for m in releases:
        e = ends.filter(pl.col("model") == m)
        total = int(e["n"].sum())
        by_end = {k: int(e.filter(pl.col("ended") == k)["n"].sum()) for k in ENDED_ORDER}
        by_closure = {k: int(e.filter(pl.col("closure") == k)["n"].sum()) for k in CLOSURE_ORDER}
        ln = length.filter(pl.col("model") == m, pl.col("ended") == "all")
        ln = ln.row(0, named=True) if ln.height else None
        mine = affect.filter(pl.col("model") == m)
        af = mine.filter(pl.col("n_states") > 0).sort("turn")
        first = af.row(0, named=True) if af.height else None
        last = af.row(af.height - 1, named=True) if af.height else None
        rows.append({"release": m, "display": v.display(m), "n": total, "ended": [by_end[k] for k in ENDED_ORDER],
                     "closure": [by_closure[k] for k in CLOSURE_ORDER], "closed": closed[m], "length": ln, "first": first, "last": last,
                     "affect_failed": int(mine["n_failed"].sum()), "affect_states": int(mine["n_states"].sum())})  # fmt: skip
    rub = t["rubric_by_encounter"]
    objectives = rub.filter(pl.col("level") == "objective").sort("model", "objective").to_dicts()
    reasons = rub.filter(pl.col("level") == "reason").sort("model", "reason").to_dicts()
    overall = rub.filter(pl.col("level") == "all").to_dicts()
    scored = {r["model"]: r for r in rub.filter(pl.col("level") == "all", pl.col("mean").is_not_null()).iter_rows(named=True)}
    for r in rows:
        r["rubric"] = scored.get(r["release"])  # keyed by release: two releases may share a display name
    # led by the overall rubric score where the encounters were judged, else by the reasonably closed share (of the labelled)
    lead = max(rows, key=lambda r: (r["rubric"] is not None, r["rubric"]["mean"] if r["rubric"] else (r["closed"]["share"] or -1)),
               default=None)  # fmt: skip
    return {
        "rows": rows,
        "ended": list(ENDED_ORDER),
        "closures": list(CLOSURE_ORDER),
        "lead": lead,
        "overall": overall,
        "objectives": objectives,
        "reasons": reasons,
        "heatmap": rub.filter(pl.col("level") == "reason_objective").height > 0,
        "affect_figure": valid_affect(t).height > 0,
        "affect_failed": sum(r["affect_failed"] for r in rows),
    }


def tables(inputs) -> dict[str, pl.DataFrame]:
    """The task's tables from an analysis' inputs (:class:`craftmd.analysis.tables.TaskInputs`): its releases, judged or not."""
    return encounter_tables(inputs.releases, inputs.packets, inputs.rubric)


def figures(a, v, out: Path) -> list[Path]:
    """The task's figures (:func:`write_figures`), its releases under their display names."""
    return write_figures(a.tasks.get(TASK, {}), {m: v.display(m) for m in v.release_info}, out)


def board(a, v) -> list[dict]:
    """The task's rows on the board per task: each release's overall rubric score (0-100, the mean of a conversation's
    meta-category scores) when judged, and the share of its labelled encounters reasonably closed."""
    t = a.tasks.get(TASK)
    if not t:
        return []
    rows = []
    overall = t["rubric_by_encounter"].filter(pl.col("level") == "all")
    for r in overall.iter_rows(named=True):  # the rubric's tables are keyed by release id
        if r["model"] in v.release_info and v.release_info[r["model"]]["task"] == TASK:
            rows.append(dict(release=r["model"], measure="rubric_overall", value=r["mean"], ci_low=r["ci_low"], ci_high=r["ci_high"],
                             n_cases=r["n_cases"], n_failed=r["n_failed"]))  # fmt: skip
    for rel, c in reasonable_closure(t["encounter_endings"]).items():
        rows.append(dict(release=rel, measure="reasonable_closure", value=c["share"], n_cases=c["n"], n_failed=c["n_failed"]))
    return rows


#: What the encounters task brings to an analysis.
ANALYSIS = Analysis(
    unscored=True,
    tables=tables,
    figures=figures,
    section=page_section,
    template="section",
    nav="Encounters",
    anchor="encounters",
    measures=(
        Measure("rubric_overall", "Overall rubric score (0-100)", percent=False),
        Measure("reasonable_closure", "Reasonably closed (of the labelled encounters)"),
    ),
    board=board,
    label="MedPI encounters",
)
