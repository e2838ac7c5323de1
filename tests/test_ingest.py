"""Upstream results -> frozen releases: what a user of a release relies on."""

from __future__ import annotations

import json

import polars as pl
import pytest

from craftmd import CraftMDError
from craftmd.generation.ingest import UPSTREAM_MODELS, ingest, upstream_protocol
from craftmd.release import ANSWER_STATUS, ENDINGS, find_releases, read_release

TEXT_MODELS = [m for m, spec in UPSTREAM_MODELS.items() if not spec.with_image]


@pytest.fixture(scope="module")
def releases(releases_dir):
    return {r.id: r for r in find_releases(releases_dir)}


def _t(release, name):
    return pl.from_arrow(release.table(name))


def test_every_upstream_model_becomes_a_graded_upstream_release(releases):
    assert sorted(releases) == sorted(UPSTREAM_MODELS)
    for rid, r in releases.items():
        assert r.manifest.kind == "upstream"
        assert r.manifest.model == UPSTREAM_MODELS[rid].model
        assert r.manifest.source["commit"] == "3bb2737d4fae5d64694d38456f878c2c5d35576a"
        assert r.has("conversations") and r.has("answers") and r.has("scores")
        assert not r.has("grades")  # schema 2: the grades are scores
        assert r.manifest.schema_version == 2
        assert r.manifest.display_name == UPSTREAM_MODELS[rid].display
        # the protocol it ran: upstream's code at the pinned commit (GPT-4 patient, GPT-3.5 summarizer, 5 trials)
        p = r.manifest.protocol
        # (GPT-4V's run showed the doctor the NEJM images: upstream's multimodal path, its own protocol)
        assert p == upstream_protocol(images=UPSTREAM_MODELS[rid].with_image)
        assert (p.task, p.version, p.trials) == ("craftmd", 2, 5)
        assert p.images is (rid == "gpt4v")
        assert p.roles == {"patient": "openai/gpt-4-1106-preview", "summarizer": "openai/gpt-3.5-turbo-1106"}
        assert p.prompt_set.name == "craftmd-upstream-3bb2737" and p.grader.name == "upstream-gpt4"
        read_release(r.path, verify=True)  # file hashes match the manifest
        # every scorer's record says what it scored: the answers written beside it and the dataset
        records = r.scorer_records()
        assert records and all(
            rec["inputs"]["answers_sha256"] == r.manifest.files["answers.parquet"]["sha256"] for rec in records.values()
        )


@pytest.mark.parametrize("model", TEXT_MODELS)
def test_no_answer_is_dropped_and_missing_ones_are_counted(releases, model):
    r = releases[model]
    answers = _t(r, "answers")
    # 2,004 cases x 5 trials x 4 settings x 2 formats, whatever upstream recorded
    assert answers.height == 2004 * 5 * 4 * 2
    assert answers["case_id"].n_unique() == 2004
    assert set(answers["status"].unique()) <= set(ANSWER_STATUS)
    bad = answers.filter(pl.col("status") != "ok")
    assert bad["response"].null_count() == bad.height  # null response whenever not ok
    assert answers.filter(pl.col("status") == "ok")["response"].null_count() == 0
    counts = r.manifest.counts["answers_by_status"]
    assert sum(counts.values()) == answers.height
    assert counts.get("ok", 0) == answers.height - bad.height


def test_known_missing_and_non_text_answers_are_recorded(releases):
    # llama2-7b lacks three trial-level answers; gpt3_1106 stores some answers as lists
    llama = releases["llama2-7b"].manifest.counts["answers_by_status"]
    assert llama.get("missing", 0) >= 6
    gpt3 = releases["gpt3_1106"].manifest.counts["answers_by_status"]
    assert gpt3.get("non_text", 0) > 0


@pytest.mark.parametrize("model", TEXT_MODELS)
def test_every_answer_is_graded_and_a_missing_answer_is_wrong(releases, model):
    r = releases[model]
    answers = _t(r, "answers")
    grades = r.verdicts()
    records = r.scorer_records()
    key = ["case_id", "trial", "setting", "format", "with_image"]
    for grader, fmt in (("paper", "mcq4"), ("strict", "mcq4"), ("upstream-gpt4", "frq")):
        g = grades.filter(pl.col("grader") == grader)
        a = answers.filter(pl.col("format") == fmt)
        assert g.height == a.height
        joined = a.join(g, on=key, how="left")
        assert joined["correct"].null_count() == 0
        assert (joined["status_right"] == "ok").all()  # recorded and rule grades are all verdicts
        assert not joined.filter(pl.col("status") != "ok")["correct"].any()
        # the scorer's record counts what it graded
        assert records[grader]["graded"] == g.height and records[grader]["correct"] == g["correct"].sum()


def test_upstream_grader_labels_are_kept(source, releases):
    data = json.loads(source.read("results/gpt4_1106/case_1.json"))
    g = releases["gpt4_1106"].verdicts(grader="upstream-gpt4", case_id="case_1")
    for t in range(5):
        for s in ("vignette", "multiturn", "singleturn", "summarized"):
            row = g.filter(pl.col("trial") == t, pl.col("setting") == s).row(0, named=True)
            ev = data[f"trial_{t}"][f"evaluation_{s}_frq"]
            assert row["correct"] == (ev == 1)
            assert json.loads(row["detail"])["evaluation"] == ev
            ex = data[f"trial_{t}"][f"extracted_ans_{s}_frq"]
            if ex in ("none", "multiple") or ev == -1:
                assert row["resolved_kind"] in ("none", "multiple") and row["resolved"] is None
            else:
                assert row["resolved"] == ex and row["resolved_kind"] == "single"


