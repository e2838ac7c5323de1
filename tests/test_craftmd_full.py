"""CRAFT-MD in full: the paper's other tests (four-choice MCQ against FRQ, with against without the image, McNemar
between models on the dermatologists' labels), the preprint's published p-values beside them, the dermatologists'
reported accuracy, and the figures with significance brackets.

The tests are computed by hand on tiny constructed releases whose answers are known; the published comparison runs
on the ingested upstream releases of GPT-4 and GPT-3.5."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from scipy.stats import binomtest, chi2

from craftmd import CraftMDError
from craftmd.analysis.bootstrap import DEFAULT_SEED, resample_counts
from craftmd.analysis.tables import analyse, compute
from craftmd.release import RunRecord, write_release

from helpers import analysed_twice

N, TRIALS, B = 20, 5, 1000
IMAGES = 6
SETTINGS = ("vignette", "multiturn", "singleturn", "summarized")


def _dataset(root):
    d = root / "data"
    (d / "all").mkdir(parents=True)
    pl.DataFrame({
        "case_id": [f"case_{i}" for i in range(N)], "source": ["derm_public"] * 10 + ["derm_private"] * 10,
        "specialty": ["Dermatology"] * N, "single_dx": [i % 4 != 0 for i in range(N)],
    }).write_parquet(d / "all" / "test-00000-of-00001.parquet")  # fmt: skip
    (d / "nejm_image").mkdir()
    pl.DataFrame(
        {
            "case_id": [f"img_{i}" for i in range(IMAGES)],
            "source": ["nejm_image"] * IMAGES,
            "specialty": pl.Series([None] * IMAGES, dtype=pl.String),
        }
    ).write_parquet(d / "nejm_image" / "test-00000-of-00001.parquet")
    return d


def _release(out, rid, cells: dict, display=None):
    """cells: {(setting, format, with_image): (case ids, set of correct (case id, trial))}; MCQ graded by 'paper',
    FRQ by 'offline'."""
    from craftmd.scoring.scorers import scores_from_grades

    ans = {k: [] for k in ("case_id", "trial", "setting", "format", "with_image", "response", "status")}
    grd = []
    for (setting, fmt, img), (cases, correct) in cells.items():
        for c in cases:
            for t in range(TRIALS):
                for k, v in zip(ans, (c, t, setting, fmt, img, f"dx ({rid})", "ok")):  # each release's answers its own
                    ans[k].append(v)
                grd.append({"case_id": c, "trial": t, "setting": setting, "format": fmt, "with_image": img,
                            "grader": "paper" if fmt == "mcq4" else "offline", "resolved": "dx", "resolved_kind": "single",
                            "correct": (c, t) in correct, "detail": None})  # fmt: skip
    m = RunRecord(
        task="craftmd",
        release=rid,
        kind="generated",
        model=f"test/{rid}",
        source={"commit": "test"},
        display_name=display or rid.upper(),
    )
    return write_release(out / rid, m, {"answers": pa.table(ans)}, scores=(scores_from_grades(grd), {"paper": {}, "offline": {}}))


def _trials(cases, trials=range(TRIALS)):
    return {(f"case_{c}" if isinstance(c, int) else c, t) for c in cases for t in trials}


TEXT = [f"case_{i}" for i in range(N)]
IMG = [f"img_{i}" for i in range(IMAGES)]

#: release a: MCQ right on cases 0-14 in every setting; FRQ right on 0-4 (vignette), 0-1 (conversations), and on
#: summarized FRQ also case 15's first trial (one trial the other way round)
A_MCQ = _trials(range(15))
A_FRQ = {"vignette": _trials(range(5)), "multiturn": _trials(range(2)), "singleturn": _trials(range(2)),
         "summarized": _trials(range(2)) | {("case_15", 0)}}  # fmt: skip


def _correct_mask(cases, correct):
    return np.array([[(c, t) in correct for t in range(TRIALS)] for c in cases])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    data = _dataset(root)
    rel = root / "releases"
    cells = {}
    for s in SETTINGS:
        cells[(s, "mcq4", False)] = (TEXT, A_MCQ)
        cells[(s, "frq", False)] = (TEXT, A_FRQ[s])
    _release(rel, "a", cells)
    # b: a vision model, FRQ on the image cases with the image (right on img_0-img_3) and without (right on img_0's
    # trials 0-1 and img_5's trial 0)
    _release(
        rel,
        "b",
        {
            ("vignette", "frq", True): (IMG, _trials(IMG[:4])),
            ("vignette", "frq", False): (IMG, _trials(["img_0"], range(2)) | {("img_5", 0)}),
            ("multiturn", "frq", True): (IMG, _trials(IMG[:1])),
            ("multiturn", "frq", False): (IMG, _trials(IMG[:1])),
        },
    )
    return rel, data, compute(rel, data, B=B)


def _row(df, **kw):
    for k, v in kw.items():
        df = df.filter(pl.col(k) == v)
    assert df.height == 1, kw
    return df.row(0, named=True)


def _holm(p):
    order = np.argsort(p, kind="stable")
    out, run = np.empty(len(p)), 0.0
    for i, j in enumerate(order):
        run = max(run, min(1.0, p[j] * (len(p) - i)))
        out[j] = run
    return out


def test_mcq_against_frq_by_hand(built):
    _, _, a = built
    ft = a.format_tests
    W = resample_counts(N, B, DEFAULT_SEED)
    boot = []
    for s in SETTINGS:
        r = _row(ft, model="a", setting=s, group_by="all", test="paired-bootstrap", mcq_grader="paper", frq_grader="offline")
        mcq, frq = _correct_mask(TEXT, A_MCQ), _correct_mask(TEXT, A_FRQ[s])
        d = mcq.mean(axis=1) - frq.mean(axis=1)  # per case: MCQ's share of right trials minus FRQ's
        assert r["n_cases"] == N and r["diff"] == pytest.approx(d.mean())
        sums = W.astype(np.float64) @ (d * TRIALS)  # the documented draw, in trial units (exact integers)
        obs = d.sum() * TRIALS
        p = (np.count_nonzero(np.abs(sums - obs) >= abs(obs)) + 1) / (B + 1)
        assert r["p_value"] == pytest.approx(p)
        boot.append(r)
        # McNemar on the paired trials: n10 = MCQ right and FRQ wrong, n01 = the reverse
        mc = _row(ft, model="a", setting=s, group_by="all", test="mcnemar", mcq_grader="paper", frq_grader="offline")
        n10, n01 = int((mcq & ~frq).sum()), int((~mcq & frq).sum())
        expected = (
            binomtest(n01, n10 + n01, 0.5).pvalue if n10 + n01 < 25 else chi2.sf((abs(n10 - n01) - 1) ** 2 / (n10 + n01), 1)
        )
        assert mc["p_value"] == pytest.approx(expected)
        assert mc["diff"] == pytest.approx((n10 - n01) / (N * TRIALS))
    assert _row(ft, model="a", setting="summarized", group_by="all", test="mcnemar")["diff"] == pytest.approx((65 - 1) / 100)
    # Holm within the model's four settings (one family per pair of graders, group and test)
    p = np.array([r["p_value"] for r in boot])
    assert [r["p_adjusted"] for r in boot] == pytest.approx(_holm(p).tolist())
    # groups: per dataset and the single-diagnosis subset, never per specialty; the image release has no MCQ
    assert set(ft["group_by"]) == {"all", "dataset", "single_dx"}
    sub = _row(ft, model="a", setting="vignette", group_by="single_dx", group="all", test="paired-bootstrap")
    assert sub["n_cases"] == 15
    assert ft.filter(pl.col("model") == "b").height == 0


def test_image_against_none_by_hand(built):
    _, _, a = built
    it = a.image_tests
    assert set(it["group_by"]) == {"all"} and set(it["model"]) == {"b"}
    r = _row(it, setting="vignette", test="paired-bootstrap")
    with_img = _correct_mask(IMG, _trials(IMG[:4]))
    without = _correct_mask(IMG, _trials(["img_0"], range(2)) | {("img_5", 0)})
    d = with_img.mean(axis=1) - without.mean(axis=1)
    assert r["n_cases"] == IMAGES and r["diff"] == pytest.approx(d.mean()) and r["grader"] == "offline" and r["format"] == "frq"
    sums = resample_counts(IMAGES, B, DEFAULT_SEED).astype(np.float64) @ (d * TRIALS)
    obs = d.sum() * TRIALS
    assert r["p_value"] == pytest.approx((np.count_nonzero(np.abs(sums - obs) >= abs(obs)) + 1) / (B + 1))
    mc = _row(it, setting="vignette", test="mcnemar")
    n10, n01 = int((with_img & ~without).sum()), int((~with_img & without).sum())
    assert (n10, n01) == (18, 1)
    assert mc["p_value"] == pytest.approx(binomtest(n01, n10 + n01, 0.5).pvalue)
    same = _row(it, setting="multiturn", test="mcnemar")
    assert same["diff"] == 0 and same["p_value"] == 1.0
    # Holm over the release's two settings
    ps = it.filter(pl.col("test") == "mcnemar").sort("setting")
    assert ps["p_adjusted"].to_list() == pytest.approx(_holm(ps["p_value"].to_numpy()).tolist())


def test_new_tables_are_written_and_the_published_ones_keep_their_columns(built, tmp_path):
    rel, data, a = built
    analysed_twice(rel, data, tmp_path, ("format_tests", "image_tests"), B=B, more_than=2)
    # the tests ride on the accuracy bootstrap without changing it
    from craftmd.analysis.stats import bootstrap_tables
    from craftmd.analysis.tables import prepared_connection
    from craftmd.analysis import runner
    from craftmd.release import find_releases

    con = prepared_connection([r for r in find_releases(rel) if r.has("scores")], data)
    q = {n: pl.from_arrow(runner.run(con, n)) for n in ("case_groups", "accuracy", "comparisons")}
    acc, pv = bootstrap_tables(q["case_groups"], q["accuracy"], q["comparisons"], B=B)
    assert acc.equals(a.accuracy) and pv.equals(a.pvalues)


# -- McNemar between models on the experts' labels -----------------------------------------------------------


def _review(labels: dict, tiebreak: dict | None = None):
    """labels: {(model, case): (r1, r2)}; tiebreak: {(model, case): r3}; one question, doctor_one_dx."""
    from craftmd.analysis.agreement.review import Rating, ReviewInput, Unit

    inp = ReviewInput(raters=["r1", "r2", "r3"])
    for (model, case), (x, y) in labels.items():
        u = f"{model}|{case}"
        inp.units[u] = Unit(u, model, case)
        inp.ratings += [Rating(u, "doctor_one_dx", "r1", x, "sheet"), Rating(u, "doctor_one_dx", "r2", y, "sheet")]
        if tiebreak and (model, case) in tiebreak:
            inp.ratings.append(Rating(u, "doctor_one_dx", "r3", tiebreak[(model, case)], "sheet"))
    return inp


def test_expert_mcnemar_by_hand():
    from craftmd.analysis.agreement.review import model_tests

    # P yes on cases 0-9, Q yes on 0-2 (and on case 9 only by the tie-break), R yes on 0-4
    labels = {}
    for c in range(12):
        labels[("P", f"case_{c}")] = (c < 10, c < 10)
        labels[("Q", f"case_{c}")] = (c < 3 or c == 9, c < 3)
        labels[("R", f"case_{c}")] = (c < 5, c < 5)
    t = model_tests(_review(labels, {("Q", "case_9"): True}))
    assert t.height == 3 and set(t["question"]) == {"doctor_one_dx"}
    pq = _row(t, model_a="P", model_b="Q")
    assert (pq["n_cases"], pq["yes_a"], pq["yes_b"], pq["n10"], pq["n01"]) == (12, 10, 4, 6, 0)
    assert pq["p_value"] == pytest.approx(binomtest(0, 6, 0.5).pvalue)
    assert pq["diff"] == pytest.approx(6 / 12)
    qr = _row(t, model_a="Q", model_b="R")
    assert (qr["n10"], qr["n01"]) == (1, 2) and qr["p_value"] == pytest.approx(1.0)
    assert t.sort("model_a", "model_b")["p_adjusted"].to_list() == pytest.approx(
        _holm(t.sort("model_a", "model_b")["p_value"].to_numpy()).tolist()
    )
    # a model rated twice on one case cannot be paired
    from craftmd.analysis.agreement.review import Rating, Unit

    inp = _review({("P", "case_0"): (True, True), ("Q", "case_0"): (False, False)})
    inp.units["P2|case_0"] = Unit("P2|case_0", "P", "case_0")
    inp.ratings += [Rating("P2|case_0", "doctor_one_dx", "r1", True, "x"), Rating("P2|case_0", "doctor_one_dx", "r2", True, "x")]
    with pytest.raises(CraftMDError, match="reviewed more than once on case_0"):
        model_tests(inp)


def test_expert_mcnemar_on_the_dermatologists_sheets(source):
    """Upstream's sheets: four models on the same 45 cases, three questions; each model's yes count is its share in
    the recomputed expert figures (the audit's path)."""
    from craftmd.analysis.agreement.expert import dermatologists_sheets
    from craftmd.analysis.agreement.review import model_tests, summarise

    inp = dermatologists_sheets(source)
    t = model_tests(inp)
    assert t.height == 3 * 6 and set(t["n_cases"]) == {45}
    shares = {(r["model"], r["question"]): r["yes"] for r in summarise(inp)["shares"]}
    for r in t.iter_rows(named=True):
        assert r["yes_a"] == shares[(r["model_a"], r["question"])] and r["yes_b"] == shares[(r["model_b"], r["question"])]
        assert r["yes_a"] - r["yes_b"] == r["n10"] - r["n01"]
        assert r["p_adjusted"] >= r["p_value"]


# -- the preprint's p-values ----------------------------------------------------------------------------------


def test_published_comparison_reads_the_rows_it_can_compare():
    from craftmd.analysis.published import published_format_comparison

    tsv = ("\tExperiment1\tExperiment2\tGPT_model\tpvalue\tcorrected_pvalue\n0\tFRQ\t4-choice MCQ\tGPT4\t0.5\t1\n"
           "1\tFRQ\tMany-choice MCQ\tGPT4\t0.01\t0.03\n").encode()  # fmt: skip
    ours = pl.DataFrame({"model": ["gpt4_1106"], "setting": ["multiturn"], "with_image": [False], "group_by": ["all"], "group": ["all"],
                         "mcq_grader": ["paper"], "frq_grader": ["upstream-gpt4"], "n_cases": [10], "diff": [0.1], "p_value": [0.01],
                         "p_adjusted": [0.04], "test": ["paired-bootstrap"]})  # fmt: skip
    tables = {"fig3c_stats.tsv": tsv, "figs3a_stats.tsv": tsv, "figs3b_stats.tsv": tsv}
    cmp = published_format_comparison(tables, ours)
    assert cmp.height == 3  # the many-choice rows have no released answers: left out
    main = _row(cmp, table="fig3c_stats.tsv")
    assert (main["published_p"], main["p_value"], main["same_p"], main["same_decision"]) == (0.5, 0.01, False, False)
    assert _row(cmp, table="figs3a_stats.tsv")["p_value"] is None  # no derm_public test here
    with pytest.raises(CraftMDError, match="p-value is not a number"):
        published_format_comparison({**tables, "fig3c_stats.tsv": tsv.replace(b"0.5", b"n/a")}, ours)


def test_published_p_values_of_mcq_against_frq(source, releases_dir, dataset_dir, tmp_path):
    """The preprint's FRQ-vs-4-choice-MCQ p-values (results/statistics/) beside the same tests on the ingested GPT-4
    and GPT-3.5 releases (multi-turn, paper rule, the recorded GPT-4 grader-AI, 10,000 resamples as the preprint):
    equal in five cells, all at the bootstrap's floor 1 / 10,001; not in the sixth (the preprint's GPT-3.5 on its
    second dermatology panel, 0.149, against < 0.001 here)."""
    from craftmd.analysis.published import FORMAT_TABLES, STATISTICS, published_format_comparison

    two = tmp_path / "releases"
    two.mkdir()
    for rid in ("gpt4_1106", "gpt3_1106"):
        (two / rid).symlink_to(releases_dir / rid, target_is_directory=True)
    a = compute(two, dataset_dir)
    files = source.read_files([STATISTICS + n for n in FORMAT_TABLES])
    cmp = published_format_comparison({p.rsplit("/", 1)[1]: d for p, d in files.items()}, a.format_tests)
    same = {(r["table"], r["preprint_model"]) for r in cmp.filter(pl.col("same_p")).iter_rows(named=True)}
    assert same == {("fig3c_stats.tsv", "GPT4"), ("fig3c_stats.tsv", "GPT-3.5"), ("figs3a_stats.tsv", "GPT4"),
                    ("figs3a_stats.tsv", "GPT-3.5"), ("figs3b_stats.tsv", "GPT4")}  # fmt: skip
    for r in cmp.filter(pl.col("same_p")).iter_rows(named=True):
        assert r["p_value"] == pytest.approx(1 / 10_001, abs=1e-12)
    differ = _row(cmp, same_p=False)
    assert (differ["table"], differ["preprint_model"], differ["group"]) == ("figs3b_stats.tsv", "GPT-3.5", "derm_private")
    assert differ["published_p"] == pytest.approx(0.1494850514948505) and differ["p_value"] < 0.001


# -- the page ---------------------------------------------------------------------------------------------------


def _page(rel, data, out, B=B):
    from craftmd.analysis.page import write_page

    a = analyse(rel, data, out, B=B)
    write_page(a, out)
    return (out / "index.html").read_text()


def test_the_page_shows_the_new_tests_figures_and_the_reported_human_row(built, tmp_path):
    rel, data, _ = built
    page = _page(rel, data, tmp_path / "lb")
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert srcs and all((tmp_path / "lb" / s).is_file() for s in srcs)  # every figure the page shows exists
    for f in ("settings_tests.png", "single_dx.png", "mcq_vs_frq.png", "vision.png"):
        assert f"figures/{f}" in srcs
    assert "figures/exam.png" not in srcs and 'id="exam-none"' in page  # no exam settings: said, not drawn
    assert 'id="format-tests-table"' in page and 'id="image-tests-table"' in page
    assert 'href="tables/format_tests.csv"' in page and (tmp_path / "lb" / "tables" / "format_tests.csv").is_file()
    board = page[page.index('id="leaderboard"') :]
    board = board[: board.index("</table>")]
    human = board[board.index('<tfoot id="human-row">') :]  # under the ranked rows, never sorted among them
    assert "<tr" not in board[board.rindex("</tbody>") : board.index("<tfoot")]
    assert (
        "Dermatologists" in human and "reported" in human and "86.0%" in human and "87.0%" in human and "not recomputed" in human
    )
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "reported, not recomputed" in md and "Four-choice MCQ against FRQ" in md


def test_without_image_answers_the_page_says_so_and_exam_settings_draw_their_figure(tmp_path):
    data = _dataset(tmp_path)
    rel = tmp_path / "releases"
    cells = {}
    for s in ("vignette", "multiturn", "exam", "multiturn_no_exam", "multiturn_plus_exam"):
        cells[(s, "mcq4", False)] = (TEXT, _trials(range(12)))
        cells[(s, "frq", False)] = (TEXT, _trials(range(3 if "exam" in s else 6)))
    _release(rel, "a", cells)
    _release(rel, "v", {("vignette", "frq", True): (IMG, _trials(IMG[:2]))})  # with the image only, as upstream's GPT-4V
    page = _page(rel, data, tmp_path / "lb", B=200)
    assert 'id="image-tests-none"' in page and 'id="image-tests-table"' not in page
    assert "figures/exam.png" in page and (tmp_path / "lb" / "figures" / "exam.png").is_file() and 'id="exam-none"' not in page
    assert pl.read_csv(tmp_path / "lb" / "tables" / "image_tests.csv").height == 0
