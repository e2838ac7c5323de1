"""The paper's other figures, drawn from the tables, with significance brackets (matplotlib, Agg, deterministic PNGs).

Brackets carry the paired bootstrap's Holm-adjusted p-value of the comparison they span, as the paper marks them:
``ns`` (p >= 0.05), ``*`` (< 0.05), ``**`` (< 0.01), ``***`` (< 0.001).

Each names the paper and figure it reproduces: *Nature Medicine* 2025 (Johri et al.) or the preprint (medRxiv 2024,
whose p-value tables are upstream's ``results/statistics/``).

* ``settings_tests.png``: Nature Medicine 2025, Fig. 2, with its brackets: per model, vignette against each
  conversational setting (``tables/pvalues.csv``, family ``setting``);
* ``single_dx.png``: the same on the single-diagnosis subset (Nature Medicine 2025, Extended Data Fig. 5): the
  Derm-Public and Derm-Private cases the dermatologists labelled single-diagnosis (MedQA has no such label);
* ``mcq_vs_frq.png``: four-choice MCQ against FRQ per model and setting (``tables/format_tests.csv``;
  Nature Medicine 2025, Supplementary Table 3);
* ``vision.png``: the image cases' FRQ accuracy per setting, with the image and, where a release has them, without
  it, bracketed by ``tables/image_tests.csv`` (Nature Medicine 2025, Fig. 4; Supplementary Table 21);
* ``exam.png``: the exam settings (exam findings alone, the conversation without and with them) beside the vignette
  and the multi-turn conversation (the preprint's, medRxiv 2024: Fig. 2c and 3d for the exam alone, Fig. 4c for the
  conversation without it; *Nature Medicine*'s Extended Data Fig. 1 is the specialties and MELD): drawn only when a
  release has answers in those settings (upstream released none).

A figure whose data no release has is not drawn: :func:`write_paper_figures` returns the files it wrote.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from .figures import COLORS, PNG, shown  # noqa: E402
from .view import SETTING_LABELS, UPSTREAM_SETTINGS, View  # noqa: E402

#: the settings of the exam figure (the preprint's, medRxiv 2024: Fig. 2c, 3d and 4c), in order
EXAM_SETTINGS = ("vignette", "exam", "multiturn", "multiturn_no_exam", "multiturn_plus_exam")
EXAM_COLORS = {"exam": "#C44E52", "multiturn_no_exam": "#937860", "multiturn_plus_exam": "#DA8BC3"}
FORMAT_COLORS = {"mcq4": "#4C72B0", "frq": "#DD8452"}
IMAGE_COLORS = {True: "#55A868", False: "#8C8C8C"}


def _accuracy_bars(ax, x, width, cells: list, *, capsize: float, elinewidth: float, **style) -> None:
    """Each cell's accuracy as a bar at ``x`` (``width`` wide) with its 95% CI as error bars; a missing cell: no bar."""
    acc = [c["accuracy"] if c else np.nan for c in cells]
    err = [
        [c["accuracy"] - c["ci_low"] if c else 0 for c in cells],
        [c["ci_high"] - c["accuracy"] if c else 0 for c in cells],
    ]
    ax.bar(x, acc, width, yerr=err, capsize=capsize, error_kw={"elinewidth": elinewidth}, **style)


def _pair_bars(ax, x, k: int, cells: list, **style) -> None:
    """The ``k``-th (0 or 1) bar of a pair at each ``x``: two bars side by side, each 0.38 wide, with their CIs."""
    _accuracy_bars(ax, x + (k - 0.5) * 0.38, 0.38, cells, capsize=1.5, elinewidth=0.7, **style)


def _accuracy_axis(ax, label: str, top: float) -> None:
    """A panel of accuracies: 0 to ``top`` (room for the brackets above 1), ticks 0 to 1, ``label`` as its title."""
    ax.set_ylim(0, top)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("accuracy")
    ax.set_title(label, fontsize=10, loc="left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def stars(p: float | None) -> str:
    """The paper's marks: ns, *, **, *** (Holm-adjusted p below 0.05, 0.01, 0.001)."""
    if p is None:
        return ""
    return "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < 0.05 else "ns"


def bracket(ax, x1: float, x2: float, y: float, text: str, h: float = 0.015) -> None:
    """A bracket from ``x1`` to ``x2`` at height ``y`` (axes data units) with ``text`` above it."""
    ax.plot([x1, x1, x2, x2], [y, y + h, y + h, y], color="#333333", linewidth=0.7)
    ax.text((x1 + x2) / 2, y + h, text, ha="center", va="bottom", fontsize=6.5)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, **PNG)
    plt.close(fig)
    return path


def _setting_p(v: View, m: str, a: str, b: str, fmt: str, grader: str, group_by: str, group: str) -> float | None:
    """The Holm-adjusted paired-bootstrap p-value of settings ``a`` and ``b`` of one model (either order)."""
    pv = v.a.pvalues
    sel = pv.filter(pl.col("family") == "setting", pl.col("model") == m, pl.col("format") == fmt, pl.col("grader") == grader,
                    ~pl.col("with_image"), pl.col("group_by") == group_by, pl.col("group") == group,
                    pl.col("test") == "paired-bootstrap", ((pl.col("a") == a) & (pl.col("b") == b)) | ((pl.col("a") == b) & (pl.col("b") == a)))  # fmt: skip
    return sel["p_adjusted"][0] if sel.height else None


