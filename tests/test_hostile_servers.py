"""Hostile or careless servers: a Retry-After is waited for (capped), a key the server echoes is never stored,
a reply of megabytes under a small max_tokens is a failure (not an answer), and a run in which nothing
succeeded says so and exits non-zero, its release written with every failure recorded.

The real openai client against tests/loopback.py."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path


from craftmd.commands.cli import main as cli_main
from craftmd.models import Sampling, get_model
from craftmd.models import calls
from craftmd.models.cache import RequestCache
from craftmd.models.calls import Caller
from craftmd.release import read_release

sys.path.insert(0, str(Path(__file__).parent))
from helpers import generate_argv  # noqa: E402
from loopback import LoopbackServer, Replay  # noqa: E402

KEY = "sk-test-secret-0123456789abcdef"
HI = [{"role": "user", "content": "hi"}]


def ask(server: LoopbackServer, cache: Path | None = None, n: int = 1, sampling: Sampling = Sampling(), **caller):
    async def go():
        model = get_model("openai/loopback", base_url=server.base_url)
        c = Caller(model, RequestCache(cache) if cache else None, **caller)
        out = [await c(HI, sampling) for _ in range(n)]
        await model.aclose()
        return out, c

    return asyncio.run(go())


def test_retry_after_is_waited_for(tmp_path):
    with LoopbackServer(lambda req: "x", error_rate=1.0, error_kinds=("429",), retry_after="1") as server:
        t = time.monotonic()
        [c], caller = ask(server, max_retries=2, backoff=0.001)
        took = time.monotonic() - t
    assert server.calls == 3 and caller.retries == 2
    assert took >= 2.0, f"three attempts in {took:.2f} s against Retry-After: 1"
    assert c.status == "error" and c.transient and c.reason == "HTTP 429 rate_limit_exceeded"


def test_retry_after_is_capped(monkeypatch):
    monkeypatch.setattr(calls, "RETRY_AFTER_CAP", 0.2)
    with LoopbackServer(lambda req: "x", error_rate=1.0, error_kinds=("429",), retry_after="3600") as server:
        t = time.monotonic()
        ask(server, max_retries=2, backoff=0.001, max_backoff=0.01)
        took = time.monotonic() - t
    assert server.calls == 3 and 0.4 <= took < 5


def test_retry_after_is_read_in_each_of_its_forms():
    from email.utils import formatdate

    from craftmd.models.openai import retry_after

    assert retry_after({"retry-after": "20"}) == 20.0 and retry_after({"retry-after-ms": "1500"}) == 1.5
    assert 25 < retry_after({"retry-after": formatdate(time.time() + 30, usegmt=True)}) <= 30
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past: no wait beyond the backoff
    assert retry_after({"retry-after": "soon"}) is None and retry_after({}) is None


def test_an_echoed_key_is_never_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cache = tmp_path / "c.sqlite"
    with LoopbackServer(lambda req: "x", echo_auth=True) as server:
        [c], _ = ask(server, cache)
    assert c.status == "error" and c.reason == "HTTP 400 invalid_request"
    assert "Authorization: Bearer [token]" in c.error and KEY not in c.error
    assert KEY.encode() not in cache.read_bytes()


def test_an_echoed_key_in_a_reply_is_taken_out(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with LoopbackServer(lambda req: f"your key is {KEY}") as server:
        [c], _ = ask(server)
    assert c.status == "ok" and c.text == "your key is [API key]"


def test_a_reply_of_megabytes_under_a_small_max_tokens_is_a_failure(tmp_path):
    with LoopbackServer(lambda req: "word " * 10_000) as server:  # 50,000 characters: within the body's bound
        [c], _ = ask(server, tmp_path / "small.sqlite", sampling=Sampling(max_tokens=512))
    assert c.status == "error" and c.reason == "reply too long" and "50,000 characters under max_tokens 512" in c.error
    with LoopbackServer(lambda req: "word " * 400_000) as server:  # 2 MB: past the body's bound, read no further
        [c, again], caller = ask(server, tmp_path / "c.sqlite", n=2, sampling=Sampling(max_tokens=512))
    assert c.status == "error" and c.text is None and c.reason == "reply too long"
    assert "under max_tokens 512" in c.error and "read no further" in c.error  # its body was cut off at its bound
    assert again == c and server.calls == 1  # deterministic: the same request gets it again, so it is cached (without the text)
    assert (tmp_path / "c.sqlite").stat().st_size < 200_000


# -- generate ------------------------------------------------------------------------------------------------------


#: The recorded upstream cases of the conftest fixtures upstream and tiny_dataset.
REPLAY = {"n": 2, "seed": 5, "max_messages": 14}


def generate_cli(dataset, out, url, cache, *extra) -> int:
    options = ("--experiments", "vignette,frq", "--max-retries", "1", *extra)
    return cli_main(generate_argv(dataset, *options, base_url=url, cache=cache, out=out))


def test_generate_exits_non_zero_when_nothing_succeeded(tiny_dataset, upstream, tmp_path, capsys):
    with LoopbackServer(Replay(upstream["text"]), error_rate=1.0, error_kinds=("500",)) as server:
        assert generate_cli(tiny_dataset, tmp_path / "rel", server.base_url, tmp_path / "c.sqlite") == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("craftmd generate: error: nothing succeeded: none of the") and "error column" in last
    answers = read_release(tmp_path / "rel").table("answers").to_pylist()
    assert answers and all(a["status"] == "error" and a["error"].startswith("HTTP 500") for a in answers)
    with LoopbackServer(Replay(upstream["text"])) as server:  # the server is back: the run succeeds
        assert generate_cli(tiny_dataset, tmp_path / "rel2", server.base_url, tmp_path / "c.sqlite") == 0
