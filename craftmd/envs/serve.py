"""The environment server: one task's environment on one split behind OpenEnv's own server, one command.

``python -m craftmd.envs.serve TASK [--split test] --options JSON [--port 8000] [--release DIR]``, run by an
interpreter with the ``rl`` extra (``.venv-rl``, ``make rl``): the server side of the GRPO recipe (docs/training.md).
``--options`` is a JSON object of :func:`craftmd.envs.load_environment`'s options (``{"dataset": "out/data",
"patient": "openai-api/sim/MODEL", "max_turns": 2}``); they are checked, and the split opened, before the server
starts (a bad one: one line, exit status 2). Each client session (OpenEnv's WebSocket) plays on an environment of its
own. The server runs until it is stopped (Ctrl-C, SIGTERM); with ``--release DIR`` the finished episodes are then
written as a release (``craftmd score DIR`` gives each episode's reward back): DIR itself when one session played,
``DIR/session-<n>`` for each of several.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from craftmd import CraftMDError


def make_app(task: str, split: str, options: dict, made: list):
    """OpenEnv's app over ``load_environment(task, split, **options)``: the options are checked now (the first
    environment is made here and given to the first session); each environment made is appended to ``made``."""
    from openenv.core.env_server.http_server import create_app

    from . import load_environment
    from .openenv import DoctorAction, DoctorObservation

    if not isinstance(options, dict):
        raise CraftMDError(f"--options must be a JSON object of the environment's options, not {type(options).__name__}")
    first = [load_environment(task, split, **options)]

    def factory():
        made.append(first.pop() if first else load_environment(task, split, **options))
        return made[-1]

    return create_app(factory, DoctorAction, DoctorObservation, env_name=task)


def write_releases(made: list, out: Path) -> list[Path]:
    """The finished episodes as releases: ``out`` when one session played, ``out/session-<n>`` for each of several."""
    played = [env for env in made if env.episodes.episode_rows]
    if len(played) == 1:
        return [played[0].write_release(out)]
    return [env.write_release(out / f"session-{n}") for n, env in enumerate(played, 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m craftmd.envs.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("task", help="the task (craftmd, consultation, encounters)")
    ap.add_argument("--split", default="test", help="test (the benchmark) or train (the task's training cases)")
    ap.add_argument("--options", default="{}", metavar="JSON", help="the environment's options, a JSON object")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    ap.add_argument("--release", type=Path, metavar="DIR", help="write the finished episodes here as a release when stopped")
    a = ap.parse_args(argv)
    made: list = []
    try:
        try:
            options = json.loads(a.options)
        except ValueError as exc:
            raise CraftMDError(f"--options is not JSON: {exc}") from None
        if a.release is not None and a.release.exists():
            raise CraftMDError(f"{a.release} already exists; choose a new folder for the release")
        app = make_app(a.task, a.split, options, made)
    except CraftMDError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")  # until SIGINT or SIGTERM
    if a.release is not None:
        written = write_releases(made, a.release)
        print(f"episodes written to {', '.join(map(str, written)) or 'nothing (no episode finished)'}", file=sys.stderr)
    for env in made:
        env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
