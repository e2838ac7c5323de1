"""``--serve`` and ``--serve-args``, for every command that calls models: the local models it starts itself.

A model given as a local model (``llama.cpp/PATH.gguf``, always started; ``vllm/MODEL`` with ``--serve ROLE``) is
served by :class:`craftmd.models.serve.ServePlan`: K replicas on free loopback ports, checked ready, pooled, called
``openai-api/<engine>/<name>``, their logs kept beside what the command writes, and stopped when the command ends, fails,
is stopped or is killed. Each command names the models it calls by role (``craftmd generate``: its task's roles;
``craftmd score``: ``grader`` for an ``llm:`` scorer, ``judge`` for a ``judge:`` one, ...), and this module is the one
place that parses the two options, plans the servers (:func:`plan`), and runs them for a block (:func:`serving`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from craftmd import CraftMDError

T = TypeVar("T")


def add_serve_arguments(p: argparse.ArgumentParser, roles: str, logs: str) -> None:
    """``--serve ROLE[=K]`` and ``--serve-args [ROLE=]OPTIONS`` on ``p``; ``roles``: the command's roles, in words;
    ``logs``: where the servers' logs go, in words."""
    p.add_argument(
        "--serve",
        action="append",
        metavar="ROLE[=K]",
        help="start ROLE's local model as K servers (default 1) on free loopback ports, pooled, and stop them when the "
        "command ends or is stopped or killed: ROLE's model is llama.cpp/PATH.gguf (llama.cpp's server; such a model is "
        "always started, --serve sets its replicas) or vllm/MODEL, a model folder or hub id (`vllm serve`, instead of "
        "the offline engine). It is called openai-api/llamacpp/<file name> (or openai-api/vllm/<model>) and recorded "
        f"like any server; roles on one model share its servers. The roles: {roles}. The servers' logs: {logs}. "
        "Repeatable, e.g. --serve ROLE=2",
    )
    p.add_argument(
        "--serve-args",
        action="append",
        metavar="[ROLE=]OPTIONS",
        help="options for the servers --serve starts (every one, or ROLE's), as one string, e.g. --serve-args "
        "'--n_ctx 16384 --n_gpu_layers 99' (llama.cpp; its default window is 16,384) or 'ROLE=--max-model-len 8192' "
        "(vLLM); the model, its name, the host and the port are the command's. Recorded in the run record",
    )


def logs_folder(out: Path | str, command: str | None = None) -> Path:
    """The folder beside ``out`` (what the command writes) that its servers' logs go to: ``OUT.servers`` (``craftmd
    generate``), ``OUT.<command>-servers`` for another command (so a release's own servers' logs are never replaced)."""
    out = Path(out)
    return out.parent / f"{out.name}.{command + '-' if command else ''}servers"


def plan(args: argparse.Namespace, roles: dict[str, str], logs: Path):
    """The local models of ``roles`` (role -> model as given), checked and named, nothing started: (the
    :class:`~craftmd.models.serve.ServePlan`, role -> the name to call its model by), or (None, ``roles``) when the
    command serves none. A model that cannot be served, a ``--serve`` of a role that is not the command's or whose model
    is not local, ``--serve-args`` for no served role: one line."""
    from craftmd.models.serve import ServePlan, serve_args

    serve, given = getattr(args, "serve", None), getattr(args, "serve_args", None)
    if not (serve or given or any(str(m).startswith("llama.cpp/") for m in roles.values())):
        return None, dict(roles)
    if not roles:
        raise CraftMDError(f"--serve{'-args' if given and not serve else ''}: the command calls no model to serve here")
    replicas: dict[str, int] = {}
    for item in serve or []:
        role, eq, k = item.partition("=")
        try:
            replicas[role.strip()] = int(k) if eq else 1
        except ValueError:
            raise CraftMDError(f"--serve {item!r}: expected ROLE or ROLE=K (K a number of replicas)") from None
    served = ServePlan(roles, replicas, serve_args(given), logs)
    if not served:
        raise CraftMDError("--serve-args: no role of the run is served (--serve ROLE, or a llama.cpp/ model)")
    return served, {r: served.names.get(r, m) for r, m in roles.items()}


def concurrency(served, given: dict[str, int]) -> dict[str, int]:
    """The requests in flight per service: ``given`` (``--concurrency SERVICE=N``), and one at a time for the services
    of ``served`` whose replicas answer one at a time (llama.cpp's), unless given."""
    return {**{svc: 1 for svc in (served.one_at_a_time if served else [])}, **given}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside the block (each variable as it was after it)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def serving(served, ready: Callable[[], T] | None = None) -> Iterator[T | None]:
    """Run the block with ``served``'s servers (a :func:`plan`; None: none), started and ready, their variables
    (``<SERVICE>_BASE_URL``) set, and stop them after it, whether it ends, fails or is stopped by a signal (a ``kill
    PID``; a ``kill -9``: each server's guard). ``ready`` (a check of the whole command, with the variables already set)
    runs before any server starts, and what it returns is the block's."""
    if served is None:
        yield ready() if ready else None
        return
    from craftmd.models.local_server import stopped_by_signals

    with environment(served.env), stopped_by_signals():
        out = ready() if ready else None  # the whole command checked (one line) before any server starts
        try:
            served.start()
            os.environ.update(served.env)  # the ports they were started on (the block puts the variables back)
            what = ", ".join(f"{m} ({d['replicas']} x {d['engine']})" for m, d in served.describe().items())
            print(f"serving {what}; logs in {served.logs}", file=sys.stderr)
            yield out
        finally:
            served.stop()


#: The scorers whose name holds the model they call, and the role it plays (``--serve ROLE``).
MODEL_SCORERS = {"llm:": "grader", "judge:": "judge"}


def served_scorers(args: argparse.Namespace, names: list[str] | None, logs: Path):
    """Scorer (or grader) ``names`` whose model is a local one (``llm:llama.cpp/PATH.gguf``, ``judge:vllm/MODEL`` with
    ``--serve judge``) renamed to the names their servers answer to, with their :func:`plan` (None when none is
    served). The roles: ``grader`` for an ``llm:`` scorer, ``judge`` for a ``judge:`` one (``grader-2``, ``judge-2``,
    ... for more)."""
    out = list(names or [])
    roles, at = {}, {}
    for prefix, role in MODEL_SCORERS.items():
        found = [i for i, n in enumerate(out) if n.startswith(prefix)]
        for r, i in zip(numbered(found, role), found):
            roles[r], at[r] = out[i].removeprefix(prefix), (i, prefix)
    served, called = plan(args, roles, logs)
    for r, (i, prefix) in at.items():
        out[i] = prefix + called[r]
    return served, out or names


def numbered(names: list, role: str) -> list[str]:
    """Role names for ``names`` models of one kind: ``role``, ``role-2``, ``role-3``, ..."""
    return [role if i == 0 else f"{role}-{i + 1}" for i in range(len(names))]


__all__ = ["add_serve_arguments", "logs_folder", "plan", "concurrency", "serving", "environment", "numbered", "served_scorers"]
