"""The figures: the same bytes drawn in worker processes or in order, read back only when their inputs are the same,
and of a size that does not grow with the board (a summary past figures.MAX_MODELS models)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import polars as pl
import pytest
from PIL import Image
from test_analysis import _all_trials, _dataset, _release

from craftmd.analysis import draw, figures
from craftmd.analysis.tables import analyse, compute

B = 60
SETTINGS = ("vignette", "multiturn", "singleturn", "summarized")


def _board(root, n: int):
    data = _dataset(root)
    rel = root / "releases"
    for i in range(n):
        _release(rel, f"r{i:02d}", {s: _all_trials(range(3 + 5 * i + j)) for j, s in enumerate(SETTINGS)})
    return rel, data


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    return _board(tmp_path_factory.mktemp("figboard"), 3)


def test_figures_drawn_by_workers_are_the_bytes_drawn_in_order(board, tmp_path, monkeypatch):
    rel, data = board
    monkeypatch.setattr(draw, "JOBS", 1)
    analyse(rel, data, tmp_path / "one", B=B)
    monkeypatch.setattr(draw, "JOBS", 2)
    monkeypatch.setattr(draw, "cpus", lambda: 2)  # workers even on one CPU
    analyse(rel, data, tmp_path / "two", B=B)
    one, two = _digests(tmp_path / "one"), _digests(tmp_path / "two")
    assert any(k.startswith("figures/") for k in one) and len([k for k in one if k.endswith(".png")]) >= 4
    assert one == two  # every table, every figure, the cache: the same bytes


def test_a_figure_raising_in_a_worker_fails_the_analysis(board, tmp_path, monkeypatch):
    rel, data = board
    monkeypatch.setattr(draw, "cpus", lambda: 2)
    a = compute(rel, data, B=B)
    a.rubric = object()  # a rubric whose figures cannot be drawn (no tables): the worker raises, the analysis does
    with draw.Workers(2) as w, pytest.raises(Exception):
        draw.draw_all(a, tmp_path / "figures", w)


def test_figures_are_read_back_only_when_their_inputs_are_the_same(board, tmp_path, monkeypatch):
    rel, data = board
    monkeypatch.setattr(draw, "JOBS", 1)
    first = tmp_path / "first"
    analyse(rel, data, first, B=B)
    drawn = []
    real = draw.draw
    monkeypatch.setattr(draw, "draw", lambda *a, **k: drawn.append(a[2]) or real(*a, **k))
    again = tmp_path / "again"
    analyse(rel, data, again, B=B, previous=first)  # the same inputs: read back, nothing drawn
    assert drawn == [] and _digests(again / "figures") == _digests(first / "figures")
    changed = tmp_path / "changed"
    analyse(rel, data, changed, B=B + 1, previous=first)  # other resamples, other intervals: every figure drawn again
    assert drawn and _digests(changed / "figures") != _digests(first / "figures")
    fresh = tmp_path / "fresh"
    analyse(rel, data, fresh, B=B + 1)
    assert _digests(changed / "figures") == _digests(fresh / "figures")  # no stale figure: what a fresh run draws


def _many(a, n: int):
    """Analysis ``a`` with its releases copied ``n`` times over under other names (each copy's accuracies moved a
    little), for figures of a board of ``n`` models."""
    acc, rel = a.accuracy, a.releases
    models = rel["release"].to_list()
    accs, rels = [], []
    for i in range(n):
        name = {m: f"m{i:04d}-{m}" for m in models}
        shift = (i % 50) / 500
        accs.append(acc.with_columns(pl.col("model").replace(name), (pl.col("accuracy") * (1 - shift)).alias("accuracy")))
        rels.append(
            rel.with_columns(pl.col("release").replace(name), pl.col("display").replace({m: f"model {i} {m}" for m in models}))
        )
    a.accuracy, a.releases = pl.concat(accs), pl.concat(rels)
    a.pvalues = a.pvalues.clear()
    a.format_tests = a.image_tests = None
    a.history_by_coverage, a.history_by_complexity = a.history_by_coverage.clear(), a.history_by_complexity.clear()
    a.metrics = a.metrics.clear()
    a.__dict__.pop("_view", None)
    return a


def test_a_board_past_the_limit_draws_figures_of_a_bounded_size(board, tmp_path):
    rel, data = board
    a = _many(compute(rel, data, B=B), 250)  # 500 models
    from craftmd.analysis.view import View

    v = View.of(a)
    assert len(v.models) > figures.MAX_MODELS
    t = time.perf_counter()
    draw.draw_all(a, tmp_path / "figures")
    assert time.perf_counter() - t < 120
    drawn = {p.name: Image.open(p).size for p in (tmp_path / "figures").glob("*.png")}
    assert {"settings.png", "specialty_heatmap.png", "mcq_frq_drop.png", "settings_tests.png"} <= set(drawn)
    # as large as a board of TOP models draws them, at most
    most = (figures.PNG["dpi"] * (1.8 * figures.TOP + 3), figures.PNG["dpi"] * 9)
    for name, (w, h) in drawn.items():
        assert w <= most[0] and h <= most[1], (name, w, h)
