"""The consultation framework's fine-tuning experiment, small: SmolLM2-135M as the doctor, base against fine-tuned.

The framework fine-tuned Vicuna on its golden consultations and found the fine-tuned doctor (Vicuna-FT) asked
better questions than the base (§4.2, Tables 2-3). Here the same, at a size a CPU runs:

1. The dataset (``--dataset``, else ``craftmd build`` into a temporary folder). Cases with MediQ atomic facts
   (the ``facts`` config) and four choices are shuffled with ``--seed``; the first ``--held-out`` are the
   evaluation cases; each gets key-value information from its facts (first fact: the initial request; each
   other fact: an item whose key is its first three words), written as the ``keyinfo`` config
   (model ``bench/facts``).
2. The training dialogues: the first ``--train`` rows of the dataset's ``consult_train`` config (golden
   consultations, the benchmark's cases excluded). When the dataset has no such config yet, a stand-in in
   the same shape is written from the facts of ``--train`` other cases (none held out): the doctor asks
   for each key with the order oracle's question, the patient answers with the fact, the doctor ends with
   the correct diagnosis. The report says which was used.
3. ``craftmd finetune train`` from SmolLM2's GGUF file: ``--steps 0`` for the base (the same weights saved
   as a checkpoint, so both doctors run on the same server) and ``--steps N`` (LoRA) for the fine-tuned.
4. Each doctor, served by ``transformers serve``, consults every held-out case once (``consult_100``:
   consultation, then the solver answers the 4-choice question and the free response); the patient and the
   solver are SmolLM2 on llama.cpp (``make llm``), the same for both. Graded and scored by the package
   (``paper``, ``offline``, ``keyinfo``).
5. Per case: doctor turns, words per doctor turn, query similarity (mean pairwise ROUGE-1/2/L F1 of the
   doctor's questions, the framework's diversity; lower is more diverse), doctor key recall and F1 (the
   ``keyinfo`` scorer), accuracy (4-choice). Means with 95% case-bootstrap CIs (2,000 resamples), and the
   paired difference fine-tuned − base with its CI.

    .venv/bin/python bench/bench_finetune.py [--train 20] [--held-out 10] [--steps 40] [--max-turns 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from realmodel import ALIAS, MissingModel, RealModelServer, find_gguf, llm_python  # noqa: E402

METRICS = ("turns", "words_per_turn", "question_rouge1", "question_rouge2", "question_rougeL", "doctor_key_recall", "doctor_key_f1",
           "accuracy_mcq4")


def craftmd(*args, env=None) -> str:
    proc = subprocess.run([sys.executable, "-m", "craftmd.commands.cli", *map(str, args)], capture_output=True, text=True,
                          env=env or os.environ)
    if proc.returncode:
        raise SystemExit(f"craftmd {args[0]} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def pick_cases(data: Path, seed: int) -> list[dict]:
    import polars as pl

    facts = pl.read_parquet(data / "facts" / "test-00000-of-00001.parquet").select("case_id", "facts")
    cases = pl.read_parquet(data / "all" / "test-00000-of-00001.parquet").filter(pl.col("choices").list.len() == 4)
    rows = cases.join(facts, on="case_id").filter(pl.col("facts").list.len() >= 3).sort("case_id").to_dicts()
    random.Random(seed).shuffle(rows)
    return rows


def items_of(facts: list[str]) -> tuple[str, list[dict]]:
    """(initial request, key-value items) from a case's atomic facts."""
    return facts[0], [{"key": " ".join(f.split()[:3]), "value": f} for f in facts[1:]]


def write_standin_training(rows: list[dict], out: Path) -> Path:
    """A consult_train-shaped dataset folder of scripted golden dialogues from ``rows``' facts."""
    prompts = ROOT / "craftmd" / "tasks" / "consultation" / "prompts" / "consult-v1"
    system = (prompts / "doctor_system.txt").read_text().strip()
    question = (prompts / "oracle_question.txt").read_text().strip()
    (out / "consult_train").mkdir(parents=True)
    with open(out / "consult_train" / "train-00000-of-00001.jsonl", "w") as f:
        for r in rows:
            request, items = items_of(r["facts"])
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": request}]
            for it in items[:8]:
                msgs += [{"role": "assistant", "content": question.format(key=it["key"])}, {"role": "user", "content": it["value"]}]
            msgs.append({"role": "assistant", "content": f"**Final Diagnosis:** {r['answer']}"})
            f.write(json.dumps({"messages": msgs, "key_values": items, "answer": r["answer"], "source": "bench-standin",
                                "licence": "CC BY 4.0"}) + "\n")
    (out / "README.md").write_text("---\nconfigs:\n- config_name: consult_train\n  data_files:\n  - split: train\n"
                                   "    path: consult_train/train-*.jsonl\n---\nA stand-in of consult_train for bench_finetune.\n")
    return out


