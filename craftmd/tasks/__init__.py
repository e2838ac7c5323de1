"""Tasks: a dataset, a protocol with its roles and options, its prompts and scorers; one folder per task.

The definitions (:class:`~craftmd.tasks.base.Task`, :class:`~craftmd.tasks.base.Role`, the registry) are in
:mod:`craftmd.tasks.base`. The built-in tasks are the packages :data:`BUILTIN` names (``diagnosis/``,
``consultation/``, ``encounters/``), imported when first looked up (:func:`get_task`), so that nothing below
them imports them. A task of your own is one Python file that registers a ``TASK`` and keeps its prompts beside
it: ``craftmd generate --task path/to/my_task.py`` loads it; ``$CRAFTMD_TASKS`` lists such files for every command.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from craftmd import CraftMDError

from .base import TASKS, Analysis, Environment, Experiment, Measure, NoOptions, Role, Table, Task, parse_matrix, register

#: The built-in tasks: name -> the package that registers it (imported on first use).
BUILTIN = {
    "craftmd": "craftmd.tasks.diagnosis",
    "consultation": "craftmd.tasks.consultation",
    "encounters": "craftmd.tasks.encounters",
    "agentclinic": "craftmd.tasks.agentclinic",
}

#: The task a command runs when none is named (``craftmd generate`` without ``--task``): the benchmark's own.
DEFAULT = "craftmd"

#: The task files loaded in this process: task name -> (the file, the sha256 of its bytes). A release of a task of
#: one's own records that hash, and is read only by the same file (:func:`craftmd.release.release_task`).
TASK_FILES: dict[str, tuple[Path, str]] = {}


def load_task_file(path: str | Path) -> Task:
    """The ``TASK`` a task file registers (the file is run once per process). Only a file the user named runs:
    ``--task FILE.py`` on the command line or ``$CRAFTMD_TASKS``; never a name read from a release or a log."""
    import hashlib

    path = Path(path).resolve()
    if not path.is_file():
        raise CraftMDError(f"task file {path} does not exist")
    name = f"craftmd_task_{path.stem}"
    module = sys.modules.get(name)
    digest = None
    if module is None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()  # the bytes that run, hashed before they run
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except CraftMDError:
            del sys.modules[name]
            raise
        except (Exception, SystemExit) as exc:  # a broken task file (or one that exits): one line, with where
            del sys.modules[name]
            what = f"exits ({type(exc).__name__}: {exc.code})" if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
            raise CraftMDError(f"task file {path}: {what}") from None
    task = getattr(module, "TASK", None)
    if not isinstance(task, Task):
        raise CraftMDError(f"task file {path} defines no TASK (a craftmd.tasks.Task)")
    if digest is not None or task.name not in TASK_FILES:
        TASK_FILES[task.name] = (path, digest or hashlib.sha256(path.read_bytes()).hexdigest())
    return task


def load_task_files() -> list[Task]:
    """The tasks of the task files ``$CRAFTMD_TASKS`` lists (``os.pathsep``-separated), loaded: their scorers and metrics too."""
    return [load_task_file(f) for f in filter(None, os.environ.get("CRAFTMD_TASKS", "").split(os.pathsep))]


def builtin_tasks() -> dict[str, Task]:
    """Every built-in task, registered (their packages imported), and those of ``$CRAFTMD_TASKS``: the registry, full."""
    for module in BUILTIN.values():
        importlib.import_module(module)
    load_task_files()
    return TASKS


def get_task(name: str) -> Task:
    """The task called ``name``, or the one a task file (``*.py``) registers; a name not registered is looked for in
    the built-in tasks, then in the task files ``$CRAFTMD_TASKS`` lists. For a name the user gave (``--task``); a
    release's task is :func:`craftmd.release.release_task`, which never runs a file the release names."""
    if name.endswith(".py"):
        return load_task_file(name)
    if name not in TASKS and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if name not in TASKS:
        builtin_tasks()
    return TASKS.lookup(name)


def declaring(what: str) -> Task:
    """The one registered task that declares ``what`` (a flag of :class:`Task`: ``upstream``, ``submissions``): the task
    the pinned upstream's results, or the submitted answers, belong to. None or two is one line."""
    found = [t for t in builtin_tasks().values() if getattr(t, what)]
    if len(found) != 1:
        raise CraftMDError(f"{len(found)} tasks declare {what} ({', '.join(t.name for t in found) or 'none'}); one must")
    return found[0]


def in_order(names) -> list[Task]:
    """The tasks called ``names`` (each once): the built-in ones in :data:`BUILTIN`'s order, then the others by name. The
    order of the page's sections and boards."""
    rank = {n: i for i, n in enumerate(BUILTIN)}
    return [get_task(n) for n in sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))]


__all__ = [
    "Task",
    "Analysis",
    "Measure",
    "Environment",
    "in_order",
    "declaring",
    "DEFAULT",
    "Table",
    "Experiment",
    "Role",
    "NoOptions",
    "TASKS",
    "BUILTIN",
    "register",
    "get_task",
    "builtin_tasks",
    "load_task_file",
    "load_task_files",
    "parse_matrix",
    "TASK_FILES",
]
