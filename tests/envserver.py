"""A task's environment behind OpenEnv's server (``python -m craftmd.envs.serve``), run by the RL side venv for the GRPO
smoke test and bench: :class:`EnvServer` starts it on a free loopback port, waits for its ``/health``, and stops it
(SIGTERM: the server then writes the episodes as the release ``release``)."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.request
from pathlib import Path

from craftmd.models.local_server import LocalServer, free_port

ROOT = Path(__file__).resolve().parent.parent
#: The server's program: this checkout's craftmd (the side venv's editable install may point at another checkout).
PROGRAM = (
    "import sys; sys.path.insert(0, {tests!r}); import openenv_episodes; "
    "from craftmd.envs.serve import main; sys.exit(main(sys.argv[1:]))"
)


def rl_python() -> Path:
    """The RL side venv's interpreter (``make rl``); a missing one is an error naming the command that installs it."""
    python = ROOT / ".venv-rl" / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError("the RL side venv is missing: run `make rl` (.venv-rl)")
    return python


class EnvServer(LocalServer):
    """``load_environment(task, split, **options)`` served by OpenEnv; ``with EnvServer(...) as s: s.url``."""

    stop_wait = 120.0  # seconds after SIGTERM: the server writes its episodes' release before it exits

    def __init__(self, task: str, split: str, options: dict, *, release: Path | None = None, env: dict | None = None):
        self.task, self.split, self.options, self.release = task, split, options, release
        self.env = {**os.environ, **(env or {})}
        self.log = Path(tempfile.mkdtemp(prefix="craftmd-envserver-")) / "server.log"
        self.start_timeout = 300.0
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EnvServer:
        self.port = free_port()
        command = [str(rl_python()), "-c", PROGRAM.format(tests=str(ROOT / "tests")), self.task, "--split", self.split]
        command += ["--options", json.dumps(self.options, default=str), "--port", str(self.port)]
        command += ["--release", str(self.release)] if self.release else []
        self.launch(command, self._healthy, what="the environment server", error=RuntimeError, cwd=ROOT, env=self.env)
        return self

    def _healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
            return r.status == 200
