"""Tasks: a dataset, a protocol and its scorers, one file per task.

The definitions (:class:`~craftmd.tasks.base.Task`, its experiments and tables, the registry) are in
:mod:`craftmd.tasks.base`; the task files import them from there, and this package imports the task
files, so each registers itself once and nothing imports back: :func:`get_task` looks a task up by name.
"""

from __future__ import annotations

from . import consultation  # noqa: F401  (registers the consultation task)
from . import diagnosis  # noqa: F401  (registers the CRAFT-MD task)
from . import encounters  # noqa: F401  (registers the patient-led encounters task)
from .base import TASKS, Experiment, Table, Task, parse_matrix, register


def get_task(name: str) -> Task:
    return TASKS.lookup(name)


__all__ = ["Task", "Table", "Experiment", "TASKS", "register", "get_task", "parse_matrix"]
