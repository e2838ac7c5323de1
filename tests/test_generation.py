"""The generation engine, offline: the real openai client against tests/loopback.py.

A tiny dataset is made from the pinned source (a few sampled cases with their recorded
GPT-4 trial-0 conversations, and one NEJM image case whose image comes from the
recorded GPT-4V messages). The loopback responder replays the recorded doctor and
patient turns, keyed by the conversation so far, so the engine must send exactly
upstream's doctor prompt and turn order to reproduce the conversations.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from aiohttp import web

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.models.cache import RequestCache
from craftmd.models.calls import Caller, Slots
from craftmd.generation.protocol import PromptSet
from craftmd.generation.runner import GenerateSpec, generate
from craftmd.models import Sampling, VLLMModel, get_model
from craftmd.models.base import ChatModel, Completion, TransientError
from craftmd.models.openai import parse_completion
from craftmd.release import read_release
from craftmd.tasks.diagnosis.protocol import CraftMD

sys.path.insert(0, str(Path(__file__).parent))
from helpers import generate_argv  # noqa: E402
from loopback import LoopbackServer, Replay, text_of  # noqa: E402

N_TEXT_CASES = 4


#: The conftest fixtures upstream and tiny_dataset: recorded GPT-4 trial-0 data of a few sampled text cases (an "Other"
#: and a renamed specialty among them).
REPLAY = {"n": N_TEXT_CASES, "seed": 5, "max_messages": 14, "categories": ("Other", "Cardiovascular System", "Dermatology")}


@pytest.fixture(scope="module")
def replay(upstream):
    return Replay(upstream["text"])


_text = text_of


def spec(dataset, out, url, cache, **kw) -> GenerateSpec:
    base = dict(
        dataset=dataset,
        out=out,
        doctor="openai/loopback",
        task="craftmd",
        patient="openai/loopback",
        base_url=url,
        cache=cache,
        trials=1,
        progress=False,
        timeout=5.0,
        backoff=0.01,
        concurrency=16,
    )
    base.update(kw)
    return GenerateSpec(**base)


def release_bytes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(path).iterdir())}


# --- tests ------------------------------------------------------------------------------
def test_reproduces_upstream_gpt4_conversations_turn_for_turn(tiny_dataset, upstream, replay, tmp_path):
    with LoopbackServer(replay) as server:
        report = generate(
            spec(tiny_dataset, tmp_path / "rel", server.base_url, tmp_path / "c.sqlite", experiments=["multiturn", "frq"])
        )
        log = list(server.log)
    assert not replay.mismatches
    conv = read_release(report.path).table("conversations").to_pylist()
    assert len(conv) == len(upstream["text"]) == N_TEXT_CASES
    for row in conv:
        rec = upstream["text"][row["case_id"]]["trial_0"]["multiturn_conversation"]
        # the doctor's prompt is the pinned code's (the GPT-4 runs recorded an earlier wording); the dialogue is theirs
        assert row["messages"][0]["content"].startswith("You are an AI doctor") and row["messages"][0] != rec[0]
        assert row["messages"][1:] == [{"role": m["role"], "content": m["content"]} for m in rec[1:]]
        assert row["n_turns"] == sum(m["role"] == "assistant" for m in rec)
        assert row["ended"] == ("final_diagnosis" if "Final Diagnosis" in rec[-1]["content"] else "no_question")
    # The multiturn question is asked after the conversation without its final-diagnosis turn.
    questions = [r["messages"] for r in log if "Stop asking" in _text(r["messages"][-1]["content"])]
    assert len(questions) == N_TEXT_CASES
    for q in questions:
        cid = replay.by_first[q[2]["content"]]
        assert q[1:-1] == upstream["text"][cid]["trial_0"]["multiturn_conversation"][1:-1]
        assert upstream["text"][cid]["question"].strip() in q[-1]["content"]
    answers = read_release(report.path).table("answers").to_pylist()
    assert {(a["setting"], a["format"], a["status"]) for a in answers} == {("multiturn", "frq", "ok")}


def test_every_experiment_and_image_variants(tiny_dataset, replay, tmp_path):
    with LoopbackServer(replay) as server:
        text = generate(spec(tiny_dataset, tmp_path / "text", server.base_url, tmp_path / "c.sqlite", trials=2))
        nejm = generate(spec(tiny_dataset, tmp_path / "nejm", server.base_url, tmp_path / "c.sqlite", config="nejm_image"))
        log = list(server.log)
    ans = read_release(text.path).table("answers").to_pylist()
    got = {(a["setting"], a["format"]) for a in ans}
    assert got == {
        (s, f)
        for s in ("vignette", "multiturn", "singleturn", "summarized", "exam", "multiturn_no_exam", "multiturn_plus_exam")
        for f in ("mcq4", "mcq_many", "frq", "top3")
    }
    assert all(a["status"] == "ok" and a["response"] for a in ans)
    assert {a["trial"] for a in ans} == {0, 1}
    conv = read_release(text.path).table("conversations").to_pylist()
    assert {c["conversation"] for c in conv} == {"standard", "no_exam"}
    assert all(c["summary"] for c in conv if c["conversation"] == "standard" and c["trial"] == 0)
    # The history-only patient never sees the exam; the plus-exam question carries it.
    no_exam_prompts = [
        _text(r["messages"][0]["content"]) for r in log if _text(r["messages"][0]["content"]).startswith("You are a patient")
    ]
    assert any("Physical examination" not in p for p in no_exam_prompts)
    plus = [
        r
        for r in log
        if "Physical examination findings:" in _text(r["messages"][-1]["content"])
        and r["messages"][-1]["content"].startswith("Stop asking")
    ]
    assert plus
    # Image cases: no mcq4/mcq_many, with and without the image, the image sent as a content part.
    nans = read_release(nejm.path).table("answers").to_pylist()
    assert {a["format"] for a in nans} == {"frq", "top3"}
    assert {a["with_image"] for a in nans} == {True, False}
    assert {a["setting"] for a in nans} == {"vignette", "multiturn", "singleturn", "summarized"}
    with_image = [
        r
        for r in log
        if any(isinstance(m["content"], list) and any(p.get("type") == "image_url" for p in m["content"]) for m in r["messages"])
    ]
    # an image job speaks upstream's multimodal path: its prompt the text part of a system message, the image beside it
    from craftmd.upstream_prompts import upstream_prompt

    upstream_image = [r for r in with_image if isinstance(r["messages"][0]["content"], list)]
    assert upstream_image and all(
        r["messages"][0]["role"] == "system" and [p["type"] for p in r["messages"][0]["content"]] == ["text", "image_url"]
        for r in upstream_image
    )
    assert any(r["messages"][0]["content"][0]["text"] == upstream_prompt("get_doctor_prompt_multimodal") for r in upstream_image)
    own = [r for r in with_image if r not in upstream_image]  # vignette × top3: the package's wording and image line
    image_line = PromptSet("craftmd-v1", CraftMD.prompts_root).text("doctor_image.txt")
    assert own and all(r["messages"][0]["content"].endswith(image_line) for r in own)
    nconv = read_release(nejm.path).table("conversations").to_pylist()
    assert any("<image>" in m["content"] for c in nconv if c["with_image"] for m in c["messages"])
    manifest = read_release(text.path).manifest
    assert (
        manifest.kind == "generated"
        and manifest.prompt_set["name"] == "craftmd-upstream-3bb2737"
        and len(manifest.prompt_set["sha256"]) == 64
        and manifest.prompt_set["own"]["name"] == "craftmd-v1"
    )
    assert manifest.models == {"doctor": "openai/loopback", "patient": "openai/loopback", "summarizer": "openai/loopback"}
    assert manifest.counts["tokens_in"]["doctor"] > 0
    # the protocol it ran: the task's version, its prompt set, every role but the doctor (the model under test), trials
    p = manifest.protocol
    assert (p.task, p.version, p.prompt_set.model_dump(), p.trials) == (
        "craftmd",
        2,
        {"name": manifest.prompt_set["name"], "sha256": manifest.prompt_set["sha256"]},
        manifest.counts["trials"],
    )
    assert p.roles == {"patient": "openai/loopback", "summarizer": "openai/loopback"} and p.answer_rules == {
        "paper": 4,
        "strict": 4,
    }
    # the default prompt set is the paper's runs' (the upstream releases' protocol): only the roles and trials differ
    from craftmd.generation.ingest import upstream_protocol
    from craftmd.release import protocol_differences

    differences = protocol_differences(p, upstream_protocol())
    assert differences and not [d for d in differences if "prompt" in d or "version" in d], differences


def test_faults_give_the_same_release_and_full_cache_makes_no_call(tiny_dataset, replay, tmp_path):
    exp = ["vignette", "multiturn", "summarized", "mcq4", "frq"]
    with LoopbackServer(replay) as clean:
        a = generate(spec(tiny_dataset, tmp_path / "a" / "rel", clean.base_url, tmp_path / "a.sqlite", experiments=exp))
    with LoopbackServer(replay, error_rate=0.2, slow_rate=0.1, slow_delay=0.2, timeout_delay=0.6, seed=3) as faulty:
        b = generate(
            spec(
                tiny_dataset,
                tmp_path / "b" / "rel",
                faulty.base_url,
                tmp_path / "b.sqlite",
                experiments=exp,
                timeout=0.4,
                max_retries=10,
            )
        )
        assert set(faulty.faults) >= {"429", "500", "timeout", "drop"} and b.retries > 0
        assert b.failures == 0
        assert faulty.calls > faulty.served
        again = generate(spec(tiny_dataset, tmp_path / "c" / "rel", faulty.base_url, tmp_path / "b.sqlite", experiments=exp))
        assert again.calls == 0 and again.cache_hits > 0
        served_after = faulty.served
    # The same model on another server: the same tables; the manifest records each run's server.
    tables = lambda r: {k: v for k, v in release_bytes(r.path).items() if k.endswith(".parquet")}  # noqa: E731
    assert tables(a) == tables(b)
    assert release_bytes(b.path) == release_bytes(again.path)
    assert served_after == faulty.served


def test_kill_and_resume_repeats_no_finished_call(tiny_dataset, replay, tmp_path):
    exp = ["multiturn", "singleturn", "frq"]
    cache = tmp_path / "kill.sqlite"
    with LoopbackServer(replay) as clean:
        ref = generate(spec(tiny_dataset, tmp_path / "ref" / "rel", clean.base_url, tmp_path / "ref.sqlite", experiments=exp))
        total = clean.served
    with LoopbackServer(replay, latency=0.05) as server:
        options = ("--experiments", ",".join(exp), "--concurrency", "2")
        argv = generate_argv(tiny_dataset, *options, base_url=server.base_url, cache=cache, out=tmp_path / "killed" / "rel")
        cmd = [sys.executable, "-m", "craftmd.commands.cli", *argv]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        cached = 0
        while time.time() < deadline and cached < total // 2:
            time.sleep(0.05)
            if cache.exists():
                try:
                    with sqlite3.connect(cache) as db:
                        cached = db.execute("SELECT count(*) FROM requests").fetchone()[0]
                except sqlite3.OperationalError:
                    pass
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert 0 < cached < total, "the run should be killed mid-way"
        assert not (tmp_path / "killed" / "rel").exists()
        with RequestCache(cache) as c:
            done = {json.dumps(r["messages"], sort_keys=True) for r in c.requests()}
        before = len(server.log)
        resumed = generate(spec(tiny_dataset, tmp_path / "ref2" / "rel", server.base_url, cache, experiments=exp))
        after = [json.dumps(r["messages"], sort_keys=True) for r in server.log[before:]]
    assert len(done) >= cached
    assert not done & set(after), "a call finished before the kill was made again"
    assert resumed.cache_hits >= len(done)
    assert release_bytes(ref.path).keys() == release_bytes(resumed.path).keys()
    for name in ("conversations.parquet", "answers.parquet"):
        assert pq.read_table(ref.path / name).equals(pq.read_table(resumed.path / name))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cases", "case_999999"], "unknown case id"),
        (["--config", "nonesuch"], "unknown config"),
        (["--experiments", "multiturn,essay"], "unknown experiment 'essay'"),
        (["--doctor", "openai/not-served"], "does not serve 'not-served'"),
        (["--base-url", "http://127.0.0.1:9/v1"], "cannot reach"),
        (["--doctor", "gpt-4"], "expected PROVIDER/MODEL"),
    ],
)
def test_bad_input_is_one_line_before_any_call(tiny_dataset, replay, tmp_path, capsys, args, message):
    with LoopbackServer(replay) as server:
        # later flags override earlier ones
        argv = generate_argv(tiny_dataset, *args, base_url=server.base_url, cache=tmp_path / "c.sqlite", out=tmp_path / "rel")
        assert cli_main(argv) == 2
        assert server.calls == 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "rel").exists() and not (tmp_path / "c.sqlite").exists()


def test_refusal_is_recorded_not_retried(tmp_path):
    with LoopbackServer(lambda req: None) as server:

        async def go():
            model = get_model("openai/loopback", base_url=server.base_url)
            caller = Caller(model, RequestCache(tmp_path / "c.sqlite"), backoff=0.01)
            c = await caller([{"role": "user", "content": "hi"}], Sampling())
            again = await caller([{"role": "user", "content": "hi"}], Sampling())
            await model.aclose()
            return c, again, caller

        c, again, caller = asyncio.run(go())
    assert c.status == "refusal" and c.finish_reason == "content_filter" and again == c
    assert server.calls == 1 and caller.retries == 0 and caller.cache_hits == 1


def test_retries_are_capped_and_failures_recorded(tmp_path):
    with LoopbackServer(lambda req: "x", error_rate=1.0, error_kinds=("500",)) as server:

        async def go():
            model = get_model("openai/loopback", base_url=server.base_url)
            caller = Caller(model, RequestCache(tmp_path / "c.sqlite"), max_retries=3, backoff=0.001)
            c = await caller([{"role": "user", "content": "hi"}], Sampling())
            await model.aclose()
            return c, caller

        c, caller = asyncio.run(go())
    assert c.status == "error" and "4 attempts" in c.error
    assert server.calls == 4 and caller.retries == 3 and caller.failures == 1
    assert len(RequestCache(tmp_path / "c.sqlite")) == 0  # errors are not the record; the next run retries


def test_conversation_turns_overtake_queued_questions(tmp_path):
    """With every slot taken, a waiting turn (priority 0) goes before questions queued earlier (priority 1)."""
    order: list[str] = []

    class Recorder(ChatModel):
        provider = "test"

        async def check(self) -> None:
            pass

        async def chat(self, messages, sampling):
            order.append(messages[0]["content"])
            await asyncio.sleep(0.01)
            return Completion("ok", "ok")

    async def go():
        caller = Caller(Recorder("m"), None, concurrency=1)
        first = asyncio.ensure_future(caller([{"role": "user", "content": "q0"}], Sampling(), 1))
        await asyncio.sleep(0)  # q0 holds the only slot
        later = [asyncio.ensure_future(caller([{"role": "user", "content": f"q{i}"}], Sampling(), 1)) for i in (1, 2)]
        await asyncio.sleep(0)
        turn = asyncio.ensure_future(caller([{"role": "user", "content": "turn"}], Sampling(), 0))
        await asyncio.gather(first, *later, turn)
        return caller

    caller = asyncio.run(go())
    assert order == ["q0", "turn", "q1", "q2"]
    assert caller.calls == 4 and caller.peak_in_flight == 1


def test_cancelled_waiter_gives_its_slot_on():
    async def go():
        slots = Slots(1)
        await slots.acquire()
        waiter = asyncio.ensure_future(slots.acquire(0))
        other = asyncio.ensure_future(slots.acquire(1))
        await asyncio.sleep(0)
        slots.release()  # handed to ``waiter`` ...
        waiter.cancel()  # ... which is cancelled before it runs: the slot must reach ``other``
        await asyncio.wait_for(other, 1)
        slots.release()
        return slots.free

    assert asyncio.run(go()) == 1


@pytest.mark.parametrize(
    "body, status",
    [
        (
            {
                "choices": [{"message": {"content": "Hi?"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            },
            "ok",
        ),
        ({"choices": [{"message": {"content": None}, "finish_reason": "content_filter"}]}, "refusal"),
        ({"choices": [{"message": {"content": None, "refusal": "I can't help"}, "finish_reason": "stop"}]}, "refusal"),
        ({"choices": [{"message": {"content": None}, "finish_reason": "length"}]}, "error"),
    ],
)
def test_response_bodies_become_completions(body, status):
    c = parse_completion(body)
    assert c.status == status
    if status == "ok":
        assert (c.text, c.tokens_in, c.tokens_out) == ("Hi?", 3, 1)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"choices": []},
        {"choices": [{"message": {"content": 3}}]},
        "not json",
        None,
        {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "many"}},
    ],
)
def test_malformed_response_is_retried_not_recorded(body):
    with pytest.raises(TransientError, match="malformed response"):
        parse_completion(body)


def _serve_chat(answers: list[web.Response]):
    """An aiohttp app answering POST …/chat/completions under any path prefix with ``answers`` in turn; it records the requests."""
    seen: list[dict] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append({"path": request.path, "headers": dict(request.headers), "body": await request.json()})
        return answers[len(seen) - 1]

    app = web.Application()
    app.router.add_post("/{prefix:.*}chat/completions", chat)
    return app, seen


@pytest.mark.parametrize("suffix", ["", "/"])
def test_openai_requests_go_to_the_base_url_path_with_the_key_and_no_sdk_telemetry(suffix):
    ok = {  # the reply names the model asked (a server that lists no models is believed only for that name)
        "model": "m",
        "choices": [{"message": {"content": "Hi?"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    app, seen = _serve_chat([web.json_response(ok)])

    async def go():
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        model = get_model("openai/m", base_url=f"http://127.0.0.1:{port}/proxy/v1{suffix}", api_key="sk-test")
        try:
            return await model.chat([{"role": "user", "content": "héllo"}], Sampling(max_tokens=7))
        finally:
            await model.aclose()
            await runner.cleanup()

    c = asyncio.run(go())
    assert (c.status, c.text, c.tokens_in, c.tokens_out) == ("ok", "Hi?", 3, 1)
    [req] = seen
    assert req["path"] == "/proxy/v1/chat/completions"
    assert req["body"] == {
        "model": "m",
        "messages": [{"role": "user", "content": "héllo"}],
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 7,
        "seed": 0,
    }
    headers = {k.lower(): v for k, v in req["headers"].items()}
    assert headers["authorization"] == "Bearer sk-test" and headers["content-type"] == "application/json"
    assert not [h for h in headers if h.startswith("x-stainless")]  # the SDK's platform/runtime telemetry stays home


def test_a_200_answer_that_is_not_json_is_retried_not_a_crash(tmp_path):
    ok = {"model": "m", "choices": [{"message": {"content": "Hi?"}, "finish_reason": "stop"}]}
    cut_off = web.Response(status=200, body=b'{"choices": [{"mess', content_type="application/json")
    proxy_page = web.Response(status=200, text="<html>gateway</html>", content_type="text/html")
    app, seen = _serve_chat([cut_off, proxy_page, web.json_response(ok)])

    async def go():
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        model = get_model("openai/m", base_url=f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
        caller = Caller(model, RequestCache(tmp_path / "c.sqlite"), max_retries=3, backoff=0.001)
        try:
            return await caller([{"role": "user", "content": "hi"}], Sampling()), caller
        finally:
            await model.aclose()
            await runner.cleanup()

    c, caller = asyncio.run(go())
    assert (c.status, c.text) == ("ok", "Hi?")
    assert len(seen) == 3 and caller.retries == 2


# --- vLLM path: batching logic with a fake engine (no torch) --------------------------------
class _Out:
    def __init__(self, text, prompt_len):
        self.prompt_token_ids = list(range(prompt_len))
        self.outputs = [type("Gen", (), {"text": text, "token_ids": list(range(len(text.split()))), "finish_reason": "stop"})()]


class FakeLLM:
    """Stands in for vllm.LLM: ``chat(list_of_messages, list_of_params, use_tqdm=False)``."""

    def __init__(self, responder):
        self.responder = responder
        self.batches: list[int] = []

    def chat(self, batch, params, use_tqdm=True):
        assert isinstance(batch, list) and len(params) == len(batch)
        assert all(p["max_tokens"] == 512 for p in params)  # explicit max_tokens, never vLLM's 16
        self.batches.append(len(batch))
        return [_Out(self.responder({"messages": m, "model": "fake"}), len(json.dumps(m).split())) for m in batch]


def test_vllm_provider_batches_every_active_conversation(tiny_dataset, replay, tmp_path, monkeypatch):
    import craftmd.models as models

    fake = FakeLLM(replay)
    monkeypatch.setitem(models._VLLM_ENGINES, "fake", VLLMModel("fake", llm=fake, sampling_params=dict))
    exp = ["multiturn", "frq"]
    r = generate(
        spec(
            tiny_dataset,
            tmp_path / "v" / "rel",
            None,
            tmp_path / "v.sqlite",
            doctor="vllm/fake",
            patient="vllm/fake",
            experiments=exp,
        )
    )
    longest = max(c["n_turns"] for c in read_release(r.path).table("conversations").to_pylist())
    requests = sum(t.requests for t in r.tallies.values())
    assert sum(fake.batches) == requests
    # one engine call per turn of the longest conversation (doctor + patient turns, and the question), not per request
    assert len(fake.batches) <= 2 * longest + 1 < requests
    assert max(fake.batches) == N_TEXT_CASES
    with LoopbackServer(replay) as server:
        o = generate(spec(tiny_dataset, tmp_path / "o" / "rel", server.base_url, tmp_path / "o.sqlite", experiments=exp))
    a, b = read_release(r.path), read_release(o.path)
    assert a.table("conversations").equals(b.table("conversations")) and a.table("answers").equals(b.table("answers"))


def test_vllm_missing_is_one_clear_error():
    try:
        import vllm  # noqa: F401
    except ImportError:
        model = VLLMModel("some/model")
        with pytest.raises(CraftMDError, match="need vLLM"):
            asyncio.run(model.check())
    else:  # pragma: no cover - on a GPU machine with vLLM
        pytest.skip("vLLM is installed here")


def test_on_the_built_dataset_reproduces_upstream_and_serves_image_cases(dataset_dir, upstream, replay, tmp_path):
    """The same replay through helper A's real dataset: its specialties, questions, splits and images."""

    from craftmd.dataset import load_config

    ids = sorted(upstream["text"])
    built = load_config(dataset_dir, "all").filter(pl.col("case_id").is_in(ids))
    same = [
        r["case_id"]
        for r in built.iter_rows(named=True)
        if r["vignette"].strip() == upstream["text"][r["case_id"]]["case_vignette"].strip()
    ]
    assert same, "the built vignettes should match upstream's split for these cases"
    with LoopbackServer(replay) as server:
        r = generate(
            spec(
                dataset_dir,
                tmp_path / "rel",
                server.base_url,
                tmp_path / "c.sqlite",
                cases=ids,
                experiments=["multiturn", "multiturn_no_exam", "exam", "mcq4", "mcq_many", "frq"],
            )
        )
        n = generate(
            spec(
                dataset_dir,
                tmp_path / "nejm",
                server.base_url,
                tmp_path / "c.sqlite",
                config="nejm_image",
                cases=["case_1"],
                experiments=["vignette", "frq"],
            )
        )
    assert not replay.mismatches
    conv = {c["case_id"]: c for c in read_release(r.path).table("conversations").to_pylist() if c["conversation"] == "standard"}
    for cid in same:  # the dialogue is the recorded one (the doctor's prompt is the pinned code's, not the recorded)
        assert conv[cid]["messages"][1:] == upstream["text"][cid]["trial_0"]["multiturn_conversation"][1:]
    ans = read_release(r.path).table("answers").to_pylist()
    assert {a["format"] for a in ans} == {"mcq4", "mcq_many", "frq"} and all(a["status"] == "ok" for a in ans)
    assert {(a["setting"], a["with_image"]) for a in read_release(n.path).table("answers").to_pylist()} == {
        ("vignette", False),
        ("vignette", True),
    }


