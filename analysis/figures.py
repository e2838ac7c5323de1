"""Figures in the manner of the paper (matplotlib, Agg, deterministic PNGs).

* ``settings.png``: per model, the four settings' accuracy with 95 % CI error bars,
  MCQ and FRQ side by side (the paper's Fig. 2);
* ``specialty_heatmap.png``: conversational FRQ accuracy per specialty and model;
* ``mcq_frq_drop.png``: how far accuracy falls from the four-choice MCQ to free response;
* ``mcq_rules.png``: the ``paper`` and ``strict`` MCQ rules side by side.
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


def settings_bars(v: View, path: Path) -> Path:
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
            ax.bar(x + (j - 1.5) * width, acc, width, yerr=[lo, hi], capsize=2, label=SETTING_LABELS[s], color=COLORS[s], error_kw={"elinewidth": 0.8})
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
    models = v.models
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
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8, color="white" if grid[i, j] < 0.3 else "black")
    ax.set_xticks(range(len(models)), [v.display(m) for m in models], fontsize=8)
    ax.set_yticks(range(len(specs)), [f"{s} (n={v.n_cases(s)})" for s in specs], fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.04, label="accuracy")
    ax.set_title(f"{SETTING_LABELS[setting]} {v.format_label(fmt)} accuracy by specialty", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def mcq_frq_drop(v: View, path: Path) -> Path:
    models = v.models
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
    ax.set_title("Drop from four-choice MCQ (paper rule) to free response", fontsize=10, loc="left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def mcq_rules(v: View, path: Path) -> Path:
    models = [m for m in v.models if v.cell(m, "vignette", "mcq4", grader="paper")]
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
    fig.suptitle("MCQ accuracy under the paper rule and the strict rule", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def write_figures(a, out: Path) -> list[Path]:
    """All figures of an :class:`~craftmd.analysis.tables.Analysis` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    v = a if isinstance(a, View) else View(a)
    plt.rcParams.update({"font.family": "DejaVu Sans", "svg.hashsalt": "craftmd", "font.size": 9})
    paths = [
        settings_bars(v, out / "settings.png"),
        specialty_heatmap(v, out / "specialty_heatmap.png"),
        mcq_frq_drop(v, out / "mcq_frq_drop.png"),
        mcq_rules(v, out / "mcq_rules.png"),
    ] if v.models else []
    if getattr(v.a, "rubric", None) is not None:
        from .rubric import write_figures as rubric_figures

        paths += rubric_figures(v.a.rubric, out)
    return paths


__all__ = ["write_figures"]
