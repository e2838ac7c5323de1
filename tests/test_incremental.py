"""A board that grows, incrementally: an analysis into the folder of an earlier one reads back every interval and
p-value whose case vectors are unchanged (OUT/.cache), resamples only what a new or changed release brings, and
writes the same bytes as a full analysis."""

from __future__ import annotations

import shutil

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from test_analysis import _all_trials, _dataset, _release

from craftmd.analysis.tables import CACHE, analyse
from craftmd.commands.cli import main

B = 200


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _add(rel, i: int):
    _release(rel, f"r{i:02d}", {"vignette": _all_trials(range(2 + 3 * i)), "multiturn": _all_trials(range(1 + 3 * i))})


def _board(root, n: int):
    """The test dataset and ``n`` releases r00.. (release i right on 2 + 3 i vignette and 1 + 3 i multi-turn cases)."""
    data, rel = _dataset(root), root / "releases"
    for i in range(n):
        _add(rel, i)
    return data, rel


def _keys(out) -> set[bytes]:
    return set(pq.read_table(out / CACHE / "resamples.parquet").column("key").to_pylist())


def _analyse(rel, data, out, previous=None):
    return analyse(rel, data, out, B=B, figures=False, previous=previous)


def test_adding_a_release_resamples_only_it_and_its_pairs_and_writes_what_a_full_run_writes(tmp_path):
    data, rel = _board(tmp_path, 4)
    first = _analyse(rel, data, tmp_path / "one")
    assert first.timings["memo"]["read_back"] == 0
    again = _analyse(rel, data, tmp_path / "same", previous=tmp_path / "one")  # nothing changed: nothing resampled
    assert again.timings["memo"] == {"read_back": first.timings["memo"]["resampled"], "resampled": 0}
    assert _files(tmp_path / "same") == _files(tmp_path / "one")

    _add(rel, 4)
    inc = _analyse(rel, data, tmp_path / "inc", previous=tmp_path / "one")
    full = _analyse(rel, data, tmp_path / "full")
    assert _files(tmp_path / "inc") == _files(tmp_path / "full")  # tables and the kept memo, byte for byte
    # what was resampled is what the new release brought: its own cells and its pairs with the four others
    new = _keys(tmp_path / "full") - _keys(tmp_path / "one")
    assert inc.timings["memo"]["resampled"] == len(new) > 0
    assert inc.timings["memo"]["read_back"] == len(_keys(tmp_path / "one"))  # everything kept was still current
    # and the per-release queries (trial grades to case scores) ran for the new release alone, the pairs of models'
    # counts for its four new pairs alone
    assert first.timings["kept"] == {"read_back": 0, "computed": 4, "pairs_read_back": 0, "pairs_computed": 6}
    assert inc.timings["kept"] == {"read_back": 4, "computed": 1, "pairs_read_back": 6, "pairs_computed": 4}
    alone = tmp_path / "releases-new-only"
    shutil.copytree(rel / "r04", alone / "r04")
    own = _keys_of(alone, data, tmp_path / "own")  # the new release's own cells (no pairs: it is alone)
    assert own <= _keys(tmp_path / "full") and new - own  # and its pairs with the others
    pairs = full.pvalues.filter(pl.col("family") == "model", pl.col("test") == "paired-bootstrap")
    assert pairs.filter((pl.col("a") == "r04") | (pl.col("b") == "r04")).height > 0


def _keys_of(rel, data, out):
    _analyse(rel, data, out)
    return _keys(out)


def test_a_changed_scores_file_resamples_exactly_what_read_it(tmp_path):
    data, rel = _board(tmp_path, 3)
    _analyse(rel, data, tmp_path / "one")
    # r01 gets one more case right in the vignette: its cells and its pairs change, r00 against r02 does not
    shutil.rmtree(rel / "r01")
    _release(rel, "r01", {"vignette": _all_trials(range(6)), "multiturn": _all_trials(range(4))})
    two = _analyse(rel, data, tmp_path / "two", previous=tmp_path / "one")
    assert _files(tmp_path / "two") == _files(_full(rel, data, tmp_path / "full"))
    without = tmp_path / "without-r01"
    for r in ("r00", "r02"):
        shutil.copytree(rel / r, without / r)
    untouched = _keys_of(without, data, tmp_path / "untouched")  # everything that never read r01
    kept = _keys(tmp_path / "one") & _keys(tmp_path / "two")
    assert untouched <= kept  # read back, not recomputed
    assert two.timings["memo"]["resampled"] == len(_keys(tmp_path / "two") - _keys(tmp_path / "one")) > 0
    # r01's case scores made again, and its two pairs' counts; the others read back
    assert two.timings["kept"] == {"read_back": 2, "computed": 1, "pairs_read_back": 1, "pairs_computed": 2}
    assert not (_keys(tmp_path / "two") - _keys(tmp_path / "one")) & untouched