def test_worker_processes_write_the_same_release(tiny_dataset, replay, tmp_path):
    exp = ["vignette", "multiturn", "summarized", "frq", "mcq4"]
    with LoopbackServer(replay) as server:
        one = generate(
            spec(tiny_dataset, tmp_path / "a" / "rel", server.base_url, tmp_path / "a.sqlite", experiments=exp, trials=2)
        )
        served = server.served
        two = generate(
            spec(
                tiny_dataset, tmp_path / "b" / "rel", server.base_url, tmp_path / "b.sqlite", experiments=exp, trials=2, workers=3
            )
        )
        assert server.served - served == served  # the same calls, each made once
    assert two.calls == one.calls
    assert release_bytes(one.path) == release_bytes(two.path)


def test_max_turns_and_refusals_are_recorded_never_silent(tiny_dataset, upstream, tmp_path):
    refusing = sorted(upstream["text"])[0]
    vignette = upstream["text"][refusing]["case_vignette"].strip()

    def responder(req):
        system = _text(req["messages"][0]["content"])
        if system.startswith("You are a patient"):
            return None if vignette in system else "It hurts."  # a content-filter block for one case
        if system.startswith("You are an AI doctor") and not Replay.is_question(req["messages"]):
            return "Where does it hurt?"  # a doctor who never concludes
        return "**Final Diagnosis:** Flu"

    run = {"options": {"max_turns": 3}, "experiments": ["vignette", "multiturn", "singleturn", "frq"]}
    with LoopbackServer(responder) as server:
        r = generate(spec(tiny_dataset, tmp_path / "rel", server.base_url, tmp_path / "c.sqlite", **run))
        patient = [_text(q["messages"][0]["content"]) for q in server.log if q["messages"][0]["role"] == "system"]
        refusal_calls = sum(1 for p in patient if p.startswith("You are a patient") and vignette in p)
    conv = {c["case_id"]: c for c in read_release(r.path).table("conversations").to_pylist()}
    assert conv[refusing]["ended"] == "refusal" and conv[refusing]["n_turns"] == 1
    assert refusal_calls == 1  # a refusal is an answer: not retried
    others = [c for cid, c in conv.items() if cid != refusing]
    assert others and all(c["ended"] == "max_turns" and c["n_turns"] == 3 for c in others)
    assert all(c["messages"][-1]["role"] == "user" for c in others)  # stopped after the patient's answer
    ans = read_release(r.path).table("answers").to_pylist()
    mine = {a["setting"]: a for a in ans if a["case_id"] == refusing}
    assert mine["multiturn"]["status"] == mine["singleturn"]["status"] == "refusal" and mine["multiturn"]["response"] is None
    assert "content_filter" in mine["multiturn"]["error"] and "content_filter" in conv[refusing]["error"]  # the reason is kept
    assert all(a["error"] is None for a in ans if a["status"] == "ok")
    assert mine["vignette"]["status"] == "ok"
    assert all(a["status"] == "ok" for a in ans if a["case_id"] != refusing)
    assert read_release(r.path).manifest.counts["refusals"] == 1


