"""Fine-tuning a doctor on the dataset's golden consultations, and serving the result to the benchmark.

The training itself needs torch, transformers, TRL and peft, which are no part of the package: they live in
the side environment ``.venv-train`` (``make train-env``; ``$CRAFTMD_TRAIN_PYTHON`` names another
interpreter that has them). This module, imported by the package, imports none of them: it checks the
arguments here (one line for each bad one, before anything runs), then runs
``generation/finetune_train.py`` in that interpreter (:func:`finetune`), and serves a checkpoint with
transformers' own OpenAI-compatible server, ``transformers serve`` (:class:`CheckpointServer`).

A served checkpoint is a model like any other: ``openai-api/<service>/<folder name>`` with
``<SERVICE>_BASE_URL`` pointing at the server (the server is pinned to that one checkpoint and answers
to its folder's name), so ``craftmd generate --task consultation --doctor openai-api/ft/<name>`` evaluates
it and every other role can be any other model.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from craftmd import CraftMDError
from craftmd.models.local_server import LocalServer, free_port

TRAIN_SCRIPT = Path(__file__).with_name("finetune_train.py")
CONFIG = "consult_train"
RECORD = "craftmd-finetune.json"  # the training record inside a checkpoint (finetune_train.RECORD)
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")  # a checkpoint folder's name as a hub model name (served as such)
INSTALL_HINT = "run `make train-env` (or set CRAFTMD_TRAIN_PYTHON to a Python with torch, transformers, trl and peft)"


def train_python(python: str | Path | None = None) -> Path:
    """The training environment's interpreter: ``python``, else ``$CRAFTMD_TRAIN_PYTHON``, else ``.venv-train/bin/python``."""
    chosen = python or os.environ.get("CRAFTMD_TRAIN_PYTHON") or Path(".venv-train") / "bin" / "python"
    path = Path(os.path.abspath(chosen))  # absolute, symbolic links kept (a venv's python is one)
    if not path.exists():
        raise CraftMDError(f"the training environment is not installed ({path} is missing): {INSTALL_HINT}")
    return path


#: The suffixes of pickle-format files (PyTorch's ``torch.save``, Python's pickle, Lightning's checkpoints): loading one
#: may run any code it holds.
PICKLED = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def check_checkpoint(path: Path) -> Path:
    """``path`` if it is a transformers checkpoint folder a server can load without running code; else one line.

    A checkpoint has a ``config.json`` naming its ``model_type``, its weights in safetensors and its tokenizer. A
    folder holding any pickle-format file (:data:`PICKLED`: ``pytorch_model.bin``, ``*.pt``, ``*.ckpt``, ...), at any
    depth, is refused whatever else it holds: a loader that finds it may unpickle it, and unpickling runs code.
    """
    path = Path(path)
    if not path.is_dir():
        raise CraftMDError(f"checkpoint {path} is not a folder")
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise CraftMDError(f"checkpoint {path} is not a model: it has no config.json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CraftMDError(f"checkpoint {path} is not a model: its config.json is not JSON ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise CraftMDError(f"checkpoint {path} is not a model: its config.json names no model_type")
    safe = any(path.glob("*.safetensors"))
    pickled = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.suffix.lower() in PICKLED)
    if pickled or not safe:
        shown = ", ".join(pickled[:5]) + (", …" if len(pickled) > 5 else "")
        why = (
            "no weights"
            if not pickled
            else f"pickled weights ({shown}) beside its safetensors, which run code when loaded; remove them"
            if safe
            else f"only pickled weights ({shown}), which run code when loaded"
        )
        raise CraftMDError(f"checkpoint {path} is not a model it is safe to load: it has {why}; save it with safetensors")
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise CraftMDError(f"checkpoint {path} is not a model: it has no tokenizer (tokenizer.json)")
    return path


