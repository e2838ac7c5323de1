"""The consultation protocol, offline: key-value extraction, the keyinfo scorer, and generation with a solver.

A tiny dataset is made from the pinned source (a few recorded cases); the loopback server plays
every model: the extracting model (JSON derived from the vignette's sentences, one case answering
prose and one answering HTTP 400, so failures are recorded), the doctor, the lazy patient and the
solver.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.tasks import get_task

sys.path.insert(0, str(Path(__file__).parent))
from helpers import generate_argv  # noqa: E402
from loopback import LoopbackServer, pick_upstream, text_of, write_replay_dataset  # noqa: E402

N_CASES = 4


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=\.)\s+", text.strip()) if s]


class Models:
    """A responder for every agent of the protocol; ``bad`` maps a vignette to how its extraction fails."""

    def __init__(self, bad: dict[str, str] | None = None):
        self.bad = bad or {}

    def __call__(self, req: dict) -> str:
        msgs = req["messages"]
        system = text_of(msgs[0]["content"])
        last = text_of(msgs[-1]["content"])
        if system.startswith("You turn a clinical case"):
            vignette = last.split("Case description:\n", 1)[1].rsplit("\n\nJSON:", 1)[0]
            how = self.bad.get(vignette)
            if how == "prose":
                return "Sure! The patient is unwell and has several findings."
            if how == "raise":
                raise ValueError("cannot extract")
            items = [{"key": " ".join(s.split()[:3]), "value": s} for s in sentences(vignette)]
            return "```json\n" + json.dumps({"initial_request": "I feel unwell, can you help me?", "items": items}) + "\n```"
        return self.other(req, system, last)

    def other(self, req: dict, system: str, last: str) -> str:
        msgs = req["messages"]
        if system.startswith("You are a doctor"):  # asks three questions, then names a diagnosis
            asked = sum(m["role"] == "assistant" for m in msgs)
            return f"Have you had any fever or cough, question {asked + 1}?" if asked < 3 else "**Final Diagnosis:** Pneumonia"
        if system.startswith("You play a patient"):  # one sentence of what it holds per reply, cut short
            vignette = system.split("What you know about your condition: ", 1)[1]
            n = sum(m["role"] == "user" for m in msgs)
            parts = sentences(vignette)
            return " ".join(parts[min(n - 1, len(parts) - 1)].split()[:8])
        if system.startswith("You are a medical expert"):  # the first option, or a name
            options = [ln[2:] for ln in last.splitlines() if ln.startswith("- ")]
            return options[0] if options else "Pneumonia"
        raise ValueError(f"unexpected request: {system[:60]!r}")


@pytest.fixture(scope="module")
def upstream(source):
    return pick_upstream(source, N_CASES, seed=11, max_messages=14)


def make_dataset(upstream, out: Path) -> Path:
    write_replay_dataset(upstream, out)
    return out


@pytest.fixture()
def tiny(upstream, tmp_path) -> Path:
    return make_dataset(upstream, tmp_path / "data")


def vignettes(dataset: Path) -> dict[str, str]:
    df = pl.read_parquet(dataset / "all" / "test-00000-of-00001.parquet")
    return dict(zip(df["case_id"], df["vignette"]))


def extract(dataset: Path, url: str, cache: Path, *extra: str) -> int:
    return cli_main(
        [
            "keyinfo",
            "extract",
            "--dataset",
            str(dataset),
            "--model",
            "openai/loopback",
            "--base-url",
            url,
            "--cache",
            str(cache),
            "--max-retries",
            "1",
            "--quiet",
            *extra,
        ]
    )


def test_extraction_writes_the_config_and_records_every_failure(tiny, tmp_path, capsys):
    from craftmd.generation.keyinfo import prompts
    from craftmd.keyinfo import load_keyinfo

    v = vignettes(tiny)
    ids = sorted(v)
    bad = {v[ids[1]]: "prose", v[ids[2]]: "raise"}
    # a built dataset's card and manifest: the new config is listed in both, nothing else of them changes
    (tiny / "README.md").write_text(
        "---\nconfigs:\n- config_name: all\n  data_files:\n  - split: test\n    path: all/test-00000-of-00001.parquet\n"
        "pretty_name: CRAFT-MD\n---\n\n# CRAFT-MD\n\nbody text\n"
    )
    (tiny / "build_manifest.json").write_text(json.dumps({"version": "1", "files": {"all/test-00000-of-00001.parquet": {}}}))
    with LoopbackServer(Models(bad)) as server:
        assert extract(tiny, server.base_url, tmp_path / "c.sqlite") == 0
        first = server.calls
        err = capsys.readouterr().err
        # a re-run over the cache sends nothing and writes the same bytes
        before = (tiny / "keyinfo" / "test-00000-of-00001.parquet").read_bytes()
        assert extract(tiny, server.base_url, tmp_path / "c.sqlite") == 0
        assert server.calls == first
    assert (tiny / "keyinfo" / "test-00000-of-00001.parquet").read_bytes() == before
    rows = {r["case_id"]: r for r in pq.read_table(tiny / "keyinfo" / "test-00000-of-00001.parquet").to_pylist()}
    assert set(rows) == set(ids)
    assert rows[ids[1]]["status"] == "invalid" and "invalid reply" in rows[ids[1]]["error"] and rows[ids[1]]["items"] == []
    assert rows[ids[2]]["status"] == "error" and "cannot extract" in rows[ids[2]]["error"]
    ok = rows[ids[0]]
    assert ok["status"] == "ok" and ok["error"] is None and ok["initial_request"] == "I feel unwell, can you help me?"
    assert [i["value"] for i in ok["items"]] == sentences(v[ids[0]])
    assert {r["model"] for r in rows.values()} == {"openai/loopback"}
    assert {r["prompt_sha256"] for r in rows.values()} == {prompts().sha256}
    assert f"{N_CASES}: {N_CASES - 2} extracted, 2 failed" in err and ids[1] in err and ids[2] in err
    assert set(load_keyinfo(tiny)) == {ids[0], ids[3]}
    card = (tiny / "README.md").read_text()
    assert "config_name: keyinfo" in card and "path: keyinfo/test-00000-of-00001.parquet" in card and "body text" in card
    manifest = json.loads((tiny / "build_manifest.json").read_text())
    assert "keyinfo/test-00000-of-00001.parquet" in manifest["files"] and manifest["configs"]["keyinfo"] == N_CASES
    assert manifest["keyinfo"]["model"] == "openai/loopback" and manifest["keyinfo"]["ok"] == N_CASES - 2


def test_extraction_errors_are_one_line(tiny, tmp_path, capsys):
    from craftmd.keyinfo import load_keyinfo

    with pytest.raises(CraftMDError, match="run `craftmd keyinfo extract"):
        load_keyinfo(tiny)
    assert cli_main(["keyinfo", "extract", "--dataset", str(tiny), "--model", "nope", "--quiet"]) == 2
    assert "expected PROVIDER/MODEL" in capsys.readouterr().err
    with LoopbackServer(Models()) as server:
        assert extract(tiny, server.base_url, tmp_path / "c.sqlite", "--cases", "case_no_such") == 2
    assert "unknown case id" in capsys.readouterr().err
    assert not (tiny / "keyinfo").exists()


def test_reply_parsing():
    from craftmd.generation.keyinfo import parse_reply

    got, why = parse_reply('{"initial_request": " Help ", "items": [{"key": "Age", "value": "61"}]}')
    assert why is None and got.initial_request == "Help" and got.items[0].key == "Age"
    for bad, where in [
        ('{"initial_request": "x", "items": []}', "items"),
        ('{"items": [{"key": "a", "value": "b"}]}', "initial_request"),
        ('{"initial_request": "x", "items": [{"key": "", "value": "b"}]}', "items.0.key"),
        ("no json", "reply"),
        ('{"initial_request": "x", "items": [{"key": "a", "value": "b"}], "extra": 1}', "extra"),
    ]:
        got, why = parse_reply(bad)
        assert got is None and why.startswith(f"invalid reply: {where}"), (bad, why)


# --- generation: the protocol, graded ---------------------------------------------------------


@pytest.fixture(scope="module")
def extracted(upstream, tmp_path_factory):
    """A tiny dataset with its keyinfo config (one case's extraction fails) and a paper key, and the extraction cache."""
    root = tmp_path_factory.mktemp("consult")
    data = make_dataset(upstream, root / "data")
    df = pl.read_parquet(data / "all" / "test-00000-of-00001.parquet")
    df.with_columns(paper_answer=pl.col("answer").str.to_lowercase()).write_parquet(data / "all" / "test-00000-of-00001.parquet")
    v = vignettes(data)
    failed = sorted(v)[1]
    with LoopbackServer(Models({v[failed]: "prose"})) as server:
        assert extract(data, server.base_url, root / "c.sqlite") == 0
    return data, root / "c.sqlite", failed


def consult(dataset, out, url, cache, *extra) -> int:
    options = ("--seed", "3", "--temperature", "0", *extra)
    argv = generate_argv(dataset, *options, task="consultation", solver="openai/loopback", base_url=url, cache=cache, out=out)
    return cli_main(argv)


def test_consultation_generates_grades_and_scores_every_setting(extracted, tmp_path, capsys):
    from rouge_score.rouge_scorer import RougeScorer

    from craftmd.keyinfo import load_keyinfo
    from craftmd.tasks.consultation.protocol import oracle_keys
    from craftmd.release import read_release
    from craftmd.tasks.consultation import TASK

    data, cache, failed = extracted
    info = load_keyinfo(data)
    rel = tmp_path / "releases" / "loopback"
    with LoopbackServer(Models()) as server:
        assert consult(data, rel, server.base_url, cache) == 0
        log = list(server.log)
        sent = server.calls
        assert (
            consult(data, tmp_path / "again" / "loopback", server.base_url, cache) == 0
        )  # a re-run over the cache: no call, same bytes
        assert server.calls == sent
    assert f"no keyinfo   1 cases posed in upper only: {failed}" in capsys.readouterr().err
    for name in ("answers.parquet", "conversations.parquet", "manifest.json"):
        assert (rel / name).read_bytes() == (tmp_path / "again" / "loopback" / name).read_bytes()
    release = read_release(rel)
    m = release.manifest
    assert m.task == "consultation" and m.prompt_set["name"] == "consult-v1" and set(m.roles) == {"doctor", "patient", "solver"}
    assert m.counts["no_keyinfo"] == [failed] and m.counts["requests"]["solver"] > 0

    answers = release.table("answers").to_pylist()
    cells = {(e.setting, e.format) for e in TASK.experiments}
    for cid in vignettes(data):
        got = {(a["setting"], a["format"]) for a in answers if a["case_id"] == cid}
        assert got == ({("upper", "mcq4"), ("upper", "frq")} if cid == failed else cells), cid
    assert all(a["status"] == "ok" for a in answers)

    convs = release.table("conversations").to_pylist()
    solver_requests = [
        r["messages"][1]["content"] for r in log if r["messages"][0]["content"].startswith("You are a medical expert")
    ]
    for c in convs:
        ki = info[c["case_id"]]
        msgs = c["messages"]
        assert msgs[1] == {"role": "user", "content": ki.initial_request}  # the patient opens
        asked = [x["content"] for x in msgs[2::2]]
        if c["conversation"] == "consult":
            assert c["ended"] == "final_diagnosis" and len(asked) == 4
        else:  # the oracle asks every key in its order, then closes
            order = c["conversation"].split("_")[1]
            keys = oracle_keys(ki.keys, order, 3, c["case_id"])
            assert asked == [f"Can you tell me about {k}?" for k in keys] + ["Thank you, that is all I wanted to ask."]
            assert c["ended"] == "no_question"
        # the solver saw the initial request and the first ceil(p K / 100) rounds, for each share p
        k = (len(msgs) - 2) // 2
        shown = {t.count("\nDoctor: ") for t in solver_requests if f"Patient: {ki.initial_request}" in t}
        assert {-(-p * k // 100) for p in (20, 40, 60, 80, 100)} <= shown
    by_case = {}
    for c in convs:
        by_case.setdefault(c["case_id"], []).append(c["conversation"])
    direct = {c["case_id"]: c for c in convs if c["conversation"] == "oracle_direct"}
    random_ = {c["case_id"]: c for c in convs if c["conversation"] == "oracle_random"}
    assert any(direct[cid]["messages"] != random_[cid]["messages"] for cid in direct)  # the shuffle shuffles
    assert all(sorted(v) == sorted(("consult", "oracle_direct", "oracle_random", "oracle_reverse")) for v in by_case.values())
    assert failed not in by_case
    assert any(t.startswith("Patient information: ") for t in solver_requests)  # the upper bound reads the vignette

    # graded by the existing graders: a score for every answer of every setting
    assert cli_main(["score", str(rel), "--dataset", str(data), "--scorer", "paper", "--scorer", "offline", "--quiet"]) == 0
    scores = pl.read_parquet(rel / "scores.parquet")
    for grader, fmt in (("paper", "mcq4"), ("offline", "frq")):
        mine = scores.filter((pl.col("scorer") == grader) & (pl.col("metric") == "correct"))
        want = {(a["case_id"], a["setting"]) for a in answers if a["format"] == fmt}
        assert set(zip(mine["case_id"], mine["setting"])) == want and mine["status"].to_list() == ["ok"] * len(want)

    # the keyinfo scorer: every conversation, exactly rouge-score's ROUGE-1
    assert cli_main(["score", str(rel), "--dataset", str(data), "--scorer", "keyinfo", "--quiet"]) == 0
    from craftmd.scoring.keyinfo import METRIC_NAMES

    ks = pl.read_parquet(rel / "scores.parquet").filter(pl.col("scorer") == "keyinfo")
    assert set(ks["status"]) == {"ok"}
    ks = ks.filter(pl.col("metric").is_in(METRIC_NAMES))  # the consultation's other measures: tests/test_consult_train.py
    assert ks.height == 6 * len(convs)
    rs = RougeScorer(["rouge1"], use_stemmer=True)
    for c in convs:
        ki = info[c["case_id"]]
        msgs = c["messages"]
        doctor = "\n".join(x["content"] for x in msgs if x["role"] == "assistant")
        patient = "\n".join(x["content"] for x in msgs[2:] if x["role"] == "user")
        want_d = rs.score("\n".join(ki.keys), doctor)["rouge1"]
        want_p = rs.score("\n".join(ki.values), patient)["rouge1"]
        got = {
            r["metric"]: r["value"]
            for r in ks.filter((pl.col("case_id") == c["case_id"]) & (pl.col("conversation") == c["conversation"])).to_dicts()
        }
        assert got == {
            "doctor_key_recall": want_d.recall,
            "doctor_key_precision": want_d.precision,
            "doctor_key_f1": want_d.fmeasure,
            "patient_value_recall": want_p.recall,
            "patient_value_precision": want_p.precision,
            "patient_value_f1": want_p.fmeasure,
        }
    rec = read_release(rel).scorer_records()["keyinfo"]
    assert rec["scored"] == len(convs) and rec["inputs"]["keyinfo_sha256"]


def test_consultation_refuses_bad_input_in_one_line(extracted, tiny, tmp_path, capsys):
    data, cache, _ = extracted
    assert consult(data, tmp_path / "x", "http://127.0.0.1:9/v1", cache, "--solver", "bad") == 2
    assert "expected PROVIDER/MODEL" in capsys.readouterr().err
    assert cli_main(generate_argv(data, task="consultation", doctor="openai/a", out=tmp_path / "x")) == 2
    assert "needs a solver" in capsys.readouterr().err
    assert consult(tiny, tmp_path / "x", "http://127.0.0.1:9/v1", cache) == 2  # no keyinfo config
    assert "run `craftmd keyinfo extract" in capsys.readouterr().err
    assert consult(data, tmp_path / "x", "http://127.0.0.1:9/v1", cache, "--experiments", "multiturn") == 2
    assert "unknown experiment 'multiturn'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_keyinfo_scores_equal_rouge_score_on_craftmd_and_consultation_turns():
    """A CRAFT-MD conversation leaves out the doctor's fixed opening line; a consultation leaves out the patient's
    initial request; what is left is scored exactly as rouge-score's ROUGE-1."""
    from rouge_score.rouge_scorer import RougeScorer

    from craftmd.scoring.keyinfo import METRIC_NAMES, score_conversation

    keys = ["Patient age", "Chief complaint", "Duration of the rash", "Itching at night"]
    values = ["54 years old", "An itchy red rash on both arms", "Two weeks", "Yes, itching gets worse at night"]
    roles = ["system", "assistant", "user", "assistant", "user", "assistant", "user", "assistant"]
    contents = [
        "You are an AI doctor.",
        "Hi! What symptoms are you facing today?",
        "I've got an itchy rash on my arms, doctor.",
        "How long has the rash been there, and does it itch at night?",
        "About two weeks, itching worse at night!",
        "How old are you?",
        "I'm 54 years old.",
        "**Final Diagnosis:** Scabies",
    ]
    rs = RougeScorer(["rouge1"], use_stemmer=True)
    for led, doctor, patient in ((False, contents[3::2], contents[2::2]), (True, contents[1::2], contents[4::2])):
        rk = rs.score("\n".join(keys), "\n".join(doctor))["rouge1"]
        rv = rs.score("\n".join(values), "\n".join(patient))["rouge1"]
        got = dict(
            score_conversation(led, roles, contents, keys, values)[: len(METRIC_NAMES)]
        )  # then a consultation's other measures
        assert list(got) == list(METRIC_NAMES)
        assert got == {
            "doctor_key_recall": rk.recall,
            "doctor_key_precision": rk.precision,
            "doctor_key_f1": rk.fmeasure,
            "patient_value_recall": rv.recall,
            "patient_value_precision": rv.precision,
            "patient_value_f1": rv.fmeasure,
        }
    assert dict(score_conversation(True, roles, contents, keys, values)) != dict(
        score_conversation(False, roles, contents, keys, values)
    )
    # which kinds are patient-led is the task's word (its folder), not the scorer's
    assert get_task("consultation").patient_led == get_task("consultation").conversations and not get_task("craftmd").patient_led


def test_estimate_sends_nothing_and_counts_each_role(extracted, tmp_path, capsys):
    data, cache, failed = extracted
    with LoopbackServer(Models()) as server:
        assert consult(data, tmp_path / "r", server.base_url, cache, "--estimate", "--price", "1,2") == 0
        assert server.calls == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "r").exists()
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split() and line.split()[0] in ("doctor", "patient", "solver", "total")
    }
    assert set(rows) == {"doctor", "patient", "solver", "total"}
    n = len(vignettes(data))
    # the solver answers every posed question: 2 formats x (2 bounds + 4 kinds x 5 shares), upper only without keyinfo
    assert float(rows["solver"][2].replace(",", "")) == (n - 1) * 2 * 22 + 2
    assert rows["total"][-1].startswith("$")
