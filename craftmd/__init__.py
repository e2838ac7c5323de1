"""CRAFT-MD: conversational clinical reasoning benchmark for LLMs.

The shared ground (this folder) holds what every room meets at: the release contract and
its run record (:mod:`craftmd.release`), samples and the dataset registry
(:mod:`craftmd.samples`), tasks (:mod:`craftmd.tasks`: dataset + protocol + scorers, one file
each), the metric registry (:mod:`craftmd.metrics`), the model layer (:mod:`craftmd.models`:
providers, calls, the request cache) and the pinned-source reader; above the rooms, the jobs
that run across them (:mod:`craftmd.commands.leaderboard`, :mod:`craftmd.commands.submit`, the CLI).

The rooms install under this namespace and import each other in one direction only
(``tests/test_imports.py``): ``craftmd.dataset_builder`` (pinned source -> dataset),
``craftmd.generation`` (tasks posed to models -> releases), ``craftmd.scoring`` (releases ->
scores), ``craftmd.analysis`` (scores -> tables, figures, the page; it only reads) and
``craftmd.cards`` (templates).
"""

__version__ = "0.1.0"


class CraftMDError(Exception):
    """An error the user can act on. The CLI prints it as one line, no traceback."""


def cpus() -> int:
    """The CPUs this process may run on (its affinity: ``taskset``, a cgroup's cpuset), not the machine's count."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
