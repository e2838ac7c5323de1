"""Local models the run starts itself (``--serve``, :mod:`craftmd.commands.serving`): K replicas of a server per model, pooled.

A role's model may be a local model instead of a server:

- ``llama.cpp/PATH.gguf``: a GGUF file, served by llama.cpp's OpenAI-compatible server of llama-cpp-python
  (``python -m llama_cpp.server``; the interpreter: ``$CRAFTMD_LLM_PYTHON``, else this one when it has
  ``llama_cpp``, else ``.venv-llm/bin/python``, which ``make llm`` installs). Always started by the run.
- ``vllm/MODEL`` (a model folder or a hub id) with ``--serve ROLE``: served by vLLM's ``vllm serve`` (the executable:
  ``$CRAFTMD_VLLM``, else ``vllm`` on the PATH) rather than by the offline engine in this process.

``--serve ROLE=K`` starts K replicas (default 1), each on a free loopback port, each checked ready (it lists its model
at ``/v1/models``) before anything is sent; they are one service, ``openai-api/<engine>/<name>`` with
``<ENGINE>_BASE_URL`` listing every replica (a pool: :mod:`.pool`), so the run record names them as it names any server
(``roles.<role>``: model, base URL, service) and adds what was served (``roles.<role>.served``: the engine, the model
file's name and sha256 or the model as given, the replicas, the server options, the logs). Every role that names a
served model shares its servers (the most replicas any of them asks for): ``--doctor vllm/M --patient vllm/M --serve
doctor`` serves both from one set. Each replica's log is kept beside the release
(``RELEASE_DIR.servers/<service>-<i>.log``). The servers stop when the run ends, fails or is stopped, and, since each
runs under a guard (:mod:`.guard`), when it is killed.

``--serve-args [ROLE=]OPTIONS`` passes options to the servers (llama.cpp's ``--n_ctx 16384 --n_gpu_layers 99``, vLLM's
``--max-model-len 8192 --dtype bfloat16``); the model, the name it answers to, the host and the port are the run's own.
llama.cpp gets a 16,384-token window and half the cores shared among its replicas unless told otherwise; its service
takes one request at a time per replica (llama-cpp-python's server answers one at a time) unless ``--concurrency
SERVICE=N`` says otherwise. vLLM replicas get a GPU each where there are enough (``CUDA_VISIBLE_DEVICES``, else those
``nvidia-smi -L`` lists; ``--tensor-parallel-size`` GPUs each), else they share them, each with an equal part of 0.9 of
the memory unless ``--gpu-memory-utilization`` is given.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from craftmd import CraftMDError, cpus
from craftmd.atomic import sha256_file

from .local_server import LocalServer, free_port

#: The engines a run can start: the provider prefix of a role's model -> the service (and variable prefix) it is named by.
ENGINES = {"llama.cpp": "llamacpp", "vllm": "vllm"}
#: The most replicas of one model.
MAX_REPLICAS = 16
#: llama.cpp's window when the server options give none (the tasks' largest prompt fits: docs/local.md's table).
LLAMA_CPP_CONTEXT = 16_384
#: Seconds a replica may take to answer before the run gives up on it (vLLM may download and compile first).
START_TIMEOUT = {"llama.cpp": 600.0, "vllm": 1800.0}
#: Server options the run sets itself, per engine.
OURS = {
    "llama.cpp": ("--model", "--model_alias", "--host", "--port"),
    "vllm": ("--served-model-name", "--host", "--port"),
}
LLM_HINT = "run `make llm` (or set CRAFTMD_LLM_PYTHON to a Python with llama-cpp-python[server])"
VLLM_HINT = "pip install 'craftmd[vllm]' on a machine with a GPU (or set CRAFTMD_VLLM to vLLM's `vllm` executable)"


def llm_python(root: Path | None = None) -> Path:
    """The interpreter with llama.cpp's server: ``$CRAFTMD_LLM_PYTHON``, else this one when it has ``llama_cpp``, else
    ``.venv-llm/bin/python`` under ``root`` (default: the current folder), which ``make llm`` installs."""
    named = os.environ.get("CRAFTMD_LLM_PYTHON")
    if not named and importlib.util.find_spec("llama_cpp") is not None:
        return Path(sys.executable)
    python = Path(named) if named else Path(root or ".") / ".venv-llm" / "bin" / "python"
    if not python.exists():
        raise CraftMDError(f"llama.cpp's server is not installed ({python} is missing): {LLM_HINT}")
    return python


def vllm_executable() -> str:
    """vLLM's ``vllm`` command: ``$CRAFTMD_VLLM``, else the one on the PATH."""
    found = os.environ.get("CRAFTMD_VLLM") or shutil.which("vllm")
    if not found or not Path(found).exists():
        raise CraftMDError(f"vllm/ models served with --serve need vLLM's `vllm` command: {VLLM_HINT}")
    return found


