"""Generation speed: 100 cases against a loopback OpenAI-compatible server with 100 ms per call.

Runs ``craftmd generate``'s engine (every experiment, one trial) over 100 upstream cases
whose recorded GPT-4 conversations the server replays, then the same work the way
upstream ran it: seven blocking workers, each making one call at a time. Prints calls/s,
peak requests in flight, wall time, the floor (the longest chain of dependent calls in
any conversation × 100 ms: no schedule can beat it) and the speed-up over seven workers.
Goal: wall ≤ 1.5 × floor and ≥ 10 × faster than the seven workers.

It then runs the same work once more with the HTTP layer taken out (an in-process model
that answers from the same replay after the same latency): what is left is the engine's
own scheduling and bookkeeping, so the two walls say how much of the gap to the floor is
the engine and how much is the client's and the server's CPU per request.

    .venv/bin/python bench/bench_generation.py [--cases 100] [--latency 0.1] [--concurrency 512] [--processes N]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from loopback import LoopbackServer, Replay, pick_upstream, write_replay_dataset  # noqa: E402

from craftmd.models import connect as connect_module  # noqa: E402
from craftmd.generation.runner import GenerateSpec, generate  # noqa: E402
from craftmd.models.base import ChatModel, Completion  # noqa: E402
from craftmd.release import read_release  # noqa: E402
from craftmd.source import Source  # noqa: E402


def chain_length(release: Path) -> int:
    """The longest chain of dependent calls: a conversation's turns, then its summary and one question."""
    longest = 0
    for c in read_release(release).table("conversations").to_pylist():
        dialogue = c["messages"][1:]
        patient_calls = sum(m["role"] == "user" for m in dialogue)
        doctor_calls = c["n_turns"] - 1  # the opening is not a call
        after = 2 if c["conversation"] == "standard" else 1  # summary + question, or the question
        longest = max(longest, patient_calls + doctor_calls + after)
    return longest


class ServerProcess:
    """The loopback server in a child process (as a real server is): its threads do not share our GIL."""

    def __init__(self, responder, **options):
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=self._serve, args=(child, responder, options), daemon=True)

    @staticmethod
    def _serve(conn, responder, options) -> None:
        with LoopbackServer(responder, **options) as server:
            conn.send(server.base_url)
            while True:
                cmd = conn.recv()
                if cmd == "stop":
                    return
                ru = resource.getrusage(resource.RUSAGE_SELF)
                conn.send(
                    {
                        "calls": server.calls,
                        "served": server.served,
                        "max_in_flight": server.max_in_flight,
                        "mismatches": list(getattr(responder, "mismatches", [])),
                        "cpu": ru.ru_utime + ru.ru_stime,
                    }
                )
                if cmd == "reset":
                    server.reset_counters()

    def __enter__(self) -> ServerProcess:
        self._proc.start()
        self.base_url = self._conn.recv()
        return self

    def stats(self, reset: bool = False) -> dict:
        """Counters so far (then zeroed when ``reset``)."""
        self._conn.send("reset" if reset else "stats")
        return self._conn.recv()

    def __exit__(self, *exc) -> None:
        self._conn.send("stop")
        self._proc.join(5)