# --- failures with reasons, one set of counts, the server in the cache key ----------------------
def _with_long_option_list(dataset: Path, out: Path, n: int = 1000) -> Path:
    """A copy of ``dataset`` whose many-choice list has ``n`` three-word diagnoses (a prompt of 3n+ words)."""
    shutil.copytree(dataset, out)
    many = [f"Diagnosis number {i}" for i in range(n)]
    pl.DataFrame({"diagnosis": many, "count": [1] * n}).write_parquet(out / "diagnoses" / "test-00000-of-00001.parquet")
    return out


def test_failures_keep_their_reason_and_a_rerun_over_the_cache_sends_nothing(tiny_dataset, replay, tmp_path):
    data = _with_long_option_list(tiny_dataset, tmp_path / "data")
    exp = ["vignette", "multiturn", "mcq4", "mcq_many"]
    with LoopbackServer(replay, max_context=2000) as server:
        first = generate(spec(data, tmp_path / "a" / "rel", server.base_url, tmp_path / "c.sqlite", experiments=exp))
        sent = server.calls
        again = generate(spec(data, tmp_path / "b" / "rel", server.base_url, tmp_path / "c.sqlite", experiments=exp))
        assert server.calls == sent, "a deterministic failure is cached: the re-run must send nothing"
    rel = read_release(first.path)
    ans = rel.table("answers").to_pylist()
    failed = [a for a in ans if a["status"] == "error"]
    assert failed and {a["format"] for a in failed} == {"mcq_many"}
    assert all("HTTP 400 context_length_exceeded" in a["error"] and "maximum context length" in a["error"] for a in failed)
    assert all(a["error"] is None and a["response"] for a in ans if a["status"] == "ok")
    # One set of counts: the run's report, its summary and the manifest agree.
    counts = rel.manifest.counts
    assert first.requests == first.calls + first.cache_hits + first.deduplicated == sum(counts["requests"].values())
    assert first.failures == len(failed) == counts["failures"]
    [(label, n)] = counts["failures_by_reason"].items()
    assert n == len(failed) and label.startswith("HTTP 400 context_length_exceeded") and "deterministic" in label
    summary = first.summary()
    assert f"{len(failed)} × {label}" in summary and f"{first.requests}: {first.calls} sent" in summary
    assert (again.calls, again.cache_hits, again.failures) == (0, again.requests, first.failures)
    assert release_bytes(first.path) == release_bytes(again.path)