def _full(rel, data, out):
    _analyse(rel, data, out)
    return out


def test_the_command_reads_the_cache_of_its_own_folder_and_no_cache_recomputes(tmp_path, capsys):
    data, rel = _board(tmp_path, 3)
    out = tmp_path / "out"
    argv = ["analyse", "--releases", str(rel), "--dataset", str(data), "--out", str(out), "--resamples", str(B)]
    assert main(argv) == 0
    before = _files(out)
    assert ".cache/resamples.parquet" in before and ".cache/figures.sha256" in before
    # a damaged cache only costs the work it would have saved
    (out / CACHE / "resamples.parquet").write_bytes(b"not parquet")
    kept = sorted((out / CACHE / "queries").glob("case_scores-*.parquet"))
    assert len(kept) == 3
    kept[0].write_bytes(kept[0].read_bytes()[:100])  # a kept release's case scores, cut short: made again
    pairs = out / CACHE / "queries" / "model_pairs.parquet"  # the pairs' counts kept in another shape: counted again
    pl.read_parquet(pairs).with_columns(pl.col("n_cases").cast(pl.Int64)).write_parquet(pairs)
    (out / "figures" / "settings.png").write_bytes(b"stale")  # figures are read back only when the digest matches...
    (out / CACHE / "figures.sha256").write_text("0" * 64)  # ...which it no longer does
    assert main(argv) == 0
    assert _files(out) == before
    assert main([*argv, "--no-cache"]) == 0
    assert _files(out) == before


def test_a_changed_dataset_resamples_exactly_the_groups_it_changed(tmp_path):
    data, rel = _board(tmp_path, 3)
    one = _analyse(rel, data, tmp_path / "one")
    # case_0 moves from Cardiology to Neurology: those two groups' cells change; every other group's stay as they were
    path = next((data / "all").glob("*.parquet"))
    cases = pl.read_parquet(path)
    cases.with_columns(pl.when(pl.col("case_id") == "case_0").then(pl.lit("Neurology")).otherwise(pl.col("specialty"))
                       .alias("specialty")).write_parquet(path)  # fmt: skip
    two = _analyse(rel, data, tmp_path / "two", previous=tmp_path / "one")
    assert _files(tmp_path / "two") == _files(_full(rel, data, tmp_path / "full"))
    assert 0 < two.timings["memo"]["resampled"] < one.timings["memo"]["resampled"]
    # every release's case groups read the dataset (and so every pair's counts)
    assert two.timings["kept"] == {"read_back": 0, "computed": 3, "pairs_read_back": 0, "pairs_computed": 3}
    moved = ("Cardiology", "Neurology")
    for name in ("accuracy", "pvalues"):  # and the groups it did not touch have the same intervals and p-values
        before, after = getattr(one, name), getattr(two, name)
        assert before.filter(~pl.col("group").is_in(moved)).equals(after.filter(~pl.col("group").is_in(moved)))
        assert not before.filter(pl.col("group").is_in(moved)).equals(after.filter(pl.col("group").is_in(moved)))


def test_a_draw_is_kept_on_disk_and_read_back_the_same_and_a_damaged_one_is_drawn_again(tmp_path, monkeypatch):
    import numpy as np

    from craftmd.analysis import bootstrap

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    bootstrap.resample_counts.cache_clear()
    first = bootstrap.resample_counts(37, 500, 7)
    kept = tmp_path / "cache" / "resamples" / "counts-v1-seed7-B500-n37.npy"
    assert kept.is_file() and np.array_equal(np.load(kept), first)
    bootstrap.resample_counts.cache_clear()
    monkeypatch.setattr(bootstrap, "_draw", None)  # read back: nothing drawn
    assert np.array_equal(bootstrap.resample_counts(37, 500, 7), first)
    monkeypatch.undo()
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    for damage in (b"not an array", kept.read_bytes()[:200]):
        kept.write_bytes(damage)
        bootstrap.resample_counts.cache_clear()
        assert np.array_equal(bootstrap.resample_counts(37, 500, 7), first)
        assert np.array_equal(np.load(kept), first)  # and kept again whole
    bootstrap.resample_counts.cache_clear()


