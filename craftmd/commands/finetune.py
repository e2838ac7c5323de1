"""``craftmd finetune train`` and ``craftmd finetune serve``: a doctor fine-tuned on the golden consultations, served to the benchmark."""

from __future__ import annotations

import json
from pathlib import Path

from craftmd.commands.cli import command


def _train(args) -> int:
    """Fine-tune a causal LM on the dataset's consult_train config (TRL, LoRA) into a checkpoint folder.

    Runs in the training environment (make train-env: torch, transformers, TRL, peft; or
    $CRAFTMD_TRAIN_PYTHON). The base model is a transformers checkpoint folder, or a GGUF file in a folder
    (--gguf-file). The training rows are the config's messages column as they are (TRL's conversational
    format); LoRA adapters on every linear layer (--lora-r 0: full fine-tuning), merged into the weights at the
    end, so OUT is an ordinary checkpoint in safetensors with its tokenizer and chat template and a record of
    the run (craftmd-finetune.json: data, settings, versions, the mean loss over the training rows before and
    after). OUT must not exist; a failed run leaves none. Serve it with craftmd finetune serve.
    """
    from craftmd.generation.finetune import TrainSettings, finetune

    settings = TrainSettings(
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
        lora_r=args.lora_r,
        seed=args.seed,
        limit=args.limit,
    )
    record = finetune(args.dataset, args.base, args.out, settings, gguf_file=args.gguf_file, python=args.python)
    print(json.dumps({"checkpoint": str(args.out), **{k: record[k] for k in ("rows", "steps", "loss_before", "loss_after")}}))
    return 0


def _serve(args) -> int:
    """Serve a checkpoint with transformers' own OpenAI-compatible server (transformers serve), pinned to it.

    The server answers to the checkpoint folder's name: with SERVICE_BASE_URL=http://HOST:PORT/v1 the benchmark
    calls it as openai-api/SERVICE/<folder name>, e.g. craftmd generate --task consultation --doctor
    openai-api/ft/<folder name>. A folder that is not a checkpoint (no config.json with a model_type, no
    safetensors weights, no tokenizer) is refused before the server starts. Runs until interrupted (Ctrl-C, or
    SIGTERM/SIGHUP to this command's process), then stops the server.
    """
    from craftmd.generation.finetune import CheckpointServer
    from craftmd.models.local_server import stopped_by_signals

    server = CheckpointServer(args.checkpoint, python=args.python, port=args.port, host=args.host)
    with stopped_by_signals():  # `kill PID` of this command stops the server too (its own session: no signal reaches it)
        server.start()
        print(
            f"serving {server.model} at {server.base_url} (log: {server.log}); "
            f"e.g. FT_BASE_URL={server.base_url} craftmd generate --doctor openai-api/ft/{server.model} ...",
            flush=True,
        )
        try:
            return server.wait()
        finally:
            server.stop()


def _add_train_arguments(t) -> None:
    """``craftmd finetune train``'s arguments, their defaults those of :class:`TrainSettings`."""
    from craftmd.generation.finetune import TrainSettings

    d = TrainSettings()
    t.add_argument(
        "--dataset",
        type=Path,
        required=True,
        metavar="DIR",
        help="the dataset folder (craftmd build) with the consult_train config",
    )
    t.add_argument(
        "--base",
        type=Path,
        required=True,
        metavar="DIR",
        help="the base model: a transformers checkpoint folder, or the folder of --gguf-file",
    )
    t.add_argument(
        "--gguf-file", metavar="NAME", help="a GGUF file inside --base to start from (transformers unpacks it into plain weights)"
    )
    t.add_argument("--out", type=Path, required=True, metavar="DIR", help="the new checkpoint folder (must not exist)")
    t.add_argument(
        "--steps",
        type=int,
        default=d.steps,
        help=f"optimiser steps (default {d.steps}); 0 saves the base model as it is, a baseline served the same way",
    )
    t.add_argument("--batch-size", type=int, default=d.batch_size, help=f"dialogues per step (default {d.batch_size})")
    t.add_argument(
        "--learning-rate", type=float, default=d.learning_rate, help=f"constant learning rate (default {d.learning_rate})"
    )
    t.add_argument(
        "--max-length", type=int, default=d.max_length, help=f"tokens per dialogue, the rest cut (default {d.max_length})"
    )
    t.add_argument(
        "--lora-r",
        type=int,
        default=d.lora_r,
        help=f"LoRA rank on every linear layer; 0 trains every weight (default {d.lora_r})",
    )
    t.add_argument("--limit", type=int, metavar="N", help="train on the first N rows only")
    t.add_argument("--seed", type=int, default=d.seed, help=f"seed of the initialisation and the order (default {d.seed})")
    _add_python_argument(t)


def _add_python_argument(p) -> None:
    """``--python``: the training environment's interpreter."""
    p.add_argument(
        "--python",
        metavar="PATH",
        help="the training environment's interpreter (default $CRAFTMD_TRAIN_PYTHON, else .venv-train/bin/python)",
    )


def register(sub) -> None:
    """Add ``craftmd finetune train|serve`` to the `craftmd` parser."""
    p = sub.add_parser(
        "finetune", help="fine-tune a doctor on the golden consultations (consult_train) and serve it to the benchmark"
    )
    inner = p.add_subparsers(dest="finetune_command", metavar="STEP", required=True)
    t = command(inner, "train", _train)
    _add_train_arguments(t)
    s = command(inner, "serve", _serve)
    s.add_argument("checkpoint", type=Path, metavar="CHECKPOINT", help="a checkpoint folder (craftmd finetune train --out)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    _add_python_argument(s)


__all__ = ["register"]
