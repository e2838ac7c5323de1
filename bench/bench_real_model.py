"""The real model's speed: SmolLM2-135M-Instruct on llama.cpp's OpenAI-compatible server (``make llm``).

Starts the server (tests/realmodel.py), builds the dataset, and runs ``craftmd generate``'s
engine over the shortest few cases with a fresh cache: the vignette and multi-turn settings,
4-choice MCQ and free response, two doctor turns, 48 tokens per reply. Prints the calls and
tokens per second the server sustains (it answers one request at a time) and the time the
server took to start.

    .venv/bin/python bench/bench_real_model.py [--cases 2] [--max-tokens 48] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from realmodel import ALIAS, MissingModel, RealModelServer  # noqa: E402

from craftmd.generation.runner import GenerateSpec, generate  # noqa: E402


def shortest_cases(dataset: Path, n: int) -> list[str]:
    import polars as pl

    df = pl.read_parquet(dataset / "all" / "test-00000-of-00001.parquet").filter(pl.col("choices").list.len() == 4)
    return (
        df.sort(pl.col("vignette").str.len_chars(), "case_id")
        .filter(pl.col("vignette").str.len_chars() > 0)["case_id"]
        .head(n)
        .to_list()
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument(
        "--threads", type=int, default=None, help="llama.cpp threads (default: half the cores, llama.cpp's own default)"
    )
    a = ap.parse_args()
    from craftmd.dataset_builder.build import build_dataset
    from craftmd.source import Source

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_dataset(Source(), tmp / "data", progress=False)
        cases = shortest_cases(tmp / "data", a.cases)
        try:
            server = RealModelServer(threads=a.threads)
        except MissingModel as exc:
            print(f"bench_real_model: {exc}", file=sys.stderr)
            return 1
        t0 = time.monotonic()
        with server:  # one server, stopped whatever happens
            started = time.monotonic() - t0
            report = generate(
                GenerateSpec(
                    dataset=tmp / "data",
                    out=tmp / "rel",
                    doctor=f"openai/{ALIAS}",
                    patient=f"openai/{ALIAS}",
                    cases=cases,
                    experiments=["vignette", "multiturn", "mcq4", "frq"],
                    options={"max_turns": 2},
                    max_tokens=a.max_tokens,
                    base_url=server.base_url,
                    api_key="EMPTY",
                    cache=tmp / "cache.sqlite",
                    concurrency=a.concurrency,
                    progress=False,
                )
            )
            received = server.chat_requests()
    c, wall = report.counts, report.wall_s
    assert received == c.calls, (received, c.calls)
    print(f"model                 SmolLM2-135M-Instruct (Q4_1 GGUF), llama.cpp server, {server.threads} threads, n_ctx 8192")
    print(f"server start          {started:.1f} s")
    print(f"work                  {len(cases)} cases, vignette+multiturn x mcq4+frq, 2 doctor turns, max_tokens {a.max_tokens}")
    print(f"calls                 {c.calls} sent ({c.deduplicated} deduplicated, {c.failures} failed) in {wall:.1f} s")
    print(f"calls/s               {c.calls / wall:.2f}")
    print(
        f"tokens/s              {c.tokens_out / wall:.1f} generated, {(c.tokens_in + c.tokens_out) / wall:.0f} prompt+generated "
        f"({c.tokens_in:,} in, {c.tokens_out:,} out)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