def test_on_a_ranked_board_a_new_release_computes_its_pairs_and_those_the_new_ranking_tests(tmp_path, monkeypatch):
    from craftmd.analysis import runner

    monkeypatch.setattr(runner, "ALL_PAIRS_UP_TO", 2)  # neighbours in the ranking and the leader from three models on
    data, rel = _board(tmp_path, 5)
    first = _analyse(rel, data, tmp_path / "one")
    _release(rel, "r05", {"vignette": _all_trials(range(9)), "multiturn": _all_trials(range(7))})  # ranked in the middle
    inc = _analyse(rel, data, tmp_path / "inc", previous=tmp_path / "one")
    full = _analyse(rel, data, tmp_path / "full")
    assert _files(tmp_path / "inc") == _files(tmp_path / "full")
    tested = full.pvalues.filter(pl.col("family") == "model", pl.col("test") == "paired-bootstrap")
    pairs = set(tested.select("a", "b").iter_rows())
    assert len(pairs) < 6 * 5 // 2  # not every pair: neighbours and the leader
    kept = inc.timings["kept"]
    assert kept["pairs_read_back"] + kept["pairs_computed"] == len(pairs) == full.timings["kept"]["pairs_computed"]
    assert 0 < kept["pairs_read_back"] and kept["pairs_computed"] < len(pairs)
    assert first.timings["kept"]["pairs_computed"] >= kept["pairs_read_back"]


def test_models_that_tie_are_ranked_by_release_id_so_the_pairs_tested_are_always_the_same(tmp_path, monkeypatch):
    from craftmd.analysis import runner

    monkeypatch.setattr(runner, "ALL_PAIRS_UP_TO", 2)
    data, rel = _dataset(tmp_path), tmp_path / "releases"
    for name in ("r03", "r01", "r02", "r00"):  # four equal models
        _release(rel, name, {"vignette": _all_trials(range(7)), "multiturn": _all_trials(range(3))})
    a = _analyse(rel, data, tmp_path / "a")
    tested = a.pvalues.filter(pl.col("family") == "model", pl.col("test") == "paired-bootstrap")
    pairs = set(tested.select("a", "b").iter_rows())
    # neighbours in id order and the leader (the first id) against every other
    assert pairs == {("r00", "r01"), ("r01", "r02"), ("r02", "r03"), ("r00", "r02"), ("r00", "r03")}
    _analyse(rel, data, tmp_path / "b")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_releases_computed_apart_give_what_the_whole_boards_queries_give_whatever_their_score_columns(tmp_path, monkeypatch):
    """The per-release queries run a few releases at a time, each batch in a connection of its own with the whole
    board's score columns: two releases' scores have two more variant columns, in either order, and a metric of their
    own; each release computed alone gives the tables that the queries over the whole board give."""
    import hashlib
    import json

    from craftmd.analysis import runner
    from craftmd.analysis.tables import compute
    from craftmd.release import note_made_here

    data, rel = _board(tmp_path, 3)
    for rid, keys in (("r01", ("site", "ward")), ("r02", ("ward", "site"))):  # two variant keys, in either order
        scores = pl.read_parquet(rel / rid / "scores.parquet")
        extra = scores.filter(pl.col("metric") == "correct").with_columns(
            pl.lit("doctor_turns").alias("metric"), pl.lit(3.0).alias("value")
        )
        scores = pl.concat([scores, extra]).with_columns(*(pl.lit(f"{k}-1").alias(k) for k in keys))
        scores.write_parquet(rel / rid / "scores.parquet")
        manifest = json.loads((rel / rid / "manifest.json").read_text())
        sha = hashlib.sha256((rel / rid / "scores.parquet").read_bytes()).hexdigest()
        manifest["files"]["scores.parquet"].update(sha256=sha, rows=scores.height)
        (rel / rid / "manifest.json").write_text(json.dumps(manifest))
        note_made_here(sha, scores["scorer"].unique().to_list())  # written here, by hand: made here, as a scorer's are
    monkeypatch.setattr(runner, "KEEP_BATCH", 1)
    apart = _analyse(rel, data, tmp_path / "apart")
    monkeypatch.setattr(runner, "KEEP_BATCH", 3)
    whole = compute(rel, data, B=B)  # every query over the whole board in one connection
    assert apart.timings["kept"]["computed"] == 3
    for name in ("accuracy", "pvalues", "metrics", "answer_status", "mcq_rule_gap", "history_tests"):
        assert getattr(apart, name).equals(getattr(whole, name)), name
    variants = apart.metrics.filter(pl.col("metric") == "doctor_turns")["variant"].to_list()
    assert len(variants) == 4 and all(v.endswith(", site=site-1, ward=ward-1") for v in variants)  # the board's order


