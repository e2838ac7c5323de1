"""Figures in the manner of the paper (matplotlib, Agg, deterministic PNGs).

* ``settings.png``: per model, the four settings' accuracy with 95 % CI error bars,
  MCQ and FRQ side by side (Nature Medicine 2025, Fig. 2);
* ``specialty_heatmap.png``: conversational FRQ accuracy per specialty and model;
* ``mcq_frq_drop.png``: how far accuracy falls from the four-choice MCQ to free response;
* ``mcq_rules.png``: the ``paper`` and ``strict`` MCQ rules side by side;
* ``history_coverage_curve.png``: how much of the case the patient has revealed after each
  tenth of the doctor's turns, per model (the consultation framework's turn analysis);
* ``history_coverage_accuracy.png``: multi-turn and vignette FRQ accuracy per quintile of coverage;
* ``history_complexity.png``: coverage and multi-turn FRQ accuracy per tertile of the case's length.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .view import SETTING_LABELS, UPSTREAM_SETTINGS, View  # noqa: E402

PNG = {"metadata": {"Software": None}, "dpi": 110}
COLORS = {"vignette": "#4C72B0", "multiturn": "#DD8452", "singleturn": "#55A868", "summarized": "#8172B3"}


def _save(fig, path: Path) -> Path:
    fig.savefig(path, **PNG)
    plt.close(fig)
    return path


#: Beyond this many models, a figure that draws one bar, column, line or panel per model draws the first :data:`TOP` of
#: the board's ranking and says how many it leaves out (:func:`shown`), and ``settings.png`` shows every model's
#: accuracy as a distribution (:func:`settings_distribution`): a board of a thousand models draws figures of a size
#: that does not grow with it. The six upstream releases are far below it.
MAX_MODELS = 30
TOP = 20


def shown(models: list, title: str = "") -> tuple[list, str]:
    """The models a per-model figure draws (all, up to :data:`MAX_MODELS`; else the first :data:`TOP`, the board's
    ranking's) and ``title`` with what is left out said, when anything is."""
    if len(models) <= MAX_MODELS:
        return models, title
    return models[:TOP], f"{title} (the first {TOP} of {len(models)} models by rank)"


def settings_distribution(v: View, path: Path) -> Path:
    """A board above :data:`MAX_MODELS`: per format, each setting's accuracy over every model as a histogram, the
    leader's marked."""
    models = v.models
    fmts = [("mcq4", "MCQ (4 choices, paper rule)"), ("frq", "Free response")]
    fig, axes = plt.subplots(len(fmts), 1, figsize=(9, 7), sharex=True)
    bins = np.linspace(0, 1, 51)
    for ax, (fmt, title) in zip(axes, fmts):
        for s in UPSTREAM_SETTINGS:
            acc = [r["accuracy"] for m in models if (r := v.cell(m, s, fmt))]
            if acc:
                ax.hist(
                    acc, bins=bins, histtype="step", linewidth=1.4, color=COLORS[s], label=f"{SETTING_LABELS[s]} ({len(acc)})"
                )
        lead = v.cell(models[0], "vignette", fmt)
        if lead:
            ax.axvline(lead["accuracy"], color="#333333", linewidth=0.8, linestyle=":")
            ax.text(lead["accuracy"], ax.get_ylim()[1] * 0.95, f" {v.display(models[0])}", fontsize=7, va="top")
        ax.set_ylabel("models")
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, frameon=False, loc="upper right")
    axes[-1].set_xlim(0, 1)
    axes[-1].set_xlabel("accuracy (the vignette's leader marked)")
    fig.suptitle(f"Accuracy by setting across {len(models)} models", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def settings_bars(v: View, path: Path) -> Path:
    if len(v.models) > MAX_MODELS:
        return settings_distribution(v, path)
    models = v.models
    fmts = [("mcq4", "MCQ (4 choices, paper rule)"), ("frq", "Free response")]
    fig, axes = plt.subplots(len(fmts), 1, figsize=(max(7, 1.7 * len(models) + 2), 7), sharex=True)
    width = 0.8 / len(UPSTREAM_SETTINGS)
    x = np.arange(len(models))
    for ax, (fmt, title) in zip(np.atleast_1d(axes), fmts):
        for j, s in enumerate(UPSTREAM_SETTINGS):
            acc, lo, hi = [], [], []
            for m in models:
                r = v.cell(m, s, fmt)
                acc.append(r["accuracy"] if r else np.nan)
                lo.append(r["accuracy"] - r["ci_low"] if r else 0)
                hi.append(r["ci_high"] - r["accuracy"] if r else 0)
            ax.bar(
                x + (j - 1.5) * width,
                acc,
                width,
                yerr=[lo, hi],
                capsize=2,
                label=SETTING_LABELS[s],
                color=COLORS[s],
                error_kw={"elinewidth": 0.8},
            )
        ax.set_ylim(0, 1)
        ax.set_ylabel("accuracy")
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    np.atleast_1d(axes)[0].legend(ncol=4, fontsize=8, loc="upper right", frameon=False)
    np.atleast_1d(axes)[-1].set_xticks(x, [v.display(m) for m in models])
    fig.suptitle("Accuracy by setting (95% bootstrap CI over cases)", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def specialty_heatmap(v: View, path: Path, setting: str = "multiturn", fmt: str = "frq") -> Path:
    models, note = shown(v.models)
    specs = v.specialties
    grid = np.full((len(specs), len(models)), np.nan)
    for i, sp in enumerate(specs):
        for j, m in enumerate(models):
            r = v.cell(m, setting, fmt, group_by="specialty", group=sp)
            if r:
                grid[i, j] = r["accuracy"]
    fig, ax = plt.subplots(figsize=(1.3 * len(models) + 3.5, 0.42 * len(specs) + 1.6))
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(0.5, np.nanmax(grid) if np.isfinite(grid).any() else 1), aspect="auto")
    for i in range(len(specs)):
        for j in range(len(models)):
            if np.isfinite(grid[i, j]):
                ax.text(
                    j,
                    i,
                    f"{grid[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if grid[i, j] < 0.3 else "black",
                )
    ax.set_xticks(range(len(models)), [v.display(m) for m in models], fontsize=8)
    ax.set_yticks(range(len(specs)), [f"{s} (n={v.n_cases(s)})" for s in specs], fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.04, label="accuracy")
    ax.set_title(f"{SETTING_LABELS[setting]} {v.format_label(fmt)} accuracy by specialty{note}", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def mcq_frq_drop(v: View, path: Path) -> Path:
    models, title = shown(v.models, "Drop from four-choice MCQ (paper rule) to free response")
    fig, ax = plt.subplots(figsize=(max(7, 1.7 * len(models) + 2), 3.8))
    width = 0.8 / len(UPSTREAM_SETTINGS)
    x = np.arange(len(models))
    for j, s in enumerate(UPSTREAM_SETTINGS):
        drops = []
        for m in models:
            a, b = v.cell(m, s, "mcq4"), v.cell(m, s, "frq")
            drops.append(a["accuracy"] - b["accuracy"] if a and b else np.nan)
        ax.bar(x + (j - 1.5) * width, drops, width, label=SETTING_LABELS[s], color=COLORS[s])
    ax.set_xticks(x, [v.display(m) for m in models])
    ax.set_ylabel("MCQ - FRQ accuracy")
    ax.set_title(title, fontsize=10, loc="left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def mcq_rules(v: View, path: Path) -> Path:
    models, title = shown([m for m in v.models if v.cell(m, "vignette", "mcq4", grader="paper")],
                          "MCQ accuracy under the paper rule and the strict rule")  # fmt: skip
    fig, axes = plt.subplots(1, len(UPSTREAM_SETTINGS), figsize=(12, 3.4), sharey=True)
    x = np.arange(len(models))
    for ax, s in zip(axes, UPSTREAM_SETTINGS):
        for k, (rule, color) in enumerate((("paper", "#999999"), ("strict", "#C44E52"))):
            vals = [(v.cell(m, s, "mcq4", grader=rule) or {}).get("accuracy", np.nan) for m in models]
            ax.bar(x + (k - 0.5) * 0.38, vals, 0.38, label=rule, color=color)
        ax.set_title(SETTING_LABELS[s], fontsize=9)
        ax.set_xticks(x, [v.display(m) for m in models], rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].set_ylabel("MCQ accuracy")
    axes[0].legend(fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


MODEL_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")


def history_coverage_curve(v: View, path: Path) -> Path | None:
    from craftmd.scoring.history import SHARES

    models, title = shown([m for m in v.models if v.history_cell(m, "patient_info_recall")],
                          "How much of the case the patient has revealed, turn by turn (95% CI)")  # fmt: skip
    if not models:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, m in enumerate(models):
        rows = [v.history_cell(m, f"patient_info_recall_at_{s}") for s in SHARES]
        mean = [r["mean"] if r else np.nan for r in rows]
        lo = [r["ci_low"] if r else np.nan for r in rows]
        hi = [r["ci_high"] if r else np.nan for r in rows]
        c = MODEL_COLORS[k % len(MODEL_COLORS)]
        ax.plot(SHARES, mean, marker="o", ms=3, color=c, label=v.display(m))
        ax.fill_between(SHARES, lo, hi, color=c, alpha=0.2, linewidth=0)
    ax.set_xticks(SHARES, [f"{s}%" for s in SHARES])
    ax.set_xlabel("share of the doctor's turns")
    ax.set_ylabel("patient_info_recall")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10, loc="left")
    fig.tight_layout()
    return _save(fig, path)


def history_coverage_accuracy(v: View, path: Path) -> Path | None:
    cov = v.a.history_by_coverage
    models, title = shown([m for m in v.models if v.grader_for(m, "frq") and cov.filter(cov["model"] == m).height],
                          "Free-response accuracy by how much of the case the conversation revealed (quintiles of patient_info_recall)")  # fmt: skip
    if not models:
        return None
    fig, axes = plt.subplots(1, len(models), figsize=(2.6 * len(models) + 1, 3.6), sharey=True)
    for ax, m in zip(np.atleast_1d(axes), models):
        g = cov.filter(cov["model"] == m, cov["grader"] == v.grader_for(m, "frq")).sort("quintile")
        q = g["quintile"].to_numpy()
        for col, label, color, style in (
            ("multiturn", "multi-turn", COLORS["multiturn"], "-"),
            ("vignette", "vignette", COLORS["vignette"], "--"),
        ):
            acc = g[f"{col}_accuracy"].to_numpy()
            err = [acc - g[f"{col}_ci_low"].to_numpy(), g[f"{col}_ci_high"].to_numpy() - acc]
            ax.errorbar(q, acc, yerr=err, color=color, linestyle=style, marker="o", ms=3, capsize=2, label=label, elinewidth=0.8)
        ax.set_title(v.display(m), fontsize=9)
        ax.set_xticks(q)
        ax.set_xlabel("coverage quintile")
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
        ax.set_axisbelow(True)
    np.atleast_1d(axes)[0].set_ylabel("FRQ accuracy")
    np.atleast_1d(axes)[0].legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def history_complexity(v: View, path: Path) -> Path | None:
    cx = v.a.history_by_complexity
    models, title = shown([m for m in v.models if cx.filter(cx["model"] == m).height],
                          "By the length of the case's history (tertiles of its words)")  # fmt: skip
    if not models:
        return None
    panels = (("patient_info_recall", None, "patient_info_recall"), ("frq_accuracy_multiturn", "frq", "multi-turn FRQ accuracy"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(models)
    for ax, (measure, fmt, label) in zip(axes, panels):
        for k, m in enumerate(models):
            g = cx.filter(cx["model"] == m, cx["measure"] == measure)
            if fmt:
                g = g.filter(g["grader"] == v.grader_for(m, fmt))
            g = g.sort("tertile")
            if not g.height:
                continue
            t = g["tertile"].to_numpy()
            mean = g["mean"].to_numpy()
            ax.bar(
                t + (k - (len(models) - 1) / 2) * width,
                mean,
                width,
                yerr=[mean - g["ci_low"].to_numpy(), g["ci_high"].to_numpy() - mean],
                capsize=1.5,
                color=MODEL_COLORS[k % len(MODEL_COLORS)],
                label=v.display(m),
                error_kw={"elinewidth": 0.7},
            )
        rng = cx.filter(cx["measure"] == measure).unique(["tertile", "words_low", "words_high"]).sort("tertile")
        ax.set_xticks(rng["tertile"].to_numpy(), [f"{lo}-{hi} words" for lo, hi in zip(rng["words_low"], rng["words_high"])])
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.93),
        ncol=len(models),
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    return _save(fig, path)


#: The figures of :func:`write_figures`, in order: file, the function that draws it (None: no data, not drawn).
FIGURES = (
    ("settings.png", settings_bars),
    ("specialty_heatmap.png", specialty_heatmap),
    ("mcq_frq_drop.png", mcq_frq_drop),
    ("mcq_rules.png", mcq_rules),
    ("history_coverage_curve.png", history_coverage_curve),
    ("history_coverage_accuracy.png", history_coverage_accuracy),
    ("history_complexity.png", history_complexity),
)


def style() -> None:
    """The figures' matplotlib style (every figure of an analysis is drawn under it)."""
    # text.parse_math off: labels drawn from names (a model called "evil$\frac{$x") are plain text, never mathtext
    plt.rcParams.update({"font.family": "DejaVu Sans", "svg.hashsalt": "craftmd", "font.size": 9, "text.parse_math": False})


def write_figures(a, out: Path, only: set[str] | None = None) -> list[Path]:
    """All figures of an :class:`~craftmd.analysis.tables.Analysis` into ``out`` (``only``: those of these files)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    v = a if isinstance(a, View) else View.of(a)
    style()
    if not v.models:
        return []
    drawn = (draw(v, out / name) for name, draw in FIGURES if only is None or name in only)
    return [p for p in drawn if p is not None]


__all__ = ["write_figures", "style", "FIGURES"]