def has_consult_train(data: Path) -> bool:
    from craftmd import CraftMDError
    from craftmd.generation.finetune import check_training_data

    try:
        check_training_data(data)
        return True
    except CraftMDError:
        return False


def case_metrics(rel: Path) -> dict[str, dict[str, float]]:
    """case_id -> metric -> value, from the release's conversations and scores."""
    import polars as pl

    from craftmd.release import read_release
    from craftmd.scoring.history import question_similarity, tokens

    out: dict[str, dict[str, float]] = {}
    for c in read_release(rel).table("conversations").to_pylist():
        if c["conversation"] != "consult":
            continue
        doctor = [m["content"] or "" for m in c["messages"] if m["role"] == "assistant"]
        questions = [d for d in doctor if "final diagnosis" not in d.lower()]
        m = {"turns": float(len(doctor)), "words_per_turn": sum(len(tokens(d)) for d in doctor) / max(len(doctor), 1)}
        sim = question_similarity([tokens(q) for q in questions])
        if sim is not None:
            m.update(zip(("question_rouge1", "question_rouge2", "question_rougeL"), sim))
        out[c["case_id"]] = m
    scores = pl.read_parquet(rel / "scores.parquet")
    for r in scores.filter(pl.col("metric").is_in(["doctor_key_recall", "doctor_key_f1"]) & (pl.col("conversation") == "consult")
                           & pl.col("value").is_not_null()).to_dicts():
        out[r["case_id"]][r["metric"]] = float(r["value"])
    for r in scores.filter((pl.col("metric") == "correct") & (pl.col("setting") == "consult_100") & (pl.col("format") == "mcq4")
                           & (pl.col("scorer") == "paper") & pl.col("value").is_not_null()).to_dicts():
        out[r["case_id"]]["accuracy_mcq4"] = float(r["value"])
    return out


