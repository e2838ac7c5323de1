"""craftmd inside the inspect_ai ecosystem (``pip install craftmd[inspect]``).

* :mod:`.tasks`: every craftmd task under ``inspect eval`` through one factory, :func:`inspect_task`: the built-in
  ``craftmd/craftmd``, ``craftmd/consultation``, ``craftmd/encounters`` (the ``inspect_ai`` entry point) and any task
  file that exposes itself with :mod:`.task_file`'s ``@task`` (``inspect eval my_task.py -T key=value``).
* :mod:`.logs`: ``craftmd ingest --inspect LOG…`` (logs → a release) and ``craftmd export RELEASE --inspect DIR``.

inspect_ai is imported only when one of these is used: a task file imports this package without it.
"""

#: Where a sample's store keeps the release rows it produced, and a score's metadata its score rows.
STORE_KEY = "craftmd"


def _tasks() -> tuple[str, ...]:
    from craftmd.tasks import BUILTIN

    return tuple(f"craftmd/{name}" for name in BUILTIN)


#: The package's tasks as inspect names them (``inspect eval craftmd/craftmd``): every built-in task.
TASKS = _tasks()


def require_inspect():
    """inspect_ai, or one line saying how to install it."""
    from craftmd import CraftMDError

    try:
        import inspect_ai
    except ImportError:
        raise CraftMDError("inspect-ai is not installed: pip install 'craftmd[inspect]'") from None
    return inspect_ai