def test_transient_failures_keep_their_reason_and_are_tried_again(tiny_dataset, replay, tmp_path):
    exp = ["vignette", "frq"]
    with LoopbackServer(replay, error_rate=1.0, error_kinds=("500",)) as server:
        r = generate(
            spec(tiny_dataset, tmp_path / "a" / "rel", server.base_url, tmp_path / "c.sqlite", experiments=exp, max_retries=1)
        )
    ans = read_release(r.path).table("answers").to_pylist()
    assert ans and all(
        a["status"] == "error" and a["error"].startswith("HTTP 500") and "gave up after 2 attempts" in a["error"] for a in ans
    )
    assert all("transient" in label for label in r.counts.reasons)
    with LoopbackServer(replay) as server:  # the server is back: nothing failed was cached
        ok = generate(spec(tiny_dataset, tmp_path / "b" / "rel", server.base_url, tmp_path / "c.sqlite", experiments=exp))
        assert server.calls == len(ans)
    assert ok.failures == 0


def test_identical_requests_are_sent_once_and_counted_as_deduplicated(tiny_dataset, tmp_path):
    """A conversation that ends after one turn makes the multi-turn and single-turn questions the same request."""

    def responder(req):
        return "It hurts." if _text(req["messages"][0]["content"]).startswith("You are a patient") else "**Final Diagnosis:** Flu"

    exp = ["multiturn", "singleturn", "frq"]
    with LoopbackServer(responder) as server:
        r = generate(spec(tiny_dataset, tmp_path / "rel", server.base_url, tmp_path / "c.sqlite", experiments=exp))
        sent = server.calls
    assert r.calls == sent == 3 * N_TEXT_CASES  # patient, doctor (final diagnosis), one question for both settings
    assert r.deduplicated == N_TEXT_CASES and r.requests == 4 * N_TEXT_CASES
    assert sum(read_release(r.path).manifest.counts["requests"].values()) == r.requests
    assert len(read_release(r.path).table("answers")) == 2 * N_TEXT_CASES