#: How the two settings figures look: inches per model and the height, the error bars' caps, the axis' top, the legend.
SETTINGS_LOOK = dict(size=(1.8, 8), bars=dict(capsize=2, elinewidth=0.8), top=1.25, legend=dict(ncol=4, fontsize=8))
EXAM_LOOK = dict(size=(2.0, 7), bars=dict(capsize=1.5, elinewidth=0.7), top=1.3, legend=dict(ncol=3, fontsize=7))


def settings_with_brackets(v: View, path: Path, group_by: str = "all", group: str = "all", title: str = "") -> Path | None:
    """Per model, the four settings' accuracy (95 % CI) in one group, MCQ and FRQ panels, with brackets from the
    vignette to each conversational setting."""
    models = [m for m in v.models if v.cell(m, "vignette", "mcq4", group_by=group_by, group=group)
              or v.cell(m, "vignette", "frq", group_by=group_by, group=group)]  # fmt: skip
    if not models:
        return None
    title = title or "Accuracy by setting, with the vignette against each conversational setting (paired bootstrap, Holm)"
    models, title = shown(models, title)
    pairs = [("vignette", s) for s in UPSTREAM_SETTINGS[1:]]
    return _setting_panels(v, path, models, UPSTREAM_SETTINGS, pairs, title, group_by=group_by, group=group, **SETTINGS_LOOK)


