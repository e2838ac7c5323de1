"""GRPO in the CRAFT-MD environment, small: SmolLM2-135M trained for a few steps on a CPU, then run on the benchmark.

The issue's RL run (#45), at a size the 2-core development machine runs; it measures the machinery, not learning:

1. The dataset (``--dataset``, else ``craftmd build`` into a temporary folder); the environment's training split is its
   ``craftmd_train`` config (MedQA items posed as CRAFT-MD vignettes, none of them a benchmark case).
2. The patient: SmolLM2 on llama.cpp (``make llm``), at temperature 0, so that an episode's patient replies depend on the
   doctor's messages alone (a held-out case played after training is its next trial, whose sampling seed differs).
3. The environment: ``python -m craftmd.envs.serve craftmd --split train`` in ``.venv-rl`` (``make rl``), rewarded
   with the environment's own weights (the offline grader's ``correct``) unless ``--reward-weights`` says otherwise.
4. ``generation/grpo_train.py --cpu`` in ``.venv-train`` (``make train-env``) from SmolLM2's GGUF file: ``--steps``
   steps, each a group of ``--num-generations`` episodes of one of the split's first ``--train-cases`` cases; the next
   ``--held-out`` cases are played before and after the training with the same sampling seed and never trained on.
5. The held-out reward before and after (the mean of each case's episodes), each with its 95% case-bootstrap CI, and the
   paired difference after − before with its CI (2,000 resamples of the package's draw).
6. The trained checkpoint, served by ``transformers serve``, as the doctor of ``--bench-cases`` benchmark cases (MedQA
   cases of the ``all`` config with four choices, shuffled with ``--seed``): ``craftmd generate --task craftmd
   --experiments multiturn,frq,mcq4`` (the environment's conversation, then the free-response and the 4-choice
   question), greedy (temperature 0, every role), then ``craftmd score --scorer offline --scorer paper``: the accuracy
   of each format with its CI.

Every process it starts (the model server, the environment server, the training run, the checkpoint's server) runs
under the package's guard and is stopped when the bench ends, fails, is interrupted (Ctrl-C, SIGTERM, SIGHUP) or killed.
What it measured is written to ``--json`` (default ``out/bench/bench_grpo.json``), settings and timings included.

    .venv/bin/python bench/bench_grpo.py [--dataset DIR] [--steps 2] [--held-out 6] [--bench-cases 4] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_finetune import case_interval, common_arguments, craftmd, print_table, small_model, summarise, workspace  # noqa: E402
from envserver import EnvServer  # noqa: E402
from realmodel import ALIAS, RealModelServer  # noqa: E402

from craftmd.models.local_server import LocalServer, stopped_by_signals  # noqa: E402

GRPO = ROOT / "generation" / "grpo_train.py"
CHECKPOINT = "smollm2-grpo"  # the trained doctor's folder, and the name its server answers to
#: The benchmark's formats after the conversation, and the scorer whose ``correct`` grades each.
FORMATS = {"frq": "offline", "mcq4": "paper"}


class Training(LocalServer):
    """``grpo_train.py`` in the training env: a process group of its own under the package's guard (so it goes with the
    bench however the bench ends), its output (the trainer's log, then the run's summary) in ``log``."""

    stop_wait = 30.0

    def __init__(self, command: list[str], log: Path, env: dict):
        self.command, self.log, self.env, self.start_timeout = command, log, env, 60.0

    def start(self) -> Training:
        self.launch(self.command, lambda: True, what="grpo_train.py", error=RuntimeError, cwd=ROOT, env=self.env)
        return self

    def wait(self) -> int:
        return self.proc.wait()

    def error(self) -> str:
        """The run's one-line error (``grpo_train.py: error: ...``), else its log's last lines."""
        lines = self.log.read_text(errors="replace").splitlines()
        said = [ln for ln in lines if ln.startswith("grpo_train.py: error:")]
        return said[-1] if said else self.log_tail()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_grpo.py", description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, help="a built dataset with craftmd_train (default: build one in a temporary folder)")
    ap.add_argument("--steps", type=int, default=2, help="GRPO steps (default 2)")
    ap.add_argument("--train-cases", type=int, default=8, help="train on the split's first N cases (default 8)")
    ap.add_argument("--num-generations", type=int, default=2, help="episodes per case per step, GRPO's group (default 2)")
    ap.add_argument("--held-out", type=int, default=6, help="held-out training cases, before and after (default 6)")
    ap.add_argument("--eval-trials", type=int, default=1, help="episodes of each held-out case (default 1)")
    ap.add_argument("--bench-cases", type=int, default=4, help="benchmark cases the trained doctor runs (default 4)")
    ap.add_argument("--max-turns", type=int, default=2, help="doctor turns before the diagnosis question (default 2)")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per reply, doctor and patient (default 48)")
    ap.add_argument("--learning-rate", type=float, default=1e-5, help="GRPO's learning rate (default 1e-5)")
    ap.add_argument("--lora-r", type=int, default=16, help="LoRA rank; 0 trains every weight (default 16)")
    ap.add_argument(
        "--reward-weights",
        metavar="JSON",
        help='the environment\'s reward, {"scorer/metric": weight} (default its own: {"offline/correct": 1.0})',
    )
    common_arguments(ap)
    ap.set_defaults(json=ROOT / "out" / "bench" / "bench_grpo.json")
    a = ap.parse_args(argv)
    refuse = lambda why: ap.exit(2, f"bench_grpo.py: error: {why}\n")  # noqa: E731 (one line, exit 2)
    for name in ("steps", "train_cases", "held_out", "eval_trials", "bench_cases", "max_turns", "max_tokens"):
        if getattr(a, name) < 1:
            refuse(f"--{name.replace('_', '-')} must be at least 1")
    if a.num_generations < 2:
        refuse("--num-generations must be at least 2 (GRPO compares the episodes of a case)")
    if a.reward_weights is not None:
        try:
            a.reward_weights = json.loads(a.reward_weights)
        except ValueError as exc:
            refuse(f"--reward-weights is not JSON ({exc})")
        if not isinstance(a.reward_weights, dict):
            refuse('--reward-weights must be a JSON object, {"scorer/metric": weight}')
    if a.work is not None and a.work.exists():
        refuse(f"--work {a.work} already exists; choose a new folder")
    return a


def pick_bench_cases(data: Path, n: int, seed: int) -> list[str]:
    """``n`` MedQA cases of the ``all`` config with four choices, shuffled with ``seed`` (sorted by id first)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(data / "all" / "test-00000-of-00001.parquet", columns=["case_id", "source", "choices"]).to_pylist()
    ids = sorted(r["case_id"] for r in rows if r["source"] == "medqa_usmle" and len(r["choices"]) == 4)
    random.Random(seed).shuffle(ids)
    return ids[:n]