def test_the_same_model_on_another_server_is_called_afresh_and_no_key_is_kept(tiny_dataset, replay, tmp_path, monkeypatch):
    key = "sk-test-secret-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    exp = ["vignette", "frq"]
    cache = tmp_path / "c.sqlite"
    with LoopbackServer(replay) as one, LoopbackServer(replay) as two:
        a = generate(spec(tiny_dataset, tmp_path / "a" / "rel", one.base_url, cache, experiments=exp))
        b = generate(spec(tiny_dataset, tmp_path / "b" / "rel", two.base_url, cache, experiments=exp))
        c = generate(spec(tiny_dataset, tmp_path / "c" / "rel", one.base_url + "/", cache, experiments=exp))  # the same server
        assert one.calls == two.calls == a.calls == b.calls > 0 and c.calls == 0
    with RequestCache(cache) as rc:
        assert {r["server"] for r in rc.requests()} == {one.base_url, two.base_url}
    roles = read_release(b.path).manifest.roles
    assert roles["doctor"]["base_url"] == two.base_url and roles["doctor"]["model"] == "openai/loopback"
    for path in [cache, *a.path.iterdir(), *b.path.iterdir()]:
        assert key.encode() not in Path(path).read_bytes()


def test_a_base_url_without_v1_gets_a_hint(tiny_dataset, replay, tmp_path, capsys):
    with LoopbackServer(replay) as server:
        bare = f"http://127.0.0.1:{server.port}"
        assert cli_main(generate_argv(tiny_dataset, base_url=bare, cache=tmp_path / "c.sqlite", out=tmp_path / "rel")) == 2
    err = capsys.readouterr().err.strip()
    assert f"{bare}/models answered HTTP 404" in err and f"--base-url {bare}/v1" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("url", ["localhost:8000/v1", "http://", "ftp://host/v1", "http://host:99999/v1"])