def test_a_release_whose_kept_files_did_not_change_is_neither_digested_nor_paired_again(tmp_path, monkeypatch):
    """With a release added, the others' intervals and tests are found by their kept files' digests: their case vectors
    are neither digested for the memo's key nor paired again; only the new release's cells and its pairs are."""
    import craftmd.analysis.stats as stats
    from craftmd.analysis.bootstrap import Memo

    data, rel = _board(tmp_path, 4)
    _analyse(rel, data, tmp_path / "one")
    _add(rel, 4)
    paired, by_vector = [], []
    real_paired, real_key = stats._paired, Memo.key

    def key(B, seed, *parts):
        if parts[0] in ("mean", "paired"):  # keyed by a case vector's bytes
            by_vector.append(parts[0])
        return real_key(B, seed, *parts)

    monkeypatch.setattr(stats, "_paired", lambda cells, ka, kb: paired.append({ka[0], kb[0]}) or real_paired(cells, ka, kb))
    monkeypatch.setattr(Memo, "key", staticmethod(key))
    inc = _analyse(rel, data, tmp_path / "inc", previous=tmp_path / "one")
    assert paired and all("r04" in p for p in paired)  # the new release's pairs alone
    assert by_vector.count("mean") == inc.accuracy.filter(pl.col("model") == "r04").height > 0  # its cells alone
    assert by_vector.count("paired") == len(paired)
    assert _files(tmp_path / "inc") == _files(_full(rel, data, tmp_path / "full"))  # and the same bytes as a full run


def test_a_key_begun_once_and_finished_many_times_is_the_key_of_all_its_parts():
    """Memo keys that begin alike (a release's kept files) digest that beginning once: finished, each is the key of all
    its parts, so results kept under keys made either way are found either way."""
    import numpy as np

    from craftmd.analysis.bootstrap import Memo

    digest = bytes(range(16))
    for head, tail in ((("mean of", 60, digest), (("gpt4", "vignette", "frq", False, "all", "all"),)),
                       (("paired of", digest), (("paper", "vignette"), digest[::-1], ("paper", "multiturn"))),
                       (("sum", True, np.arange(7)), ())):  # fmt: skip
        begun = Memo.begun(10_000, 3, *head)
        assert Memo.then(begun, *tail) == Memo.key(10_000, 3, *head, *tail)
        assert Memo.then_encoded(begun, b"".join(Memo.encoded(p) for p in tail)) == Memo.key(10_000, 3, *head, *tail)
        assert Memo.then(begun, *tail) == Memo.then(begun, *tail)  # (the begun state is left as it was)
    assert Memo.then(Memo.begun(10_000, 3, "a"), "b") != Memo.key(10_000, 4, "a", "b")


