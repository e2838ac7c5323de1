"""The package's environment server as this environment starts it: ``python -m craftmd.envs.serve`` in a process group of
its own, with the Python where ``craftmd[rl]`` is installed; stopped at the end of the run (SIGTERM: it then writes its
release), or at exit."""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from typing import Any

import httpx

logger = logging.getLogger("craftmd_verifiers")

#: The variable naming the Python that runs the server where ``python=`` does not.
PYTHON_VAR = "CRAFTMD_PYTHON"


class ServerError(RuntimeError):
    """The environment server could not be started, reached or stopped cleanly (one line)."""


class Server:
    """``python -m craftmd.envs.serve TASK --split SPLIT --options JSON --port 0 [--release DIR]``, serving once it says
    so (its first line names its URL); its output goes to this package's log."""

    def __init__(self, python: str, task: str, split: str, options: dict[str, Any], release: str | None, timeout: float):
        argv = [python, "-m", "craftmd.envs.serve", task, "--split", split, "--options", json.dumps(options), "--port", "0"]
        if release:
            argv += ["--release", release]
        self.release = release
        try:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        except OSError as exc:
            raise ServerError(f"cannot start the environment server with {python}: {exc}") from None
        self.said: deque[str] = deque(maxlen=20)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, None), daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise ServerError(f"the environment server did not start within {timeout:g} s") from None
            if line is None:
                code = self.proc.wait()
                raise ServerError(f"the environment server exited ({code}) before serving: {self.last_words()}")
            if line.startswith("serving "):
                self.url = line.rsplit(" ", 1)[-1]
                break

    def _read(self, stream, lines: queue.Queue | None) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            self.said.append(line)
            logger.info("environment server: %s", line)
            if lines is not None:
                lines.put(line)
        if lines is not None:
            lines.put(None)

    def last_words(self) -> str:
        """Its last line of error (``error: ...``), else its last line."""
        errors = [line for line in self.said if line.startswith("error:")]
        return (errors or list(self.said) or ["(nothing)"])[-1]

    def stop(self, timeout: float = 300.0) -> int:
        """SIGTERM to its process group (it writes its release, then exits); SIGKILL after ``timeout`` s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


#: The servers this process started, by what they serve (one per task, split, options and release).
_servers: dict[str, Server] = {}
_lock = threading.Lock()


def started(python: str | None, task: str, split: str, options: dict, release: str | None, timeout: float) -> Server:
    """The server of ``task`` on ``split`` with ``options``, started on first use."""
    python = python or os.environ.get(PYTHON_VAR)
    if not python:
        raise ServerError(
            f"name the Python where craftmd[rl] is installed (it runs the environment server): python= or ${PYTHON_VAR}"
        )
    key = json.dumps([python, task, split, options, release], sort_keys=True)
    with _lock:
        if key not in _servers:
            _servers[key] = Server(python, task, split, options, release, timeout)
        return _servers[key]


def stop_all() -> list[str]:
    """Stop every server this process started; the one-line failures (a release that was asked for and not written)."""
    failures = []
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        code = server.stop()
        if code != 0 and server.release:
            failures.append(f"the environment server wrote no release to {server.release} (exit {code}): {server.last_words()}")
    return failures


atexit.register(stop_all)


def served(url: str) -> dict:
    """What a running server serves (``GET /split``): its task, split and cases in episode order."""
    try:
        answer = httpx.get(f"{url.rstrip('/')}/split", timeout=30)
        answer.raise_for_status()
        info = answer.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ServerError(f"{url} is not a craftmd environment server (GET /split: {exc})") from None
    if not isinstance(info, dict) or not isinstance(info.get("cases"), list):
        raise ServerError(f"{url} is not a craftmd environment server (GET /split answered {str(info)[:80]!r})")
    return info
