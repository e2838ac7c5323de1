"""What a task is (a dataset, a protocol and its scorers) and the registry the task files register in.

A :class:`Task` names the dataset it poses (:mod:`craftmd.samples`), the experiments its
protocol runs (a declarative table: what each setting × format needs), the conversation
kinds it records, the variant keys its scores carry, and the scorers and metrics that judge
it. A release's run record names its task; the release contract checks the release's
settings, formats and conversation kinds against it, and analysis reads its metrics.

A task links its **protocol** (the :class:`craftmd.generation.runner.Runner` subclass that generates it) by
import, and declares the protocol's **roles** (:class:`Role`: the models it calls) and **options** (a pydantic
model: ``craftmd generate -T key=value``), so the command line and the run spec are derived from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

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
class Role:
    """A model a protocol calls: ``--role NAME=provider/model`` (``--doctor``, ``--patient`` for those two).
    ``default``: the role whose model it reuses when it is not given (the summarizer: the patient's)."""

    name: str
    help: str
    required: bool = True
    default: str | None = None


@dataclass(frozen=True)
class Measure:
    """A column of a board, declared once: the templates loop over the declared columns.

    In :attr:`Analysis.measures`, one of a task's headline measures: a column of its table on the board per task
    (:mod:`craftmd.analysis.boards`), its values the rows of :attr:`Analysis.board` that name it. In
    :attr:`Analysis.columns`, a column of the page's main board: the accuracy of the answers in ``setting`` and
    ``format`` graded by ``grader`` (None: the board's grader for the format, :class:`craftmd.analysis.view.View`)."""

    name: str
    label: str
    percent: bool = True  # a share, shown as a percentage (else a score shown as it is)
    setting: str | None = None  # a main board column's cell: the setting, format and grader of its accuracy
    format: str | None = None
    grader: str | None = None


@dataclass(frozen=True)
class Analysis:
    """What a task brings to an analysis (``craftmd analyse``, the leaderboard): each part its folder's own, each
    optional. The analysis calls the hooks over the releases of the task, in the registry's order of tasks.

    * ``main``: its releases are the page's main board (accuracy by setting and format, its tests, figures and sections);
    * ``unscored``: its releases are analysed before they are scored (their own tables: conversations, states);
    * ``tables(inputs)``: its tables, name -> polars frame (``inputs``: :class:`craftmd.analysis.tables.TaskInputs`),
      written as ``tables/<name>.csv``; its SQL files sit in its folder (``sql/``);
    * ``figures(a, view, folder)``: its figures, drawn into ``folder``;
    * ``section(a, view)``: its page section's data (None: no section), filled into ``<template>.html.j2`` and
      ``<template>.md.j2`` in its folder, linked from the page's navigation as ``nav`` (anchor ``anchor``);
    * ``measures`` and ``board(a, view)``: its columns on the board per task, in order (the first ranks it), and its rows
      there (dicts of ``release``, ``measure``, ``value``, ``ci_low``, ``ci_high``, ``n_cases``, ``n_failed``; a row of
      an undeclared measure is an error), headed ``label``;
    * ``columns``: a ``main`` task's columns on the page's main board, in order (each a :class:`Measure` with a
      ``setting`` and ``format``): the first is the leading one, which ranks the board.
    """

    main: bool = False
    unscored: bool = False
    tables: Callable | None = None
    figures: Callable | None = None
    section: Callable | None = None
    template: str | None = None
    nav: str | None = None
    anchor: str | None = None
    measures: tuple[Measure, ...] = ()
    board: Callable | None = None
    label: str | None = None
    columns: tuple[Measure, ...] = ()


@dataclass(frozen=True)
class Environment:
    """How a task is posed as a training environment (:mod:`craftmd.envs`): its roles and options are the task's own (its
    required roles must be bound; the environment's ``max_turns``, ``max_messages``, ``memory_tags`` go to the options it
    has); the rest is declared here, in its folder.

    * ``experiment``: the experiment an episode poses, ``setting:format`` (None: the task has one);
    * ``reward``: the reward's default weights by ``scorer/metric`` (``{grader}``: the grader named by ``grader=``);
    * ``judged``: its reward is the rubric judge's (``judge=``; weights ``judge/...``), not its answers' scorers';
    * ``config``: the dataset config its test split poses (None: its dataset's only one, ``packets``);
    * ``test(dataset)``: its test split, where its cases are not a config of a built dataset (a pinned source it reads
      in place): a :class:`craftmd.envs.splits.Split` of the folder its runner reads (None: the dataset's ``config``);
    * ``train(dataset)``: its training split, a view of the dataset folder (a :class:`craftmd.envs.splits.Split`; None:
      it has none); ``train_config``: the dataset config that view reads; ``train_prompt``: the doctor's system prompt its training
      dialogues carry, where the dataset's builder writes them (the golden consultations');
    * ``build``: the command that builds its data, with ``{dataset}`` and ``{train}`` (the training split's options).
    """

    reward: tuple[tuple[str, float], ...]
    experiment: str | None = None
    judged: bool = False
    config: str | None = None
    test: Callable | None = None
    train: Callable | None = None
    train_config: str | None = None
    train_prompt: Path | None = None
    build: str = "craftmd build --out {dataset}"


class NoOptions(BaseModel):
    """The options of a task that has none."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    dataset: str  # a registered dataset name
    experiments: tuple[Experiment, ...]
    conversations: tuple[str, ...] = ()
    patient_led: tuple[str, ...] = ()  # the conversation kinds that open with the patient's initial request (not the doctor)
    scorers: tuple[str, ...] = ()  # the scorers `craftmd score` and the leaderboard run on its releases by default
    metrics: tuple[str, ...] = ()  # the metrics its scorers write
    variant_keys: tuple[str, ...] = ("setting", "format", "with_image")
    endings: tuple[str, ...] | None = None  # why a conversation may stop (None: the release's CRAFT-MD endings)
    required_tables: tuple[str, ...] = ("answers",)  # the release tables a release of it must have
    extra_tables: tuple[Table, ...] = ()  # its own tables, declared here
    protocol: type | None = None  # the generation Runner subclass (None: not generated here)
    roles: tuple[Role, ...] = ()  # the models its protocol calls, in the order the run record lists them
    options: type[BaseModel] = NoOptions  # its protocol's options (fields with defaults; -T key=value)
    prompt_labels: tuple[tuple[str, str], ...] = ()  # (prompt set, what the page calls a release run with it)
    #: the settings the analysis tests against each other (McNemar, per model and between models), in the order the
    #: tests list their sides; () none (a task whose analysis compares its settings its own way)
    paired_settings: tuple[str, ...] = ()
    folder: Path | None = None  # its folder: its page section's templates, its SQL (None: a task file's own folder)
    analysis: Analysis = Analysis()  # what it brings to an analysis beyond the accuracy of its answers
    environment: Environment | None = None  # how it is posed as a training environment (None: it is not)
    #: the texts of its test cases by case id, ``cases(dataset_dir) -> {case_id: text}``, or None where ``dataset_dir``
    #: does not hold them (built elsewhere); one line where it holds them broken. What the overlap between benchmarks
    #: compares and every training split is kept apart from (:mod:`craftmd.overlap`); a task whose cases come from a pinned
    #: source may read them there and ignore the folder. None: it declares no cases (the overlap says so)
    cases: Callable | None = None
    upstream: bool = False  # the pinned upstream source's recorded results are releases of it (craftmd ingest)
    submissions: bool = False  # it takes submitted answers (craftmd submit, scoring/submission.schema.json)
    #: the comparability version of its protocol, recorded in every release it makes (craftmd.release.Protocol): bumped
    #: by every change that moves its scores (CHANGELOG.md, "Changes that move scores"); releases of two versions are
    #: never ranked together
    version: int = 1

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

    def parse_options(self, given: BaseModel | dict | None = None) -> BaseModel:
        """The task's options from ``given``: an instance of its options class, or a dict of values (strings, as ``-T``
        gives them, or typed). An unknown key or a bad value is one line naming it."""
        if isinstance(given, self.options):
            return given
        if given is not None and not isinstance(given, dict):
            kind = type(given).__name__
            raise CraftMDError(f"task {self.name!r}: options must be a {self.options.__name__} or a dict, not {kind}")
        given = dict(given or {})
        known = list(self.options.model_fields)
        unknown = [k for k in given if k not in known]
        if unknown:
            raise CraftMDError(f"task {self.name!r} has no option {unknown[0]!r}; its options: {', '.join(known) or 'none'}")
        try:
            return self.options.model_validate(given)  # lax: "20" is 20, "false" is False
        except ValidationError as exc:
            e = exc.errors()[0]
            key = str(e["loc"][0]) if e["loc"] else "?"
            raise CraftMDError(f"task {self.name!r}: option {key}={given.get(key)!r}: {e['msg']}") from None

    def protocol_options(self, options: BaseModel) -> dict[str, str | int]:
        """The options of ``options`` (this task's, :meth:`parse_options`) that are part of its protocol's identity
        (declared with ``json_schema_extra={"protocol": True}``) and not at their default: what
        :class:`craftmd.release.Protocol` records, so that runs that asked the doctor differently are not ranked as one."""
        out = {}
        for name, f in type(options).model_fields.items():
            value = getattr(options, name)
            if (f.json_schema_extra or {}).get("protocol") and value != f.get_default(call_default_factory=True):
                out[name] = value
        return out

    def bind_roles(self, given: dict[str, str | None]) -> dict[str, str]:
        """role -> model for every role of the task: the ``given`` ones, a default role's model where one is not given.
        An unknown role, or a required one left unbound, is one line."""
        names = [r.name for r in self.roles]
        for name, model in given.items():
            if model and name not in names:
                raise CraftMDError(f"task {self.name!r} has no role {name!r}; its roles: {', '.join(names)}")
        out: dict[str, str] = {}
        for r in self.roles:
            model = given.get(r.name) or (out.get(r.default) if r.default else None)
            if model:
                out[r.name] = model
            elif r.required:
                how = f"--{r.name} MODEL" if r.name in ("doctor", "patient") else f"--role {r.name}=MODEL"
                raise CraftMDError(f"the {self.name} task needs a {r.name} ({r.help}): {how}")
        return out


TASKS: Registry[Task] = Registry("task")


def register(task: Task) -> Task:
    return TASKS.register(task.name, task)


__all__ = [
    "Task",
    "Table",
    "Experiment",
    "Role",
    "NoOptions",
    "Analysis",
    "Measure",
    "Environment",
    "TASKS",
    "register",
    "parse_matrix",
]
