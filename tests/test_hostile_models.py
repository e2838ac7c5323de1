"""Hostile or careless model servers (issues #29 and #30): a reply that is empty or another model's is a failure that
is never cached; no key reaches the cache, the error column or a record; a pool starts with the members that answer;
a refused response format moves the server to the next format once; a deterministic refusal is one try.

The real openai client against tests/loopback.py."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
from pathlib import Path

import pytest

from craftmd import CraftMDError
from craftmd.models import OpenAIModel, PoolModel, Sampling, get_model
from craftmd.models.base import EMPTY, FOREIGN, MALFORMED
from craftmd.models.cache import RequestCache
from craftmd.models.calls import Caller
from craftmd.models.connect import CallSettings, Connections
from craftmd.models.formats import structured
from craftmd.models.pool import in_conversation

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer  # noqa: E402

KEY = "sk-test-secret-0123456789abcdef"
HI = [{"role": "user", "content": "hi"}]


def ask(
    server: LoopbackServer,
    cache: Path | None = None,
    n: int = 1,
    sampling: Sampling = Sampling(),
    model: str = "loopback",
    reverse: bool = False,
    **caller,
):
    async def go():
        m = get_model(f"openai/{model}", base_url=server.base_url)
        c = Caller(m, RequestCache(cache) if cache else None, **{"backoff": 0.001, **caller})
        out = [await c([{"role": "user", "content": f"q{i}"}], sampling) for i in (reversed(range(n)) if reverse else range(n))]
        await m.aclose()
        return out, c

    return asyncio.run(go())


def cached(cache: Path) -> list[dict]:
    with RequestCache(cache) as c:
        return c.requests()


def completion(content, model="loopback", **message) -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": model,
        "usage": {"prompt_tokens": 1, "completion_tokens": 0},
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content, **message}}],
    }


# -- an empty or foreign reply is a failure, never cached -------------------------------------------------------------

EMPTY_BODIES = {
    "empty string": completion(""),
    "whitespace": completion("   \n"),
    "null content": completion(None),
    "message without content": {
        "model": "loopback",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant"}}],
    },
    "zero-width characters only": completion("\u200b\u200c\u200d\u2060\ufeff"),
    "braille blanks only": completion("\u2800\u2800 \u2800"),
    "Hangul fillers and combining marks only": completion("\u3164\u115f \u0301\u20dd"),
    "a tool call only": completion(
        None, tool_calls=[{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    ),
}


@pytest.mark.parametrize("name", list(EMPTY_BODIES))
def test_an_empty_reply_is_a_failure_never_cached_and_a_fixed_server_is_asked_again(tmp_path, name):
    broken = [True]
    cache = tmp_path / "c.sqlite"
    with LoopbackServer(lambda r: "fixed", body=lambda r: EMPTY_BODIES[name] if broken[0] else None) as server:
        [c], caller = ask(server, cache, max_retries=6)
        assert c.status == "error" and c.transient and c.reason == EMPTY, c
        assert c.text is None and not cached(cache)  # not an answer, nor a deterministic failure
        assert server.calls == 2  # asked once more (the same server says the same again), not six times
        broken[0] = False  # the server is fixed: the same request is asked again, and answered
        [again], _ = ask(server, cache)
    assert again.status == "ok" and again.text == "fixed"
    assert [r["response"]["text"] for r in cached(cache)] == ["fixed"]


def test_an_empty_answer_an_older_version_cached_is_asked_again(tmp_path):
    cache = tmp_path / "c.sqlite"
    with LoopbackServer(lambda r: "answer") as server:
        ask(server, cache)
        with RequestCache(cache) as db:  # as the cache of an older version held it: "" stored as an answer
            db._sql("UPDATE requests SET response = json_set(response, '$.text', '')")
        [c], _ = ask(server, cache)
    assert c.status == "ok" and c.text == "answer" and server.calls == 2
    assert [r["response"]["text"] for r in cached(cache)] == ["answer"]


@pytest.mark.parametrize(
    "asked, named",
    [
        ("loopback", "other-model-7b"),
        ("gpt-4o", "gpt-4o-mini"),
        ("med-7b", "llama-3-70b-instruct"),
        ("smollm2", "/models/qwen2.5-0.5b-instruct-q8_0.gguf"),
        ("gpt-4o", "gpt-3.5-turbo"),
        ("gpt-4", "gpt-4.5-preview"),  # issue #48: a longer name is another model, unless what follows is a date
        ("llama-3", "llama-3-70b"),
        ("loopback", "evil-org/loopback"),  # an organisation added is another model
        ("gpt-4o", "gpt-4o-2024-08-06-evil"),
    ],
)
def test_a_reply_from_another_model_is_a_failure_never_cached(tmp_path, asked, named):
    cache = tmp_path / "c.sqlite"
    with LoopbackServer(lambda r: "an answer", models=(asked, named), served_as={asked: named}) as server:
        [c], caller = ask(server, cache, model=asked, max_retries=6)
    assert c.status == "error" and c.transient and c.reason == FOREIGN and named in c.error and c.model == named
    assert not cached(cache) and server.calls == 2
    assert caller.counters.served == {named: 1}  # the name the failed request's reply gave is counted
    # names that are the model asked are answers: llama.cpp's file path, a dated snapshot, a revision, the root the server declares
    # for the name asked, a placeholder name the server does not serve
    for asked, named, declared, roots in [
        ("smollm2", "/home/me/models/SmolLM2-135M-Instruct.gguf", ("smollm2",), {}),
        ("smollm2", "smollm2.gguf", ("smollm2",), {}),
        ("gpt-4o", "gpt-4o-2024-08-06", ("gpt-4o",), {}),
        ("gpt-4", "gpt-4-0613", ("gpt-4", "gpt-4.5-preview"), {}),  # dated snapshots: MMDD, YYYYMMDD
        ("claude-3-5-sonnet", "claude-3-5-sonnet-20241022", ("claude-3-5-sonnet", "other"), {}),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct", ("Qwen/Qwen2.5-7B-Instruct", "other"), {}),
        ("my-doctor", "my-doctor@main", ("my-doctor",), {}),  # transformers serve: name@revision
        ("my-model", "Qwen/Qwen2.5-7B-Instruct", ("my-model", "other"), {"my-model": "Qwen/Qwen2.5-7B-Instruct"}),
        ("smollm2", "gpt-3.5-turbo", ("smollm2", "other"), {}),
    ]:
        with LoopbackServer(lambda r: "an answer", models=declared, served_as={asked: named}, roots=roots) as server:
            [c], _ = ask(server, model=asked)
        assert c.status == "ok" and c.model == named


def _serving(bad_server_kwargs: dict, n: int = 12, max_retries: int = 6):
    """``n`` conversations over a pool of a good server and one given ``bad_server_kwargs``: (results, members, counts)."""
    good = LoopbackServer(lambda r: "ok", models=("m",))
    bad = LoopbackServer(lambda r: "ok", models=("m",), **bad_server_kwargs)
    with good, bad:
        import os

        os.environ["POOL_BASE_URL"] = f"{bad.base_url},{good.base_url}"
        try:

            async def go():
                async with Connections(
                    CallSettings(max_retries=max_retries, backoff=0.001, concurrency=2), ["openai-api/pool/m"]
                ) as conn:
                    caller = conn.caller("openai-api/pool/m")
                    out = await asyncio.gather(
                        *(in_conversation(caller([{"role": "user", "content": f"q{i}"}], Sampling())) for i in range(n))
                    )
                    return out, conn.pools["pool"].members, conn.counts()

            results, members, counts = asyncio.run(go())
        finally:
            del os.environ["POOL_BASE_URL"]
        return results, members, counts, bad, good


@pytest.mark.parametrize(
    "kind, bad_kwargs",
    [
        ("foreign", {"served_as": {"m": "other-model-7b"}}),
        ("empty", {"body": lambda r: completion("")}),
        ("null", {"body": lambda r: completion(None)}),
        ("html", {"body": lambda r: "<html><body><h1>502 Bad Gateway</h1></body></html>"}),
        ("no choices", {"body": lambda r: {"model": "m", "object": "chat.completion", "usage": {}}}),
        ("empty choices", {"body": lambda r: {"model": "m", "choices": []}}),
    ],
)
def test_a_pool_member_that_sends_no_answers_leaves_the_pool(kind, bad_kwargs, capsys):
    results, (b, g), counts, bad, good = _serving(bad_kwargs)
    assert capsys.readouterr().err.count("taken out of its pool") == 1
    assert all(r.status == "ok" and r.text == "ok" for r in results), results
    assert good.served == 12 and b.dead and g.dead is None
    assert bad.calls <= 4  # taken out after a few: every request it gave no answer moved to the other at once
    assert counts.served == {"m": 12}
    if kind == "foreign":
        assert b.dead.startswith(FOREIGN) and bad.calls <= 2  # taken out at its first reply (two were in flight)


def test_the_run_record_lists_the_model_names_the_replies_gave(tiny_dataset, upstream, tmp_path, monkeypatch, capsys):
    from craftmd.commands.cli import main as cli_main
    from craftmd.release import read_release
    from loopback import Replay

    def generate(out) -> int:
        return cli_main(
            [
                "generate",
                "--dataset",
                str(tiny_dataset),
                "--doctor",
                "openai-api/pool/doc",
                "--patient",
                "openai-api/pool/doc",
                "--cache",
                str(tmp_path / "c.sqlite"),
                "--experiments",
                "vignette,frq",
                "--out",
                str(tmp_path / out),
                "--quiet",
                "--max-retries",
                "1",
            ]
        )

    replay = Replay(upstream["text"])
    with LoopbackServer(replay, models=("doc",), served_as={"doc": "other-model-7b"}) as bad:
        monkeypatch.setenv("POOL_BASE_URL", bad.base_url)  # one server, serving another model: nothing is an answer
        assert generate("alone") == 2
        m = read_release(tmp_path / "alone").manifest
        assert m.counts["served_models"] == {"doctor": {"other-model-7b": m.counts["requests"]["doctor"]}}
        assert set(m.counts["failures_by_reason"]) == {f"{FOREIGN} (transient: a re-run tries again)"}
        with LoopbackServer(replay, models=("doc",)) as good:  # beside a good one: it leaves the pool, the run is whole
            monkeypatch.setenv("POOL_BASE_URL", f"{bad.base_url},{good.base_url}")
            capsys.readouterr()
            assert generate("pool") == 0
    assert f"{bad.base_url} taken out of its pool ({FOREIGN}" in capsys.readouterr().err
    m = read_release(tmp_path / "pool").manifest
    assert m.counts["failures"] == 0 and m.counts["served_models"] == {"doctor": {"doc": m.counts["requests"]["doctor"]}}


# -- keys scrubbed from every text that is stored ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"choices": [], "debug": f"Authorization: Bearer {KEY}"},  # malformed, echoing the header
        {"choices": [], "debug": {"headers": {"authorization": f"Bearer {KEY}"}}},
        {"error": "bad", "request": {"api_key": KEY}},
        {"choices": None, "x-api-key": "an-unrelated-key-9876543210"},
    ],
)
def test_a_key_echoed_in_a_malformed_response_is_not_stored(tmp_path, monkeypatch, body):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with LoopbackServer(lambda r: "x", body=lambda r: body) as server:
        [c], _ = ask(server, tmp_path / "c.sqlite", max_retries=0)
    assert c.status == "error" and c.reason == MALFORMED
    assert KEY not in c.error and "an-unrelated-key-9876543210" not in c.error, c.error


@pytest.mark.parametrize("named", [KEY, f"Bearer {KEY}", f"model-{KEY}"])
def test_a_key_echoed_in_a_replys_model_name_is_not_stored(tmp_path, monkeypatch, named):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cache = tmp_path / "c.sqlite"
    with LoopbackServer(lambda r: "x", body=lambda r: completion("an answer", model=named), roots={"loopback": named}) as server:
        [c], caller = ask(server, cache)
    assert c.status == "ok" and KEY not in (c.model or "")
    assert KEY.encode() not in cache.read_bytes() and KEY not in json.dumps(caller.counters.served)


def test_a_key_in_an_error_code_or_header_is_not_stored(tmp_path, monkeypatch):
    """A key from any environment variable (not only the client's), in the error's code, message or an echoed header."""
    other = "hf_abcdefghijklmnop0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("HF_TOKEN", other)
    from aiohttp import web

    def error(request):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": {"message": f"x-api-key: {KEY}; token {other}", "code": f"bad_{KEY}"}}),
            content_type="application/json",
        )

    with LoopbackServer(lambda r: "x", body=error) as server:
        [c], _ = ask(server, tmp_path / "c.sqlite")
    assert c.status == "error" and KEY not in c.error + c.reason and other not in c.error
    assert KEY.encode() not in (tmp_path / "c.sqlite").read_bytes() and other.encode() not in (tmp_path / "c.sqlite").read_bytes()


def test_one_function_scrubs():
    from craftmd.models import base, openai

    assert base.scrub(f"Authorization: Bearer {KEY}") == "Authorization: Bearer [token]"
    assert base.scrub(f"api-key: abc{KEY}") == "api-key: [API key]" and base.scrub(f"key {KEY}!") == "key [API key]!"
    assert base.scrub(f"your key is {KEY}", patterns=False) == f"your key is {KEY}"  # only keys it knows, in a reply's words
    assert base.scrub(f"your key is {KEY}", (KEY,), patterns=False) == "your key is [API key]"
    assert not hasattr(openai, "BEARER")  # no second scrubber


# -- pools start with the members that answer -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_pool_with_a_refused_port_and_a_hanging_member_runs_on_the_live_one(monkeypatch, capsys):
    from craftmd.models import pool as pool_mod

    monkeypatch.setattr(pool_mod, "CHECK_TIMEOUT", 1.0)
    refused = f"http://127.0.0.1:{free_port()}/v1"
    with (
        LoopbackServer(lambda r: "ok", models=("m",), models_delay=30, latency=30) as hanging,
        LoopbackServer(lambda r: "ok", models=("m",)) as live,
    ):
        monkeypatch.setenv("POOL_BASE_URL", f"{refused},{hanging.base_url},{live.base_url}")

        async def go():
            settings = CallSettings(max_retries=1, backoff=0.001, timeout=60)
            async with Connections(settings, ["openai-api/pool/m"]) as conn:
                await conn.check()
                down = conn.down
            # a later connection of the same run (the run after its check) starts without them
            async with Connections(
                CallSettings(max_retries=1, backoff=0.001, timeout=60, down=down), ["openai-api/pool/m"]
            ) as conn:
                caller = conn.caller("openai-api/pool/m")
                out = await asyncio.wait_for(
                    asyncio.gather(
                        *(in_conversation(caller([{"role": "user", "content": f"q{i}"}], Sampling())) for i in range(6))
                    ),
                    20,
                )
                return down, out, conn.pools["pool"].members

        down, results, members = asyncio.run(go())
    assert set(down) == {refused, hanging.base_url}
    assert all(r.status == "ok" for r in results) and live.served == 6 and hanging.calls == 0
    assert [m.dead is None for m in members] == [False, False, True]
    err = capsys.readouterr().err
    assert err.count("taken out of its pool") == 2 and refused in err and hanging.base_url in err


def test_a_pool_with_every_member_down_is_one_line(monkeypatch, tiny_dataset, tmp_path, capsys):
    from craftmd.commands.cli import main as cli_main

    monkeypatch.setenv("POOL_BASE_URL", f"http://127.0.0.1:{free_port()}/v1,http://127.0.0.1:{free_port()}/v1")

    async def go():
        async with Connections(CallSettings(), ["openai-api/pool/m"]) as conn:
            await conn.check()

    with pytest.raises(
        CraftMDError, match=r"^no server of POOL_BASE_URL answers: cannot reach the model server at http://127\.0\.0\.1:\d+/v1$"
    ):
        asyncio.run(go())
    capsys.readouterr()
    rc = cli_main(
        [
            "generate",
            "--dataset",
            str(tiny_dataset),
            "--doctor",
            "openai-api/pool/m",
            "--patient",
            "openai-api/pool/m",
            "--experiments",
            "vignette",
            "--out",
            str(tmp_path / "rel"),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "no server of POOL_BASE_URL answers" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "rel").exists()


@pytest.mark.parametrize(
    "listed",
    [
        "http://127.0.0.1:{p}/v1,http://127.0.0.1:{p}/v1/",
        "http://127.0.0.1:{p}/v1,http://localhost:{p}/v1",
        "http://LOCALHOST:{p}/v1/,http://[::1]:{p}/v1",
        "http://127.0.0.1:{p}/v1,http://127.0.0.1:{p}/v1",
    ],
)
def test_a_server_listed_twice_in_any_spelling_is_one_member(monkeypatch, listed):
    monkeypatch.setenv("ONE_BASE_URL", listed.format(p=8000))
    m = get_model("openai-api/one/m")
    assert isinstance(m, OpenAIModel) and not isinstance(m, PoolModel)
    monkeypatch.setenv("ONE_BASE_URL", listed.format(p=8000) + ",http://example.org:80/v1,http://EXAMPLE.org/v1/")
    m = get_model("openai-api/one/m")
    assert isinstance(m, PoolModel) and len(m.clients) == 2


# -- the judge's undated-alias warning --------------------------------------------------------------------------------


def test_a_service_judge_answered_by_its_own_name_is_no_undated_alias():
    from craftmd.scoring.judge import alias_warning

    assert alias_warning("openai-api/local/judge-a", {"judge-a"}) is None
    assert alias_warning("openai-api/my-svc/qwen2.5-7b", {"qwen2.5-7b"}) is None
    assert "judge-a-2025-01-31" in alias_warning("openai-api/local/judge-a", {"judge-a-2025-01-31"})


# -- structured output that degrades; deterministic refusals are one try ----------------------------------------------

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.mark.parametrize("status", [400, 422, 500])
def test_a_refused_format_moves_the_server_to_the_next_once(tmp_path, status):
    with LoopbackServer(lambda r: '{"answer": "yes"}', refuse_formats={"json_schema": status}) as server:
        out, caller = ask(server, tmp_path / "c.sqlite", n=5, sampling=structured(Sampling(), SCHEMA, name="t"), max_retries=6)
        assert all(c.status == "ok" for c in out)
        assert server.formats == {"json_schema": 1, "json_object": 5}  # refused once, never again, never retried
        assert caller.formats.record()["used"] == ["json_object"] and "json_schema" in caller.formats.record()["refused"]
        server.reset_counters()  # a re-run over the cache, in another order: the refusal is remembered, nothing is sent
        again, _ = ask(server, tmp_path / "c.sqlite", n=5, sampling=structured(Sampling(), SCHEMA, name="t"), reverse=True)
        assert server.calls == 0 and again[::-1] == out


def test_a_server_refusing_every_format_is_asked_without_one():
    with LoopbackServer(lambda r: '{"answer": "yes"}', refuse_formats={"json_schema": 500, "json_object": 400}) as server:
        out, caller = ask(server, n=3, sampling=structured(Sampling(), SCHEMA, name="t"))
    assert all(c.status == "ok" for c in out) and server.formats == {"json_schema": 1, "json_object": 1, "": 3}
    assert caller.formats.record()["used"] == ["none"]


@pytest.mark.parametrize(
    "status, message",
    [
        (500, "the request exceeds the available context size, try increasing it"),  # llama.cpp
        (400, "This model's maximum context length is 2048 tokens. However, you requested 4000 tokens."),  # vLLM
        (500, "Requested tokens (4000) exceed context window of 2048"),  # llama-cpp-python
    ],
)
def test_a_context_overflow_is_one_try_and_cached(tmp_path, status, message):
    with LoopbackServer(lambda r: "x", max_context=0, context_error=(status, message)) as server:
        [c], caller = ask(server, tmp_path / "c.sqlite", max_retries=6)
        assert c.status == "error" and not c.transient and "context_length_exceeded" in c.reason
        assert server.calls == 1 and caller.retries == 0
        ask(server, tmp_path / "c.sqlite")
        assert server.calls == 1  # deterministic: cached


def _valid_judge(request: dict) -> str:
    prompt = request["messages"][0]["content"]
    if prompt.startswith("You chair a review committee"):
        return 'Clinician: the doctor asked "Hello, what brings you in today?".'
    ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", prompt, re.M) or re.findall(r"^Aspect: ([a-z_]+\.[a-z_]+) ", prompt, re.M)
    items = [{"dimension": d, "score": 3, "rationale": "r", "evidence": ["Hello, what brings you in today?"]} for d in ids]
    return json.dumps({"scores": items}) if len(ids) > 1 or "scores" in prompt else json.dumps(items[0])


@pytest.mark.parametrize("status", [400, 500])
@pytest.mark.parametrize("mode", ["dimension", "category"])
def test_a_judge_against_a_server_refusing_json_schema_scores_every_dimension(tmp_path, status, mode):
    from test_judge import CATS, make_release

    from craftmd.release import read_release
    from craftmd.scoring import judge as J
    from craftmd.scoring.score import judge_release

    rel = make_release(tmp_path)
    with LoopbackServer(_valid_judge, models=("judge-a",), refuse_formats={"json_schema": status}) as server:
        spec = J.JudgeSpec(
            models=["openai/judge-a"],
            mode=mode,
            dimensions=CATS,
            base_url=server.base_url,
            progress=False,
            max_retries=6,
            max_invalid=0,
        )
        judge_release(rel, spec, cases=["case_1", "case_2"])
        asked_with_schema = server.formats["json_schema"]
        calls = server.calls
    rows = [r for r in read_release(rel).scores_with_records()[0].to_pylist() if r["scorer"] == "judge:openai/judge-a"]
    assert rows and all(r["status"] == "ok" and r["value"] == 3.0 for r in rows), [
        r["detail"] for r in rows if r["status"] != "ok"
    ]
    assert asked_with_schema == 1  # refused once; every call after went as json_object, in one try
    jobs = len({json.loads(r["detail"])["category"] + r["case_id"] for r in rows})
    scoring_calls = len(rows) if mode == "dimension" else jobs
    assert calls == jobs + scoring_calls + 1
    rec = read_release(rel).scorer_records()["judge:openai/judge-a"]["response_format"]
    assert rec["requested"] == "json_schema" and rec["used"] == "json_object"
    assert (
        rec["refused"].startswith(f"json_schema: response format refused (HTTP {status})") and "not supported" in rec["refused"]
    )


@pytest.mark.parametrize("text", ["\u200b\u200d", "\u2800\u2800", " \u3164 "])
def test_the_offline_engines_invisible_reply_is_no_answer(text):
    from types import SimpleNamespace

    from craftmd.models.vllm import _completion

    out = SimpleNamespace(prompt_token_ids=[1], outputs=[SimpleNamespace(text=text, token_ids=[2], finish_reason="stop")])
    c = _completion(out)
    assert c.status == "error" and c.transient and c.reason == EMPTY and "no visible text" in c.error
    good = SimpleNamespace(
        prompt_token_ids=[1], outputs=[SimpleNamespace(text=f"{text}psoriasis", token_ids=[2], finish_reason="stop")]
    )
    assert _completion(good).status == "ok"


@pytest.mark.parametrize("named", ["evil-org/loopback", "other-model-7b", "gpt-3.5-turbo", None])
def test_a_server_that_lists_no_models_is_taken_at_its_word_only_for_the_model_asked(tmp_path, named, capsys):
    """Issue 48, 6: a server without ``/v1/models`` was trusted on any name its replies gave. Now a reply counts only when
    it names the model asked (or a dated snapshot of it); another name, or none, is a reply from another model (never
    cached)."""
    cache = tmp_path / "c.sqlite"
    body = (lambda r: completion("an answer", model=None)) if named is None else None  # a reply that names no model
    with LoopbackServer(lambda r: "an answer", list_models=False, served_as={"loopback": named or ""}, body=body) as server:
        [c], _ = ask(server, cache, max_retries=6)
    assert c.status == "error" and c.transient and c.reason == FOREIGN, c
    assert ("names no model" in c.error) if named is None else (named in c.error)
    assert not cached(cache) and server.calls == 2


@pytest.mark.parametrize("named", ["loopback", "loopback-2024-08-06"])
def test_a_reply_whose_model_field_is_the_only_evidence_is_said_once_and_recorded(tmp_path, named, capsys):
    """The model asked (or its dated snapshot), from a server that lists no models: an answer, with one line on stderr
    that its model field is the only evidence, and the answer marked so (``unlisted``: cached with it, counted by the
    caller as ``unlisted``, recorded in a run record as ``model_named_by_reply_only``)."""
    cache = tmp_path / "c.sqlite"
    with LoopbackServer(lambda r: "an answer", list_models=False, served_as={"loopback": named}) as server:
        out, caller = ask(server, cache, n=3)
        assert [c.status for c in out] == ["ok"] * 3 and all(c.unlisted for c in out)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "lists no models" in err[0] and "model field alone" in err[0], err
        assert caller.counters.unlisted == 3
        assert all(r["response"]["unlisted"] is True for r in cached(cache))
        out, caller = ask(server, cache, n=3)  # again, from the cache: the same record
    assert caller.counters.unlisted == 3 and caller.counters.cache_hits == 3 and server.calls == 3
    with LoopbackServer(lambda r: "an answer") as server:  # a server that lists its models: nothing to say
        out, caller = ask(server, tmp_path / "d.sqlite", n=2)
    assert caller.counters.unlisted == 0 and not any(c.unlisted for c in out)
    assert "unlisted" not in json.dumps([r["response"] for r in cached(tmp_path / "d.sqlite")])
    assert capsys.readouterr().err == ""


def test_an_llm_grader_on_a_server_that_lists_no_models_records_that_its_reply_names_are_the_only_evidence(
    dataset_dir, tmp_path, capsys
):
    """The run record of scores from such a server (the LLM grader's record in the release) says how many answers rest on
    the reply's model name alone (``model_named_by_reply_only``), and the command says so in one line."""
    from craftmd.commands.cli import main
    from craftmd.release import read_release

    from test_forged_scores import _release
    from test_llm_grader import GraderResponder

    rel = _release(tmp_path / "releases" / "tiny", dataset_dir)
    with LoopbackServer(GraderResponder(), list_models=False) as server:
        argv = ["score", str(rel), "--dataset", str(dataset_dir), "--scorer", "llm:openai/loopback"]
        argv += ["--base-url", server.base_url, "--cache", str(tmp_path / "c.sqlite"), "--grader-prompts", "grader-v1", "--quiet"]
        assert main(argv) == 0
    record = read_release(rel).scorer_records()["llm:openai/loopback"]
    assert record["model_named_by_reply_only"] == 2 * record["asked"] > 0  # two steps per answer asked: extract, judge
    warned = [line for line in capsys.readouterr().err.splitlines() if "lists no models" in line]
    assert len(warned) == 1
