"""GRPO in a task's environment: the training side of the recipe in docs/training.md, run in the training env.

    .venv-train/bin/python generation/grpo_train.py --env http://127.0.0.1:8000 --model DIR [--gguf-file F] \\
        --cases 160 --out DIR [--cpu]

The environment is served by OpenEnv's own server (``python -m craftmd.envs.serve TASK train ...`` in ``.venv-rl``);
this script is its client (OpenEnv's ``GenericEnvClient``) and TRL's ``GRPOTrainer`` over whole episodes: the prompts
are the split's case indices (``0`` .. ``--cases`` − 1), TRL's sampler repeats each ``--num-generations`` times in a
row (GRPO's group: each play of a case is its next trial in the environment), and ``rollout_func`` plays one episode per
prompt. The doctor's tokens train on the episode's reward (the environment's: the task's own scorers), the patient's
are context, masked out with ``env_mask``. Generation is vLLM's (colocated, a GPU), or with ``--cpu`` transformers'
``generate`` through TRL's own generation step, no vLLM, in float32: the one difference between the two.

TRL logs each step (the mean reward of its episodes among them). With ``--eval-cases M`` the M cases after the training
ones (``--cases`` .. ``--cases`` + M − 1) are played ``--eval-trials`` times each before and after the training, with the
same sampling seed, and are never trained on (the server's split must have N + M cases: the server poses case i
modulo its size, so a held-out case past it would be a training case again; asked by its ``GET /split``). The result is an ordinary transformers checkpoint (LoRA merged into the
weights, safetensors, the tokenizer and chat template) with ``craftmd-grpo.json``: settings, the mean reward of each
step, every episode (phase, step, case index, the environment's job ``case_id/trial``, reward), the held-out rewards
before and after, seconds and versions. ``--out`` must not exist; a failed run leaves none. Imports nothing of
``craftmd`` (the training env does not have it); the base model is loaded as ``finetune_train`` loads it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import urllib.request
from pathlib import Path

if __package__:  # imported as craftmd.generation.grpo_train (the docs, the import test)
    from .finetune_train import load_model, lora_config, scratch, versions
else:  # run as a script in the training env, beside finetune_train.py
    from finetune_train import load_model, lora_config, scratch, versions

RECORD = "craftmd-grpo.json"


class Refused(Exception):
    """A bad argument: one line, exit status 2."""


def tokens(tok, messages: list[dict]) -> list[int]:
    """The token ids of the chat so far, up to the assistant's turn."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def generate(trainer, ids: list[int]) -> tuple[list[int], list[float] | None]:
    """One reply to the context ``ids``: its token ids and (vLLM) their log-probabilities."""
    if trainer.use_vllm:  # the GPU: vLLM, colocated
        _, out, lps, _ = trainer.vllm_generation.generate(prompts=[ids], images=None, num_generations=1)
        return out[0], [lp[0] for lp in lps[0]]
    out, _ = trainer._generate_single_turn([ids], None, {})  # --cpu: transformers' generate, TRL's sampling settings
    return out[0], None


def episode(trainer, env, case: int) -> dict:
    """One episode of case ``case``: the prompt's and the completion's ids (the doctor's replies, mask 1, and the
    patient's turns between them, mask 0), the log-probabilities (vLLM), the environment's reward and job."""
    tok = trainer.processing_class
    result = env.reset(seed=case)  # case `case` of the split; played again, it is its next trial
    job = env.state()["episode_id"]  # case_id/trial, as the environment's release names the episode
    if result.done:  # nothing for the doctor to learn from; a run does not go on without saying so
        raise RuntimeError(
            f"episode {job} (case {case}) ended before the doctor spoke: the patient failed (the server's log says why)"
        )
    prompt = tokens(tok, result.observation["messages"])
    ids, mask, logprobs = [], [], []
    while not result.done:
        out, lps = generate(trainer, prompt + ids)
        ids, mask = ids + out, mask + [1] * len(out)
        logprobs += lps if lps is not None else [0.0] * len(out)
        result = env.step({"message": tok.decode(out, skip_special_tokens=True)})
        if not result.done:  # the patient's reply (and the template around it): context only
            more = tokens(tok, result.observation["messages"])[len(prompt) + len(ids) :]
            ids, mask, logprobs = ids + more, mask + [0] * len(more), logprobs + [0.0] * len(more)
    return {"prompt": prompt, "ids": ids, "mask": mask, "logprobs": logprobs, "reward": result.reward, "job": job}