class InProcess(ChatModel):
    """The replay as a model in this process: same answers, same latency, no HTTP."""

    provider = "openai"  # the same cache keys and manifest as the HTTP run

    def __init__(self, model: str, responder, latency: float):
        super().__init__(model)
        self.responder, self.latency = responder, latency

    async def check(self) -> None:
        pass

    async def chat(self, messages, sampling) -> Completion:
        await asyncio.sleep(self.latency)
        text = self.responder({"model": self.model, "messages": messages})
        return Completion(text, "ok", "stop") if text is not None else Completion(None, "refusal", "content_filter")


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (the engine's worker processes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--latency", type=float, default=0.1, help="seconds per call at the server")
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument(
        "--processes", type=int, default=min(8, os.cpu_count() or 1), help="engine worker processes (default: cores, at most 8)"
    )
    ap.add_argument("--workers", type=int, default=7, help="blocking workers of the baseline (upstream ran 7)")
    ap.add_argument("--skip-baseline", action="store_true", help="estimate the baseline instead of running it")
    a = ap.parse_args()

    picked = pick_upstream(Source(), a.cases, seed=0)
    ids = sorted(picked["text"])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_replay_dataset(picked, tmp / "data")
        replay = Replay(picked["text"])

        def spec(out, cache, cases, concurrency, processes=1):
            return GenerateSpec(
                dataset=tmp / "data",
                out=out,
                doctor="openai/loopback",
                patient="openai/loopback",
                base_url=server.base_url,
                cache=cache,
                cases=cases,
                trials=1,
                concurrency=concurrency,
                workers=processes,
                progress=False,
                timeout=60,
            )

        with ServerProcess(replay, latency=a.latency, max_seconds=1800) as server:
            server_cpu0 = server.stats()["cpu"]
            t, cpu0 = time.perf_counter(), _cpu()
            report = generate(spec(tmp / "engine", tmp / "engine.sqlite", ids, a.concurrency, a.processes))
            wall, cpu = time.perf_counter() - t, _cpu() - cpu0
            st = server.stats(reset=True)
            peak_server, server_cpu = st["max_in_flight"], st["cpu"] - server_cpu0
            assert not st["mismatches"] and st["served"] == report.calls, st
            floor = chain_length(report.path) * a.latency
            calls = report.calls

            # The engine alone: the same run with the HTTP layer replaced by an in-process model.
            real_get_model = connect_module.get_model
            connect_module.get_model = lambda name, **_: InProcess(name.split("/", 1)[1], replay, a.latency)
            try:
                t, cpu0 = time.perf_counter(), _cpu()
                alone = generate(spec(tmp / "alone", tmp / "alone.sqlite", ids, a.concurrency, a.processes))
                alone_wall, alone_cpu = time.perf_counter() - t, _cpu() - cpu0
            finally:
                connect_module.get_model = real_get_model
            assert alone.calls == calls, (alone.calls, calls)
            same = read_release(alone.path).table("answers").equals(read_release(report.path).table("answers"))

            if a.skip_baseline:
                base_wall, how = calls * a.latency / a.workers, "estimated: calls × latency / workers"
            else:
                # Upstream's set-up: each worker takes its share of the cases and makes one call at a time.
                shares = [ids[i :: a.workers] for i in range(a.workers)]
                errors: list[BaseException] = []

                def worker(i: int) -> None:
                    try:
                        generate(spec(tmp / f"w{i}", tmp / f"w{i}.sqlite", shares[i], 1))
                    except BaseException as exc:  # noqa: BLE001
                        errors.append(exc)

                t = time.perf_counter()
                threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.workers) if shares[i]]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                base_wall, how = time.perf_counter() - t, f"measured, {server.stats()['served']} calls"
                if errors:
                    raise errors[0]

    print(f"cases                 {len(ids)} (every experiment, 1 trial), {a.latency * 1000:.0f} ms per call")
    print(f"calls                 {calls}  ({report.conversations} conversations, {report.answers} answers)")
    print(
        f"wall                  {wall:.2f} s  ({a.processes} engine processes, concurrency {a.concurrency}, {os.cpu_count()} cores)"
    )
    print(f"calls/s               {calls / wall:.0f}")
    print(
        f"client CPU            {cpu:.1f} s = {cpu / calls * 1000:.1f} ms per call (engine processes; bounds wall at CPU / cores)"
    )
    print(
        f"server CPU            {server_cpu:.1f} s = {server_cpu / calls * 1000:.1f} ms per call (the loopback server's process, same cores)"
    )
    print(f"peak in flight        {report.peak_in_flight} (client), {peak_server} (server)")
    print(
        f"floor                 {floor:.2f} s  (longest chain {chain_length_str(floor, a.latency)} calls × {a.latency * 1000:.0f} ms)"
    )
    print(f"wall / floor          {wall / floor:.2f}   (goal ≤ 1.5)")
    print(
        f"engine alone          {alone_wall:.2f} s = {alone_wall / floor:.2f} × floor, {alone_cpu / calls * 1000:.2f} ms CPU per call "
        f"(in-process model, no HTTP; same answers: {same})"
    )
    print(
        f"HTTP per call         {(cpu - alone_cpu) / calls * 1000:.2f} ms client + {server_cpu / calls * 1000:.2f} ms server CPU "
        f"on {os.cpu_count()} cores: at least {(cpu + server_cpu) / (os.cpu_count() or 1):.1f} s of wall for this run"
    )
    print(f"{a.workers} blocking workers    {base_wall:.1f} s  ({how})")
    print(f"speed-up              {base_wall / wall:.1f}×  (goal ≥ 10×)")
    ok = wall <= 1.5 * floor and base_wall / wall >= 10
    print("goal                  " + ("met" if ok else "NOT met"))
    return 0


def chain_length_str(floor: float, latency: float) -> str:
    return str(round(floor / latency))


if __name__ == "__main__":
    sys.exit(main())