def test_a_bad_base_url_is_one_line(tiny_dataset, tmp_path, capsys, url):
    assert cli_main(generate_argv(tiny_dataset, doctor="openai/m", base_url=url, out=tmp_path / "rel")) == 2
    err = capsys.readouterr().err.strip()
    assert "--base-url" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("cases", [["case_1,case_2"], ["case_1", "case_2"], ["case_1,", "case_2,case_1"]])
@pytest.mark.parametrize("command", ["generate", "meld"])
def test_case_ids_take_commas_and_spaces_alike(command, cases):
    from craftmd.commands.cli import build_parser

    required = {
        "generate": ["--dataset", "d", "--doctor", "a/b", "--patient", "a/b", "--out", "o"],
        "meld": ["--dataset", "d", "--model", "a/b", "--out", "o"],
    }[command]
    args = build_parser().parse_args([command, *required, "--cases", *cases])
    assert args.cases == ["case_1", "case_2"]


def test_the_progress_bar_moves_per_request_and_agrees_with_the_summary_and_manifest(tiny_dataset, replay, tmp_path, capsys):
    import re

    out = tmp_path / "rel"
    with LoopbackServer(replay, latency=0.05) as server:
        options = ("--concurrency", "2", "--experiments", "vignette,multiturn,singleturn,frq,mcq4")
        argv = generate_argv(tiny_dataset, *options, base_url=server.base_url, cache=tmp_path / "c.sqlite", out=out, quiet=False)
        assert cli_main(argv) == 0
    err = capsys.readouterr().err
    bars = re.findall(r"(\d+)req .*?answers (\d+)/(\d+) sent=(\d+) cached=(\d+) dedup=(\d+) retries=\d+ fail=(\d+)", err)
    assert len({b[0] for b in bars}) > N_TEXT_CASES, "the bar should move per request, not per case"
    n, done, total, sent, cached, dedup, failed = map(int, bars[-1])
    [(requests, s, c, d)] = re.findall(r"requests\s+(\d+): (\d+) sent, (\d+) from cache, (\d+) deduplicated", err)
    assert (n, sent, cached, dedup) == (int(requests), int(s), int(c), int(d)) and n == sent + cached + dedup
    assert done == total == len(read_release(out).table("answers"))
    counts = read_release(out).manifest.counts
    assert sum(counts["requests"].values()) == n and counts["failures"] == failed


_OPEN_AND_PUT = """
import sys
from craftmd.models.base import Completion
from craftmd.models.cache import RequestCache
sys.stdin.read()  # every process waits here, then all open the one new file at once
c = RequestCache(sys.argv[1])
c.put(sys.argv[2], "openai", "m", "{}", Completion("ok", "ok"))
print(len(c))
"""


def test_processes_opening_one_new_cache_at_once_all_get_it(tmp_path):
    """The environment server's episodes, or several runs, open one request cache together: SQLite answers a
    switch to WAL under contention "database is locked" without waiting, which must not fail an episode."""
    import subprocess
    import sys

    path = tmp_path / "c.sqlite"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AND_PUT, str(path), f"k{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(12)
    ]
    outs = [p.communicate("go", timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 12, [e for _, e in outs if e]
    assert len(RequestCache(path)) == 12
