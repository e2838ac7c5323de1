"""The tasks as environments to train a doctor in: ``load_environment(task=…, split=…, **options)``.

The episode logic is library-independent (:mod:`craftmd.envs.core`: reset/step over the task's own runner,
patient and scorers; :mod:`craftmd.envs.splits`: the benchmark and the training cases); :mod:`craftmd.envs.openenv`
adapts it to OpenEnv (``pip install craftmd[rl]``), the library the environments are served with. Nothing here is
imported by ``import craftmd``, and nothing of an RL library is imported before :func:`load_environment` is called.
"""

from __future__ import annotations


def load_environment(task: str, split: str = "test", **options):
    """An OpenEnv environment of ``task`` (a task posed as one, :attr:`craftmd.tasks.Task.environment`) on ``split`` (``test``: the
    benchmark; ``train``: the task's training cases, :mod:`craftmd.envs.splits`). ``options``: ``dataset`` (the built
    dataset folder, or packets folder for encounters; required), ``patient`` (required), ``solver`` (consultation),
    ``judge`` (encounters), ``grader``, ``reward_weights``, ... (:class:`craftmd.envs.core.Options`)."""
    from .core import episodes

    core = episodes(task, split, **options)  # bad inputs: one line, before the library is needed
    from .openenv import DoctorEnvironment

    return DoctorEnvironment(core)


__all__ = ["load_environment"]