def test_a_release_whose_kept_files_did_not_change_has_its_metric_rows_read_back_not_made_again(tmp_path, monkeypatch):
    """Each release's rows of the metrics table are kept beside its case scores: with a release added, only its rows
    are made from case scores; a kept rows file that is damaged, or that names a metric declared otherwise now, is made
    again; and the output is the bytes a full analysis writes."""
    import craftmd.analysis.stats as stats
    from craftmd.metrics import metric

    from craftmd.release import read_release, write_scores

    def meld(i: int):  # a release's MELD similarity of each case (a metric of the metrics table)
        rows = [{"case_id": f"case_{c}", "trial": 0, "scorer": "meld", "metric": "meld_similarity", "value": (c * i % 7) / 7,
                 "label": None, "detail": None, "status": "ok"} for c in range(12)]  # fmt: skip
        write_scores(read_release(rel / f"r{i:02d}"), pa.Table.from_pylist(rows), {"meld": {}})

    data, rel = _board(tmp_path, 3)
    for i in range(3):
        meld(i)
    _analyse(rel, data, tmp_path / "one")
    _add(rel, 3)
    meld(3)
    made, real = [], stats._metric_rows
    monkeypatch.setattr(stats, "_metric_rows", lambda frame, *a: made.append(set(frame["release"])) or real(frame, *a))
    inc = _analyse(rel, data, tmp_path / "inc", previous=tmp_path / "one")
    assert made == [{"r03"}] and inc.metrics.filter(pl.col("model") == "r03").height > 0
    assert _files(tmp_path / "inc") == _files(_full(rel, data, tmp_path / "full"))
    kept = sorted((tmp_path / "inc" / CACHE / "queries").glob("metric_rows-*.parquet"))
    assert len(kept) == 4
    kept[0].write_bytes(b"PAR1 not a parquet file PAR1")  # damaged: made again
    made.clear()
    _analyse(rel, data, tmp_path / "again", previous=tmp_path / "inc")
    assert len(made) == 1 and _files(tmp_path / "again") == _files(tmp_path / "full")
    import dataclasses

    import craftmd.metrics

    turned = dataclasses.replace(metric("meld_similarity"), higher_is_better=not metric("meld_similarity").higher_is_better)
    monkeypatch.setattr(craftmd.metrics, "metric", lambda name: turned if name == "meld_similarity" else metric(name))
    made.clear()
    _analyse(rel, data, tmp_path / "declared", previous=tmp_path / "again")
    assert len(made) == 4  # every release names it: every release's rows made again


def _history_scored(rel, i: int, recall) -> None:
    """Release r<i>'s history scores: trial t of case c recalls ``recall(c, t)`` of the patient's information, and its
    doctor took ``c % 4 + i`` turns."""
    from craftmd.release import read_release, write_scores
    from test_analysis import N_CASES, TRIALS

    rows = [{"case_id": f"case_{c}", "trial": t, "conversation": "standard", "with_image": False, "scorer": "history",
             "metric": m, "value": recall(c, t) if m == "patient_info_recall" else float(c % 4 + i), "label": None,
             "detail": None, "status": "ok"}
            for c in range(N_CASES) for t in range(TRIALS) for m in ("patient_info_recall", "doctor_turns")]  # fmt: skip
    write_scores(read_release(rel / f"r{i:02d}"), pa.Table.from_pylist(rows), {"history": {}})


def test_a_release_whose_kept_files_did_not_change_has_its_coverage_rows_read_back_not_its_trials(tmp_path, monkeypatch):
    """Each release's rows of the history-by-coverage table are kept beside its case scores, under the coverage cut
    points too: with a release added (the cut points unchanged), only its trials are read and cut into quintiles; a
    damaged kept file is made again; and the output is the bytes a full analysis writes."""
    import craftmd.analysis.history as history

    def scored(i: int):  # every trial the same recall (the cut points stay as releases come)
        _history_scored(rel, i, lambda c, t: 0.5)

    data, rel = _board(tmp_path, 3)
    for i in range(3):
        scored(i)
    one = _analyse(rel, data, tmp_path / "one")
    _add(rel, 3)
    scored(3)
    cut, real = [], history._add_coverage
    monkeypatch.setattr(
        history, "_add_coverage", lambda ratios, trials, *a: cut.append(set(trials["release"])) or real(ratios, trials, *a)
    )
    inc = _analyse(rel, data, tmp_path / "inc", previous=tmp_path / "one")
    assert cut == [{"r03"}] and one.history_by_coverage.height > 0
    assert inc.history_by_coverage.filter(pl.col("model") != "r03").equals(one.history_by_coverage)
    assert _files(tmp_path / "inc") == _files(_full(rel, data, tmp_path / "full"))
    kept = sorted((tmp_path / "inc" / CACHE / "queries").glob("history_rows-*.json"))
    assert len(kept) == 4
    kept[0].write_text('{"coverage": [')  # damaged: made again
    kept[1].write_text('{"coverage": [], "complexity": [], "memo": ["not a digest"]}')  # JSON, but not the rows kept
    cut.clear()
    _analyse(rel, data, tmp_path / "again", previous=tmp_path / "inc")
    assert len(set().union(*cut)) == 2 and _files(tmp_path / "again") == _files(tmp_path / "full")


