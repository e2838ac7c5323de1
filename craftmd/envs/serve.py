"""The environment server: one task's environment on one split, served by OpenEnv over HTTP and WebSocket.

``python -m craftmd.envs.serve TASK [--split test] --options JSON [--port 0] [--release DIR]``, where the ``rl`` extra is
installed (``make rl``: ``.venv-rl``). ``--options`` is a JSON object of :func:`craftmd.envs.load_environment`'s options
(``{"dataset": "out/data", "patient": "openai-api/sim/MODEL"}``); they are checked, and the split opened, before the
server starts (a bad one: one line, exit 2). Once it listens it prints one line, ``serving TASK on SPLIT at URL``, the
URL with the port it bound (``--port 0``: a free one).

It is OpenEnv's own server (``create_app``): every WebSocket session plays on an environment of its own, and they all
share one :class:`~craftmd.envs.core.Ledger`, so a case played by several sessions at once (a GRPO group) is its next
trial in each, and the episodes of every session make one release. ``GET /split`` answers what is served: the task, the
split and its cases in episode order (``reset(seed=i)`` poses case ``i``), from which a client such as the verifiers
environment (``environments/craftmd_verifiers``) builds its tasks. When the server is stopped (SIGTERM or SIGINT) with
``--release DIR``, it writes every finished episode there as one release (``craftmd score DIR`` gives the episodes'
rewards back); no finished episode is one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from craftmd import CraftMDError


class Served:
    """The environments of one task, split and options: the first is made (and checked) at once and answers ``/split``;
    :meth:`make` makes one more, on the same ledger, for each session."""

    def __init__(self, task: str, split: str, options: dict):
        from .core import Ledger, episodes

        if not isinstance(options, dict):
            raise CraftMDError(f"--options must be a JSON object of the environment's options, not {type(options).__name__}")
        self.task, self.split, self.options = task, split, options
        self.ledger = Ledger()
        self.first = episodes(task, split, ledger=self.ledger, **options)  # bad options, a split not built: one line
        self.made: list = []
        self._lock = threading.Lock()

    def make(self):
        from .core import episodes
        from .openenv import DoctorEnvironment

        env = DoctorEnvironment(episodes(self.task, self.split, ledger=self.ledger, **self.options))
        with self._lock:
            self.made.append(env)
        return env

    def describe(self) -> dict:
        first = self.first
        return {"task": self.task, "split": self.split, "cases": [first.case_id(i) for i in range(len(first))]}

    def write_release(self, out: Path, overwrite: bool = False) -> Path:
        """Every session's finished episodes as one release (the record's call counts are every session's)."""
        from craftmd.models.calls import Counts

        tallies = self.first.runner.tallies
        with self._lock:
            for env in self.made:
                for agent, counts in env.episodes.runner.tallies.items():
                    tallies.setdefault(agent, Counts()).merge(counts)
        return self.first.write_release(out, overwrite=overwrite)


def app(served: Served, sessions: int = 16):
    """OpenEnv's app over ``served`` (``create_app``, at most ``sessions`` at once), with ``GET /split``."""
    from openenv.core.env_server.http_server import create_app

    from .openenv import DoctorAction, DoctorObservation

    api = create_app(served.make, DoctorAction, DoctorObservation, env_name=served.task, max_concurrent_envs=sessions)
    api.add_api_route("/split", served.describe, methods=["GET"], summary="The task, the split and its cases")
    return api


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m craftmd.envs.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("task", help="the task (craftmd, consultation, encounters)")
    parser.add_argument("--split", default="test", help="test (the benchmark) or train (the task's training cases)")
    parser.add_argument("--options", default="{}", help="the environment's options, a JSON object")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: a free port (the line it prints names it)")
    parser.add_argument("--sessions", type=int, default=16, help="the most sessions (episodes in play) at once")
    parser.add_argument("--release", type=Path, help="write every finished episode here as a release when stopped")
    parser.add_argument("--overwrite", action="store_true", help="replace --release if it exists")
    args = parser.parse_args(argv)
    try:
        try:
            options = json.loads(args.options)
        except json.JSONDecodeError as exc:
            raise CraftMDError(f"--options is not JSON: {exc}") from None
        if args.release is not None and args.release.exists() and not args.overwrite:
            raise CraftMDError(f"{args.release} exists: pass --overwrite to replace it")
        if args.sessions < 1:
            raise CraftMDError(f"--sessions must be at least 1, not {args.sessions}")
        served = Served(args.task, args.split, options)
        api = app(served, args.sessions)
    except CraftMDError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(api, host=args.host, port=args.port, log_level="warning"))

    def announce() -> None:
        while not server.started and not server.should_exit:
            threading.Event().wait(0.05)
        if server.started:
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            print(f"serving {args.task} on {args.split} at http://{host}:{port}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    # uvicorn shuts down on SIGTERM or SIGINT, then raises the signal again for the handler it found: this one lets the
    # release be written after it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if args.release is None:
        return 0
    try:
        out = served.write_release(args.release, overwrite=args.overwrite)
    except CraftMDError as exc:
        print(f"error: {exc}; no release written", file=sys.stderr)
        return 1
    print(f"wrote {len(served.ledger.episode_rows)} episodes to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