def _option(options: list[str], name: str) -> str | None:
    """The value of ``name`` in a server's options (``--name VALUE`` or ``--name=VALUE``), or None."""
    for i, o in enumerate(options):
        if o == name and i + 1 < len(options):
            return options[i + 1]
        if o.startswith(name + "="):
            return o.split("=", 1)[1]
    return None


def _answers(base_url: str, name: str) -> bool:
    """Whether the server at ``base_url`` lists ``name`` at ``/models`` (an ``OSError``: not yet)."""
    with urllib.request.urlopen(f"{base_url}/models", timeout=2) as r:
        return name in [m.get("id") for m in json.load(r).get("data", [])]


class ModelServer(LocalServer):
    """A local OpenAI-compatible server of one model on loopback, answering to ``alias``: a subclass gives ``command()``
    (on ``self.port``) and ``what`` (its name in an error); ``env``: what its environment adds (nothing: this one's)."""

    alias: str
    port: int | None = None
    env: dict[str, str] = {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def what(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self):
        """Start it on its port (a free one when none was given) and wait until it lists its model (idempotent)."""
        if self.running:
            return self
        self.port = self.port or free_port()
        env = {"env": {**os.environ, **self.env}} if self.env else {}
        self.launch(self.command(), lambda: _answers(self.base_url, self.alias), what=self.what, **env)
        return self


class LlamaCppServer(ModelServer):
    """One llama.cpp server (llama-cpp-python's ``python -m llama_cpp.server``) of one GGUF file, on loopback.

    ``options``: the server's options as a user gives them; the model file, the name it answers to (``alias``), the
    host and the port are put in (replacing any given), and, unless given, ``--n_ctx`` (:data:`LLAMA_CPP_CONTEXT`),
    ``--n_threads`` (``threads``, for the reply; default: half the CPUs this process may run on) and ``--n_threads_batch``
    (``batch_threads``, for the prompt; default: all of them). llama.cpp's own default for the prompt is every core of
    the machine, whatever the process may use: its threads wait for each other by spinning, so two servers (replicas,
    or a server beside other work pinned with ``taskset``) that each take every core run several times slower than one
    that takes its share. ``start()`` is idempotent; ``with`` it, or ``stop()`` it."""

    def __init__(
        self,
        model_file: Path,
        *,
        alias: str,
        python: Path | None = None,
        options: list[str] | tuple[str, ...] = (),
        threads: int | None = None,
        batch_threads: int | None = None,
        log: Path,
        port: int | None = None,
        start_timeout: float = START_TIMEOUT["llama.cpp"],
    ):
        self.model_file = Path(model_file)
        self.alias = alias
        self.python = Path(python) if python else llm_python()
        self.options = list(options)
        self.threads = threads or max(1, cpus() // 2)
        self.batch_threads = batch_threads or cpus()
        self.log = Path(log)
        self.port = port
        self.start_timeout = start_timeout

    @property
    def what(self) -> str:
        return f"llama.cpp's server of {self.model_file.name}"

    def command(self) -> list[str]:
        ours = {"--model": str(self.model_file), "--model_alias": self.alias, "--host": "127.0.0.1", "--port": str(self.port)}
        given = _without(self.options, ours)
        if _option(given, "--n_ctx") is None:
            given += ["--n_ctx", str(LLAMA_CPP_CONTEXT)]
        if _option(given, "--n_threads") is None:
            given += ["--n_threads", str(self.threads)]
        if _option(given, "--n_threads_batch") is None:
            given += ["--n_threads_batch", str(self.batch_threads)]
        return [str(self.python), "-m", "llama_cpp.server", *given, *(x for kv in ours.items() for x in kv)]

    def chat_requests(self) -> int:
        """Chat requests the server has received so far (its access log)."""
        return self.log.read_text(errors="replace").count('"POST /v1/chat/completions')


class VLLMServer(ModelServer):
    """One ``vllm serve MODEL`` on loopback, answering to ``alias``; ``env``: its environment's additions (the GPUs it
    sees). ``options`` as :class:`LlamaCppServer`'s (vLLM's own: ``--max-model-len``, ``--dtype``, ...)."""

    stop_wait = 30.0  # a vLLM server lets go of its GPU memory before it exits

    def __init__(
        self,
        model: str,
        *,
        alias: str,
        executable: str | None = None,
        options: list[str] | tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log: Path,
        port: int | None = None,
        start_timeout: float = START_TIMEOUT["vllm"],
    ):
        self.model, self.alias = model, alias
        self.executable = executable or vllm_executable()
        self.options, self.env = list(options), dict(env or {})
        self.log, self.port, self.start_timeout = Path(log), port, start_timeout

    @property
    def what(self) -> str:
        return f"vllm serve {self.model}"

    def command(self) -> list[str]:
        ours = {"--served-model-name": self.alias, "--host": "127.0.0.1", "--port": str(self.port)}
        return [self.executable, "serve", self.model, *_without(self.options, ours), *(x for kv in ours.items() for x in kv)]


def _without(options: list[str], ours) -> list[str]:
    """``options`` without those of ``ours`` (each as ``--name VALUE`` or ``--name=VALUE``)."""
    out, skip = [], False
    for o in options:
        if skip:
            skip = False
        elif o in ours:
            skip = True
        elif o.split("=", 1)[0] not in ours:
            out.append(o)
    return out


def gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES``, else the ones ``nvidia-smi -L`` lists, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, ln in enumerate(listed.stdout.splitlines()) if ln.startswith("GPU ")] if listed.returncode == 0 else []


@dataclass
class Served:
    """One local model the run serves: its engine, the model as given, its replicas and what they are called."""

    engine: str  # llama.cpp | vllm
    model: str  # the GGUF file's path, or vLLM's model folder or hub id, as given
    roles: list[str]
    replicas: int
    options: list[str]
    service: str  # openai-api/<service>/<name>
    name: str  # the name the servers answer to
    ports: list[int] = field(default_factory=list)
    servers: list[ModelServer] = field(default_factory=list)
    sha256: str | None = None  # the GGUF file's

    @property
    def model_name(self) -> str:
        return f"openai-api/{self.service}/{self.name}"

    @property
    def variable(self) -> str:
        return f"{self.service.upper().replace('-', '_')}_BASE_URL"

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}/v1" for p in self.ports]

    def logs(self, folder: Path) -> list[Path]:
        return [folder / f"{self.service}-{i}.log" for i in range(self.replicas)]

    def describe(self, folder: Path) -> dict:
        """What the run record says of it (no path but the logs' beside the release; never a key)."""
        model = Path(self.model).name if self.engine == "llama.cpp" or Path(self.model).is_dir() else self.model
        out = {"engine": self.engine, "model": model, "replicas": self.replicas, "options": list(self.options)}
        if self.sha256:
            out["sha256"] = self.sha256
        out["logs"] = [f"{folder.name}/{p.name}" for p in self.logs(folder)]
        return out