def test_a_release_that_moves_the_coverage_cut_points_has_the_others_rows_read_back_with_the_new_ones(tmp_path, monkeypatch):
    """The coverage quintiles are cut at quantiles of every release's conversations together, so a new release moves
    the cut points; where no other release's conversation changes quintile, only the new release's trials are read and
    the others' kept rows are read back with the new cut points: the bytes a full analysis writes. Where the new cut
    points move another release's conversation into another quintile, its trials are read again."""
    import craftmd.analysis.history as history

    def scored(i: int, recall):  # the recall of case c is recall(c), in every trial
        _history_scored(rel, i, lambda c, t: recall(c))

    def spread(c: int) -> float:
        return 0.05 + 0.1 * (c % 10)

    data, rel = _board(tmp_path, 3)
    for i in range(3):
        scored(i, spread)
    one = _analyse(rel, data, tmp_path / "one")
    cut, real = [], history._add_coverage
    monkeypatch.setattr(
        history, "_add_coverage", lambda ratios, trials, *a: cut.append(set(trials["release"])) or real(ratios, trials, *a)
    )
    for i, recall, read in ((3, lambda c: spread(c) + 0.01, [{"r03"}]), (4, lambda c: 0.95, None)):
        _add(rel, i)
        scored(i, recall)
        cut.clear()
        inc = _analyse(rel, data, tmp_path / f"inc{i}", previous=tmp_path / ("one" if i == 3 else "inc3"))
        ranges = [
            a.history_by_coverage.select("quintile", "recall_low", "recall_high").unique().sort("quintile") for a in (one, inc)
        ]
        assert not ranges[0].equals(ranges[1])  # the cut points moved
        if read is not None:
            assert cut == read  # no other release's conversation changed quintile: its rows read back
        else:
            assert len(set().union(*cut)) > 1  # some did: their trials are read again
        assert _files(tmp_path / f"inc{i}") == _files(_full(rel, data, tmp_path / f"full{i}"))


def test_the_history_tables_are_the_same_whatever_the_releases_read_together(tmp_path, monkeypatch):
    """The history's trials are read and cut into quintiles, and their conversations told apart for the cut points, a
    few releases at a time (``RELEASES_AT_ONCE``): one at a time, or three (a board of four: a chunk of three and one
    of one), the folders are the same bytes."""
    import craftmd.analysis.history as history

    data, rel = _board(tmp_path, 4)
    for i in range(4):
        _history_scored(rel, i, lambda c, t, i=i: 0.03 * i + 0.1 * ((c + t) % 9))
    made = {}
    for n in (1, 3):
        monkeypatch.setattr(history, "RELEASES_AT_ONCE", n)
        a = _analyse(rel, data, tmp_path / f"at{n}")
        assert a.history_by_coverage["model"].n_unique() == 4 and a.history_tests.height > 0
        made[n] = _files(tmp_path / f"at{n}")
    assert made[1] == made[3]


def test_the_coverage_cut_points_read_from_the_kept_files_a_few_releases_at_a_time_are_the_board_tables(tmp_path, monkeypatch):
    """The cut points counted in the releases' kept files, three releases at a time (the whole board's distinct
    conversations are never one table), are the ones the board's ``history_trials`` gives as one query."""
    import numpy as np

    import craftmd.analysis.history as history
    from craftmd.analysis import runner
    from craftmd.analysis.tables import prepared_connection
    from craftmd.release import find_releases

    data, rel = _board(tmp_path, 4)
    for i in range(4):
        _history_scored(rel, i, lambda c, t, i=i: 0.03 * i + 0.1 * ((c + t) % 9))
    kept = runner.Kept(tmp_path / "kept", None, data)
    con = prepared_connection(find_releases(rel), data, kept=kept)
    monkeypatch.setattr(history, "RELEASES_AT_ONCE", 3)
    edges = history._coverage_edges(con, kept)
    assert len(edges) == history.QUINTILES - 1 and len(set(edges.tolist())) > 1
    assert np.array_equal(edges, history._coverage_edges(con))