def held_out(record: dict) -> tuple[dict, dict, int]:
    """(before, after, unscored) from grpo_train's record: case -> {"reward": the mean of its scored episodes} per phase,
    and how many held-out episodes the environment could not score (left out of their case's mean)."""
    phases: dict[str, dict] = {"before": {}, "after": {}}
    unscored = 0
    for e in record["episodes"]:
        if e["phase"] in phases:
            if e["reward"] is None:
                unscored += 1
                continue
            phases[e["phase"]].setdefault(str(e["case"]), []).append(e["reward"])
    means = {p: {c: {"reward": sum(v) / len(v)} for c, v in cases.items()} for p, cases in phases.items()}
    return means["before"], means["after"], unscored


def groups_with_spread(record: dict) -> tuple[int, int]:
    """(groups whose episodes' rewards differ, groups): GRPO learns only from a group whose rewards are not all equal."""
    groups: dict[tuple, set] = {}
    for e in record["episodes"]:
        if e["phase"] == "train":
            groups.setdefault((e["step"], e["case"]), set()).add(e["reward"])
    return sum(len(r) > 1 for r in groups.values()), len(groups)


def bench_accuracy(rel: Path) -> tuple[list[dict], int]:
    """Per format: the trained doctor's accuracy over the cases (the mean of each case's trials) with its CI; and the
    answers not graded ``ok`` (a failed conversation or grade), which are left out and counted."""
    import polars as pl

    from craftmd.release import read_release

    scores = pl.from_arrow(read_release(rel).table("scores")).filter(
        (pl.col("setting") == "multiturn") & (pl.col("metric") == "correct")
    )
    rows, failed = [], 0
    for fmt, scorer in FORMATS.items():
        part = scores.filter((pl.col("format") == fmt) & (pl.col("scorer") == scorer))
        ok = part.filter((pl.col("status") == "ok") & pl.col("value").is_not_null())
        failed += part.height - ok.height
        per_case = ok.group_by("case_id").agg(pl.col("value").cast(pl.Float64).mean()).sort("case_id")
        values = per_case["value"].to_list()
        rows.append({"format": fmt, "scorer": scorer, "n": len(values), "accuracy": case_interval(values) if values else None})
    return rows, failed


