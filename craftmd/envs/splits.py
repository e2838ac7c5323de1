"""The splits an environment poses: ``test`` is the benchmark itself, ``train`` the task's training cases.

A training split is posed by the benchmark's own runner and scorers, from a view of the dataset folder
(:class:`Split`, :func:`open_split`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from craftmd import CraftMDError

SPLITS = ("test", "train")


@dataclass
class Split:
    """What a split gives the runner: the folder it reads (``dataset``) and, for a view, the temporary folder holding it.

    Each task's runner reads its cases from a built dataset folder, in the benchmark's own configs (split ``test``). A
    training split is posed by the same runner and scored by the same scorers, from a **view**: a folder of the
    environment's own (temporary, kept while the environment lives) in which the training cases stand where the
    benchmark's would, in the benchmark's columns. Each task makes its own view (:attr:`craftmd.tasks.Environment.train`,
    in its folder's ``environment.py``), with the helpers below.
    """

    dataset: Path
    config: str | None
    view: tempfile.TemporaryDirectory | None = None
    cases: int = 0  # the training cases the view holds (0: the benchmark)


def train_file(dataset: Path, config: str) -> Path:
    return Path(dataset) / config / "train-00000-of-00001.parquet"


def environment_task(name: str):
    """The task called ``name``, when it is posed as an environment (:attr:`craftmd.tasks.Task.environment`); else one line."""
    from craftmd.tasks import builtin_tasks, get_task, in_order

    task = get_task(name) if isinstance(name, str) and name in builtin_tasks() else None
    if task is None or task.environment is None:
        known = [t.name for t in in_order(builtin_tasks()) if t.environment is not None]
        raise CraftMDError(f"unknown task {name!r} for an environment; known: {', '.join(known)}")
    return task


def open_split(task, split: str, dataset: Path | str) -> Split:
    """The folder ``task``'s (a :class:`craftmd.tasks.Task` posed as an environment, or its name) runner and scorers read
    for ``split`` (one line when it is not built or not disjoint):
    ``test`` the benchmark's config (:attr:`craftmd.tasks.Environment.config`) or the task's own test split
    (:attr:`craftmd.tasks.Environment.test`), ``train`` the task's own view (:attr:`craftmd.tasks.Environment.train`).

    The training cases of a task that poses the benchmark's dataset are checked, when the environment is made, against
    every registered task's test cases in the same dataset folder (its own required:
    :func:`craftmd.dataset_builder.golden.benchmark_texts`): no training id is a benchmark id, and no training vignette is
    a benchmark case by the golden build's decontamination rule (:func:`craftmd.dataset_builder.golden.check_disjoint`);
    a case that is one is refused with one line naming it.
    """
    from craftmd.dataset import config_file

    if split not in SPLITS:
        raise CraftMDError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    if isinstance(task, str):
        task = environment_task(task)
    env = task.environment
    dataset = Path(dataset)
    if not dataset.is_dir():
        raise CraftMDError(f"dataset {dataset} does not exist: run {build_command(task, split, dataset)}")
    if split == "test" and env.test is not None:  # cases read in place (a pinned source), not a built config
        return env.test(task, dataset)
    if split == "train" and env.train is None:
        raise CraftMDError(f"the {task.name} environment has no training split; its split is 'test'")
    if split == "test":
        config = env.config or "packets"
        if not config_file(dataset, config).exists():
            raise CraftMDError(
                f"split 'test' of {task.name} (config {config}) is not built in {dataset}: run {build_command(task, split, dataset)}"
            )
        return Split(dataset, env.config)
    return env.train(task, dataset)


def build_command(task, split: str, dataset: Path) -> str:
    """The command that builds ``task``'s data for ``split`` (:attr:`craftmd.tasks.Environment.build`)."""
    train = " --split train --against BENCHMARK_PACKETS" if split == "train" else ""
    return task.environment.build.format(dataset=dataset, train=train)


def train_source(task, dataset: Path, config: str) -> Path:
    """The training split's file of ``config`` in ``dataset`` (one line, with the command that builds it, when it is not built)."""
    path = train_file(dataset, config)
    if not path.exists():
        raise CraftMDError(
            f"split 'train' of {task.name} (config {config}) is not built in {dataset}: run {build_command(task, 'train', dataset)}"
        )
    return path


def new_view(prefix: str) -> tempfile.TemporaryDirectory:
    """A view's folder: temporary, kept while the environment lives."""
    return tempfile.TemporaryDirectory(prefix=f"craftmd-env-{prefix}-")


def link(view: Path, config: str, source: Path) -> None:
    """``source`` standing as ``config`` of the view (a link, not a copy)."""
    from craftmd.dataset import config_file

    target = config_file(view, config)
    target.parent.mkdir(parents=True)
    target.symlink_to(source.resolve())


__all__ = ["Split", "open_split", "environment_task", "train_source", "new_view", "link", "train_file", "build_command", "SPLITS"]
