"""A real OpenAI-compatible HTTP server on 127.0.0.1 for offline tests and benchmarks.

``LoopbackServer(responder)`` serves ``POST /v1/chat/completions`` and ``GET /v1/models``
from a background thread (stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive), so the
real ``openai`` client talks to it exactly as it talks to a hosted API or a vLLM server.

- ``responder(request_json) -> str | None`` writes the assistant's text; ``None`` answers
  with a content-filter block (``finish_reason="content_filter"``, no content). An
  exception in the responder answers HTTP 400 with its message (not retried).
- Faults, drawn from a seeded RNG: ``error_rate`` of requests fail as one of
  ``error_kinds`` (``429``, ``500``, ``timeout`` = answer after ``timeout_delay`` s,
  later than the client waits, ``drop`` = close the connection without answering);
  ``slow_rate`` of the rest are delayed by ``slow_delay`` s. Every request waits
  ``latency`` s.
- Counters: ``calls`` (chat requests received), ``served`` (answered 200), ``faults``
  (by kind), ``max_in_flight``, ``log`` (every request answered 200, in order).
- Bounded: the server stops by itself after ``max_seconds``, and when the ``with``
  block ends.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def count_tokens(text: str) -> int:
    """A stand-in tokenizer: whitespace-separated words."""
    return len(text.split())


class LoopbackServer:
    def __init__(
        self,
        responder: Callable[[dict], str | None],
        *,
        models: tuple[str, ...] = ("loopback",),
        latency: float = 0.0,
        error_rate: float = 0.0,
        error_kinds: tuple[str, ...] = ("429", "500", "timeout", "drop"),
        timeout_delay: float = 1.0,
        slow_rate: float = 0.0,
        slow_delay: float = 0.3,
        seed: int = 0,
        max_seconds: float = 600.0,
    ):
        unknown = set(error_kinds) - {"429", "500", "timeout", "drop"}
        if unknown:
            raise ValueError(f"unknown error kinds {sorted(unknown)}")
        self.responder = responder
        self.models = tuple(models)
        self.latency = latency
        self.error_rate = error_rate
        self.error_kinds = tuple(error_kinds)
        self.timeout_delay = timeout_delay
        self.slow_rate = slow_rate
        self.slow_delay = slow_delay
        self.max_seconds = max_seconds
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.calls = 0
        self.served = 0
        self.faults: Counter = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.log: list[dict] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> LoopbackServer:
        handler = type("Handler", (_Handler,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.max_seconds, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reset_counters(self) -> None:
        with self._lock:
            self.calls = self.served = self.max_in_flight = 0
            self.faults.clear()
            self.log.clear()

    # --- one request ------------------------------------------------------------------
    def _draw(self) -> tuple[str | None, float]:
        with self._lock:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            fault = self._rng.choice(self.error_kinds) if self._rng.random() < self.error_rate else None
            slow = self.slow_delay if fault is None and self._rng.random() < self.slow_rate else 0.0
            if fault:
                self.faults[fault] += 1
            elif slow:
                self.faults["slow"] += 1
        return fault, slow

    def _done(self, request: dict | None) -> None:
        with self._lock:
            self.in_flight -= 1
            if request is not None:
                self.served += 1
                self.log.append(request)

    def completion(self, request: dict) -> dict:
        text = self.responder(request)
        prompt = sum(count_tokens(_text(m.get("content"))) for m in request.get("messages", []))
        if text is None:
            message, finish, out = {"role": "assistant", "content": None, "refusal": None}, "content_filter", 0
        else:
            message, finish, out = {"role": "assistant", "content": text, "refusal": None}, "stop", count_tokens(text)
        return {
            "id": f"chatcmpl-loopback-{self.calls}",
            "object": "chat.completion",
            "created": 0,
            "model": request.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out},
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: LoopbackServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        self._send(status, {"error": {"message": message, "type": "loopback", "code": code}})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "loopback"} for m in self.owner.models]
            self._send(200, {"object": "list", "data": data})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}")
            return
        owner = self.owner
        fault, slow = owner._draw()
        answered = None
        try:
            if owner.latency or slow:
                time.sleep(owner.latency + slow)
            if fault == "429":
                self._error(429, "rate limited (injected)", "rate_limit_exceeded")
            elif fault == "500":
                self._error(500, "server error (injected)")
            elif fault == "drop":
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            elif fault == "timeout":
                time.sleep(owner.timeout_delay)
                self._error(504, "too late (injected timeout)")
            else:
                try:
                    request = json.loads(body)
                except json.JSONDecodeError:
                    self._error(400, "body is not JSON")
                    return
                if request.get("model") not in owner.models:
                    self._error(404, f"model {request.get('model')!r} not served", "model_not_found")
                    return
                try:
                    reply = owner.completion(request)
                except Exception as exc:  # the responder could not answer this request
                    self._error(400, f"responder: {type(exc).__name__}: {exc}")
                    return
                self._send(200, reply)
                answered = request
        finally:
            owner._done(answered)
