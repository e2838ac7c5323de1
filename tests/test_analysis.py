"""The analysis on constructed releases whose answers are known: accuracy, groups, CIs,
paired bootstrap, McNemar, Holm, and missing answers counted as wrong."""

from __future__ import annotations

import dataclasses
import re

import polars as pl
import pyarrow as pa
import pytest
from scipy.stats import binomtest, chi2

from craftmd import CraftMDError
from craftmd.analysis import runner
from craftmd.analysis.tables import compute
from craftmd.release import RunRecord, write_release

from helpers import ACCURACY_HEAD, analysed_twice, listings

N_CASES, TRIALS, B = 40, 5, 2000


def _dataset(root):
    d = root / "data" / "all"
    d.mkdir(parents=True)
    pl.DataFrame(
        {
            "case_id": [f"case_{i}" for i in range(N_CASES)],
            "source": ["medqa_usmle"] * N_CASES,
            "specialty": ["Cardiology"] * 20 + ["Neurology"] * 20,
            "single_dx": [i % 2 == 0 for i in range(N_CASES)],
        }
    ).write_parquet(d / "test-00000-of-00001.parquet")
    return root / "data"


def _release(
    out,
    rid,
    cells,
    *,
    missing=(),
    ungraded=(),
    graded_missing_correct=False,
    cases=range(N_CASES),
    display=None,
    grader="offline",
    record=None,
    kind="generated",
    protocol=None,
    source=None,
    image=False,
):
    """cells: {setting: set of (case, trial) correct}; every case (of ``cases``) x trial x setting answered (frq), each
    release's answers its own (two releases of one answer file are one run, refused on a board); ``image``: the NEJM
    cases of :func:`_nejm` (``nejm_<i>``), shown with their image."""
    prefix = "nejm" if image else "case"
    ans = {k: [] for k in ("case_id", "trial", "setting", "format", "with_image", "response", "status")}
    grd = {
        k: []
        for k in (
            "case_id",
            "trial",
            "setting",
            "format",
            "with_image",
            "grader",
            "resolved",
            "resolved_kind",
            "correct",
            "detail",
        )
    }
    for setting, correct in cells.items():
        for c in cases:
            for t in range(TRIALS):
                miss = (setting, c, t) in missing
                for k, v in zip(
                    ans, (f"{prefix}_{c}", t, setting, "frq", image, None if miss else f"dx ({rid})", "missing" if miss else "ok")
                ):
                    ans[k].append(v)
                if (setting, c, t) in ungraded:
                    continue
                ok = (c, t) in correct or (miss and graded_missing_correct)
                for k, v in zip(grd, (f"{prefix}_{c}", t, setting, "frq", image, grader, "dx", "single", ok, None)):
                    grd[k].append(v)
    from craftmd.scoring.scorers import scores_from_grades

    m = RunRecord(
        task="craftmd",
        release=rid,
        kind=kind,
        model=f"test/{rid}",
        source=source or {"commit": "test"},
        display_name=display or rid.upper(),
        protocol=protocol,
    )
    return write_release(
        out / rid, m, {"answers": pa.table(ans)}, scores=(scores_from_grades(pa.table(grd)), {grader: record or {}})
    )


def _nejm(data, n=10):
    """The dataset's ``nejm_image`` config: ``n`` image cases (no specialty)."""
    d = data / "nejm_image"
    d.mkdir(parents=True)
    pl.DataFrame(
        {"case_id": [f"nejm_{i}" for i in range(n)], "source": ["nejm_image"] * n, "specialty": [None] * n}
    ).write_parquet(d / "test-00000-of-00001.parquet")