def _setting_panels(v: View, path: Path, models, settings, pairs, title, *, group_by="all", group="all", size, bars, top, legend):
    """Per model, ``settings``' accuracy (95 % CI) in one group, MCQ and FRQ panels (``size``, ``bars``, ``top``,
    ``legend``: :data:`SETTINGS_LOOK`), with a bracket over each of ``pairs`` of settings that was tested (its
    paired-bootstrap p, Holm-adjusted, as stars)."""
    fmts = [("mcq4", "MCQ (4 choices, paper rule)"), ("frq", "Free response")]
    fig, axes = plt.subplots(len(fmts), 1, figsize=(max(7, size[0] * len(models) + 2), size[1]), sharex=True)
    width, middle = 0.8 / len(settings), (len(settings) - 1) / 2
    x = np.arange(len(models))
    for ax, (fmt, label) in zip(axes, fmts):
        for j, s in enumerate(settings):
            cells = [v.cell(m, s, fmt, group_by=group_by, group=group) for m in models]
            color = COLORS.get(s) or EXAM_COLORS[s]
            _accuracy_bars(ax, x + (j - middle) * width, width, cells, **bars, label=SETTING_LABELS[s], color=color)
        for i, m in enumerate(models):
            g = v.grader_for(m, fmt)
            if g is None:
                continue
            shown = (v.cell(m, s, fmt, group_by=group_by, group=group) for s in settings)
            y = max((c["ci_high"] for c in shown if c), default=0) + 0.03
            for a, b in pairs:
                p = _setting_p(v, m, a, b, fmt, g, group_by, group)
                if p is None:
                    continue
                ia, ib = settings.index(a), settings.index(b)
                bracket(ax, i + (min(ia, ib) - middle) * width, i + (max(ia, ib) - middle) * width, y, stars(p))
                y += 0.07
        _accuracy_axis(ax, label, top)
    axes[0].legend(**legend, loc="upper right", frameon=False)
    axes[-1].set_xticks(x, [v.display(m) for m in models])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def mcq_vs_frq(v: View, path: Path) -> Path | None:
    """Per model and setting, four-choice MCQ (paper rule) beside FRQ (the model's FRQ grader), with a bracket
    from ``tables/format_tests.csv``."""
    ft = v.a.format_tests
    if ft is None or not ft.height:
        return None
    models, title = shown([m for m in v.models if ft.filter(pl.col("model") == m).height],
                          "Four-choice MCQ against free response (paired bootstrap, Holm over each model's settings)")  # fmt: skip
    if not models:
        return None
    fig, grid = plt.subplots(2, 2, figsize=(max(9, 1.6 * len(models) + 3), 7), sharey=True)
    axes = grid.ravel()
    x = np.arange(len(models))
    for ax, s in zip(axes, UPSTREAM_SETTINGS):
        for k, fmt in enumerate(("mcq4", "frq")):
            cells = [v.cell(m, s, fmt) for m in models]
            _pair_bars(ax, x, k, cells, color=FORMAT_COLORS[fmt], label=v.format_label(fmt))
        for i, m in enumerate(models):
            g = v.grader_for(m, "frq")
            row = ft.filter(pl.col("model") == m, pl.col("setting") == s, pl.col("mcq_grader") == "paper", pl.col("frq_grader") == g,
                            ~pl.col("with_image"), pl.col("group_by") == "all", pl.col("test") == "paired-bootstrap")  # fmt: skip
            a, b = v.cell(m, s, "mcq4"), v.cell(m, s, "frq")
            if row.height and a and b:
                bracket(ax, i - 0.19, i + 0.19, max(a["ci_high"], b["ci_high"]) + 0.03, stars(row["p_adjusted"][0]))
        ax.set_title(SETTING_LABELS[s], fontsize=9)
        ax.set_xticks(x, [v.display(m) for m in models], fontsize=7)
        ax.set_ylim(0, 1.1)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    for ax in grid[:, 0]:
        ax.set_ylabel("accuracy")
    axes[0].legend(fontsize=7, frameon=False, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def vision(v: View, path: Path) -> Path | None:
    """The image cases: FRQ accuracy per setting with the image and, where the release has them, without it; one panel
    per image release and FRQ grader that graded it."""
    panels = [(m, g) for m in v.image_models for g in v.frq_graders_all
              if any(v.cell(m, s, "frq", grader=g, with_image=True) for s in UPSTREAM_SETTINGS)]  # fmt: skip
    if not panels:
        return None
    panels, title = shown(panels, "Image cases (NEJM Image Challenge): free-response accuracy, 95% CI")
    title = title.replace(" models by rank)", " panels: models by rank)")
    it = v.a.image_tests
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1, 3.8), sharey=True, squeeze=False)
    x = np.arange(len(UPSTREAM_SETTINGS))
    for ax, (m, g) in zip(axes[0], panels):
        for k, flag in enumerate((True, False)):
            cells = [v.cell(m, s, "frq", grader=g, with_image=flag) for s in UPSTREAM_SETTINGS]
            if not any(cells):
                continue
            _pair_bars(ax, x, k, cells, color=IMAGE_COLORS[flag], label="with the image" if flag else "without the image")
        for j, s in enumerate(UPSTREAM_SETTINGS):
            row = (it.filter(pl.col("model") == m, pl.col("setting") == s, pl.col("format") == "frq", pl.col("grader") == g,
                             pl.col("group_by") == "all", pl.col("test") == "paired-bootstrap") if it is not None else None)  # fmt: skip
            a, b = v.cell(m, s, "frq", grader=g, with_image=True), v.cell(m, s, "frq", grader=g, with_image=False)
            if row is not None and row.height and a and b:
                bracket(ax, j - 0.19, j + 0.19, max(a["ci_high"], b["ci_high"]) + 0.03, stars(row["p_adjusted"][0]))
        ax.set_title(f"{v.display(m)}, graded by {g}", fontsize=9)
        ax.set_xticks(x, [SETTING_LABELS[s] for s in UPSTREAM_SETTINGS], fontsize=8)
        ax.set_ylim(0, 1.1)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.legend(fontsize=7, frameon=False, loc="upper right")
    axes[0][0].set_ylabel("FRQ accuracy")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def exam_settings(v: View, path: Path) -> Path | None:
    """The preprint's exam comparisons (medRxiv 2024, Fig. 2c, 3d and 4c): the exam settings beside the vignette and the
    multi-turn conversation, per model and format."""
    extra = [s for s in EXAM_SETTINGS if s not in UPSTREAM_SETTINGS]
    models = [m for m in v.models if any(v.cell(m, s, f) for s in extra for f in ("mcq4", "frq"))]
    if not models:
        return None
    title = "The physical exam: alone, left out of the conversation, added to it (paired bootstrap, Holm)"
    models, title = shown(models, title)
    pairs = [("exam", "vignette"), ("multiturn_no_exam", "multiturn"), ("multiturn_plus_exam", "multiturn")]
    return _setting_panels(v, path, models, EXAM_SETTINGS, pairs, title, **EXAM_LOOK)


SINGLE_DX_TITLE = (
    "Single-diagnosis subset, Derm-Public and Derm-Private (Nature Medicine 2025, Extended Data Fig. 5):\n"
    "vignette against each conversational setting (paired bootstrap, Holm)"
)
#: The figures of :func:`write_paper_figures`, in order: file, the function that draws it, its arguments after the path.
DRAWN = (
    ("settings_tests.png", settings_with_brackets, ()),
    ("single_dx.png", settings_with_brackets, ("single_dx", "all", SINGLE_DX_TITLE)),
    ("mcq_vs_frq.png", mcq_vs_frq, ()),
    ("vision.png", vision, ()),
    ("exam.png", exam_settings, ()),
)


def write_paper_figures(v: View, out: Path, only: set[str] | None = None) -> list[Path]:
    """The figures of this module that have data, into ``out`` (the caller sets matplotlib's style; ``only``: those of
    these files)."""
    out = Path(out)
    made = (draw(v, out / name, *args) for name, draw, args in DRAWN if only is None or name in only)
    return [p for p in made if p is not None]


#: the figures write_paper_figures can draw (the page shows those that exist)
PAPER_FIGURES = tuple(name for name, _, _ in DRAWN)

__all__ = ["write_paper_figures", "stars", "PAPER_FIGURES"]
