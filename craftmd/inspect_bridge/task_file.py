"""What a task file needs to run under ``inspect eval``; importing it needs no inspect_ai (the file still serves
``craftmd generate`` without it). A task file's lines::

    from craftmd.inspect_bridge.task_file import inspect_task, task

    @task
    def my_task(**options):
        return inspect_task(TASK, **options)
"""

from __future__ import annotations

from . import require_inspect


def task(fn):
    """inspect's ``@task``, so that ``inspect eval FILE`` finds ``fn`` in a task file; ``fn`` unchanged where inspect_ai
    is not installed."""
    try:
        from inspect_ai import task as register
    except ImportError:
        return fn
    return register(fn)


def inspect_task(task, **options):
    """The inspect task of a craftmd task (a Task, a registered name or a task file), -T ``options`` its options
    (:func:`craftmd.inspect_bridge.tasks.inspect_task`)."""
    require_inspect()
    from .tasks import inspect_task as make

    return make(task, **options)
