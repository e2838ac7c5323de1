"""Scaling out: conversations per second over a pool of K servers, and a real model's pool against one bigger server.

Part 1, pools: K = 1, 2, 4, 8 loopback servers that each answer one request at a time after 100 ms, as one
pool (``POOL_BASE_URL`` lists them, each server's client limit 1). The work: ``--per-server`` conversations
per server (CRAFT-MD's multi-turn setting with its free-response question; the stand-in doctor asks four
questions, then answers: 9 calls in a chain per conversation). Prints conversations/s, the speed-up over one
server (goal: at least 0.9 x K) and each server's busy share (time with a request in flight over its span
from first request to last answer).

Part 2, a real model (needs ``make llm``): the same cases (the shortest few) on two llama.cpp servers of
SmolLM2 with one thread each, as a pool, against one server with two threads; the two set-ups take turns
(``--real-rounds``, ABBA order) so that the machine's changing load falls on both. Prints the throughput ratio
and each pool server's busy share (goal: at least 95 % busy while work remains).

    .venv/bin/python bench/bench_scale.py [--ks 1,2,4,8] [--per-server 12] [--latency 0.1] [--real-cases 4] [--no-real]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from loopback import LoopbackServer, Replay, pick_upstream, write_replay_dataset  # noqa: E402

from craftmd.generation.runner import GenerateSpec, runner  # noqa: E402
from craftmd.source import Source  # noqa: E402


def run_pool(dataset: Path, tmp: Path, urls: list[str], cases: list[str], trials: int, name: str, model: str = "m", **kw):
    """One generation over the pool ``urls`` (a fresh cache); returns (report, the pool's members or None)."""
    os.environ["POOL_BASE_URL"] = ",".join(urls)
    try:
        engine = runner(
            GenerateSpec(
                dataset=dataset,
                out=tmp / name,
                doctor=f"openai-api/pool/{model}",
                patient=f"openai-api/pool/{model}",
                cases=cases,
                trials=trials,
                cache=tmp / f"{name}.sqlite",
                progress=False,
                **kw,
            )
        )
        report = engine.run()
    finally:
        del os.environ["POOL_BASE_URL"]
    pool = getattr(engine.callers[f"openai-api/pool/{model}"].model, "pool", None)
    return report, (pool.members if pool is not None else None)


def busy(members) -> str:
    return " ".join(f"{m.busy_share:.1%}" for m in members) if members else "(one server: not a pool)"


def pools(a, source: Source, tmp: Path) -> None:
    ks = [int(k) for k in a.ks.split(",")]
    picked = pick_upstream(source, a.per_server, seed=5)
    write_replay_dataset(picked, tmp / "data")
    cases = sorted(picked["text"])
    responder = Replay({})  # the stand-in for every case: the same short interview, so conversations are alike
    print(
        f"== pools: K loopback servers, each one request at a time, {a.latency * 1000:.0f} ms per request; "
        f"{a.per_server} conversations per server (multiturn + frq: 9 calls in a chain each)"
    )
    print(
        f"{'K':>3} {'conversations':>13} {'calls':>6} {'wall s':>7} {'conv/s':>7} {'speed-up':>9} {'goal':>6}  busy share per server"
    )
    with LoopbackServer(responder, models=("m",)) as warm:  # imports, first connections: not part of any figure
        run_pool(tmp / "data", tmp, [warm.base_url], cases[:2], 1, "warm-up", experiments=["multiturn", "frq"])
    base = None
    for i, k in enumerate(ks):
        servers = [LoopbackServer(responder, models=("m",), latency=a.latency, max_concurrent=1).start() for _ in range(k)]
        try:
            report, members = run_pool(
                tmp / "data",
                tmp,
                [s.base_url for s in servers],
                cases,
                k,
                f"pool{i}-{k}",
                experiments=["multiturn", "frq"],
                server_concurrency={"pool": 1},
            )
        finally:
            for s in servers:
                s.stop()
        assert report.failures == 0, report.summary()
        rate = report.conversations / report.wall_s
        base = base or rate / k
        print(
            f"{k:>3} {report.conversations:>13} {report.calls:>6} {report.wall_s:>7.2f} {rate:>7.2f} {rate / base:>8.2f}x "
            f"{'ok' if rate / base >= 0.9 * k else 'MISS':>6}  {busy(members)}"
        )


def real(a, source: Source, tmp: Path) -> int:
    from realmodel import ALIAS, MissingModel, RealModelServer

    picked = pick_upstream(source, 100, seed=5)  # the shortest few: the small model on a small machine
    short = sorted(picked["text"], key=lambda c: (len(picked["text"][c]["case_vignette"]), c))[: a.real_cases]
    picked = {**picked, "text": {c: picked["text"][c] for c in short}}
    write_replay_dataset(picked, tmp / "real")
    cases = sorted(picked["text"])
    work = dict(experiments=["multiturn", "mcq4"], options={"max_turns": 2}, max_tokens=a.max_tokens, temperature=0.0)
    try:
        one, two = RealModelServer(threads=2), [RealModelServer(threads=1) for _ in range(2)]
    except MissingModel as exc:
        print(f"bench_scale: real model skipped: {exc}", file=sys.stderr)
        return 0
    print(
        f"== a real model: SmolLM2-135M-Instruct on llama.cpp, {len(cases)} cases x {a.real_trials} trials, multiturn + mcq4, "
        f"2 doctor turns, max_tokens {a.max_tokens}, temperature 0"
    )
    # All three servers run side by side; the two set-ups take turns (ABBA...), so a change in the machine's
    # load falls on both alike.
    with one, two[0], two[1]:
        setups = {"one server, 2 threads": [one.base_url], "pool of 2, 1 thread each": [s.base_url for s in two]}
        order = [label for i in range(a.real_rounds) for label in (list(setups) if i % 2 == 0 else list(setups)[::-1])]
        results: dict[str, list] = {label: [] for label in setups}
        for i, label in enumerate(order):
            results[label].append(
                run_pool(
                    tmp / "real",
                    tmp,
                    setups[label],
                    cases,
                    a.real_trials,
                    f"real{i}",
                    server_concurrency={"pool": 1},
                    model=ALIAS,
                    **work,
                )
            )
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    rates = {}
    for label, runs in results.items():
        for report, _ in runs:
            assert report.failures == 0, report.summary()
        calls, wall = sum(r.calls for r, _ in runs), sum(r.wall_s for r, _ in runs)
        rates[label] = calls / wall
        shares = " | ".join(busy(m) for _, m in runs)
        print(
            f"{label:<26} {calls:>4} calls in {wall:6.1f} s ({len(runs)} rounds): {rates[label]:.2f} calls/s, "
            f"{sum(r.counts.tokens_out for r, _ in runs) / wall:.1f} tokens out/s; busy per round {shares}"
        )
    first, second = rates.values()
    print(f"throughput ratio (pool / one server)  {second / first:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--per-server", type=int, default=12)
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--real-cases", type=int, default=2)
    ap.add_argument("--real-trials", type=int, default=2)
    ap.add_argument("--real-rounds", type=int, default=2, help="turns each set-up takes (ABBA order)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--no-pools", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped from outside: the servers still stop (their with blocks)
    source = Source()
    with tempfile.TemporaryDirectory() as tmp:
        if not a.no_pools:
            pools(a, source, Path(tmp))
        if not a.no_real:
            return real(a, source, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
