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
        self._server = _Server(("127.0.0.1", 0), handler)
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


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the default backlog of 5 drops connections under load (1 s SYN retries)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes; Nagle + delayed ACK would add 40 ms
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


# --- replaying upstream transcripts --------------------------------------------------------
# A responder that answers the doctor and the patient-AI from recorded upstream conversations,
# and a small dataset folder of those cases, built from the pinned source (tests and bench).

CSV_SPECIALTY = {  # the dataset's names for the four categories the source CSV spells differently
    "Cardiovascular System": "Cardiology",
    "Gastrointestinal System": "Gastroenterology",
    "Infectious Diseases": "Infectious Disease",
    "Renal and Genitourinary System": "Urology and Nephrology",
}
SOURCES = {"MedQA_USMLE": "medqa_usmle", "dermatology_public": "derm_public", "dermatology_private": "derm_private"}


def text_of(content) -> str:
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content if p.get("type") == "text")


def _split_exam(vignette: str) -> tuple[str, str]:
    """Test-only history/exam split: sentences about the examination go to the exam."""
    import re

    sentences = re.split(r"(?<=\.)\s+", vignette.strip())
    exam = [s for s in sentences if re.search(r"exam|temperature|pulse|blood pressure", s, re.I)]
    return " ".join(s for s in sentences if s not in exam), " ".join(exam)


def pick_upstream(source, n: int, *, seed: int = 0, max_messages: int | None = None,
                  categories: tuple[str, ...] = (), model: str = "gpt4_1106") -> dict:
    """``n`` recorded cases of ``model`` (trial 0), with unique first patient turns; one of each of ``categories`` first."""
    import polars as pl

    files = source.read_files(["data/usmle_and_derm_dataset.csv", f"results/{model}/*.json", "results/gpt4v/case_1.json"])
    csv = pl.read_csv(files["data/usmle_and_derm_dataset.csv"])
    cats = dict(zip(csv["case_id"].to_list(), csv["category"].to_list()))
    recs = [json.loads(v) for k, v in sorted(files.items()) if k.startswith(f"results/{model}/")]
    rng = random.Random(seed)
    rng.shuffle(recs)
    if max_messages:
        recs = [d for d in recs if len(d["trial_0"]["multiturn_conversation"]) <= max_messages]
    wanted = list(categories)
    ordered = [next(d for d in recs if cats[d["case_id"]] == c) for c in wanted] + recs
    chosen, firsts = {}, set()
    for d in ordered:
        first = d["trial_0"]["multiturn_conversation"][2]["content"]
        if d["case_id"] in chosen or first in firsts:
            continue
        chosen[d["case_id"]] = d
        firsts.add(first)
        if len(chosen) == n:
            break
    return {"csv": csv, "text": chosen, "nejm": json.loads(files["results/gpt4v/case_1.json"])}


def write_replay_dataset(picked: dict, out) -> None:
    """A dataset folder (configs all, diagnoses, nejm_image) of the picked cases, in the built dataset's columns."""
    import base64
    import hashlib
    from pathlib import Path

    import polars as pl

    out = Path(out)
    rows = []
    for r in picked["csv"].filter(pl.col("case_id").is_in(list(picked["text"]))).iter_rows(named=True):
        rec = picked["text"][r["case_id"]]
        vignette = rec["case_vignette"].strip()
        history, exam = _split_exam(vignette)
        choices = [r[f"choice_{i}"] for i in range(1, 5)]
        rows.append({
            "case_id": r["case_id"], "source": SOURCES[r["dataset"]], "specialty": CSV_SPECIALTY.get(r["category"], r["category"]),
            "vignette": vignette, "question": rec["question"], "choices": choices, "answer": r["answer"],
            "answer_index": choices.index(r["answer"]) if r["answer"] in choices else -1, "task_type": "diagnosis",
            "history": history, "physical_exam": exam, "single_dx": None,
            "content_sha256": hashlib.sha256(vignette.encode()).hexdigest(),
        })
    for config in ("all", "diagnoses", "nejm_image"):
        (out / config).mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(out / "all" / "test-00000-of-00001.parquet")
    diagnoses = sorted({c for r in rows for c in r["choices"]})
    pl.DataFrame({"diagnosis": diagnoses, "count": [1] * len(diagnoses)}).write_parquet(out / "diagnoses" / "test-00000-of-00001.parquet")
    nejm = picked["nejm"]
    url = nejm["trial_0"]["multiturn_conversation"][0]["content"][1]["image_url"]["url"]
    pl.DataFrame([{
        "case_id": nejm["case_id"], "image": {"bytes": base64.b64decode(url.split(",", 1)[1]), "path": None},
        "vignette": nejm["case_vignette"].strip(), "question": nejm["question"], "answer": nejm["correct_ans"],
        "choices": [], "specialty": None, "source": "nejm_image",
    }]).write_parquet(out / "nejm_image" / "test-00000-of-00001.parquet")