def _all_trials(cases):
    return {(c, t) for c in cases for t in range(TRIALS)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("constructed")
    data = _dataset(root)
    rel = root / "releases"
    _release(
        rel,
        "a",
        {
            "vignette": _all_trials(range(30)),
            "multiturn": _all_trials(range(10)),
            "singleturn": _all_trials(range(10)),
        },
    )
    _release(
        rel,
        "b",
        {
            "vignette": _all_trials(range(10)),
            "multiturn": _all_trials(range(10)) | {(10, 0), (10, 1), (10, 2)},
        },
    )
    # c: every answer graded correct, but cases 0-1 are missing (and a faulty grader called them correct)
    # and case 2 has no grade rows: all of them must count as wrong.
    _release(
        rel,
        "c",
        {"vignette": _all_trials(range(N_CASES))},
        missing={("vignette", c, t) for c in (0, 1) for t in range(TRIALS)},
        ungraded={("vignette", 2, t) for t in range(TRIALS)},
        graded_missing_correct=True,
    )
    return rel, data, compute(rel, data, B=B)


def acc(a, model, setting, group_by="all", group="all"):
    r = a.accuracy.filter(
        pl.col("model") == model, pl.col("setting") == setting, pl.col("group_by") == group_by, pl.col("group") == group
    )
    assert r.height == 1
    return r.row(0, named=True)


def pv(an, family, test, **kw):
    f = an.pvalues.filter(pl.col("family") == family, pl.col("test") == test, pl.col("group_by") == "all")
    for k, v in kw.items():
        f = f.filter(pl.col(k) == v)
    assert f.height == 1, kw
    return f.row(0, named=True)


def test_accuracy_is_the_mean_over_cases_of_the_trial_means(built):
    _, _, a = built
    assert acc(a, "a", "vignette")["accuracy"] == pytest.approx(0.75)
    assert acc(a, "a", "multiturn")["accuracy"] == pytest.approx(0.25)
    assert acc(a, "b", "multiturn")["accuracy"] == pytest.approx((10 + 3 / 5) / 40)
    assert acc(a, "a", "vignette")["n_cases"] == N_CASES


def test_missing_and_ungraded_answers_count_as_wrong(built):
    _, _, a = built
    assert acc(a, "c", "vignette")["accuracy"] == pytest.approx(37 / 40)
    st = a.answer_status.filter(pl.col("model") == "c").row(0, named=True)
    assert st["n_missing"] == 10 and st["n_ok"] == 190


def test_groups_resample_within_the_group(built):
    _, _, a = built
    card = acc(a, "a", "vignette", "specialty", "Cardiology")
    neuro = acc(a, "a", "vignette", "specialty", "Neurology")
    assert (card["n_cases"], card["accuracy"], card["ci_low"], card["ci_high"]) == (20, 1.0, 1.0, 1.0)
    assert neuro["accuracy"] == pytest.approx(0.5) and neuro["ci_low"] < 0.5 < neuro["ci_high"]
    sdx = acc(a, "a", "vignette", "single_dx", "all")
    assert sdx["n_cases"] == 20 and sdx["accuracy"] == pytest.approx(15 / 20)
    assert set(a.accuracy["group_by"].unique()) == {"all", "specialty", "dataset", "single_dx"}
    assert a.accuracy.columns[:10] == ACCURACY_HEAD


def test_paired_bootstrap_p_values(built):
    _, _, a = built
    big = pv(a, "setting", "paired-bootstrap", model="a", a="vignette", b="multiturn")
    assert big["diff"] == pytest.approx(0.5)
    assert big["p_value"] == pytest.approx(1 / (B + 1))  # no resample comes near zero difference
    same = pv(a, "setting", "paired-bootstrap", model="a", a="multiturn", b="singleturn")
    assert same["diff"] == 0 and same["p_value"] == 1.0
    between = pv(a, "model", "paired-bootstrap", setting="vignette", a="a", b="b")
    assert between["diff"] == pytest.approx(0.5) and between["p_value"] < 0.01


def test_holm_within_a_family(built):
    _, _, a = built
    fam = a.pvalues.filter(
        pl.col("family") == "setting", pl.col("model") == "a", pl.col("test") == "paired-bootstrap", pl.col("group_by") == "all"
    )
    assert fam.height == 3
    p = sorted(fam["p_value"].to_list())
    holm, run = [], 0.0
    for i, x in enumerate(p):
        run = max(run, min(1.0, x * (len(p) - i)))
        holm.append(run)
    assert sorted(fam["p_adjusted"].to_list()) == pytest.approx(holm)
    assert (fam["p_adjusted"] >= fam["p_value"]).all()


def test_mcnemar_on_paired_trials(built):
    _, _, a = built
    # a vignette vs multiturn: 100 trials right only in vignette, none the other way: chi-square, continuity corrected
    r = pv(a, "setting", "mcnemar", model="a", a="vignette", b="multiturn")
    assert r["p_value"] == pytest.approx(chi2.sf((100 - 1) ** 2 / 100, 1))
    # b vignette vs multiturn: 3 discordant trials, all one way: the exact binomial test
    r = pv(a, "setting", "mcnemar", model="b", a="vignette", b="multiturn")
    assert r["p_value"] == pytest.approx(binomtest(0, 3, 0.5).pvalue)
    assert r["diff"] == pytest.approx(-3 / (N_CASES * TRIALS))


def test_the_cells_read_a_few_rows_at_a_time_are_the_cells_of_the_whole_table(built):
    """The bootstrap's cells (case positions and scores per cell) are read from the board's case groups in batches,
    never whole: any batch size gives the cells the whole table gives, each cell's cases in its own order."""
    import numpy as np

    from craftmd.analysis.stats import _cells, cells_of
    from craftmd.analysis.tables import prepared_connection

    rel, data, _ = built
    con = prepared_connection(list(runner.Board.read(rel)), data)
    whole, L = _cells(pl.from_arrow(con.sql("select * from case_groups").to_arrow_table()))
    for rows in (1, 7, 1 << 20):
        cells, scale = cells_of(con, batch_rows=rows)
        assert scale == L and list(cells) == list(whole)
        for key, (positions, scores) in whole.items():
            assert np.array_equal(cells[key][0], positions) and np.array_equal(cells[key][1], scores), (rows, key)
            assert cells[key][0].dtype == cells[key][1].dtype == np.int16  # (a few cases, a few trials: 16 bits each)


def test_ratios_resampled_a_few_at_a_time_are_the_ratios_resampled_all_together(monkeypatch):
    """The history tables' ratios (integer and continuous case values, some of them paired tests) are resampled a
    batch at a time as they are added, so a board's vectors are never all held: any batch size gives the same
    estimates, intervals and p-values, in the order the ratios were added."""
    import numpy as np

    from craftmd.analysis import history

    rng = np.random.default_rng(3)
    items = []
    for i in range(11):
        has = (rng.random(40) < 0.8).astype(float)
        exact = i % 2 == 0
        num = (rng.integers(0, 5, 40) if exact else rng.random(40)) * has
        items.append((("test" if i % 3 == 0 else "cx", i), num, has, exact))

    def resampled() -> dict:
        ratios = history._Ratios(B=300, seed=7)
        for key, num, den, exact in items:
            ratios.add(key, num, den, exact)
        return ratios.results()

    together = resampled()
    assert list(together) == [key for key, *_ in items]
    assert all((p is not None) == (key[0] == "test") for key, (_, _, _, p, _) in together.items())
    for size in (1, 2, 5):
        monkeypatch.setattr(history, "RATIOS_AT_ONCE", size)
        assert resampled() == together, size


def test_holm_is_statsmodels_holm_family_by_family_and_the_collector_is_left_as_it_was():
    """Holm's adjustment is statsmodels' for each family, with its per-call ``gc.collect()`` skipped while the
    families run; ``gc.collect`` is the interpreter's own again afterwards, also when a family fails."""
    import gc

    import numpy as np
    from statsmodels.stats.multitest import multipletests

    from craftmd.analysis.stats import holm_of

    collect = gc.collect
    rng = np.random.default_rng(5)
    families = [rng.random(k) for k in (1, 2, 5, 12)]
    for got, p in zip(holm_of(families), families, strict=True):
        assert np.array_equal(got, multipletests(p, method="holm")[1])
    assert gc.collect is collect
    with pytest.raises(TypeError):
        holm_of([np.array(["not a p-value"])])
    assert gc.collect is collect


def test_holm_by_family_numbers_is_holm_of_each_familys_rows_in_their_order():
    """The p-value table's Holm adjustment numbers its families from the comparisons' columns (nulls equal to nulls):
    rows of a family far apart, interleaved with others, are adjusted together, and each family alone."""
    import numpy as np
    from statsmodels.stats.multitest import multipletests

    from craftmd.analysis.stats import _family_codes, holm, holm_coded

    frame = pl.DataFrame(
        {
            "family": ["model", "setting", "model", "setting", "model", "model", "setting"],
            "model": [None, "a", None, "a", None, None, "b"],
            "setting": ["vignette", None, "vignette", None, "multiturn", "vignette", None],
            "p_value": [0.01, 0.04, 0.03, 0.02, 0.5, 0.002, 0.3],
        }
    )
    codes = _family_codes(frame, ["family", "model", "setting"])
    assert len(set(codes.tolist())) == 4 and codes[0] == codes[2] == codes[5] and codes[1] == codes[3]
    p = frame["p_value"].to_numpy()
    want = np.empty(len(p))
    for rows in ([0, 2, 5], [1, 3], [4], [6]):
        want[rows] = multipletests(p[rows], method="holm")[1]
    assert np.array_equal(holm_coded(p, codes), want)
    assert np.array_equal(holm(frame, ["family", "model", "setting"]), want)
    assert holm_coded(np.zeros(0), np.zeros(0, np.int64)).shape == (0,)


def test_a_narrow_case_vector_too_fine_for_the_exact_path_is_refused():
    """The cells hold their scores in 16 bits where they fit: the exact path's bound on the sums is checked on the
    scores as integers (a 16-bit product would wrap around and let a vector through whose sums float32 cannot hold)."""
    import numpy as np

    from craftmd import CraftMDError
    from craftmd.analysis.bootstrap import Resampler

    with pytest.raises(CraftMDError, match="too fine-grained"):
        Resampler(B=9).add(np.full(1_000, 30_000, np.int16))
    Resampler(B=9).add(np.full(500, 30_000, np.int16))  # (500 x 30,000 < 2**24)


@pytest.mark.parametrize("B", [9, 100, 2_000])
def test_the_exact_paths_intervals_are_numpys_percentiles_of_the_resampled_sums(B):
    """An interval of the exact path is numpy's linear-interpolated percentile of the column's B resampled sums taken as
    float64, to the bit (the sums are read as the integers they are, which numpy partitions faster), at every level."""
    import numpy as np

    from craftmd.analysis.bootstrap import Resampler

    rng = np.random.default_rng(B)
    columns = [rng.integers(0, 7, 300), rng.integers(-6, 7, 300), np.zeros(300, np.int64), rng.integers(0, 55_000, 300)]
    R = Resampler(B=B, seed=3)
    handles = [R.add(c) for c in columns]
    R.run()
    for h in handles:
        sums = R.resampled(h)
        assert np.array_equal(sums, np.rint(sums))  # (exact integers)
        for level in (0.5, 0.9, 0.95, 0.99):
            a = (1 - level) / 2
            want = np.quantile(sums, [a, 1 - a])
            assert np.array(R.quantiles(h, level)).tobytes() == want.tobytes()


def test_tables_are_deterministic(built, tmp_path):
    rel, data, _ = built
    analysed_twice(rel, data, tmp_path, ("accuracy", "pvalues"), B=B, more_than=10)


def test_queries_are_named_files(built):
    rel, data, _ = built
    names = runner.query_names()
    assert {
        "trial_grades",
        "case_scores",
        "case_membership",
        "case_groups",
        "accuracy",
        "comparisons",
        "answer_status",
        "mcq_rule_gap",
    } <= set(names)
    con = runner.connect(rel, data)
    status = runner.run(con, "answer_status")
    assert status.num_rows == 6  # a: 3 settings, b: 2, c: 1
    with pytest.raises(CraftMDError, match="no analysis query named 'nope'"):
        runner.run(con, "nope")


# -- a partial release beside complete ones ------------------------------------------------------------


@pytest.fixture(scope="module")
def with_partial(tmp_path_factory):
    """Two complete releases and one over 4 of the 40 cases, all of them right: it would top the board if ranked."""
    root = tmp_path_factory.mktemp("partial")
    data = _dataset(root)
    rel = root / "releases"
    _release(rel, "a", {"vignette": _all_trials(range(30)), "multiturn": _all_trials(range(10))})
    _release(rel, "b", {"vignette": _all_trials(range(20)), "multiturn": _all_trials(range(5))})
    _release(
        rel,
        "p",
        {"vignette": _all_trials(range(4)), "multiturn": _all_trials(range(4))},
        cases=range(4),
        display="P <script>x</script>",
    )
    return data, compute(rel, data, B=200)


def test_a_partial_release_is_listed_apart_never_ranked(with_partial, tmp_path):
    from craftmd.analysis.page import markdown, write_page
    from craftmd.analysis.view import View

    _, a = with_partial
    v = View(a)
    assert (v.models, v.partial) == (["a", "b"], ["p"])  # p's 100 % does not rank it, let alone first
    assert v.board_cases == N_CASES and v.coverage["p"] == 4
    page = write_page(a, tmp_path).read_text()
    lead = page[page.index('class="lead"') : page.index('id="board"')]
    assert "<b>A</b>" in lead and "25.0%" in lead and "P &lt;script&gt;" not in lead  # the best complete release
    board = page[page.index('id="leaderboard"') :]
    board = board[: board.index("</table>")]
    assert "P &lt;script&gt;" not in board
    partial = page[page.index('id="partial-runs"') :]
    partial = partial[: partial.index("</table>")]
    assert f"4 of {N_CASES} cases" in partial and "P &lt;script&gt;x&lt;/script&gt;" in partial  # escaped, with its figures
    assert 'data-v="1.000000">1.000' in partial
    assert "<script>x" not in page
    specialty = page[page.index('id="specialty"') : page.index('id="mcq-rules"')]
    assert "P &lt;script&gt;" not in specialty  # nor in the comparisons
    md = markdown(a)
    assert "## Partial runs" in md and f"| P &lt;script&gt;x&lt;/script&gt; | generated | 4 of {N_CASES} cases |" in md
    assert "<script>" not in md  # escaped in the markdown too


def test_case_counts_per_specialty_come_from_the_dataset(with_partial):
    """The partial release covers 4 Cardiology cases; Cardiology still has 20 (issue #13)."""
    from craftmd.analysis.view import View

    data, a = with_partial
    truth = pl.read_parquet(data / "all" / "test-00000-of-00001.parquet").group_by("specialty").len()
    v = View(a)
    assert {sp: v.n_cases(sp) for sp in v.specialties} == dict(truth.iter_rows()) == {"Cardiology": 20, "Neurology": 20}
    sizes = a.group_sizes.filter(pl.col("group_by") == "all", ~pl.col("with_image"))
    assert sizes["n_cases"].to_list() == [N_CASES]


def test_the_page_is_byte_identical_for_the_same_inputs(with_partial, tmp_path):
    from craftmd.analysis.page import write_page

    data, a = with_partial
    one, two = write_page(a, tmp_path / "one"), write_page(a, tmp_path / "two")
    assert one.read_bytes() == two.read_bytes()
    assert (tmp_path / "one" / "leaderboard.md").read_bytes() == (tmp_path / "two" / "leaderboard.md").read_bytes()


def test_a_model_graded_by_itself_never_tops_the_board(tmp_path):
    """Issue #13: a 135M model graded by its own weights called all its answers right and ranked first. A release
    whose only FRQ grader is its own model (forced with --allow-self, recorded self_graded) has no FRQ
    figure on the board, ranks below every release graded by another, and the page marks it."""
    from craftmd.analysis.page import markdown, write_page
    from craftmd.analysis.view import View

    data = _dataset(tmp_path)
    rel = tmp_path / "releases"
    _release(rel, "a", {"vignette": _all_trials(range(30)), "multiturn": _all_trials(range(10))})
    _release(
        rel,
        "me",
        {"vignette": _all_trials(range(N_CASES)), "multiturn": _all_trials(range(N_CASES))},
        grader="llm:test/me",
        record={"self_graded": True},
    )
    a = compute(rel, data, B=200)
    v = View(a)
    assert v.models == ["a", "me"] and v.grader_for("me", "frq") is None and v.self_graded["me"] == {"llm:test/me"}
    page = write_page(a, tmp_path / "page").read_text()
    lead = page[page.index('class="lead"') : page.index('id="board"')]
    assert "<b>A</b>" in lead and "ME" not in lead
    board = page[page.index('id="leaderboard"') :]
    board = board[: board.index("</table>")]
    assert "self-graded: llm:test/me" in board
    who = page[page.index('id="frq-graders"') :]
    assert "self-graded</span>" in who[: who.index("</table>")]
    assert "(self-graded, not used: llm:test/me)" in markdown(a)


# -- releases of other protocols beside the paper's ---------------------------------------------------------


@pytest.fixture(scope="module")
def with_protocols(tmp_path_factory):
    """Two releases of the paper's protocol (upstream's), one generated with it, two generated with craftmd-v1 over 3
    trials (all right: they would top the board if ranked) and a submission stating no protocol (all right too)."""
    from craftmd.generation.ingest import upstream_protocol
    from craftmd.release import PromptRef

    root = tmp_path_factory.mktemp("protocols")
    data = _dataset(root)
    rel = root / "releases"
    paper = upstream_protocol()
    v1 = paper.model_copy(update={"prompt_set": PromptRef(name="craftmd-v1", sha256="0" * 64), "trials": 3, "grader": None})
    everything = {"vignette": _all_trials(range(N_CASES)), "multiturn": _all_trials(range(N_CASES))}
    _release(
        rel, "u1", {"vignette": _all_trials(range(30)), "multiturn": _all_trials(range(10))}, kind="upstream", protocol=paper
    )
    _release(rel, "u2", {"vignette": _all_trials(range(20)), "multiturn": _all_trials(range(5))}, kind="upstream", protocol=paper)
    generated_paper = paper.model_copy(update={"grader": None})  # generation records no grader: free response per grader
    _release(rel, "gp", {"vignette": _all_trials(range(25)), "multiturn": _all_trials(range(8))}, protocol=generated_paper)
    _release(rel, "v1a", everything, protocol=v1)
    _release(rel, "v1b", {"vignette": _all_trials(range(35)), "multiturn": _all_trials(range(30))}, protocol=v1)
    _release(rel, "sub", everything, kind="submission", source={"conversations_file": "c.parquet"})  # states none
    return data, compute(rel, data, B=200)


def test_releases_of_another_protocol_are_never_ranked_with_the_papers(with_protocols, tmp_path):
    from craftmd.analysis.page import markdown, write_page
    from craftmd.analysis.tables import write_tables
    from craftmd.analysis.view import View

    _, a = with_protocols
    v = View(a)
    assert v.models == ["u1", "gp", "u2"] and v.partial == [] and v.self_reported == []  # the paper's protocol alone
    v1_reasons = ["prompt set craftmd-v1 ≠ craftmd-upstream-3bb2737", "3 trials vs 5"]
    unknown = ["unknown protocol (the release states none)"]
    assert [(g["reasons"], g["models"]) for g in v.other_protocols] == [(v1_reasons, ["v1a", "v1b"]), (unknown, ["sub"])]
    # no model-vs-model test pairs releases of two protocols; each protocol's releases are tested among themselves
    pairs = {frozenset((r["a"], r["b"])) for r in a.pvalues.filter(pl.col("family") == "model").iter_rows(named=True)}
    groups = [{"u1", "u2", "gp"}, {"v1a", "v1b"}, {"sub"}]
    assert pairs and all(any(p <= g for g in groups) for p in pairs), pairs
    assert frozenset(("v1a", "v1b")) in pairs and frozenset(("gp", "u1")) in pairs
    page = write_page(a, tmp_path).read_text()
    board = page[page.index('id="leaderboard"') :]
    board = board[: board.index("</table>")]
    assert "V1A" not in board and "SUB" not in board and "GP" in board
    assert f"Not comparable with the paper's runs: {'; '.join(v1_reasons)}</h3>" in page
    assert "Not comparable with the paper's runs: unknown protocol (the release states none)</h3>" in page
    apart = page[page.index('id="protocol-runs-1"') :]
    assert "V1A" in apart[: apart.index("</table>")]
    releases = page[page.index("<h3>Releases</h3>") :]
    assert "protocol: craftmd v2, prompts craftmd-upstream-3bb2737 (" in releases  # its sha256's first 12 digits
    assert ", patient openai/gpt-4-1106-preview, summarizer openai/gpt-3.5-turbo-1106, 5 trials" in releases
    assert "protocol: unknown protocol" in releases
    md = markdown(a)
    assert f"## Not comparable with the paper's runs: {'; '.join(v1_reasons)}" in md
    assert md.index("| V1A |") > md.index("## Not comparable") and md.index("| SUB |") > md.index("unknown protocol")
    write_tables(a, tmp_path)
    t = pl.read_csv(tmp_path / "tables" / "protocols.csv")
    assert dict(t.select("release", "comparable").iter_rows()) == {
        "gp": True, "sub": False, "u1": True, "u2": True, "v1a": False, "v1b": False
    }  # fmt: skip
    assert t.filter(pl.col("release") == "v1a")["not_comparable_because"].item() == "; ".join(v1_reasons)


def test_a_holm_family_holds_one_protocols_tests(with_protocols):
    """Models are paired within a protocol, and Holm adjusts each protocol's pairs apart: in a setting where the
    paper's protocol and craftmd-v1 both have pairs, each protocol's adjusted p-values are Holm's over its own pairs."""
    import numpy as np
    from statsmodels.stats.multitest import multipletests

    _, a = with_protocols
    proto = dict(a.releases.select("release", "protocol").iter_rows())
    rows = a.pvalues.filter(pl.col("family") == "model").with_columns(pl.col("a").replace_strict(proto).alias("protocol"))
    cell = ["setting", "format", "grader", "with_image", "group_by", "group", "test"]
    mixed = 0
    for _, g in rows.group_by(cell, maintain_order=True):
        for _, f in g.group_by("protocol", maintain_order=True):
            assert f["p_adjusted"].to_list() == pytest.approx(multipletests(f["p_value"].to_numpy(), method="holm")[1].tolist())
        if g["protocol"].n_unique() > 1:
            mixed += not np.allclose(multipletests(g["p_value"].to_numpy(), method="holm")[1], g["p_adjusted"].to_numpy())
    assert mixed  # one family of both protocols' pairs would have adjusted them otherwise


def test_a_history_holm_family_holds_one_protocols_tests():
    from craftmd.analysis.history import _tests_frame

    res = {
        ("test", "m", a, b): (0.1, 0.0, 0.2, p, 10) for a, b, p in (("x1", "x2", 0.01), ("x1", "x3", 0.02), ("y1", "y2", 0.04))
    }
    t = _tests_frame(res, {"x1": "X", "x2": "X", "x3": "X", "y1": "Y", "y2": "Y"})
    assert dict(zip(t["model_b"], t["p_holm"])) == pytest.approx({"x2": 0.02, "x3": 0.02, "y2": 0.04})  # not 0.03, 0.04, 0.04


def test_an_image_run_is_never_ranked_with_a_text_run_nor_silently_beside_gpt4v(tmp_path):
    """A run that showed the doctor the images is another protocol than a text run (its words say so); the image
    cases' table puts first the releases of GPT-4V's recorded run's protocol, and says of any other image run why it is
    not comparable; tables/protocols.csv judges an image run against GPT-4V's."""
    from craftmd.analysis.page import _image_rows
    from craftmd.analysis.view import View, protocol_table
    from craftmd.generation.ingest import upstream_protocol
    from craftmd.release import protocol_differences

    data = _dataset(tmp_path)
    _nejm(data)
    rel = tmp_path / "releases"
    paper, gpt4v = upstream_protocol(), upstream_protocol(images=True)
    assert protocol_differences(gpt4v, paper) == ["images shown to the doctor vs text only"]
    assert paper.key() != gpt4v.key()
    local = gpt4v.model_copy(update={"roles": {"patient": "local/p", "summarizer": "local/p"}, "grader": None})
    same = gpt4v.model_copy(update={"grader": None})
    _release(
        rel, "u1", {"vignette": _all_trials(range(30)), "multiturn": _all_trials(range(10))}, kind="upstream", protocol=paper
    )
    for rid, p, right in (("v", gpt4v, 5), ("g", local, 9), ("h", same, 2)):  # g: the best, of another protocol
        cells = {"vignette": _all_trials(range(right)), "multiturn": _all_trials(range(right))}
        _release(rel, rid, cells, kind="upstream" if rid == "v" else "generated", protocol=p, image=True, cases=range(10))
    a = compute(rel, data, B=200)
    v = View(a)
    assert v.models == ["u1"] and v.image_models == ["g", "h", "v"]
    assert v.image_reference == gpt4v.key() and v.image_reference_is_paper
    why = ["patient local/p vs openai/gpt-4-1106-preview", "summarizer local/p vs openai/gpt-3.5-turbo-1106"]
    assert v.image_apart == {"g": why}
    rows = _image_rows(v)
    assert list(dict.fromkeys(r["display"] for r in rows)) == ["H", "V", "G"] and rows[-1]["apart"] == "; ".join(why)
    t = protocol_table(a)
    assert dict(t.select("release", "comparable").iter_rows()) == {"g": False, "h": True, "u1": True, "v": True}
    assert t.filter(pl.col("release") == "g")["not_comparable_because"].item() == "; ".join(why)


def test_the_board_by_task_never_ranks_two_protocols_together(with_protocols):
    from craftmd.analysis.boards import page_section, task_boards

    from dataclasses import replace

    a = replace(with_protocols[1])
    a.boards = task_boards(a)
    assert set(a.boards.filter(pl.col("release") == "v1a")["protocol"]) == {
        a.releases.filter(pl.col("release") == "v1a")["protocol"].item()
    }
    tables = page_section(a)
    assert [(t["label"], [r["release"] for r in t["rows"]]) for t in tables] == [
        ("CRAFT-MD diagnosis", ["u1", "gp", "u2"]),
        ("CRAFT-MD diagnosis: not comparable with the paper's runs (prompt set craftmd-v1 ≠ craftmd-upstream-3bb2737; 3 trials vs 5)", ["v1a", "v1b"]),
        ("CRAFT-MD diagnosis: not comparable with the paper's runs (unknown protocol (the release states none))", ["sub"]),
    ]  # fmt: skip


def test_craftmd_analyse_reads_the_releases_folder_once(built, tmp_path, monkeypatch):
    """`craftmd analyse --page` lists the releases folder once (the board, analysis.board.Board.read): the tables, the
    figures and the page are all made from that one reading."""
    from craftmd.commands.cli import main

    rel, data, _ = built
    seen = listings(monkeypatch, rel)
    out = tmp_path / "out"
    assert (
        main(["analyse", "--releases", str(rel), "--dataset", str(data), "--out", str(out), "--resamples", "200", "--page"]) == 0
    )
    assert (out / "index.html").is_file() and (out / "tables" / "accuracy.csv").is_file()
    assert seen == ["find_releases"]


def test_a_column_declared_once_is_on_the_board_with_no_other_edit(built, tmp_path, monkeypatch):
    """One more column of the main board is one more :class:`craftmd.tasks.Measure` in its task's ``Analysis.columns``:
    the page's board and its Markdown twin show it (heading escaped, a cell in every row, the human row's span widened)
    with no other edit, because the templates loop over the declared columns."""
    import re
    from dataclasses import replace

    from craftmd.analysis.page import write_page
    from craftmd.tasks import TASKS, Measure, get_task

    task = get_task("craftmd")
    declared = [c.label for c in task.analysis.columns]
    extra = Measure("frq_vignette_offline", "Vignette FRQ <offline|rule>", setting="vignette", format="frq", grader="offline")
    columns = (*task.analysis.columns, extra)
    monkeypatch.setitem(TASKS, "craftmd", replace(task, analysis=replace(task.analysis, columns=columns)))
    a = replace(built[2])  # a copy: a view of its own, made with the declared columns of now
    write_page(a, tmp_path)

    board = (tmp_path / "index.html").read_text().split('<table id="leaderboard"', 1)[1].split("</table>", 1)[0]
    heads = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", board.split("</thead>", 1)[0])
    assert heads == ["#", "Model", "Kind", *declared, "Vignette FRQ &lt;offline|rule&gt;", "Cases", "FRQ grader"]
    rows = re.findall(r"<tr>(.*?)</tr>", board.split("<tbody>", 1)[1].split("</tbody>", 1)[0], re.S)
    assert len(rows) == 3
    for row in rows:
        cells = re.findall(r"<td[^>]*>", row)
        assert len(cells) == len(heads)
        name = re.search(r'title="test/(\w+)"', row).group(1)
        got = re.search(r'data-v="([-\d.]+)"', cells[len(heads) - 3]).group(1)
        assert float(got) == pytest.approx(acc(a, name, "vignette")["accuracy"], abs=1e-6)
    span = int(re.search(r'colspan="(\d+)"', board).group(1))
    assert 3 + span == len(heads)  # the human row: three cells, then one over the rest

    md = (tmp_path / "leaderboard.md").read_text().split("\n\n| # |", 1)[1].split("\n\n", 1)[0].splitlines()
    assert md[0].split(" | ")[2:-1] == [*declared, "Vignette FRQ &lt;offline\\|rule&gt;"]
    assert md[1] == "|" + "---|" * len(heads[:-1])  # no Cases column in the twin
    best = next(r for r in md[2:] if r.split(" | ")[1] == "A")
    assert best.split(" | ")[-2].startswith("0.750 (")


BOARD_TASK = '''
from craftmd.tasks import Analysis, Experiment, Measure, Task, register

NAME, EXTRA = __NAME__, __EXTRA__


def board(a, v):
    """Each release's three measures."""
    rows = []
    for i, rel in enumerate(sorted(v.release_info)):
        rows.append(dict(release=rel, measure="solved", value=0.5 + i / 10, ci_low=0.4, ci_high=0.9, n_cases=10))
        rows.append(dict(release=rel, measure="turns", value=3.0 + i, ci_low=2.0, ci_high=6.0, n_cases=10))
        rows.append(dict(release=rel, measure="polite", value=0.9 - i / 10, ci_low=0.1, ci_high=0.95, n_cases=10))
    return rows


MEASURES = (Measure("solved", "Solved"), Measure("turns", "Turns", percent=False))
TASK = register(Task(name=NAME, description="a board's columns", dataset="craftmd", experiments=(Experiment("talk", "text"),),
                     analysis=Analysis(measures=MEASURES + EXTRA, board=board, label="Board toy")))
'''


@pytest.mark.parametrize("extra", [False, True])
def test_a_measure_declared_once_is_a_column_of_the_board_per_task(tmp_path, monkeypatch, extra):
    """A task file from $CRAFTMD_TASKS whose board gives three measures: declaring the third (one more ``Measure`` in
    its ``Analysis.measures``) is the one edit that puts it on the page's board per task and its Markdown twin, after
    the others, in the declared order; undeclared, its rows are one line that names it, and nothing is written."""
    import sys

    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import Analysis, _empty, _with_boards
    from craftmd.tasks import TASK_FILES, TASKS

    name = f"boardtoy{int(extra)}"
    path = tmp_path / f"{name}.py"
    declared = '(Measure("polite", "Polite <share>"),)' if extra else "()"
    path.write_text(BOARD_TASK.replace("__NAME__", repr(name)).replace("__EXTRA__", declared))
    for registry, key in ((TASKS, name), (TASK_FILES, name), (sys.modules, f"craftmd_task_{name}")):
        monkeypatch.setitem(registry, key, None)  # taken out again when the test ends
        del registry[key]
    monkeypatch.setenv("CRAFTMD_TASKS", str(path))
    ids = ["r-a", "r-b"]
    releases = pl.DataFrame({"release": ids, "kind": ["generated"] * 2, "model": ["openai/a", "openai/b"], "display": ["A", "B"],
                             "notes": ["{}"] * 2, "counts": ["{}"] * 2, "source": ["{}"] * 2, "scorers": ["{}"] * 2,
                             "task": [name] * 2, "protocol": [None, None]})  # fmt: skip
    e = _empty()
    fields = [f.name for f in dataclasses.fields(Analysis)][:10]
    a = Analysis(**{f: (releases if f == "releases" else e[f]) for f in fields})
    if not extra:
        with pytest.raises(
            CraftMDError, match=f"task '{name}': its board gives the measure 'polite', which its Analysis.measures"
        ):
            _with_boards(a)
        return
    write_page(_with_boards(a), tmp_path / "out")
    html = (tmp_path / "out" / "index.html").read_text()
    table = html.split("<h3>Board toy</h3>", 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<th(?: [^>]*)?>(.*?)</th>", table) == [
        "Model",
        "Release",
        "Solved",
        "Turns",
        "Polite &lt;share&gt;",
        "Cases",
    ]
    rows = re.findall(r"<tr><td.*?</tr>", table)
    assert [re.search(r'title="([^"]+)"', r).group(1) for r in rows] == ["r-b", "r-a"]  # best first by the first measure
    assert [re.findall(r'data-v="([-\d.]+)"', r) for r in rows] == [
        ["0.600000", "4.000000", "0.800000"],
        ["0.500000", "3.000000", "0.900000"],
    ]
    md = (tmp_path / "out" / "leaderboard.md").read_text().split("### Board toy\n\n", 1)[1].splitlines()
    assert md[0] == "| Model | Release | Solved | Turns | Polite &lt;share&gt; | " and md[1] == "|---|---|---|---|---|"


def test_letting_go_of_duckdbs_thread_memory_keeps_the_connection_and_its_threads():
    """``runner.let_go`` ends DuckDB's worker threads and starts them again (what they kept of their tasks' memory is
    given back): the connection answers as before, with as many threads as it had."""
    import duckdb

    from craftmd.analysis import runner

    con = duckdb.connect(":memory:")
    con.execute("set threads = 3")
    con.execute("create table t as select range as x from range(100000)")
    before = con.sql("select sum(x) from t").fetchall()
    runner.let_go(con)
    assert con.sql("select current_setting('threads')").fetchall() == [(3,)]
    assert con.sql("select sum(x) from t").fetchall() == before