def summarise(base: dict, tuned: dict, B: int = 2000) -> list[dict]:
    import numpy as np

    from craftmd.analysis.bootstrap import resample_counts

    rows = []
    for metric in METRICS:
        cases = sorted(c for c in base if metric in base[c] and c in tuned and metric in tuned[c])
        if not cases:
            rows.append({"metric": metric, "n": 0})
            continue
        w = np.asarray(resample_counts(len(cases), B), dtype=np.float64)
        row = {"metric": metric, "n": len(cases)}
        for name, values in (("base", [base[c][metric] for c in cases]), ("tuned", [tuned[c][metric] for c in cases]),
                             ("diff", [tuned[c][metric] - base[c][metric] for c in cases])):
            v = np.asarray(values, dtype=np.float64)
            boot = w @ v / len(cases)
            row[name] = (float(v.mean()), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)))
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, help="a built dataset (default: build one into a temporary folder)")
    ap.add_argument("--train", type=int, default=20, help="training dialogues (default 20)")
    ap.add_argument("--held-out", type=int, default=10, help="evaluation cases (default 10)")
    ap.add_argument("--steps", type=int, default=40, help="LoRA steps (default 40)")
    ap.add_argument("--max-turns", type=int, default=4, help="doctor turns per consultation (default 4)")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per reply (default 48)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--work", type=Path, help="keep the dataset, checkpoints and releases in this new folder (default: a temporary one)")
    a = ap.parse_args()

    from craftmd.generation.finetune import CheckpointServer
    from craftmd.generation.keyinfo import write_keyinfo

    try:
        gguf = find_gguf(llm_python())
    except MissingModel as exc:
        print(f"bench_finetune: {exc}", file=sys.stderr)
        return 1
    t_start = time.monotonic()
    with contextlib.nullcontext(str(a.work)) if a.work else tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        tmp = Path(tmp)
        if a.work:
            tmp.mkdir(parents=True)
        data = tmp / "data"
        if a.dataset:
            import shutil

            shutil.copytree(a.dataset, data)  # keyinfo is written into it: never into the user's folder
        else:
            from craftmd.dataset_builder.build import build_dataset
            from craftmd.source import Source

            build_dataset(Source(), data, progress=False)
        cases = pick_cases(data, a.seed)
        held = cases[: a.held_out]
        kv = []
        for r in held:
            request, items = items_of(r["facts"])
            kv.append({"case_id": r["case_id"], "items": items, "initial_request": request, "status": "ok", "error": None,
                       "model": "bench/facts", "prompt_sha256": "0" * 64})
        write_keyinfo(data, kv, {"model": "bench/facts"})
        if has_consult_train(data):
            train_data, training = data, "the dataset's consult_train config"
            limit = ["--limit", a.train]
        else:
            train_data = write_standin_training(cases[a.held_out: a.held_out + a.train], tmp / "train")
            training, limit = "a scripted stand-in from the facts of other cases (the dataset has no consult_train config)", []
        ckpts, records = {}, {}
        for arm, steps in (("smollm2-base", 0), ("smollm2-ft", a.steps)):
            ckpts[arm] = tmp / "ckpts" / arm
            out = craftmd("finetune", "train", "--dataset", train_data, "--base", gguf.parent, "--gguf-file", gguf.name,
                          "--out", ckpts[arm], "--steps", steps, "--max-length", 512, "--batch-size", 2, "--seed", a.seed, *limit,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})  # torch's threads spin on busy cores
            records[arm] = json.loads((ckpts[arm] / "craftmd-finetune.json").read_text())
            print(f"{arm}: {out.strip()}", file=sys.stderr)
        metrics = {}
        ids = [r["case_id"] for r in held]
        with RealModelServer() as llm:
            for arm, ckpt in ckpts.items():
                rel = tmp / "releases" / arm
                with CheckpointServer(ckpt) as doctor:
                    env = {**os.environ, "FT_BASE_URL": doctor.base_url, "OPENAI_API_KEY": "sk-not-used"}
                    craftmd("generate", "--task", "consultation", "--dataset", data, "--doctor", f"openai-api/ft/{arm}",
                            "--patient", f"openai/{ALIAS}", "--solver", f"openai/{ALIAS}", "--base-url", llm.base_url,
                            "--cases", *ids, "--experiments", "consult_100", "--max-turns", a.max_turns, "--max-tokens", a.max_tokens,
                            "--seed", a.seed, "--concurrency", 1, "--cache", tmp / "cache.sqlite", "--out", rel, "--quiet", env=env)
                craftmd("score", rel, "--dataset", data, "--scorer", "paper", "--scorer", "offline", "--scorer", "keyinfo", "--quiet")
                metrics[arm] = case_metrics(rel)
        table = summarise(metrics["smollm2-base"], metrics["smollm2-ft"])
    result = {"training": training, "train_rows": records["smollm2-ft"]["rows"], "steps": a.steps, "held_out": len(held),
              "max_turns": a.max_turns, "max_tokens": a.max_tokens, "seed": a.seed,
              "loss": {"before": records["smollm2-ft"]["loss_before"], "after": records["smollm2-ft"]["loss_after"]},
              "train_seconds": records["smollm2-ft"]["seconds"], "wall_seconds": round(time.monotonic() - t_start), "table": table}
    print(f"training: {training}; {result['train_rows']} dialogues, {a.steps} LoRA steps; mean loss over them "
          f"{result['loss']['before']:.3f} -> {result['loss']['after']:.3f}; {len(held)} held-out cases, 1 trial, "
          f"{a.max_turns} doctor turns at most, {a.max_tokens} tokens per reply; {result['wall_seconds']} s in all")
    print("| measure | n | base | fine-tuned | fine-tuned − base |")
    print("|---|---|---|---|---|")
    fmt = lambda t: f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"  # noqa: E731
    for r in table:
        if r["n"]:
            print(f"| {r['metric']} | {r['n']} | {fmt(r['base'])} | {fmt(r['tuned'])} | {fmt(r['diff'])} |")
        else:
            print(f"| {r['metric']} | 0 | – | – | – |")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