def evaluate(trainer, env, cases: list[int], trials: int, seed: int, phase: str, log: list) -> list[dict]:
    """``trials`` episodes of each of ``cases``, sampled from ``seed`` (so before and after draw alike)."""
    import transformers

    transformers.set_seed(seed)
    out = []
    for case in cases:
        for _ in range(trials):
            e = episode(trainer, env, case)
            out.append({"phase": phase, "step": trainer.state.global_step, "case": case, "job": e["job"], "reward": e["reward"]})
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    log += out
    return out


def mean(rows: list[dict]) -> float | None:
    scored = [r["reward"] for r in rows if r["reward"] is not None]
    return sum(scored) / len(scored) if scored else None


def split_cases(url: str) -> int:
    """How many cases the environment server's split has (its ``GET /split``); one line when it does not answer."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/split", timeout=60) as r:
            return len(json.load(r)["cases"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Refused(f"the environment at {url} does not answer GET /split ({exc}): serve it with craftmd.envs.serve") from None


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="grpo_train.py", description=__doc__.splitlines()[0])
    ap.add_argument("--env", required=True, metavar="URL", help="the environment's OpenEnv server (python -m craftmd.envs.serve)")
    ap.add_argument(
        "--model",
        type=Path,
        required=True,
        metavar="DIR",
        help="the base: a checkpoint folder or hub id, or the folder of --gguf-file",
    )
    ap.add_argument("--gguf-file", metavar="NAME", help="a GGUF file inside --model (transformers unpacks it into plain weights)")
    ap.add_argument("--out", type=Path, required=True, metavar="DIR", help="the new checkpoint folder (must not exist)")
    ap.add_argument("--cases", type=int, required=True, metavar="N", help="train on the split's cases 0 .. N-1")
    ap.add_argument("--steps", type=int, default=30, help="optimiser steps (default 30)")
    ap.add_argument("--num-generations", type=int, default=4, help="episodes per case per step, GRPO's group (default 4)")
    ap.add_argument("--cases-per-step", type=int, default=1, help="cases per step (default 1)")
    ap.add_argument("--max-completion-length", type=int, default=64, help="tokens per doctor reply (default 64)")
    ap.add_argument("--learning-rate", type=float, default=1e-5, help="constant learning rate (default 1e-5)")
    ap.add_argument("--temperature", type=float, default=1.0, help="the doctor's sampling temperature (default 1.0)")
    ap.add_argument("--lora-r", type=int, default=16, help="LoRA rank on every linear layer; 0 trains every weight (default 16)")
    ap.add_argument(
        "--eval-cases", type=int, default=0, metavar="M", help="held-out cases N .. N+M-1, before and after (default 0)"
    )
    ap.add_argument("--eval-trials", type=int, default=1, help="episodes of each held-out case (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", action="store_true", help="generate with transformers on the CPU, in float32, no vLLM")
    a = ap.parse_args(argv)
    for name in ("cases", "steps", "cases_per_step", "max_completion_length", "eval_trials"):
        if getattr(a, name) < 1:
            raise Refused(f"--{name.replace('_', '-')} must be at least 1")
    if a.num_generations < 2:
        raise Refused("--num-generations must be at least 2 (GRPO compares the episodes of a case)")
    if a.eval_cases < 0 or a.lora_r < 0 or not a.learning_rate > 0 or not a.temperature > 0:
        raise Refused("--eval-cases and --lora-r must be 0 or more, --learning-rate and --temperature more than 0")
    if a.out.exists():
        raise Refused(f"{a.out} already exists; choose a new folder for the checkpoint")
    if not a.out.parent.is_dir():
        raise Refused(f"{a.out.parent} is not a folder: make it first")
    return a


def trainer_for(a: argparse.Namespace, env, work: Path, log: list):
    """TRL's GRPOTrainer over the environment: the recipe's rollout and reward functions."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def rollout_func(prompts: list[str], trainer) -> dict:
        # TRL's sampler gives each case num_generations times in a row (GRPO's group): one episode each
        out = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "logprobs": [], "env_reward": []}
        for case in prompts:
            e = episode(trainer, env, int(case))
            for key, value in zip(out, (e["prompt"], e["ids"], e["mask"], e["logprobs"], e["reward"])):
                out[key].append(value)
            log.append(
                {
                    "phase": "train",
                    "step": trainer.state.global_step + 1,
                    "case": int(case),
                    "job": e["job"],
                    "reward": e["reward"],
                }
            )
        if not trainer.use_vllm:
            out["logprobs"] = None  # transformers' generation: TRL computes them itself
        return out

    def reward_from_env(completions, **kwargs):
        return kwargs["env_reward"]  # None where the environment could not score: TRL leaves it out

    tokenizer, model = load_model({"base": str(a.model), "gguf_file": a.gguf_file})
    args = GRPOConfig(
        output_dir=str(work / "trainer"),
        max_steps=a.steps,
        per_device_train_batch_size=a.cases_per_step * a.num_generations,
        gradient_accumulation_steps=1,
        num_generations=a.num_generations,
        max_completion_length=a.max_completion_length,
        temperature=a.temperature,
        learning_rate=a.learning_rate,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=a.seed,
        data_seed=a.seed,
        disable_tqdm=True,
        use_vllm=not a.cpu,
        vllm_mode="colocate",
        bf16=not a.cpu,
        gradient_checkpointing=not a.cpu,  # a small model's activations fit; recomputing them slows a CPU by a third
    )
    return GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=reward_from_env,
        train_dataset=Dataset.from_dict({"prompt": [str(i) for i in range(a.cases)]}),
        rollout_func=rollout_func,
        args=args,
        peft_config=lora_config(a.lora_r),
    )


