"""Fine-tune a causal LM on the dataset's ``consult_train`` config: run by ``craftmd finetune train`` in the training env.

This file runs in the side environment ``.venv-train`` (``make train-env``: torch, transformers, TRL, peft,
gguf), never in the package's own: it imports nothing of ``craftmd`` (the launcher,
:mod:`craftmd.generation.finetune`, has checked the arguments and passes them as JSON on stdin).

The recipe: ``datasets.load_dataset(DATA, "consult_train")["train"]``, its ``messages`` column as it is
(TRL's conversational format), the base model from a folder or from a GGUF file in it
(``from_pretrained(dir, gguf_file=...)``), LoRA adapters on every linear layer (peft), TRL's
``SFTTrainer`` for ``steps`` optimiser steps on the CPU (or the GPU when there is one; 0 steps: the base as it
is, for a baseline served the same way), the adapters merged
into the weights, and the merged model saved with its tokenizer (and chat template) as an ordinary
transformers checkpoint in safetensors, which ``transformers serve`` serves. Before and after the training
the mean loss over the training rows is measured the same way (the record's ``loss_before``/``loss_after``).
Everything is written in a temporary folder beside ``out`` and renamed into place at the end: a run that
fails leaves nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

RECORD = "craftmd-finetune.json"


def mean_loss(model, tokenizer, rows: list[list[dict]], max_length: int) -> float:
    """The mean token loss over whole dialogues (chat template applied, truncated to ``max_length``)."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for messages in rows:
            ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")["input_ids"]
            ids = ids[:, :max_length].to(model.device)
            out = model(input_ids=ids, labels=ids)
            n = ids.shape[1] - 1
            total += float(out.loss) * n
            count += n
    return total / count


def load_rows(cfg: dict):
    """The training dialogues (the config's ``messages``), read into memory through a datasets cache of this run's own."""
    import datasets

    datasets.disable_progress_bars()
    # A cache of this run's own: datasets' shared cache can answer for another folder of the same name and layout.
    cache = tempfile.mkdtemp(prefix="craftmd-finetune-datasets-")
    try:
        rows = datasets.load_dataset(cfg["data"], cfg["config"], cache_dir=cache, keep_in_memory=True)["train"]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if cfg.get("limit"):
        rows = rows.select(range(min(cfg["limit"], len(rows))))
    return rows.select_columns(["messages"])


def load_model(cfg: dict):
    """(tokenizer, model) of the base checkpoint, a GGUF file's weights unpacked into a plain dense model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    load = {"gguf_file": cfg["gguf_file"]} if cfg.get("gguf_file") else {}
    tokenizer = AutoTokenizer.from_pretrained(cfg["base"], **load)
    # a GGUF file: its weights unpacked into a plain dense model, trainable and saved as such (asked for at once: kept in
    # GGUF blocks by default, they were loaded a second time to unpack them, each load parsing the file again)
    unpack = {"quantization_config": GgufConfig(dequantize=True)} if load else {}
    model = AutoModelForCausalLM.from_pretrained(cfg["base"], dtype=torch.float32, **unpack, **load)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and load:
        quantizer.remove_quantization_config(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def _trainer_configs(cfg: dict, work: Path):
    """The trainer's arguments (constant learning rate, no saving, no mixed precision) and the LoRA config (None: full)."""
    from trl import SFTConfig

    args = SFTConfig(
        output_dir=str(work / "trainer"),
        max_steps=max(cfg["steps"], 1),
        per_device_train_batch_size=cfg["batch_size"],
        gradient_accumulation_steps=1,
        learning_rate=cfg["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=cfg["seed"],
        data_seed=cfg["seed"],
        max_length=cfg["max_length"],
        packing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=False,
        fp16=False,
    )
    return args, lora_config(cfg["lora_r"])


def lora_config(r: int):
    """LoRA adapters of rank ``r`` on every linear layer (alpha 2r, no dropout); None for ``r`` 0 (every weight trains)."""
    from peft import LoraConfig

    if not r:
        return None
    return LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def versions() -> dict[str, str]:
    """The versions of the training libraries, for a run's record."""
    import datasets
    import peft
    import torch
    import transformers
    import trl

    return {m.__name__: m.__version__ for m in (torch, transformers, trl, peft, datasets)}


@contextlib.contextmanager
def scratch(out: Path):
    """A temporary folder beside ``out`` (the same file system: a checkpoint written in it is renamed into place), removed
    at the end whatever happens: a run that fails leaves nothing."""
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _record(cfg: dict, rows: int, before: float, after: float, losses: list, seconds: dict) -> dict:
    """What a training run records beside its checkpoint: its inputs, settings, losses, timings and library versions."""
    record = {
        "base": cfg["base"],
        "gguf_file": cfg.get("gguf_file"),
        "data": cfg["data"],
        "config": cfg["config"],
        "rows": rows,
        "steps": cfg["steps"],
        "batch_size": cfg["batch_size"],
        "learning_rate": cfg["learning_rate"],
        "max_length": cfg["max_length"],
        "lora_r": cfg["lora_r"],
        "seed": cfg["seed"],
        "loss_before": before,
        "loss_after": after,
        "train_losses": losses,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "versions": versions(),
    }
    return record


def train(cfg: dict) -> dict:
    import transformers
    from trl import SFTTrainer

    clock = time.monotonic()
    seconds = {}
    transformers.set_seed(cfg["seed"])
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    rows = load_rows(cfg)
    tokenizer, model = load_model(cfg)
    dialogues = list(rows["messages"])
    seconds["load"] = time.monotonic() - clock
    before = mean_loss(model, tokenizer, dialogues, cfg["max_length"])

    out = Path(cfg["out"])
    with scratch(out) as work:
        args, lora = _trainer_configs(cfg, work)
        clock = time.monotonic()
        if cfg["steps"]:
            trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer, peft_config=lora)
            trainer.train()
            tuned = trainer.model.merge_and_unload() if lora else trainer.model
            losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        else:  # no step: the base model as it is, saved the same way (a baseline served by the same server)
            tuned, losses = model, []
        seconds["train"] = time.monotonic() - clock
        after = mean_loss(tuned, tokenizer, dialogues, cfg["max_length"]) if cfg["steps"] else before
        ckpt = work / "checkpoint"
        tuned.save_pretrained(ckpt, safe_serialization=True)
        tokenizer.save_pretrained(ckpt)
        seconds["measure_and_save"] = time.monotonic() - clock - seconds["train"]
        record = _record(cfg, len(dialogues), before, after, losses, seconds)
        if not all(math.isfinite(x) for x in (before, after)):
            raise RuntimeError(f"the loss is not finite (before {before}, after {after})")
        (ckpt / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        ckpt.rename(out)
        return record


def main() -> int:
    cfg = json.loads(sys.stdin.read())
    record = train(cfg)
    print(json.dumps({k: record[k] for k in ("rows", "steps", "loss_before", "loss_after")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