def check_served_name(name: str) -> str:
    """``name`` if a checkpoint folder so named can be served under it (a hub model name); else one line."""
    if not SERVED_NAME.fullmatch(name) or "--" in name or ".." in name:
        raise CraftMDError(
            f"checkpoint folder name {name!r} cannot be a served model's name: "
            "use letters, digits, '-', '_' and '.' only (no '--' or '..'), at most 96"
        )
    return name


def check_base(base: Path, gguf_file: str | None) -> None:
    """The base model: a GGUF file ``gguf_file`` in the folder ``base``, or a checkpoint folder; else one line."""
    base = Path(base)
    if gguf_file is None:
        check_checkpoint(base)
        return
    f = base / gguf_file
    if Path(gguf_file).name != gguf_file:
        raise CraftMDError(f"--gguf-file {gguf_file!r} must be a file name inside --base {base}")
    try:
        with open(f, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise CraftMDError(f"the base model's GGUF file {f} cannot be read ({exc.strerror or exc})") from None
    if magic != b"GGUF":
        raise CraftMDError(f"{f} is not a GGUF file")


def check_training_data(data: Path) -> None:
    """``data`` is a dataset folder whose card lists the ``consult_train`` config; else one line."""
    data = Path(data)
    card = data / "README.md"
    if not card.is_file():
        raise CraftMDError(f"{data} is not a dataset folder (no README.md card): build it with `craftmd build`")
    import yaml
    from huggingface_hub import DatasetCard

    try:
        configs = DatasetCard.load(card).data.get("configs") or []
    except (ValueError, yaml.YAMLError) as exc:
        raise CraftMDError(f"{card}: its metadata cannot be read ({str(exc).splitlines()[0]})") from None
    names = [c.get("config_name") for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []
    if CONFIG not in names:
        raise CraftMDError(
            f"{data} has no {CONFIG} config (its card lists {', '.join(map(str, names)) or 'none'}): "
            "build the dataset with `craftmd build`"
        )


@dataclass(frozen=True)
class TrainSettings:
    """The recipe's knobs (``craftmd finetune train --help``); the defaults fit SmolLM2-135M on 2 CPU cores."""

    steps: int = 30
    batch_size: int = 2
    learning_rate: float = 5e-4
    max_length: int = 512
    lora_r: int = 16  # 0: full fine-tuning
    seed: int = 0
    limit: int | None = None  # the first N training rows only

    def check(self) -> None:
        if self.steps < 0:
            raise CraftMDError("--steps must be 0 (the base model as it is, saved as a checkpoint) or more")
        for name in ("batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise CraftMDError(f"--{name.replace('_', '-')} must be at least 1")
        if self.lora_r < 0:
            raise CraftMDError("--lora-r must be 0 (full fine-tuning) or more")
        if not self.learning_rate > 0:
            raise CraftMDError("--learning-rate must be more than 0")
        if self.limit is not None and self.limit < 1:
            raise CraftMDError("--limit must be at least 1")


def finetune(
    data: Path,
    base: Path,
    out: Path,
    settings: TrainSettings = TrainSettings(),
    *,
    gguf_file: str | None = None,
    python: str | Path | None = None,
    timeout: float | None = None,
) -> dict:
    """Fine-tune ``base`` on ``data``'s ``consult_train`` config into the checkpoint folder ``out``; its record.

    Every argument is checked first (one line each); ``out`` must not exist. The training runs in the
    training environment; a failure there is one line (its last line) and leaves no ``out``.
    """
    settings.check()
    py = train_python(python)
    check_training_data(data)
    check_base(base, gguf_file)
    out = Path(out)
    check_served_name(out.name)
    if out.exists():
        raise CraftMDError(f"{out} already exists; choose a new folder for the checkpoint")
    made = [p for p in reversed(out.absolute().parents) if not p.exists()]  # folders made for it, removed again if it fails
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg = {
        "data": str(Path(data).resolve()),
        "config": CONFIG,
        "base": str(Path(base).resolve()),
        "gguf_file": gguf_file,
        "out": str(out.resolve()),
        **{k: getattr(settings, k) for k in settings.__dataclass_fields__},
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        proc = subprocess.run(
            [str(py), str(TRAIN_SCRIPT)], input=json.dumps(cfg), capture_output=True, text=True, env=env, timeout=timeout
        )
    finally:
        if not out.exists():
            for p in reversed(made):
                with contextlib.suppress(OSError):
                    p.rmdir()
    if proc.returncode:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise CraftMDError(f"the fine-tuning failed: {lines[-1].strip() if lines else f'exit status {proc.returncode}'}")
    return json.loads((out / RECORD).read_text())


class CheckpointServer(LocalServer):
    """``transformers serve`` pinned to one checkpoint, on loopback; ``with CheckpointServer(ckpt) as s: s.base_url``.

    The server answers to the checkpoint folder's name (``s.model``), so the benchmark calls it as
    ``openai-api/<service>/<s.model>`` with ``<SERVICE>_BASE_URL=s.base_url``. ``transformers serve`` lists
    (``/v1/models``, which the benchmark checks before it sends anything) the models of its Hugging Face
    cache, and loads a model by its hub name: so it runs with the hub offline and a cache of its own that
    holds this one checkpoint under that name (links to its files, nothing copied), from that cache's
    folder. ``stop()`` (and the end of the ``with`` block, and the interpreter's exit) stops its whole
    process group.
    """

    stop_wait = 15.0  # seconds after SIGTERM: a model server may take a while to let go of its memory

    def __init__(
        self,
        checkpoint: Path,
        *,
        python: str | Path | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        start_timeout: float = 300.0,
        log: Path | None = None,
    ):
        self.checkpoint = check_checkpoint(Path(checkpoint)).resolve()
        check_served_name(self.checkpoint.name)
        self.python = train_python(python)
        self.host, self.port = host, port
        self.start_timeout = start_timeout
        self.home = Path(tempfile.mkdtemp(prefix="craftmd-serve-"))
        self.log = log or self.home / "server.log"
        self.proc: subprocess.Popen | None = None

    def _cache(self) -> Path:
        """A Hugging Face cache of this one checkpoint under its folder's name: ref ``main``, links to its files."""
        hub = self.home / "hub"
        shutil.rmtree(hub, ignore_errors=True)
        repo = hub / f"models--{self.model}"
        revision = "0" * 40
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
        for f in sorted(self.checkpoint.iterdir()):
            if f.is_file():
                (snapshot / f.name).symlink_to(f)
        return hub

    @property
    def model(self) -> str:
        return self.checkpoint.name

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        serve = "from transformers.cli.transformers import main; import sys; sys.argv[0] = 'transformers'; main()"
        return [
            str(self.python),
            "-c",
            serve,
            "serve",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            "info",
        ]

    def start(self) -> CheckpointServer:
        if self.running:
            return self
        self.port = self.port or free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(self._cache()), "TOKENIZERS_PARALLELISM": "false"}
        self.launch(self.command(), self._healthy, what="transformers serve", cwd=self.home, env=env)
        return self

    def _healthy(self) -> bool:
        with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=2) as r:
            return json.load(r).get("status") == "ok"

    def wait(self) -> int:
        """Run until the server exits (``craftmd finetune serve``); its exit status."""
        return self.proc.wait() if self.proc is not None else 0

    def chat_requests(self) -> int:
        """Chat requests the server has answered so far (its access log)."""
        return self.log.read_text(errors="replace").count("POST /v1/chat/completions")

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.home / "hub", ignore_errors=True)


__all__ = [
    "CONFIG",
    "CheckpointServer",
    "TrainSettings",
    "check_base",
    "check_checkpoint",
    "check_served_name",
    "check_training_data",
    "finetune",
    "train_python",
]


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `craftmd finetune`")