class ServePlan:
    """The local models of a run (role -> model name as given; ``serve``: role -> replicas; ``options``: role or ``*`` ->
    server options), checked and named, nothing started: :attr:`names` (role -> the name the run calls it by) and
    :attr:`env` (the servers' variables; set them again after :meth:`start`, which picks the ports) are known before
    :meth:`start`, so the run is checked whole before any server starts (minutes for vLLM). ``logs``: the folder the replicas' logs go to."""

    def __init__(self, roles: dict[str, str], serve: dict[str, int], options: dict[str, list[str]], logs: Path):
        self.logs = Path(logs)
        for flag, given in (("--serve", set(serve)), ("--serve-args", set(options) - {"*"})):
            if given - set(roles):
                raise CraftMDError(f"{flag} {sorted(given - set(roles))[0]}: the run's roles are {', '.join(roles)}")
        by_model: dict[str, Served] = {}
        taken: dict[str, int] = {}
        # a model is served when it is a GGUF file, or a role that names it is given --serve; every role on it shares it
        chosen = {n for r, n in roles.items() if n.startswith("llama.cpp/") or (r in serve and n.startswith("vllm/"))}
        for role, name in roles.items():
            engine = name.split("/", 1)[0]
            if name in chosen:
                k = serve.get(role, 1)
                if not 1 <= k <= MAX_REPLICAS:
                    raise CraftMDError(f"--serve {role}={k}: replicas must be 1 to {MAX_REPLICAS}")
                if name in by_model:
                    s = by_model[name]
                    s.roles.append(role)
                    s.replicas = max(s.replicas, k)
                    if options.get(role) and options[role] != s.options:
                        raise CraftMDError(
                            f"{s.roles[0]} and {role} share the servers of {name} but give them other --serve-args"
                        )
                    continue
                model = name.split("/", 1)[1]
                if not model:
                    raise CraftMDError(f"--serve {role}: its model {name!r} names no model")
                service = ENGINES[engine]
                taken[service] = taken.get(service, 0) + 1
                if taken[service] > 1:
                    service = f"{service}-{taken[service]}"
                opts = list(options.get(role) or options.get("*") or [])
                ours = [o for o in opts if o.split("=", 1)[0] in OURS[engine]]
                if ours:
                    raise CraftMDError(f"--serve-args {ours[0].split('=', 1)[0]}: the run sets it ({', '.join(OURS[engine])})")
                by_model[name] = Served(engine, model, [role], k, opts, service, _served_name(engine, model))
            elif role in serve:
                raise CraftMDError(
                    f"--serve {role}: its model {name} is not a local model; give llama.cpp/PATH.gguf or vllm/MODEL (a "
                    "model folder or a hub id)"
                )
        self.models = list(by_model.values())
        for s in self.models:
            if s.engine == "llama.cpp":
                path = Path(s.model).expanduser()
                if not path.is_file():
                    raise CraftMDError(f"llama.cpp/{s.model}: no such GGUF file")
                with open(path, "rb") as f:
                    if f.read(4) != b"GGUF":
                        raise CraftMDError(f"llama.cpp/{s.model}: not a GGUF file (it does not start with GGUF)")
                s.model = str(path.absolute())  # as named (a link keeps its name: the name the run calls it by)
                s.sha256 = sha256_file(path)  # what was served, by content (the run record names the file, not its path)
                self.python = llm_python()
            else:
                self.vllm = vllm_executable()
        self.names = {role: s.model_name for s in self.models for role in s.roles}
        idle = sorted(set(options) - set(self.names) - {"*"})
        if idle:
            raise CraftMDError(f"--serve-args {idle[0]}=...: its model {roles[idle[0]]} is not one the run serves")
        for s in self.models:
            s.ports = [free_port() for _ in range(s.replicas)]

    @property
    def env(self) -> dict[str, str]:
        """The servers' variables (``<SERVICE>_BASE_URL``: every replica); their ports are chosen again at :meth:`start`."""
        return {s.variable: ",".join(s.urls) for s in self.models}

    def __bool__(self) -> bool:
        return bool(self.models)

    @property
    def one_at_a_time(self) -> list[str]:
        """The services whose replicas answer one request at a time (llama.cpp's)."""
        return [s.service for s in self.models if s.engine == "llama.cpp"]

    def describe(self) -> dict[str, dict]:
        """model name (as the run calls it) -> what the run record says was served."""
        return {s.model_name: s.describe(self.logs) for s in self.models}

    def _servers(self, s: Served) -> list[ModelServer]:
        logs = s.logs(self.logs)
        if s.engine == "llama.cpp":
            # every llama.cpp server of the run (each model's replicas) takes its part of the CPUs, never all of them
            share = max(1, cpus() // sum(m.replicas for m in self.models if m.engine == "llama.cpp"))
            return [
                LlamaCppServer(
                    Path(s.model),
                    alias=s.name,
                    python=self.python,
                    options=s.options,
                    threads=max(1, share // 2),
                    batch_threads=share,
                    log=log,
                    port=p,
                )
                for p, log in zip(s.ports, logs)
            ]
        found = gpus()
        tp = int(_option(s.options, "--tensor-parallel-size") or _option(s.options, "-tp") or 1)
        share = len(found) < tp * s.replicas  # not a GPU set each: they share what there is
        options = list(s.options)
        if share and s.replicas > 1 and _option(options, "--gpu-memory-utilization") is None:
            options += ["--gpu-memory-utilization", f"{round(0.9 / s.replicas, 4)}"]
        envs = [{} if share else {"CUDA_VISIBLE_DEVICES": ",".join(found[i * tp : (i + 1) * tp])} for i in range(s.replicas)]
        return [
            VLLMServer(s.model, alias=s.name, executable=self.vllm, options=options, env=env, log=log, port=p)
            for p, env, log in zip(s.ports, envs, logs)
        ]

    def start(self) -> None:
        """Start every replica, side by side, and wait until each answers; one that does not: every one is stopped and
        one line says why."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for s in self.models:
            s.ports = [free_port() for _ in range(s.replicas)]  # free now (the run was checked since the plan was made)
            s.servers = self._servers(s)
        every = [x for s in self.models for x in s.servers]
        try:
            with ThreadPoolExecutor(max_workers=len(every)) as pool:
                for done in [pool.submit(x.start) for x in every]:
                    done.result()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for s in self.models:
            for x in s.servers:
                x.stop()


def _served_name(engine: str, model: str) -> str:
    """The name a served model answers to: a GGUF file's name without ``.gguf``, a model folder's name, a hub id."""
    p = Path(model)
    if engine == "llama.cpp" or p.is_dir():
        name = p.name.removesuffix(".gguf") if engine == "llama.cpp" else p.name
    else:
        name = model
    return re.sub(r"[^A-Za-z0-9._/-]", "-", name) or "model"


def serve_args(given: list[str] | None) -> dict[str, list[str]]:
    """``--serve-args [ROLE=]OPTIONS`` (repeatable) -> role (``*``: every served role) -> the options, split as a shell
    splits them; one line for options that do not split."""
    out: dict[str, list[str]] = {}
    for item in given or []:
        m = re.match(r"^([A-Za-z_][\w-]*)=(.*)$", item, re.S)
        role, text = (m.group(1), m.group(2)) if m else ("*", item)
        try:
            out[role] = out.get(role, []) + shlex.split(text)
        except ValueError as exc:
            raise CraftMDError(f"--serve-args {item!r}: {exc}") from None
    return out


__all__ = [
    "ServePlan",
    "Served",
    "ModelServer",
    "LlamaCppServer",
    "VLLMServer",
    "llm_python",
    "vllm_executable",
    "serve_args",
    "gpus",
]