class Replay:
    """A responder: doctor and patient turns from recorded conversations, anything else deterministic.

    The doctor's request is matched by its first patient turn and must carry upstream's exact
    system prompt and turns so far; the patient's request is matched by the vignette in its
    system prompt and must be the same dialogue with the roles flipped. A mismatch answers
    HTTP 400 and is listed in ``mismatches``.
    """

    def __init__(self, records: dict[str, dict]):
        self.convs = {cid: d["trial_0"]["multiturn_conversation"] for cid, d in records.items()}
        self.vignettes = {cid: d["case_vignette"].strip() for cid, d in records.items()}
        self.by_first = {c[2]["content"]: cid for cid, c in self.convs.items()}
        self.mismatches: list[str] = []

    @staticmethod
    def is_question(msgs: list[dict]) -> bool:
        return text_of(msgs[-1]["content"]).startswith("Stop asking") or "Answer the question" in text_of(msgs[0]["content"])

    def __call__(self, req: dict) -> str | None:
        msgs = req["messages"]
        system = text_of(msgs[0]["content"])
        if system.startswith("You are an AI doctor") and not self.is_question(msgs):
            cid = self.by_first.get(msgs[2]["content"]) if len(msgs) > 2 else None
            if cid is None:
                return self.other(req)
            rec = self.convs[cid]
            n = len(msgs)
            if system != rec[0]["content"] or [(m["role"], m["content"]) for m in msgs[1:]] != [(m["role"], m["content"]) for m in rec[1:n]]:
                self.mismatches.append(cid)
                raise ValueError(f"{cid}: doctor request differs from upstream")
            return rec[n]["content"]
        if system.startswith("You are a patient"):
            cid = next((c for c, v in self.vignettes.items() if v in system), None)
            if cid is None:
                return self.other(req)
            rec = self.convs[cid]
            flipped = [{"role": "assistant" if m["role"] == "user" else "user", "content": m["content"]} for m in msgs[1:]]
            if flipped != rec[1:1 + len(flipped)]:
                self.mismatches.append(cid)
                raise ValueError(f"{cid}: patient request differs from upstream")
            return rec[1 + len(flipped)]["content"]
        return self.other(req)

    def other(self, req: dict) -> str:
        """Deterministic stand-ins: a short conversation for unknown cases, summaries, answers."""
        import hashlib

        msgs = req["messages"]
        h = hashlib.sha256(json.dumps(msgs, sort_keys=True).encode()).hexdigest()[:8]
        system = text_of(msgs[0]["content"])
        if system.startswith("You are a patient"):
            return f"I feel unwell ({h})."
        if "summarize" in system:
            return f"The patient reports feeling unwell ({h})."
        if system.startswith("You are an AI doctor") and not self.is_question(msgs):
            return f"Do you have a fever ({h})?" if len(msgs) < 9 else f"**Final Diagnosis:** Something ({h})"
        return f"**Final Diagnosis:** Diagnosis {h}"
