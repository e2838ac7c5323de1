"""Each role on its own server with its own key (issue #21): ``openai-api/<service>/<model>`` reads
``<SERVICE>_BASE_URL`` and ``<SERVICE>_API_KEY``; a missing variable is one line before any call; each server
gets only its roles' requests with its own key; no key reaches the release, the cache or the output; each
server has its own concurrency limit."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main
from craftmd.models import get_model, parse_name
from craftmd.models.connect import CallSettings, Connections
from craftmd.release import read_release
from craftmd.scoring import judge as J
from craftmd.scoring.score import judge_release

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer, Replay  # noqa: E402

KEYS = {
    "DOC": "sk-doctor-1111",
    "PAT": "sk-patient-2222",
    "SUM": "sk-summary-3333",
    "JUDGE_A": "sk-judge-a-4444",
    "JUDGE_B": "sk-judge-b-5555",
}


#: The recorded upstream cases of the conftest fixtures upstream and tiny_dataset.
REPLAY = {"n": 2, "seed": 3, "max_messages": 12}


def judge_responder(request: dict) -> str:
    prompt = request["messages"][0]["content"]
    if prompt.startswith("You chair a review committee"):
        return "The doctor asked about the history."
    ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", prompt, re.M) or re.findall(r"^Aspect: ([a-z_]+\.[a-z_]+) ", prompt, re.M)
    items = [{"dimension": d, "score": 3, "rationale": "fine", "evidence": []} for d in ids]
    return json.dumps({"scores": items}) if prompt.startswith("You score several aspects") else json.dumps(items[0])


def test_names_parse_the_inspect_way():
    n = parse_name("openai-api/together/meta-llama/Llama-3-8b")
    assert (n.provider, n.service, n.model, n.prefix) == ("openai-api", "together", "meta-llama/Llama-3-8b", "TOGETHER")
    assert parse_name("openai-api/my-vllm/m").prefix == "MY_VLLM"
    assert str(parse_name("openai/gpt-4o")) == "openai/gpt-4o"
    for bad in ("openai-api/onlyservice", "openai-api//m", "acme/m", "openai"):
        with pytest.raises(CraftMDError, match="expected"):
            parse_name(bad)


def test_a_missing_or_bad_variable_is_one_line_before_any_call(tiny_dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NOWHERE_BASE_URL", raising=False)
    rc = main(
        [
            "generate",
            "--dataset",
            str(tiny_dataset),
            "--doctor",
            "openai-api/nowhere/m",
            "--patient",
            "openai-api/nowhere/m",
            "--out",
            str(tmp_path / "r"),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "NOWHERE_BASE_URL" in err
    assert not (tmp_path / "r").exists()
    monkeypatch.setenv("CREDS_BASE_URL", "http://user:s3cret@127.0.0.1:9/v1")
    with pytest.raises(CraftMDError, match="CREDS_BASE_URL has credentials") as exc:
        get_model("openai-api/creds/m")
    assert "s3cret" not in str(exc.value)
    with pytest.raises(CraftMDError, match="--base-url has credentials"):
        get_model("openai/m", base_url="http://user:s3cret@127.0.0.1:9/v1")


def test_each_role_on_its_own_server_with_its_own_key(tiny_dataset, upstream, tmp_path, monkeypatch, capsys):
    replay = Replay(upstream["text"])
    servers = {"DOC": LoopbackServer(replay, models=("doc",)), "PAT": LoopbackServer(replay, models=("pat",)),
               "SUM": LoopbackServer(replay, models=("sum",)), "JUDGE_A": LoopbackServer(judge_responder, models=("ja",)),
               "JUDGE_B": LoopbackServer(judge_responder, models=("jb",))}  # fmt: skip
    for s in servers.values():
        s.start()
    try:
        for name, s in servers.items():
            monkeypatch.setenv(f"{name}_BASE_URL", s.base_url)
            monkeypatch.setenv(f"{name}_API_KEY", KEYS[name])
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        out, cache = tmp_path / "rel", tmp_path / "cache.sqlite"
        rc = main(
            [
                "generate",
                "--dataset",
                str(tiny_dataset),
                "--doctor",
                "openai-api/doc/doc",
                "--patient",
                "openai-api/pat/pat",
                "--summarizer",
                "openai-api/sum/sum",
                "--experiments",
                "multiturn,summarized,frq",
                "--out",
                str(out),
                "--cache",
                str(cache),
                "--quiet",
            ]
        )
        assert rc == 0, capsys.readouterr().err
        summary = judge_release(
            out,
            J.JudgeSpec(
                models=["openai-api/judge-a/ja", "openai-api/judge-b/jb"],
                mode="category",
                dimensions=["communication"],
                cache=cache,
                progress=False,
            ),
        )
        printed = capsys.readouterr()
        logs = {k: [r["model"] for r in s.log] for k, s in servers.items()}
        keys = {k: dict(s.keys) for k, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()
    assert not replay.mismatches
    # each server got only its own role's requests (a wrong one would be refused: it serves one model name), with its key
    want = {"DOC": "doc", "PAT": "pat", "SUM": "sum", "JUDGE_A": "ja", "JUDGE_B": "jb"}
    for k, model in want.items():
        assert logs[k] and set(logs[k]) == {model}, k
        assert keys[k] == {KEYS[k]: len(logs[k])}, k
    rel = read_release(out)
    answers = rel.table("answers").to_pylist()
    assert answers and all(a["status"] == "ok" for a in answers)
    assert {a["setting"] for a in answers} == {"multiturn", "summarized"}
    roles = rel.manifest.roles
    for role, svc in (("doctor", "DOC"), ("patient", "PAT"), ("summarizer", "SUM")):
        assert roles[role]["base_url"] == servers[svc].base_url and roles[role]["service"] == svc.lower()
    assert summary["judges"] == ["judge:openai-api/judge-a/ja", "judge:openai-api/judge-b/jb"]
    # no key anywhere: release files, the cache, what was printed
    blobs = [p.read_bytes() for p in out.rglob("*") if p.is_file()] + [p.read_bytes() for p in tmp_path.glob("cache.sqlite*")]
    blobs += [printed.out.encode(), printed.err.encode()]
    for key in KEYS.values():
        assert not any(key.encode() in b for b in blobs), key
    # the judges' records name their servers
    records = read_release(out).scores_with_records()[1]
    for name, svc in (("judge:openai-api/judge-a/ja", "JUDGE_A"), ("judge:openai-api/judge-b/jb", "JUDGE_B")):
        assert records[name]["base_url"] == servers[svc].base_url and records[name]["service"] == svc.lower().replace("_", "-")


def test_each_server_has_its_own_concurrency_limit(monkeypatch):
    import asyncio

    from craftmd.models import Sampling

    a = LoopbackServer(lambda r: "ok", models=("m1", "m2"), latency=0.05)
    b = LoopbackServer(lambda r: "ok", models=("m3",), latency=0.05)
    with a, b:
        monkeypatch.setenv("ALPHA_BASE_URL", a.base_url)
        monkeypatch.setenv("BETA_BASE_URL", b.base_url)

        async def go():
            settings = CallSettings(concurrency=5, server_concurrency={"alpha": 2})
            async with Connections(settings, ["openai-api/alpha/m1", "openai-api/alpha/m2", "openai-api/beta/m3"]) as conn:
                calls = [
                    conn.caller(n)([{"role": "user", "content": f"q{i}"}], Sampling())
                    for i in range(12)
                    for n in ("openai-api/alpha/m1", "openai-api/alpha/m2", "openai-api/beta/m3")
                ]
                return await asyncio.gather(*calls)

        results = asyncio.run(go())
        assert all(r.status == "ok" for r in results)
        assert a.max_in_flight == 2  # two models on one server share its two slots
        assert b.max_in_flight == 5
