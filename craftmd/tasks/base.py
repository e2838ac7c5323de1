"""What a task is (a dataset, a protocol and its scorers) and the registry the task files register in.

A :class:`Task` names the dataset it poses (:mod:`craftmd.samples`), the experiments its
protocol runs (a declarative table: what each setting × format needs), the conversation
kinds it records, the variant keys its scores carry, and the scorers and metrics that judge
it. A release's run record names its task; the release contract checks the release's
settings, formats and conversation kinds against it, and analysis reads its metrics.

A task names its **protocol**: the :class:`craftmd.generation.runner.Runner` subclass that generates it,
as ``"module:Class"`` (or the class itself, for a task defined outside the package). Adding a protocol is
adding a task file (registered with :func:`register`; a built-in one is imported in :mod:`craftmd.tasks`),
its prompts and, where it needs new ones, its scorers (:mod:`craftmd.scoring.scorers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from craftmd import CraftMDError
from craftmd.registry import Registry


@dataclass(frozen=True)
class Experiment:
    """One cell of a task's experiment matrix and what a sample needs to be posed in it."""

    setting: str
    format: str
    conversation: str | None = None  # the conversation kind it reads (None: no conversation)
    exam: bool = False  # needs the sample's history and exam findings apart
    image: bool = False  # allowed for image samples
    options: str | None = None  # "choices4": the sample's four choices; "diagnoses": the dataset's option list


def parse_matrix(text: str) -> tuple[Experiment, ...]:
    """An experiment matrix written as a whitespace-aligned table (header: setting format conversation
    exam image options; ``-`` for none, ``yes``/``no`` for the flags)."""
    lines = [ln.split() for ln in text.strip().splitlines() if ln.strip()]
    header, rows = lines[0], lines[1:]
    if header != ["setting", "format", "conversation", "exam", "image", "options"]:
        raise CraftMDError(f"experiment matrix header {header} is not: setting format conversation exam image options")
    flag = {"yes": True, "no": False}
    out = []
    for r in rows:
        if len(r) != 6 or r[3] not in flag or r[4] not in flag:
            raise CraftMDError(f"experiment matrix row {' '.join(r)!r} does not fit the header")
        none = lambda x: None if x == "-" else x  # noqa: E731
        out.append(Experiment(r[0], r[1], none(r[2]), flag[r[3]], flag[r[4]], none(r[5])))
    return tuple(out)


@dataclass(frozen=True)
class Table:
    """A release table a task adds besides conversations and answers (e.g. the encounters' patient states)."""

    name: str
    schema: object  # a pyarrow schema
    keys: tuple[str, ...]
    enums: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (column, allowed values)
    optional: tuple[str, ...] = ()  # columns a writer may leave out (filled with nulls)


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    dataset: str  # a registered dataset name
    experiments: tuple[Experiment, ...]
    conversations: tuple[str, ...] = ()
    scorers: tuple[str, ...] = ()  # the scorers `craftmd score` and the leaderboard run on its releases by default
    metrics: tuple[str, ...] = ()  # the metrics its scorers write
    variant_keys: tuple[str, ...] = ("setting", "format", "with_image")
    endings: tuple[str, ...] | None = None  # why a conversation may stop (None: the release's CRAFT-MD endings)
    required_tables: tuple[str, ...] = ("answers",)  # the release tables a release of it must have
    extra_tables: tuple[Table, ...] = ()  # its own tables, declared here
    protocol: object = None  # the generation Runner subclass, or "module:Class" naming it (None: not generated here)

    @property
    def settings(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.setting for e in self.experiments))

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.format for e in self.experiments))

    def experiment(self, setting: str, fmt: str) -> Experiment | None:
        for e in self.experiments:
            if e.setting == setting and e.format == fmt:
                return e
        return None


TASKS: Registry[Task] = Registry("task")


def register(task: Task) -> Task:
    return TASKS.register(task.name, task)


__all__ = ["Task", "Table", "Experiment", "TASKS", "register", "parse_matrix"]
