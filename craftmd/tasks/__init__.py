"""Tasks: a dataset, a protocol and its scorers, one file per task.

The definitions (:class:`~craftmd.tasks.base.Task`, its experiments and tables, the registry) are in
:mod:`craftmd.tasks.base`; the task files import them from there, and this package imports the task
files, so each registers itself once and nothing imports back: :func:`get_task` looks a task up by name.

A task of your own is one Python file that registers a ``TASK`` (with its protocol, and its scorers where
it needs new ones) and keeps its prompts beside it: ``craftmd generate --task path/to/my_task.py`` loads
it, and every command finds it by name when ``$CRAFTMD_TASKS`` lists its file (``os.pathsep``-separated).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from craftmd import CraftMDError

from . import consultation  # noqa: F401  (registers the consultation task)
from . import diagnosis  # noqa: F401  (registers the CRAFT-MD task)
from . import encounters  # noqa: F401  (registers the patient-led encounters task)
from .base import TASKS, Experiment, Table, Task, parse_matrix, register


def load_task_file(path: str | Path) -> Task:
    """The ``TASK`` a task file registers (the file is run once per process)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise CraftMDError(f"task file {path} does not exist")
    name = f"craftmd_task_{path.stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except CraftMDError:
            del sys.modules[name]
            raise
        except Exception as exc:  # a broken task file: one line, with where
            del sys.modules[name]
            raise CraftMDError(f"task file {path}: {type(exc).__name__}: {exc}") from None
    task = getattr(module, "TASK", None)
    if not isinstance(task, Task):
        raise CraftMDError(f"task file {path} defines no TASK (a craftmd.tasks.Task)")
    return task


def load_task_files() -> list[Task]:
    """The tasks of the task files ``$CRAFTMD_TASKS`` lists (``os.pathsep``-separated), loaded: their scorers and metrics too."""
    return [load_task_file(f) for f in filter(None, os.environ.get("CRAFTMD_TASKS", "").split(os.pathsep))]


def get_task(name: str) -> Task:
    """The task called ``name``, or the one a task file (``*.py``) registers; a name not registered is looked for in
    the task files ``$CRAFTMD_TASKS`` lists."""
    if name.endswith(".py"):
        return load_task_file(name)
    if name not in TASKS:
        load_task_files()
    return TASKS.lookup(name)


__all__ = ["Task", "Table", "Experiment", "TASKS", "register", "get_task", "load_task_file", "load_task_files", "parse_matrix"]
