"""Patient-led encounters with a real model in every role (SmolLM2-135M via llama.cpp, tests/realmodel.py), through
the command line: one short encounter (a low message cap), a complete release of the encounters task, every failed
or unparseable step (the memory tags included) kept with its reason, and a re-run over the cache that sends nothing
and writes the same bytes.
Nothing here asserts what the 135M model says."""

from __future__ import annotations

import hashlib

import polars as pl

from craftmd.dataset_builder.packets import build_packets
from craftmd.release import read_release

from helpers import analyse_argv, craftmd, generate_argv

MODEL = "openai/smollm2"


def test_one_short_encounter_with_the_real_model(real_model, tmp_path):
    medpi = tmp_path / "medpi"
    build_packets(medpi, seed=2, scale=0.05, cells=["seizure_disorder:treatment_advice"], progress=False)
    options = "--max-messages 4 --max-tokens 48 --memory-tag-tokens 96 --seed 7".split()
    where = {"base_url": real_model.base_url, "cache": tmp_path / "cache.sqlite"}
    common = generate_argv(medpi, *options, task="encounters", doctor=MODEL, **where)
    craftmd(*common, "--out", tmp_path / "a" / "rel")
    sent = real_model.chat_requests()
    rel = read_release(tmp_path / "a" / "rel")
    assert rel.manifest.task == "encounters" and rel.manifest.roles["doctor"]["base_url"] == real_model.base_url
    conv = pl.read_parquet(tmp_path / "a" / "rel" / "conversations.parquet").to_dicts()
    assert len(conv) == 1 and conv[0]["ended"] in ("doctor_closed", "patient_closed", "max_messages", "error", "refusal")
    assert conv[0]["messages"][0]["role"] == "assistant"  # the doctor opened
    if conv[0]["ended"] in ("error", "refusal"):
        assert conv[0]["error"]
    assert len(conv[0]["messages"]) <= 4
    states = pl.read_parquet(tmp_path / "a" / "rel" / "patient_states.parquet").to_dicts()
    assert states and all(len(s["emotions"]) == 27 for s in states)
    for s in states:  # the small model rarely writes valid JSON: whatever it did is kept, with the reason
        assert (s["status"] == "ok") == (s["error"] is None)
    # the memory tags: one call; whatever it gave (a 96-token budget cuts a full reply short) is kept per memory, with why
    assert rel.manifest.counts["requests"]["tagger"] == 1 and rel.manifest.producer["memory_tags"] is True
    tags = pl.read_parquet(tmp_path / "a" / "rel" / "memory_tags.parquet").to_dicts()
    assert tags and sum(rel.manifest.counts["memory_tags"].values()) == len(tags)
    for t in tags:
        assert (t["status"] == "ok") == (t["error"] is None) and (t["status"] == "ok" or not any(t["emotions"].values()))
    closure = pl.read_parquet(tmp_path / "a" / "rel" / "closures.parquet").to_dicts()[0]
    assert (closure["status"] == "ok") == (closure["label"] is not None) and (closure["status"] == "ok") == (
        closure["error"] is None
    )
    craftmd(*common, "--out", tmp_path / "b" / "rel")
    assert real_model.chat_requests() == sent
    digest = lambda p: {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(p.iterdir())}  # noqa: E731
    assert digest(tmp_path / "a" / "rel") == digest(tmp_path / "b" / "rel")

    # the release reaches the page (unjudged: how the encounter ended, its length, the patient's affect; no rubric)
    craftmd(*analyse_argv(tmp_path / "a", medpi, tmp_path / "page", resamples=200, packets=medpi))
    ends = pl.read_csv(tmp_path / "page" / "tables" / "encounter_endings.csv")
    assert ends["n"].sum() == 1 and ends["ended"][0] == conv[0]["ended"]
    length = pl.read_csv(tmp_path / "page" / "tables" / "encounter_length.csv")
    assert length.filter(pl.col("ended") == "all")["n_encounters"][0] == 1
    page = (tmp_path / "page" / "index.html").read_text()
    assert 'id="encounters"' in page and 'id="consultation"' not in page and 'id="rubric"' not in page
