"""The package's own tasks, registered on import, and :func:`get_task`, the one lookup of a task by name.

The task files import the definitions of :mod:`craftmd.tasks`; this module imports the task files
(the package itself imports none of them, so nothing imports back).
"""

from __future__ import annotations

from . import TASKS, Task
from . import consultation  # noqa: F401  (registers the consultation task)
from . import diagnosis  # noqa: F401  (registers the CRAFT-MD task)
from . import encounters  # noqa: F401  (registers the patient-led encounters task)


def get_task(name: str) -> Task:
    return TASKS.lookup(name)


__all__ = ["get_task"]
