"""A model server run as a child of this process (a fine-tuned checkpoint's ``transformers serve``, the servers
``craftmd generate --serve`` starts, the tests' llama.cpp).

:class:`LocalServer` starts it in its own process group with its output to a log, waits until it answers, and stops
the whole group: at ``stop()``, at the end of a ``with`` block, when it fails to come up, and at the interpreter's exit.
The server runs under a guard (:mod:`craftmd.models.guard`) that stops the group when this process is gone, however it
ended (a ``kill -9`` runs no handler): no server outlives the run that started it. :func:`stopped_by_signals` turns a
SIGTERM or SIGHUP into ``SystemExit``, so a ``finally`` stops the servers at once.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from craftmd import CraftMDError


#: The guard every server runs under (:mod:`craftmd.models.guard`), run as a script: it imports nothing of the package.
GUARD = Path(__file__).with_name("guard.py")


@contextlib.contextmanager
def stopped_by_signals():
    """SIGTERM and SIGHUP (a user's ``kill PID``, the terminal closing) raise ``SystemExit`` (128 + the signal) inside the
    block, as Ctrl-C raises ``KeyboardInterrupt``: a server started in a session of its own, which no signal to this
    process reaches, is then stopped by the caller's ``finally`` rather than by its guard a moment later."""

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    before = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """The process (group) of one server: a subclass gives ``start()`` (which calls :meth:`launch`), ``log`` (its log's
    path) and ``start_timeout`` (seconds)."""

    proc: subprocess.Popen | None = None
    log: Path
    start_timeout: float
    #: Seconds the server gets to stop after SIGTERM before its group is killed.
    stop_wait: float = 10.0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, command: list[str], ready: Callable[[], bool], *, what: str, error=CraftMDError, **popen) -> None:
        """Start ``command`` (``popen``: ``cwd``, ``env``) and wait until ``ready()`` holds (an ``OSError`` from it: not
        yet); a server that exits first or does not answer within ``start_timeout`` is stopped and ``error`` raised,
        naming ``what`` and the log's last lines."""
        guarded = [sys.executable, str(GUARD), str(os.getpid()), *command]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                guarded, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, **popen
            )
        atexit.register(self.stop)  # whatever happens to the caller, the server goes with the interpreter
        try:
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise error(f"{what} exited with {self.proc.returncode}: {self.log_tail()}")
                try:
                    if ready():
                        return
                except OSError:
                    pass
                time.sleep(0.25)
            raise error(f"{what} did not answer within {self.start_timeout:.0f} s: {self.log_tail()}")
        except BaseException:  # a server that never came up (or a Ctrl-C while waiting) is stopped too
            self.stop()
            raise

    def log_tail(self, n: int = 3) -> str:
        """The log's last ``n`` lines that are not blank, joined by `` | ``."""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()] if self.log.exists() else []
        return " | ".join(lines[-n:])

    def stop(self) -> None:
        """Stop the server's whole process group (idempotent)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(self.stop_wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:  # already gone (its group too)
            proc.poll()

    def start(self) -> LocalServer:
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["LocalServer", "free_port", "stopped_by_signals", "GUARD"]
