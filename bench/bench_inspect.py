"""Inspect logs in and out of releases: export of a whole upstream release, ingest of a 1,000-sample log.

1. ``craftmd export RELEASE --inspect DIR`` over one upstream model's whole release (out/releases/gpt4_1106
   from ``make leaderboard``; else ingested here from the pinned source). Goal: under a minute.
2. ``craftmd ingest --inspect LOG`` of a log of ``inspect eval craftmd/craftmd`` with 1,000 samples: two cases
   are run through ``inspect eval`` against a loopback server replaying recorded conversations (events and
   all), and their samples copied under 1,000 distinct case ids into one log. Goal: under 10 s.

Prints wall and CPU seconds of each (the CPU time says what the machine's other load does not).

    .venv/bin/python bench/bench_inspect.py [--release out/releases/gpt4_1106] [--samples 1000]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from loopback import LoopbackServer, Replay, pick_upstream, write_replay_dataset  # noqa: E402

from craftmd.source import Source, default_location  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def timed(what: str, fn):
    t, c = time.perf_counter(), cpu()
    out = fn()
    print(f"{what:<44} wall {time.perf_counter() - t:7.1f} s   cpu {cpu() - c:7.1f} s")
    return out


def upstream_release(path: Path | None, tmp: Path) -> Path:
    if path and (path / "manifest.json").exists():
        return path
    from craftmd.commands.ingest import ingest_source

    print("no release given: ingesting gpt4_1106 from the pinned source")
    return ingest_source(None, None, tmp / "releases", models=["gpt4_1106"], progress=False)[0]


def log_of(n: int, tmp: Path) -> Path:
    """A log of ``inspect eval craftmd/craftmd`` holding ``n`` samples (two real ones, copied under new case ids)."""
    from inspect_ai.log import read_eval_log, write_eval_log

    src = Source(default_location())
    up = pick_upstream(src, 2, seed=3, max_messages=12)
    data = tmp / "data"
    write_replay_dataset(up, data)
    import polars as pl

    f = data / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer")).write_parquet(f)
    with LoopbackServer(Replay(up["text"]), models=("doc", "pat")) as loop:
        env = dict(os.environ, LOOP_BASE_URL=loop.base_url, LOOP_API_KEY="k")
        subprocess.run(
            [
                str(Path(sys.executable).with_name("inspect")),
                "eval",
                "craftmd/craftmd",
                "--model",
                "openai-api/loop/doc",
                "--model-role",
                "patient=openai-api/loop/pat",
                "-T",
                f"dataset={data}",
                "-T",
                f"cases={','.join(up['text'])}",
                "-T",
                "experiments=multiturn,summarized,mcq4,frq",
                "--log-dir",
                str(tmp / "logs"),
                "--display",
                "none",
            ],
            env=env,
            cwd=tmp,
            check=True,
            capture_output=True,
        )
    log = read_eval_log(str(next((tmp / "logs").glob("*.eval"))))
    base = list(log.samples)
    samples = []
    for i in range(n):
        s = base[i % len(base)].model_copy(deep=True)
        cid = f"{s.metadata['case_id']}_{i}"
        s.id, s.metadata["case_id"] = cid, cid
        for rows in s.store["craftmd"].values():
            for r in rows:
                r["case_id"] = cid
        for sc in s.scores.values():
            for r in sc.metadata["craftmd"]["rows"]:
                r["case_id"] = cid
        samples.append(s)
    log.samples = samples
    out = tmp / f"craftmd-{n}.eval"
    write_eval_log(log, str(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", type=Path, default=ROOT / "out" / "releases" / "gpt4_1106")
    ap.add_argument("--samples", type=int, default=1000)
    args = ap.parse_args()
    from craftmd.inspect_bridge.logs import export_release, ingest_logs
    from craftmd.release import read_release

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        release = upstream_release(args.release, tmp)
        m = read_release(release).manifest
        print(
            f"release {m.release}: {m.files['conversations.parquet']['rows']:,} conversations, {m.files['answers.parquet']['rows']:,} answers"
        )
        logs = timed("export the whole release (goal < 60 s)", lambda: export_release(release, tmp / "export", progress=False))
        size = sum(p.stat().st_size for p in logs)
        print(f"  {len(logs)} logs, {size / 1e6:.0f} MB")
        log = log_of(args.samples, tmp)
        timed(f"ingest a log of {args.samples:,} samples (goal < 10 s)", lambda: ingest_logs([log], tmp / "ingested"))


if __name__ == "__main__":
    main()