def test_conversations_are_the_doctors_view(releases):
    conv = _t(releases["gpt4_1106"], "conversations")
    assert conv.height == 2004 * 5
    assert set(conv["ended"].unique()) <= set(ENDINGS)
    first = conv.filter(pl.col("case_id") == "case_1", pl.col("trial") == 0).row(0, named=True)
    roles = [m["role"] for m in first["messages"]]
    assert roles[0] == "system" and roles[1] == "assistant" and roles[2] == "user"
    assert first["n_turns"] == roles.count("assistant")
    assert first["summary"]


def test_gpt4v_keeps_text_drops_image_bytes_and_is_not_graded_by_mcq_rule(releases):
    r = releases["gpt4v"]
    conv = _t(r, "conversations")
    assert conv["with_image"].all()
    text = json.dumps(conv["messages"].to_list())
    assert "base64" not in text and "image_url" not in text
    assert "An image is also provided" in text  # the text part of the system message is kept
    grades = r.verdicts()
    assert set(grades["grader"].unique()) == {"upstream-gpt4"}
    assert set(r.scorer_records()) == {"upstream-gpt4"}
    assert "no answer choices" in r.manifest.notes["mcq"]
    assert _t(r, "answers").filter(pl.col("format") == "mcq4").height == 33 * 5 * 4


def test_ingest_is_deterministic_and_refuses_to_overwrite(source, dataset_dir, releases_dir, tmp_path):
    out = tmp_path / "again"
    ingest(source, dataset_dir, out, models=["gpt4v"], progress=False)
    a = json.loads((releases_dir / "gpt4v" / "manifest.json").read_text())
    b = json.loads((out / "gpt4v" / "manifest.json").read_text())
    for name in ("answers.parquet", "conversations.parquet"):
        assert a["files"][name] == b["files"][name]  # same bytes
    assert (releases_dir / "gpt4v" / "scores.parquet").read_bytes() == (out / "gpt4v" / "scores.parquet").read_bytes()
    with pytest.raises(CraftMDError, match="exists"):
        ingest(source, dataset_dir, out, models=["gpt4v"], progress=False)
    before = (out / "gpt4v" / "answers.parquet").stat().st_mtime_ns
    ingest(source, dataset_dir, out, models=["gpt4v"], progress=False, skip_existing=True)
    assert (out / "gpt4v" / "answers.parquet").stat().st_mtime_ns == before  # a valid release is kept
    older = json.loads((out / "gpt4v" / "manifest.json").read_text())
    del older["protocol"]  # as an ingest that recorded no protocol wrote it: ingested again, with its protocol
    (out / "gpt4v" / "manifest.json").write_text(json.dumps(older))
    ingest(source, dataset_dir, out, models=["gpt4v"], progress=False, skip_existing=True)
    assert read_release(out / "gpt4v").manifest.protocol == upstream_protocol(images=True)
    with pytest.raises(CraftMDError, match="unknown upstream model"):
        ingest(source, dataset_dir, out, models=["gpt5"], progress=False)


def test_paper_grades_the_datasets_recorded_key_and_refuses_another(source, dataset_dir, releases, tmp_path):
    """Every text model's results record the dataset's paper_answer (else ingest refuses);
    paper matches that key verbatim, strict the cleaned answer."""
    import shutil

    from craftmd.dataset import config_file, load_config
    from craftmd.scoring.mcq import grade_mcq

    ds = load_config(dataset_dir, "all")
    key = dict(ds.select("case_id", "paper_answer").iter_rows())
    cases = {r["case_id"]: r for r in ds.iter_rows(named=True)}
    # case_208's recorded key keeps upstream's stray quote; the published answer does not.
    assert key["case_208"] == 'osteosarcoma\n"' and cases["case_208"]["answer"] == "Osteosarcoma"
    g = releases["gpt4_1106"].verdicts(case_id="case_208")
    a = _t(releases["gpt4_1106"], "answers").filter((pl.col("case_id") == "case_208") & (pl.col("format") == "mcq4"))
    for row in a.iter_rows(named=True):
        for rule, target in (("paper", key["case_208"]), ("strict", "Osteosarcoma")):
            want = grade_mcq(row["response"], cases["case_208"]["choices"], target, rule)[2]
            got = g.filter((pl.col("grader") == rule) & (pl.col("trial") == row["trial"]) & (pl.col("setting") == row["setting"]))
            assert got["correct"].to_list() == [want]
    # A dataset whose key differs from what the results files recorded is refused, naming the file.
    other = tmp_path / "data"
    shutil.copytree(dataset_dir, other)
    path = config_file(other, "all")
    changed = pl.read_parquet(path).with_columns(
        paper_answer=pl.when(pl.col("case_id") == "case_208").then(pl.lit("osteosarcoma")).otherwise(pl.col("paper_answer"))
    )
    changed.write_parquet(path)
    with pytest.raises(CraftMDError, match=r"results/gpt3_1106/case_208\.json: correct_ans .* is not the dataset's paper_answer"):
        ingest(source, other, tmp_path / "out", models=["gpt3_1106"], progress=False)
    assert not (tmp_path / "out" / "gpt3_1106").exists()
    # The five text models' releases all carry the current ingest version (old ones are re-ingested).
    from craftmd.generation.ingest import INGEST_VERSION

    assert all(releases[m].manifest.producer["ingest_version"] == INGEST_VERSION >= 2 for m in TEXT_MODELS)