def run(a: argparse.Namespace) -> dict:
    import os

    import transformers

    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError:
        raise Refused("the training environment has no OpenEnv client (openenv-core): run `make train-env`") from None

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental: said in the docs, not each run
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    seconds, log = {}, []
    clock = time.monotonic()
    held = list(range(a.cases, a.cases + a.eval_cases))
    # the server poses case i modulo its split's size: past it, a held-out case would be a training case played again
    n = split_cases(a.env)
    if a.cases + a.eval_cases > n:
        raise Refused(
            f"the environment's split has {n} cases: --cases {a.cases} and --eval-cases {a.eval_cases} need "
            f"{a.cases + a.eval_cases}, each a case of its own"
        )
    env = GenericEnvClient(base_url=a.env, message_timeout_s=600).sync()
    try:
        env.connect()
    except OSError as exc:
        raise Refused(f"the environment at {a.env} does not answer ({exc})") from None
    with scratch(a.out) as work, env:
        trainer = trainer_for(a, env, work, log)
        seconds["load"] = time.monotonic() - clock
        clock = time.monotonic()
        before = evaluate(trainer, env, held, a.eval_trials, a.seed, "before", log)
        seconds["eval_before"] = time.monotonic() - clock
        clock = time.monotonic()
        with contextlib.redirect_stdout(sys.stderr):  # TRL's log of each step: stdout holds the run's summary alone
            trainer.train()
        seconds["train"] = time.monotonic() - clock
        clock = time.monotonic()
        after = evaluate(trainer, env, held, a.eval_trials, a.seed, "after", log)
        seconds["eval_after"] = time.monotonic() - clock
        tuned = trainer.model.merge_and_unload() if a.lora_r else trainer.model
        ckpt = work / "checkpoint"
        tuned.save_pretrained(ckpt, safe_serialization=True)
        trainer.processing_class.save_pretrained(ckpt)
        history = trainer.state.log_history
        record = {
            "env": a.env,
            "base": str(a.model.resolve()) if a.model.exists() else str(a.model),  # a folder, or a hub id
            "gguf_file": a.gguf_file,
            **{k: getattr(a, k) for k in ("cases", "steps", "num_generations", "cases_per_step", "max_completion_length")},
            **{k: getattr(a, k) for k in ("learning_rate", "temperature", "lora_r", "eval_trials", "seed", "cpu")},
            "eval_cases": held,
            "step_rewards": [h["reward"] for h in history if "reward" in h and "step" in h],
            "step_losses": [h["loss"] for h in history if "loss" in h and "step" in h],
            "reward_before": mean(before),
            "reward_after": mean(after),
            "episodes": log,
            "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "versions": versions(),
        }
        (ckpt / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        ckpt.rename(a.out)
    return record


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse(argv)
        record = run(a)
    except Refused as exc:
        print(f"grpo_train.py: error: {exc}", file=sys.stderr)
        return 2
    keys = ("steps", "step_rewards", "reward_before", "reward_after")
    print(json.dumps({"checkpoint": str(a.out), **{k: record[k] for k in keys}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