def test_the_per_release_queries_run_in_worker_processes_write_the_same_files_and_the_workers_are_renewed(tmp_path, monkeypatch):
    """With the analysis's worker processes (a board of at least ``APART_FROM`` releases to compute), the per-release
    queries' files are the bytes this process's threads write, and the workers that ran them have ended afterwards
    (what their allocators kept of the queries' memory with them), new ones serving what comes next."""
    import os

    from craftmd.analysis import runner
    from craftmd.analysis.draw import Workers
    from craftmd.analysis.tables import prepared_connection
    from craftmd.release import find_releases

    data, rel = _board(tmp_path, 4)
    releases = find_releases(rel)
    here = runner.Kept(tmp_path / "here", None, data)
    prepared_connection(releases, data, kept=here)
    import craftmd.analysis.draw as draw

    monkeypatch.setattr(runner, "APART_FROM", 4)
    monkeypatch.setattr(draw, "cpus", lambda: 2)  # (a test worker of the suite may be given one CPU)
    with Workers(2) as workers:
        assert workers.apart
        before = {workers.submit(os.getpid).result() for _ in range(4)}
        apart = runner.Kept(tmp_path / "apart", None, data)
        con = prepared_connection(releases, data, kept=apart, workers=workers)
        after = {workers.submit(os.getpid).result() for _ in range(4)}
    assert apart.counts["computed"] == here.counts["computed"] == 4
    assert _files(tmp_path / "apart") == _files(tmp_path / "here") != {}
    assert before and after and not before & after and os.getpid() not in before | after
    assert con.sql("select count(distinct release) from case_scores").fetchall()[0][0] == 4


def test_the_memo_gives_back_what_was_put_and_what_it_kept_and_writes_only_what_was_used(tmp_path):
    """Results of one, two and three numbers (None among them) come back as they were put, and as the file gives them
    back (three numbers, None where there was none); a key put with an alias marks the alias used when it is found;
    only the entries used are written, sorted, each with its alias; a damaged file is an empty memo."""
    from craftmd.analysis.bootstrap import Memo

    k = [Memo.key(10, 0, "part", i) for i in range(6)]
    memo = Memo()
    memo.put(k[0], (0.25,))
    memo.put(k[1], (0.1, 0.9))
    memo.put(k[2], (0.5, 7, 12), alias=k[0])
    memo.put(k[3], (0.2, 0.3, None))
    assert memo.get(k[0]) == (0.25,) and memo.get(k[1]) == (0.1, 0.9) and memo.get(k[3]) == (0.2, 0.3, None)
    assert memo.get(k[2]) == (0.5, 7.0, 12.0) and memo.get(k[5]) is None
    assert memo.counts() == {"read_back": 0, "resampled": 4}
    memo.save(tmp_path / "m.parquet")
    kept = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert [r["key"] for r in kept] == sorted(k[:4])
    assert {r["key"]: r["alias"] for r in kept} == {k[0]: None, k[1]: None, k[2]: k[0], k[3]: None}

    back = Memo.load(tmp_path / "m.parquet")
    assert back.counts() == {"read_back": 0, "resampled": 0}
    assert back.get_via(k[2]) == (0.5, 7.0, 12.0)  # its alias k[0] is used with it
    assert back.get(k[1]) == (0.1, 0.9, None)
    back.put(k[4], (1.0, None))
    assert back.counts() == {"read_back": 3, "resampled": 1}
    back.save(tmp_path / "again.parquet")
    assert [r["key"] for r in pq.read_table(tmp_path / "again.parquet").to_pylist()] == sorted([k[0], k[1], k[2], k[4]])
    assert back.get(k[3]) == (0.2, 0.3, None)  # read back and not used before: still there

    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not a parquet file")
    empty = Memo.load(tmp_path / "bad.parquet")
    assert empty.get(k[0]) is None and empty.counts() == {"read_back": 0, "resampled": 0}
