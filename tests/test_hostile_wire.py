"""Hostile model servers on the wire (issue #48): ``--timeout`` is a deadline for the whole request (a body trickled byte
by byte is cut off), a redirect is never followed (the prompts go to the server configured and nowhere else), server
text loses its terminal escapes before it is printed or stored, and a ``usage`` that is no token count is no answer.

The real openai client against a small raw HTTP server in this file (a handler that says exactly what is sent, when)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from craftmd import CraftMDError
from craftmd.models import Sampling, get_model
from craftmd.models.base import MALFORMED, Completion
from craftmd.models.cache import RequestCache
from craftmd.models.calls import Caller


def completion(content: str = "an answer", **usage) -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "loopback",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, **usage},
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
    }


class RawServer:
    """An HTTP server on 127.0.0.1 that answers every POST with ``reply(path) -> (status, headers, body)``, the body sent
    ``chunk`` bytes at a time, ``pause`` seconds apart; ``sent`` counts the body bytes it got out, ``paths`` what was asked,
    ``headers`` each request's headers."""

    def __init__(self, reply, *, chunk: int = 1 << 20, pause: float = 0.0, models: tuple[str, ...] = ("loopback",), get=None):
        self.reply, self.chunk, self.pause = reply, chunk, pause
        self.sent, self.paths, self.headers = 0, [], []
        listed = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in models]}).encode()
        self.get = get or (lambda path: (200, {}, listed))  # GET (/v1/models): the models it serves
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.paths.append(self.path)
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                self.answer(*outer.reply(self.path))

            def do_GET(self):
                outer.paths.append(self.path)
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                self.answer(*outer.get(self.path))

            def answer(self, status, headers, body):
                self.send_response(status)
                for k, v in {"content-type": "application/json", "content-length": str(len(body)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    for i in range(0, len(body), outer.chunk):
                        self.wfile.write(body[i : i + outer.chunk])
                        self.wfile.flush()
                        outer.sent += len(body[i : i + outer.chunk])
                        time.sleep(outer.pause)
                except OSError:  # the client hung up
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> RawServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def ask(url: str, cache: Path | None = None, *, timeout: float = 30.0, max_retries: int = 1) -> Completion:
    async def go():
        m = get_model("openai/loopback", base_url=url, timeout=timeout)
        c = Caller(m, RequestCache(cache) if cache else None, max_retries=max_retries, backoff=0.001)
        try:
            return await c([{"role": "user", "content": "hi"}], Sampling())
        finally:
            await m.aclose()

    return asyncio.run(go())


def ok(body: dict, headers: dict | None = None):
    return lambda path: (200, headers or {}, json.dumps(body).encode())


def test_a_reply_trickled_byte_by_byte_is_cut_off_at_the_deadline():
    body = json.dumps(completion("x" * 200)).encode()
    # a byte every 20 ms: never idle as long as the 0.5 s timeout, so only a deadline for the whole body stops it
    with RawServer(ok(completion("x" * 200)), chunk=1, pause=0.02) as server:
        c = ask(server.base_url, timeout=0.5, max_retries=1)
        sent = server.sent
    assert c.status == "error" and c.transient and c.reason == "timeout", c
    assert "no whole answer within 0.5 s" in c.error and c.text is None
    assert sent < len(body)  # the body was never read whole: nothing of it counts


def test_a_redirect_to_another_host_is_not_followed(tmp_path):
    with RawServer(ok(completion("the other host's answer"))) as other:
        where = f"{other.base_url}/chat/completions"
        with RawServer(lambda path: (307, {"location": where}, b"")) as server:
            c = ask(server.base_url, tmp_path / "c.sqlite", max_retries=3)
        assert other.paths == []  # the prompt never reached the other host
    assert c.status == "error" and c.text is None and c.reason == "redirect not followed", c
    assert "HTTP 307" in c.error and other.base_url.removesuffix("/v1") in c.error
    assert server.paths == ["/v1/chat/completions"] * 2  # asked once more at most, like a foreign reply
    with RequestCache(tmp_path / "c.sqlite") as db:
        assert db.requests() == []  # not cached: a fixed configuration is asked again


ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202e"
CONTROLS = "\x1b\x07\x9b\u202e"


def test_terminal_escapes_from_a_server_are_neither_printed_nor_stored(tmp_path):
    error = json.dumps({"error": {"message": f"bad{ESCAPES}request\nsecond line", "code": "x"}}).encode()
    with RawServer(lambda path: (400, {}, error)) as server:
        c = ask(server.base_url, tmp_path / "c.sqlite")
    assert c.status == "error" and c.reason == "HTTP 400 x"
    assert not any(ch in c.error for ch in CONTROLS + "\n\r") and "bad" in c.error and "request second line" in c.error
    with RawServer(ok(completion(f"first{ESCAPES}\nsecond\tthird"))) as server:
        c = ask(server.base_url, tmp_path / "d.sqlite")
    assert c.status == "ok" and c.text == "first[2J]0;owned31m\nsecond\tthird"  # the reply's lines and tabs are kept
    with RequestCache(tmp_path / "d.sqlite") as db:
        assert "\x1b" not in json.dumps(db.requests(), ensure_ascii=False)


def check_model(url: str) -> None:
    """``openai/loopback``'s check of the server at ``url`` (its model list read, :meth:`OpenAIModel.check`)."""

    async def go() -> None:
        m = get_model("openai/loopback", base_url=url)
        try:
            await m.check()
        finally:
            await m.aclose()

    asyncio.run(go())


def test_a_model_list_with_terminal_escapes_is_shown_without_them():
    with RawServer(ok(completion()), models=(f"other{ESCAPES}",)) as server:
        with pytest.raises(CraftMDError) as e:
            check_model(server.base_url)
    said = str(e.value)
    assert "does not serve 'loopback' (it serves: other" in said and not any(ch in said for ch in CONTROLS + "\n")


def test_the_context_window_is_read_under_a_deadline_and_never_through_a_redirect():
    from craftmd.generation.context import context_window

    window = json.dumps({"data": [{"id": "loopback", "max_model_len": 4096}]}).encode()
    with RawServer(ok(completion()), get=lambda path: (200, {}, window)) as other:
        moved = lambda path: (302, {"location": f"{other.base_url}/models"}, b"")  # noqa: E731
        with RawServer(ok(completion()), get=moved) as server:
            assert context_window(server.base_url, "loopback", key="sk-secret-key-0123456789") is None
        assert other.paths == []  # neither the request nor its key went to the other host
        assert context_window(other.base_url, "loopback") == 4096
    with RawServer(ok(completion()), get=lambda path: (200, {}, window + b" " * 400), chunk=1, pause=0.02) as slow:
        assert context_window(slow.base_url, "loopback", timeout=0.5) is None  # trickled: cut off at the deadline
        assert slow.sent < len(window) + 400


@pytest.mark.parametrize("bad", [-1_000_000, 1e400, 2.5, "12", True])
def test_a_usage_that_is_no_token_count_is_no_answer(tmp_path, bad):
    body = json.dumps(completion(prompt_tokens=bad)).encode()  # 1e400 is written as Infinity
    with RawServer(lambda path: (200, {}, body)) as server:
        c = ask(server.base_url, tmp_path / "c.sqlite")
    assert c.status == "error" and c.transient and c.reason == MALFORMED and "usage prompt_tokens" in c.error, c
    assert c.tokens_in >= 0
    with RequestCache(tmp_path / "c.sqlite") as db:
        assert db.requests() == []
    with RawServer(ok(completion(prompt_tokens=7.0, completion_tokens=None))) as server:
        c = ask(server.base_url)
    assert c.status == "ok" and (c.tokens_in, c.tokens_out) == (7, 0)


def gzip_bomb(inflated_mib: int, status_body: bytes | None = None) -> bytes:
    """A gzip body a few hundred KiB on the wire that inflates to ``inflated_mib`` MiB: a chat completion whose content is
    that many MiB of one letter (or, with ``status_body``, that text followed by as much padding)."""
    import zlib

    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    head = status_body or json.dumps(completion("")).encode().split(b'"content": ""')[0] + b'"content": "'
    parts = [z.compress(head)]
    block = b"a" * (1 << 20)
    parts += [z.compress(block) for _ in range(inflated_mib)]
    parts.append(z.compress(b"" if status_body else b'"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}'))
    return b"".join(parts) + z.flush()


def _peak(call):
    """``call()``'s result and the most memory Python held while it ran (tracemalloc's peak), in bytes; the model layer's
    modules imported first (their import is no part of it)."""
    import tracemalloc

    import craftmd.models.body  # noqa: F401 - the SDK and the bounded client

    tracemalloc.start()
    try:
        out = call()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_gzip_bomb_is_cut_off_as_it_inflates_never_read_whole(tmp_path):
    """Issue 48, 4: a reply small on the wire and 48 MiB once inflated (gzip) is read only up to the reply's bound
    (from its max_tokens), decoded a piece at a time: a failure ``reply too long`` in one line, well before memory grows;
    an error's body the same; a model list too (one line). An honest gzip reply is an answer."""
    bomb = gzip_bomb(48)
    assert len(bomb) < 1 << 20
    gz = {"content-encoding": "gzip"}
    with RawServer(lambda path: (200, gz, bomb)) as server:
        c, peak = _peak(lambda: ask(server.base_url, tmp_path / "c.sqlite"))
    assert c.status == "error" and c.reason == "reply too long" and c.text is None, c
    assert "\n" not in c.error and "gzip-encoded" in c.error and "under max_tokens 512" in c.error
    assert peak < 16 << 20, f"{peak:,} bytes held"  # the bound is ~1.4 MiB decoded; inflated whole it would be 48 MiB

    error = gzip_bomb(48, status_body=b'{"error": {"message": "')
    with RawServer(lambda path: (500, gz, error)) as server:
        c, peak = _peak(lambda: ask(server.base_url, tmp_path / "d.sqlite"))
    assert c.status == "error" and c.reason == "reply too long" and peak < 16 << 20, (c, peak)

    listed = gzip_bomb(48, status_body=b'{"object": "list", "data": [{"id": "loopback", "object": "model", "x": "')
    with RawServer(ok(completion()), get=lambda path: (200, gz, listed)) as server:
        with pytest.raises(CraftMDError) as e:
            check_model(server.base_url)
    assert "/v1/models: the reply's body passed 16,777,216 bytes" in str(e.value) and "\n" not in str(e.value)

    import gzip

    honest = gzip.compress(json.dumps(completion("psoriasis")).encode())
    with RawServer(lambda path: (200, gz, honest)) as server:
        c = ask(server.base_url)
    assert c.status == "ok" and c.text == "psoriasis"


class _Unbounded:
    """A stand-in for a brotli (or zstd) decoder as httpx2 would install it: its whole output in one piece, 48 MiB from
    any input (what a brotli bomb inflates to); ``calls`` counts how often it was asked."""

    calls = 0

    def decode(self, data: bytes):
        type(self).calls += 1
        yield b"a" * (48 << 20)

    def flush(self):
        yield from ()


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, br", "x-gzip"])
def test_only_gzip_and_deflate_are_asked_for_and_a_reply_in_another_encoding_is_never_decoded(encoding, monkeypatch, tmp_path):
    """Issue 48, 4 (brotli): httpx2 offers and decodes ``br`` and ``zstd`` once ``brotli`` or ``zstandard`` is installed,
    with decoders the reply's bound does not govern. Both are simulated here (installed or not on this machine): every
    request accepts gzip and deflate only, and a reply sent in another encoding is a malformed reply in one line, none
    of it decoded (the decoder is never called) and nothing stored; an honest reply is an answer."""
    import httpx2._client
    import httpx2._decoders

    import craftmd.models.body  # noqa: F401 - the SDK and the bounded client

    monkeypatch.setattr(httpx2._client, "ACCEPT_ENCODING", "gzip, deflate, br, zstd")  # as with brotli and zstandard
    _Unbounded.calls = 0
    for name in ("br", "zstd", "x-gzip"):
        monkeypatch.setitem(httpx2._decoders.SUPPORTED_DECODERS, name, _Unbounded)
    with RawServer(ok(completion("psoriasis"))) as server:
        c = ask(server.base_url)
        accepted = {h.get("accept-encoding") for h in server.headers}
    assert c.status == "ok" and c.text == "psoriasis", c
    assert accepted == {"gzip, deflate"}, accepted

    with RawServer(ok(completion("psoriasis"), {"content-encoding": encoding})) as server:
        c, peak = _peak(lambda: ask(server.base_url, tmp_path / "c.sqlite"))
    assert c.status == "error" and c.text is None and c.reason == MALFORMED, c
    assert "\n" not in c.error and "which the request did not accept (gzip, deflate); not read" in c.error, c.error
    assert _Unbounded.calls == 0 and peak < 16 << 20, (_Unbounded.calls, peak)
    assert "psoriasis" not in (tmp_path / "c.sqlite").read_bytes().decode("latin-1")  # nothing of it stored

    with RawServer(ok(completion()), get=lambda path: (200, {"content-encoding": encoding}, b'{"data": []}')) as server:
        with pytest.raises(CraftMDError) as e:
            check_model(server.base_url)
    assert "/v1/models: the reply's body was sent" in str(e.value) and "\n" not in str(e.value)
