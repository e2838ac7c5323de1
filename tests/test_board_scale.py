"""A board that grows: which pairs of models the analysis tests (neighbours in the ranking and the leader by default,
every pair on request or on a small board), Holm over exactly that family, and the same tables whichever way the
bootstrap's work is cut."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import polars as pl
import pytest
from statsmodels.stats.multitest import multipletests
from test_analysis import _all_trials, _dataset, _release

from craftmd.analysis.runner import ALL_PAIRS_UP_TO
from craftmd.analysis.tables import TABLES, analyse, compute
from craftmd.commands.cli import main

B = 300
SETTINGS = ("vignette", "multiturn")


def _board(root, n: int):
    """``n`` releases whose accuracies differ: release i is right on the first 2 + 3 i cases (vignette) and 1 + 3 i
    (multi-turn), so the ranking is known (r11 leads)."""
    data = _dataset(root)
    rel = root / "releases"
    for i in range(n):
        _release(rel, f"r{i:02d}", {"vignette": _all_trials(range(2 + 3 * i)), "multiturn": _all_trials(range(1 + 3 * i))})
    return rel, data


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    n = ALL_PAIRS_UP_TO + 4
    rel, data = _board(tmp_path_factory.mktemp("board"), n)
    return n, rel, data, compute(rel, data, B=B)


def _pairs(a, setting, group_by="all", group="all"):
    pv = a.pvalues.filter(pl.col("family") == "model", pl.col("setting") == setting, pl.col("group_by") == group_by,
                          pl.col("group") == group, pl.col("test") == "paired-bootstrap")  # fmt: skip
    return {(r["a"], r["b"]) for r in pv.iter_rows(named=True)}


def test_a_large_board_tests_each_model_against_its_neighbours_and_the_leader(board):
    n, _, _, a = board
    ranking = [f"r{i:02d}" for i in reversed(range(n))]  # best first
    leader = ranking[0]
    want = {tuple(sorted(p)) for p in zip(ranking, ranking[1:])} | {tuple(sorted((leader, m))) for m in ranking[1:]}
    for s in SETTINGS:
        assert _pairs(a, s) == want
        assert _pairs(a, s, "specialty", "Cardiology") == want  # every group of the setting tests the same family
    assert len(want) == 2 * n - 3  # linear in the board, not n (n - 1) / 2
    # the settings of one model are still all compared
    st = a.pvalues.filter(pl.col("family") == "setting", pl.col("group_by") == "all", pl.col("test") == "paired-bootstrap")
    assert st.height == n


def test_holm_runs_over_exactly_the_family_tested(board):
    _, _, _, a = board
    fam = a.pvalues.filter(pl.col("family") == "model", pl.col("setting") == "vignette", pl.col("group_by") == "all",
                           pl.col("test") == "paired-bootstrap")  # fmt: skip
    assert np.allclose(fam["p_adjusted"].to_numpy(), multipletests(fam["p_value"].to_numpy(), method="holm")[1])


def test_all_pairs_on_request_tests_every_pair_and_keeps_the_rest(board, tmp_path):
    n, rel, data, a = board
    out = tmp_path / "all"
    assert (
        main(["analyse", "--releases", str(rel), "--dataset", str(data), "--out", str(out), "--resamples", str(B), "--all-pairs"])
        == 0
    )
    full = pl.read_csv(out / "tables" / "pvalues.csv")
    ids = [f"r{i:02d}" for i in range(n)]
    for s in SETTINGS:
        got = full.filter(
            pl.col("family") == "model", pl.col("setting") == s, pl.col("group_by") == "all", pl.col("test") == "paired-bootstrap"
        )
        assert {(r["a"], r["b"]) for r in got.iter_rows(named=True)} == set(combinations(ids, 2))
    # the pairs the default tests have the same difference and raw p-value either way (only Holm's family differs)
    default = pl.read_csv(_write(a, tmp_path / "default") / "pvalues.csv")
    key = ["family", "model", "setting", "format", "grader", "group_by", "group", "a", "b", "test"]
    blank = pl.col(pl.String).fill_null("")  # (a model comparison has no model column, a settings one no setting)
    both = default.with_columns(blank).join(full.with_columns(blank), on=key, suffix="_all")
    assert both.height == default.height
    assert both["diff"].to_list() == both["diff_all"].to_list() and both["p_value"].to_list() == both["p_value_all"].to_list()


def _write(a, out):
    from craftmd.analysis.tables import write_tables

    write_tables(a, out)
    return out / "tables"


def test_a_small_board_tests_every_pair_and_its_tables_equal_all_pairs(tmp_path):
    n = ALL_PAIRS_UP_TO
    rel, data = _board(tmp_path, n)
    analyse(rel, data, tmp_path / "default", B=B, figures=False)
    analyse(rel, data, tmp_path / "all", B=B, figures=False, all_pairs=True)
    for name in TABLES:
        assert (tmp_path / "default" / "tables" / f"{name}.csv").read_bytes() == (
            tmp_path / "all" / "tables" / f"{name}.csv"
        ).read_bytes(), name
    pv = pl.read_csv(tmp_path / "default" / "tables" / "pvalues.csv")
    got = pv.filter(
        pl.col("family") == "model", pl.col("setting") == "vignette", pl.col("group_by") == "all", pl.col("test") == "mcnemar"
    )
    assert got.height == n * (n - 1) // 2


def test_the_page_says_which_pairs_were_tested(board, tmp_path):
    from craftmd.analysis.page import write_page

    _, _, _, a = board
    _write(a, tmp_path)
    write_page(a, tmp_path)
    page = (tmp_path / "index.html").read_text()
    assert f"On this board of more than {ALL_PAIRS_UP_TO} models, each model is tested against its neighbours" in page
    assert "craftmd analyse --all-pairs" in page
