"""MELD, offline: the real openai client against tests/loopback.py, vignettes from the pinned source."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import Levenshtein
import polars as pl
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.scoring import meld
from craftmd.upstream_prompts import upstream_prompt, upstream_prompts_sha256

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer  # noqa: E402

MODEL = "openai/loopback"
#: the first half a MELD request holds, in upstream's wording (the default) or the package's own (meld-v1)
CASE_RE = re.compile(r"(?:\*\*Case Vignette\*\*|Opening half): (.*)\Z", re.S)


@pytest.fixture(scope="module")
def mini_dataset(source, tmp_path_factory):
    """A two-config dataset folder holding real vignettes (4 derm_public, 4 MedQA cases)."""
    df = pl.read_csv(io.BytesIO(source.read("data/usmle_and_derm_dataset.csv")), infer_schema_length=0)
    out = tmp_path_factory.mktemp("meld_data")
    picks = {"derm_public": "dermatology_public", "medqa_usmle": "MedQA_USMLE"}
    for config, upstream in picks.items():
        rows = df.filter(pl.col("dataset") == upstream).head(4)
        d = out / config
        d.mkdir()
        rows.select(pl.col("case_id"), pl.col("case_vignette").alias("vignette")).write_parquet(d / "test-00000-of-00001.parquet")
    return out


def truth_by_first_half(dataset_dir) -> dict[str, str]:
    return {c.first_half: c.second_half for c in meld.meld_cases(dataset_dir, ("derm_public", "medqa_usmle"))}


def first_half_of(request: dict) -> str:
    return CASE_RE.search(request["messages"][0]["content"]).group(1)


# -- the pure parts on known text ----------------------------------------------------
def test_split_at_the_space_nearest_the_character_midpoint():
    assert meld.split_halves("one two three four five six") == ("one two three", "four five six")
    # midpoint 10 falls inside "cccccccc"; the space before it (at 6) is nearer than the one after (at 15)
    assert meld.split_halves("aa bbb cccccccc dd ee") == ("aa bbb", "cccccccc dd ee")
    # ...and here the space after is nearer
    assert meld.split_halves("aaaaaaaaaa b cc ddd") == ("aaaaaaaaaa", "b cc ddd")
    assert meld.split_halves("nospaces") == ("", "nospaces")


def test_split_by_words_and_word_count():
    assert meld.split_halves("a bb ccc dddd eeeee", "words") == ("a bb", "ccc dddd eeeee")
    assert meld.count_words("  A 45-year-old man\npresents  with fever. ") == 6
    with pytest.raises(CraftMDError, match="unknown MELD split"):
        meld.split_halves("x y", "tokens")


def test_similarity_is_one_minus_normalised_edit_distance():
    assert meld.similarity("kitten", "kitten") == 1.0
    assert meld.similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert meld.similarity("", "") == 1.0
    assert meld.similarity("abc", "") == 0.0
    # not Levenshtein.ratio, which normalises by the sum of the lengths
    assert meld.similarity("kitten", "sitting") != pytest.approx(Levenshtein.ratio("kitten", "sitting"))


def test_halves_of_real_vignettes_rejoin_and_the_prompt_names_the_word_count(mini_dataset):
    cases = meld.meld_cases(mini_dataset, ("derm_public", "medqa_usmle"))
    assert [c.config for c in cases] == ["derm_public"] * 4 + ["medqa_usmle"] * 4
    vignettes = {
        r[0]: r[1] for cfg in ("derm_public", "medqa_usmle")
        for r in pl.read_parquet(mini_dataset / cfg / "test-00000-of-00001.parquet").iter_rows()
    }  # fmt: skip
    for c in cases:
        v = vignettes[c.case_id]
        assert c.first_half and c.second_half
        assert v.strip().startswith(c.first_half) and v.strip().endswith(c.second_half)
        assert c.word_count == len(c.first_half.split())
        # the halves are within one word of the character midpoint
        assert abs(len(c.first_half) - len(v) / 2) <= max(len(w) for w in v.split()) + 1
        prompt = c.messages(meld.renderer())[0]
        # The default: upstream's get_meld_prompt, rendered from the pinned code. The package's own file (meld-v1)
        # asks the same in its own words: the first half and the word count, never upstream's sentences.
        assert prompt["content"] == upstream_prompt("get_meld_prompt", c.first_half, c.word_count)
        assert prompt["role"] == "system"
        own = c.messages(meld.renderer("meld-v1"), "user")[0]
        assert own["role"] == "user" and own["content"] != prompt["content"]
        assert own["content"].endswith(c.first_half) and f" {c.word_count} words" in own["content"]


# -- against the loopback server ---------------------------------------------------------
def test_a_model_that_recites_the_second_half_is_flagged_on_every_case(mini_dataset, tmp_path):
    truth = truth_by_first_half(mini_dataset)
    with LoopbackServer(lambda req: truth[first_half_of(req)], models=("loopback",)) as server:
        out = meld.run_meld(mini_dataset, MODEL, tmp_path / "meld", base_url=server.base_url,
                            configs=("derm_public", "medqa_usmle"), progress=False)  # fmt: skip
        assert server.served == 8
        sent = server.log[0]
        assert sent["temperature"] == 0.0 and sent["max_tokens"] == 1024 and sent["seed"] == 0
    table = meld.read_similarities(out)
    assert table.height == 8
    assert table["flagged"].all()
    assert (table["similarity"] == 1.0).all()
    assert (table["completion"] == table["second_half"]).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["configs"]["derm_public"]["share_flagged"] == 1.0
    assert summary["overall"]["n_flagged"] == 8
    assert summary["prompt"]["name"] == "meld-upstream-3bb2737" == meld.PROMPT_SET
    assert summary["prompt"]["sha256"] == upstream_prompts_sha256(["get_meld_prompt"]) and summary["prompt"]["role"] == "system"
    assert (out / "similarity_hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from craftmd.analysis.meld import meld_audit

    audit = meld_audit(out)
    assert audit["id"] == "meld-openai_loopback"
    rows = {r[0]: r for r in audit["tables"][0]["rows"]}
    assert rows["all"][3] == 8 and rows["all"][4] == 100.0
    assert audit["figures"] == ["similarity_hist.png"]


def test_unrelated_text_flags_nothing_and_a_near_copy_is_judged_by_the_threshold(mini_dataset, tmp_path):
    truth = truth_by_first_half(mini_dataset)

    def respond(req):
        second = truth[first_half_of(req)]
        if len(second) % 2:
            return second[:-3] + "☃☃☃"  # a near copy: similarity 1 - 3/len, far above 0.95
        return "The patient was lost to follow-up and no further details are available."

    with LoopbackServer(respond) as server:
        out = meld.run_meld(mini_dataset, MODEL, tmp_path / "m", base_url=server.base_url,
                            configs=("derm_public", "medqa_usmle"), progress=False)  # fmt: skip
    table = meld.read_similarities(out)
    near = table.filter(pl.col("second_half").str.len_chars() % 2 == 1)
    far = table.filter(pl.col("second_half").str.len_chars() % 2 == 0)
    assert near["flagged"].all() and (~far["flagged"]).all()
    assert (far["similarity"] < 0.5).all()
    for r in near.iter_rows(named=True):
        assert r["similarity"] == pytest.approx(1 - 3 / len(r["second_half"]))
    s = json.loads((out / "summary.json").read_text())
    assert s["overall"]["n_flagged"] == near.height


def test_all_unrelated_flags_none_and_failures_are_counted_not_flagged(mini_dataset, tmp_path):
    truth = truth_by_first_half(mini_dataset)
    failing = sorted(truth)[:2]

    def respond(req):
        if first_half_of(req) in failing:
            raise ValueError("bad request")  # loopback answers HTTP 400: a final error, not retried
        return "Lorem ipsum dolor sit amet."

    with LoopbackServer(respond) as server:
        out = meld.run_meld(mini_dataset, MODEL, tmp_path / "m", base_url=server.base_url,
                            configs=("derm_public", "medqa_usmle"), progress=False)  # fmt: skip
    table = meld.read_similarities(out)
    assert not table["flagged"].any()
    assert table.filter(pl.col("status") == "error").height == 2
    assert table.filter(pl.col("status") == "error")["similarity"].null_count() == 2
    s = json.loads((out / "summary.json").read_text())
    assert s["overall"]["n_failed"] == 2 and s["overall"]["n_flagged"] == 0 and s["overall"]["share_flagged"] == 0.0


def test_rerun_from_the_cache_gives_the_same_bytes_without_calls(mini_dataset, tmp_path):
    truth = truth_by_first_half(mini_dataset)
    cache = tmp_path / "cache.sqlite"
    with LoopbackServer(lambda r: truth[first_half_of(r)][::-1]) as server:
        a = meld.run_meld(mini_dataset, MODEL, tmp_path / "a", base_url=server.base_url, cache=cache,
                          configs=("derm_public",), progress=False)  # fmt: skip
        b = meld.run_meld(mini_dataset, MODEL, tmp_path / "b", base_url=server.base_url, cache=cache,
                          configs=("derm_public",), progress=False)  # fmt: skip
        assert server.served == 4  # the second run came from the cache
    for name in ("scores.parquet", "summary.json", "similarity_hist.png"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_cli_meld_writes_results_and_audit(mini_dataset, tmp_path, capsys):
    truth = truth_by_first_half(mini_dataset)
    with LoopbackServer(lambda r: truth[first_half_of(r)]) as server:
        rc = cli_main(["meld", "--dataset", str(mini_dataset), "--model", MODEL, "--base-url", server.base_url,
                       "--config", "medqa_usmle", "--cases", "case_200", "--out", str(tmp_path / "m"),
                       "--audits", str(tmp_path / "audits"), "--quiet"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "flagged    1 (100.00 %)" in out
    audit = json.loads((tmp_path / "audits" / "meld-openai_loopback.json").read_text())
    assert audit["figures"] == ["meld-openai_loopback.png"]
    assert (tmp_path / "audits" / "meld-openai_loopback.png").exists()


def test_bad_inputs_are_one_line_errors_and_write_nothing(mini_dataset, tmp_path, capsys):
    out = tmp_path / "m"
    with pytest.raises(CraftMDError, match="case case_999999 is not in configs"):
        meld.run_meld(mini_dataset, MODEL, out, base_url="http://127.0.0.1:9/v1", cases=["case_999999"],
                      configs=("derm_public",), progress=False)  # fmt: skip
    with pytest.raises(CraftMDError, match="no config 'derm_private'"):
        meld.run_meld(mini_dataset, MODEL, out, base_url="http://127.0.0.1:9/v1", configs=("derm_private",), progress=False)
    # an unreachable server fails before anything is written
    rc = cli_main(["meld", "--dataset", str(mini_dataset), "--model", MODEL, "--base-url", "http://127.0.0.1:9/v1",
                   "--config", "derm_public", "--out", str(out), "--quiet"])  # fmt: skip
    assert rc == 2
    assert "cannot reach the model server" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_meld_is_a_case_scorer_of_the_release_own_model(mini_dataset, tmp_path, capsys):
    """``craftmd score RELEASE --scorer meld`` asks the release's doctor model; the per-case rows go into the release's
    scores, and a second run with nothing changed asks nothing."""
    import pyarrow as pa

    from craftmd.release import RunRecord, read_release, write_release

    answers = pa.Table.from_pylist([{"case_id": "case_200", "trial": 0, "setting": "vignette", "format": "frq", "with_image": False,
                                     "response": "x", "status": "ok"}])  # fmt: skip
    manifest = RunRecord(task="craftmd", release="lb", kind="generated", model=MODEL, roles={"doctor": {"model": MODEL}})
    rel = write_release(tmp_path / "lb", manifest, {"answers": answers})
    from conftest import frozen

    before = frozen(rel)
    truth = truth_by_first_half(mini_dataset)
    argv = ["score", str(rel), "--scorer", "meld", "--dataset", str(mini_dataset), "--cases", "case_200", "case_1", "--quiet"]
    with LoopbackServer(lambda r: truth[first_half_of(r)]) as server:
        assert cli_main([*argv, "--base-url", server.base_url]) == 0
        assert server.served == 2 and json.loads(capsys.readouterr().out)["scored"] == ["meld"]
        assert cli_main([*argv, "--base-url", server.base_url]) == 0
        assert server.served == 2 and json.loads(capsys.readouterr().out)["current"] == ["meld"]
    assert frozen(rel) == before  # the release as written, but for the scores' own checksum
    table, records = read_release(rel).scores_with_records()
    rows = pl.from_arrow(table).filter(pl.col("scorer") == "meld")
    assert sorted(zip(rows["case_id"], rows["config"], rows["metric"], rows["value"])) == [
        ("case_1", "derm_public", "meld_flagged", 1.0), ("case_1", "derm_public", "meld_similarity", 1.0),
        ("case_200", "medqa_usmle", "meld_flagged", 1.0), ("case_200", "medqa_usmle", "meld_similarity", 1.0)]  # fmt: skip
    rec = records["meld"]
    assert rec["model"] == MODEL and rec["threshold"] == meld.THRESHOLD and rec["failures"] == 0
    assert rec["inputs"]["model"] == MODEL and rec["inputs"]["cases"] == ["case_1", "case_200"]
    assert rec["prompt"] == meld.prompt_record("meld-upstream-3bb2737")  # the default set, by name and sha256
    # The package's own wording, by name: another prompt record, so the scores are made again (the cache answers).
    with LoopbackServer(lambda r: truth[first_half_of(r)]) as server:
        assert cli_main([*argv, "--base-url", server.base_url, "--meld-prompts", "meld-v1"]) == 0
        assert json.loads(capsys.readouterr().out)["scored"] == ["meld"]
    rec = read_release(rel).scorer_records()["meld"]
    assert rec["prompt"]["name"] == "meld-v1" and rec["prompt"]["sha256"] == meld.prompt_sha256()


def test_the_meld_scorer_is_craftmd_meld_s_run_and_writes_nothing(mini_dataset, tmp_path, monkeypatch):
    """The ``meld`` scorer and ``craftmd meld`` are one computation: the scorer returns the rows the command writes to
    its folder, for the same model and cases, and makes no folder of its own (no temporary run read back)."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from craftmd.release import RunRecord, read_release, write_release
    from craftmd.scoring.scorers import Context, Meld

    answers = pa.Table.from_pylist([{"case_id": "case_200", "trial": 0, "setting": "vignette", "format": "frq", "with_image": False,
                                     "response": "x", "status": "ok"}])  # fmt: skip
    rel = write_release(
        tmp_path / "lb",
        RunRecord(task="craftmd", release="lb", kind="generated", model=MODEL, roles={"doctor": {"model": MODEL}}),
        {"answers": answers},
    )
    truth = truth_by_first_half(mini_dataset)
    cases = ["case_200", "case_1"]

    def no_folder(*a, **k):
        raise AssertionError("the meld scorer made a folder")

    with LoopbackServer(lambda r: truth[first_half_of(r)][: len(truth[first_half_of(r)]) // 2]) as server:
        ctx = Context(mini_dataset, base_url=server.base_url, progress=False, options={"cases": cases})
        with monkeypatch.context() as m:
            m.setattr(tempfile, "TemporaryDirectory", no_folder)
            m.setattr(tempfile, "mkdtemp", no_folder)
            result = Meld().run(read_release(rel), ctx)
        out = meld.run_meld(
            mini_dataset,
            MODEL,
            tmp_path / "m",
            base_url=server.base_url,
            configs=Meld().configs(ctx),
            cases=cases,
            progress=False,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lb", "m"]
    keys = ("case_id", "config", "metric", "value", "label", "detail", "status")
    rows = sorted(tuple(r[k] for k in keys) for r in result.rows.to_pylist())
    assert len(rows) == 4 and rows == sorted(tuple(r[k] for k in keys) for r in pq.read_table(out / "scores.parquet").to_pylist())
    assert all(r[3] < 1.0 for r in rows if r[2] == "meld_similarity")  # half a completion: not memorised
    assert result.records["meld"]["cases"] == 2 and result.records["meld"]["failures"] == 0