def fmt(t) -> str:
    return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]" if t else "–"


def run(a: argparse.Namespace, gguf: Path, python: Path, tmp: Path):
    """The servers, the GRPO run and the benchmark run in ``tmp``: (grpo_train's record, the benchmark cases, their
    accuracy rows, the answers not graded, seconds per phase). Every server is stopped when it returns or raises."""
    from craftmd.generation.finetune import CheckpointServer

    seconds: dict[str, float] = {}
    clock = time.monotonic()
    data = a.dataset
    if data is None:
        from craftmd.dataset_builder.build import build_dataset
        from craftmd.source import Source

        data = tmp / "data"
        build_dataset(Source(), data, progress=False)
    seconds["dataset"] = time.monotonic() - clock
    cases = pick_bench_cases(data, a.bench_cases, a.seed)
    if len(cases) < a.bench_cases:
        raise SystemExit(f"bench_grpo: the dataset has {len(cases)} MedQA cases with four choices, not {a.bench_cases}")
    ckpt, cache = tmp / "ckpts" / CHECKPOINT, tmp / "cache.sqlite"
    ckpt.parent.mkdir()
    options = {
        "dataset": data,
        "patient": f"openai/{ALIAS}",
        "max_turns": a.max_turns,
        "max_tokens": a.max_tokens,
        "temperature": 0.0,
        "seed": a.seed,
        "cache": cache,
        **({"reward_weights": a.reward_weights} if a.reward_weights is not None else {}),
    }
    with RealModelServer() as llm:
        options["base_url"] = llm.base_url
        clock = time.monotonic()
        keys = {"OPENAI_API_KEY": "sk-not-used"}
        with EnvServer("craftmd", "train", options, release=tmp / "episodes", env=keys) as server:
            seconds["environment_start"] = time.monotonic() - clock
            command = [str(python), str(GRPO), "--env", server.url, "--model", str(gguf.parent), "--gguf-file", gguf.name,
                       "--out", str(ckpt), "--cpu", "--cases", str(a.train_cases), "--eval-cases", str(a.held_out),
                       "--eval-trials", str(a.eval_trials), "--steps", str(a.steps), "--num-generations",
                       str(a.num_generations), "--max-completion-length", str(a.max_tokens), "--learning-rate",
                       str(a.learning_rate), "--lora-r", str(a.lora_r), "--seed", str(a.seed)]  # fmt: skip
            threads = os.environ.get("OMP_NUM_THREADS", "1")  # torch's threads spin on busy cores
            env = {**os.environ, "OMP_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
            clock = time.monotonic()
            with Training(command, tmp / "grpo_train.log", env) as job:
                if job.wait():
                    raise SystemExit(f"bench_grpo: the GRPO run failed: {job.error()}")
            seconds["grpo_train"] = time.monotonic() - clock
        record = json.loads((ckpt / "craftmd-grpo.json").read_text())
        clock = time.monotonic()
        rel = tmp / "releases" / CHECKPOINT
        with CheckpointServer(ckpt) as doctor:
            craftmd("generate", "--task", "craftmd", "--dataset", data, "--doctor", f"openai-api/grpo/{CHECKPOINT}",
                    "--patient", f"openai/{ALIAS}", "--base-url", llm.base_url, "--cases", *cases,
                    "--experiments", "multiturn,frq,mcq4", "-T", f"max_turns={a.max_turns}", "--max-tokens",
                    a.max_tokens, "--temperature", 0, "--seed", a.seed, "--concurrency", 1, "--cache", cache,
                    "--out", rel, "--quiet",
                    env={**os.environ, "GRPO_BASE_URL": doctor.base_url, **keys})  # fmt: skip
        seconds["benchmark_generate"] = time.monotonic() - clock
    clock = time.monotonic()
    craftmd("score", rel, "--dataset", data, "--scorer", "offline", "--scorer", "paper", "--quiet")
    seconds["benchmark_score"] = time.monotonic() - clock
    accuracy, failed = bench_accuracy(rel)
    return record, cases, accuracy, failed, seconds


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    from craftmd import CraftMDError
    from craftmd.atomic import atomic_write_json
    from craftmd.generation.finetune import train_python

    gguf = small_model("bench_grpo")
    if gguf is None:
        return 1
    try:
        python = train_python(ROOT / ".venv-train" / "bin" / "python")
    except CraftMDError as exc:
        raise SystemExit(f"bench_grpo: {exc}") from None
    t_start = time.monotonic()
    try:
        with stopped_by_signals(), workspace(a.work, "bench-grpo-") as tmp:
            record, cases, accuracy, failed, seconds = run(a, gguf, python, tmp)
    except RuntimeError as exc:  # a server that did not come up (the environment's options refused, say): its log's lines
        raise SystemExit(f"bench_grpo: {exc}") from None

    before, after, unscored = held_out(record)
    table = summarise(before, after, metrics=("reward",))
    spread, groups = groups_with_spread(record)
    result = {
        "settings": {
            k: getattr(a, k)
            for k in ("steps", "train_cases", "num_generations", "held_out", "eval_trials", "bench_cases", "max_turns")
        }
        | {k: getattr(a, k) for k in ("max_tokens", "learning_rate", "lora_r", "reward_weights", "seed")},
        "reward": a.reward_weights or {"offline/correct": 1.0},
        "step_rewards": record["step_rewards"],
        "step_losses": record["step_losses"],
        "groups_with_spread": [spread, groups],
        "held_out_cases": record["eval_cases"],
        "held_out_unscored_episodes": unscored,
        "held_out": table,
        "bench_cases": cases,
        "bench_failed_answers": failed,
        "bench_accuracy": accuracy,
        "grpo_seconds": record["seconds"],
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "wall_seconds": round(time.monotonic() - t_start),
        "versions": record["versions"],
    }
    print(
        f"GRPO: {a.steps} steps of {a.num_generations} episodes (cases of the split's first {a.train_cases}), "
        f"{a.max_turns} doctor turns at most, {a.max_tokens} tokens a reply; step rewards {record['step_rewards']}, "
        f"losses {record['step_losses']}; groups whose rewards differ (GRPO's signal): {spread} of {groups}; "
        f"{result['wall_seconds']} s in all ({record['seconds']['train']} s training)"
    )
    if not spread:
        print("no group's episodes differed in reward: every advantage was 0, so the reward gave no gradient")
    print(f"held-out reward, {len(record['eval_cases'])} cases × {a.eval_trials} ({unscored} episodes unscored):")
    print_table(table, base="before", tuned="after")
    print(f"the trained doctor on {len(cases)} benchmark cases ({failed} answers not graded):")
    print("| format | scorer | n | accuracy [95% CI] |")
    print("|---|---|---|---|")
    for r in accuracy:
        print(f"| {r['format']} | {r['scorer']} | {r['n']} | {fmt(r['accuracy'])} |")
    atomic_write_json(a.json, result)
    print(f"written to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
