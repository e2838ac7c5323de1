"""The release: the one contract every part of the package meets at.

A release is a folder (conversations, answers, scores and the run record): upstream results are ingested into it, new
models generated into it, submissions scored into it, and analysis only ever reads it (:class:`Release`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer

from craftmd import CraftMDError, __version__
from craftmd.atomic import atomic_dir, atomic_write_json, inside, locked, plain_name, read_regular, sha256_file
from craftmd.tasks import TASK_FILES, TASKS, Task, builtin_tasks

if TYPE_CHECKING:
    import polars as pl

SCHEMA_VERSION = 2


#: Why a conversation stopped.
ENDINGS = ("final_diagnosis", "no_question", "max_turns", "refusal", "error")
#: What became of an answer request.
ANSWER_STATUS = ("ok", "missing", "non_text", "refusal", "error")
#: Whether a score was produced: ``ok`` (value set) or ``error`` (value null, detail says why).
SCORE_STATUS = ("ok", "error")

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])

CONVERSATIONS_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("trial", pa.int16()),
        ("conversation", pa.string()),
        ("with_image", pa.bool_()),
        ("messages", pa.list_(MESSAGE)),
        ("summary", pa.string()),
        ("n_turns", pa.int16()),  # doctor turns (assistant messages)
        ("ended", pa.string()),
        ("error", pa.string()),  # why the conversation failed (ended = error): HTTP status, code, message; else null
    ]
)
#: The variant keys of CRAFT-MD's answer-level scores, in key order: an answer's key besides its case and trial.
ANSWER_VARIANT = pa.schema([("setting", pa.string()), ("format", pa.string()), ("with_image", pa.bool_())])
ANSWERS_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("trial", pa.int16()),
        *ANSWER_VARIANT,
        ("response", pa.string()),  # null when status != ok
        ("status", pa.string()),
        ("error", pa.string()),  # why the answer failed (status refusal/error): HTTP status, code, message; else null
    ]
)
#: The columns every scores table has; any other column is one of the task's variant keys.
SCORE_COLUMNS = pa.schema(
    [
        ("case_id", pa.string()),  # the sample's opaque id
        ("trial", pa.int16()),  # null for a score of the case as a whole (an expert's rating of a case, not of one trial)
        ("scorer", pa.string()),  # e.g. paper, strict, upstream-gpt4, offline, llm:openai/gpt-4o
        ("metric", pa.string()),  # a name of craftmd.metrics.METRICS
        ("value", pa.float64()),  # null when status != ok
        ("label", pa.string()),  # what the scorer resolved (a choice, a diagnosis), or null
        ("detail", pa.string()),  # the scorer's own record, JSON text, or null
        ("status", pa.string()),  # ok | error
    ]
)
VARIANT_TYPES = (pa.string(), pa.bool_(), pa.int16(), pa.int32(), pa.int64())
#: The most trials a release may hold (trial numbers 0..62), the one limit every command checks (generate --trials,
#: validate and submit, ingest, merge, analyse): the paired tests keep a case's trials as the bits of a signed 64-bit
#: integer (analysis/sql/case_scores.sql), whose sign bit is no trial.
MAX_TRIALS = 63
#: A score a release did not compute but was told (an ingested log's scores): scorer ``claimed:<name>``, kept for
#: comparison with the score computed again, never read as a score (the analysis and :meth:`Release.verdicts` skip it).
CLAIM_PREFIX = "claimed:"
SCHEMAS = {"conversations": CONVERSATIONS_SCHEMA, "answers": ANSWERS_SCHEMA}
KEYS = {
    "conversations": ["case_id", "trial", "conversation", "with_image"],
    "answers": ["case_id", "trial", *ANSWER_VARIANT.names],
}


def enums(task: Task) -> dict[str, dict[str, tuple[str, ...]]]:
    """The values each table's enum columns may take in a release of ``task``."""
    return {
        "conversations": {"conversation": task.conversations, "ended": task.endings or ENDINGS},
        "answers": {"setting": task.settings, "format": task.formats, "status": ANSWER_STATUS},
        **{t.name: dict(t.enums) for t in task.extra_tables},
    }


def _table_spec(name: str, task: Task) -> tuple[pa.Schema, list[str], tuple[str, ...]]:
    """(schema, key columns, optional columns) of release table ``name`` for ``task``."""
    for t in task.extra_tables:
        if t.name == name:
            return t.schema, list(t.keys), t.optional
    return SCHEMAS[name], KEYS[name], OPTIONAL[name]


#: Columns a writer may leave out: they are filled with nulls.
OPTIONAL = {"conversations": ("error",), "answers": ("error",)}
PARQUET_OPTIONS = dict(compression="zstd", compression_level=9, use_dictionary=True, write_statistics=True)
SCORES_FILE = "scores.parquet"
SCORERS_METADATA = b"craftmd.scorers"
#: What a release folder holds (its marker first): ``--overwrite`` replaces a folder only when it is a release and holds
#: nothing else (:func:`craftmd.atomic.atomic_dir`), never a folder of releases or one with other files in it.
RELEASE_OWNS = ("manifest.json",)
RELEASE_HOLDS = ("manifest.json", "*.parquet")


def natural_key(sample_id: str) -> tuple:
    """Sort key for opaque sample ids: digit runs compare as numbers (``case_9`` < ``case_10``)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", sample_id) if p)


def _sort(table: pa.Table, keys: list[str], what: str) -> pa.Table:
    """Sort by key (sample ids in natural order) and refuse duplicate keys."""
    ids = table.column("case_id").to_pylist()
    rank = {c: i for i, c in enumerate(sorted(set(ids), key=natural_key))}
    keyed = table.append_column("__n", pa.array([rank[c] for c in ids], pa.int64()))
    keyed = keyed.sort_by([("__n", "ascending")] + [(k, "ascending") for k in keys[1:]])
    dup = keyed.select(keys).group_by(keys, use_threads=False).aggregate([([], "count_all")])
    if dup.num_rows != keyed.num_rows:
        raise CraftMDError(f"{what}: duplicate rows for the key {keys}")
    return keyed.drop_columns(["__n"])


def _check_enums(table: pa.Table, enums: dict, what: str) -> None:
    for col, allowed in enums.items():
        values = {v for v in table.column(col).unique().to_pylist() if v is not None}
        bad = sorted(values - set(allowed))
        if bad:
            raise CraftMDError(f"{what}.{col}: unknown value(s) {bad}; allowed {list(allowed)}")


def conform(name: str, table: pa.Table, task: Task) -> pa.Table:
    """Check a table against its schema and ``task``'s enums, cast it, and sort it by key."""
    if name == "scores":
        return conform_scores(table)
    schema, keys, optional = _table_spec(name, task)
    for col in optional:
        if col not in table.column_names:
            table = table.append_column(pa.field(col, schema.field(col).type), pa.nulls(table.num_rows, schema.field(col).type))
    missing = [f.name for f in schema if f.name not in table.column_names]
    extra = [c for c in table.column_names if c not in schema.names]
    if missing or extra:
        raise CraftMDError(f"{name}: columns missing {missing}, unexpected {extra}")
    try:
        table = table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise CraftMDError(f"{name}: does not fit the release schema: {exc}") from None
    _check_enums(table, enums(task)[name], name)
    for col in keys:
        if table.column(col).null_count:
            raise CraftMDError(f"{name}.{col}: key column has nulls")
    check_trials(table, name)
    return _sort(table, keys, name)


def check_trials(table: pa.Table, what: str) -> None:
    """A one-line error when a table's ``trial`` numbers leave 0..MAX_TRIALS-1 (:data:`MAX_TRIALS`)."""
    if "trial" not in table.column_names or not table.num_rows:
        return
    lo, hi = pc.min_max(table.column("trial")).values()
    lo, hi = lo.as_py(), hi.as_py()
    if lo is not None and (lo < 0 or hi >= MAX_TRIALS):
        raise CraftMDError(
            f"{what}: trial {lo if lo < 0 else hi} is out of range: trials are numbered 0..{MAX_TRIALS - 1} "
            f"(at most {MAX_TRIALS} trials a release)"
        )


def variant_keys(table: pa.Table | pa.Schema) -> list[str]:
    """A scores table's variant keys: its columns besides :data:`SCORE_COLUMNS`, in their order."""
    names = table.names if isinstance(table, pa.Schema) else table.column_names
    return [c for c in names if c not in SCORE_COLUMNS.names]


def _codes(column: pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
    """A text column as its distinct values and each row's index into them (a dictionary column as it is read)."""
    col = column.combine_chunks() if column.num_chunks else pa.array([], pa.string())
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    return col.dictionary, col.indices


def _words(column: pa.ChunkedArray) -> frozenset[str]:
    """The distinct texts of a text column (nulls left out)."""
    words, at = _codes(column)
    return frozenset(w for w in words.take(pc.unique(at)).to_pylist() if isinstance(w, str))


def score_row_problem(table: pa.Table) -> str | None:
    """The first row of a scores table that no scorer writes, said in words (``row 7: ...``), or None: a status
    outside :data:`SCORE_STATUS` (``OK`` is not ``ok``), a value that is not there exactly when the status is ``ok``,
    or a value outside its metric's declared range and kind (NaN and infinities never are). Checked column by column,
    so that every read of a scores file can afford it."""
    from craftmd.metrics import metric

    status, value, names = (table.column(c) for c in ("status", "value", "metric"))
    value = value.combine_chunks() if value.num_chunks else pa.array([], pa.float64())
    words, at = _codes(status)
    known = pc.fill_null(pc.is_in(words, pa.array(SCORE_STATUS)).take(at), False)
    has = pc.is_valid(value)
    bad = pc.or_(pc.invert(known), pc.not_equal(pc.fill_null(pc.equal(words, "ok").take(at), False), has))
    uniq, at = _codes(names)
    defs = {m: metric(m) for m in uniq.to_pylist() if m is not None}
    low, high, binary, ordinal = (  # typed: an empty table (or one of no named metric) gives no null-typed column
        pa.array([None if m is None else f(defs[m]) for m in uniq.to_pylist()], type=t).take(at)
        for f, t in (
            (lambda d: float(d.low), pa.float64()),
            (lambda d: float(d.high), pa.float64()),
            (lambda d: d.kind == "binary", pa.bool_()),
            (lambda d: d.kind == "ordinal", pa.bool_()),
        )
    )
    fits = pc.and_(pc.greater_equal(value, low), pc.less_equal(value, high))
    fits = pc.and_(fits, pc.or_(pc.invert(binary), pc.or_(pc.equal(value, 0.0), pc.equal(value, 1.0))))
    fits = pc.and_(fits, pc.or_(pc.invert(ordinal), pc.equal(pc.floor(value), value)))
    bad = pc.or_(bad, pc.and_(has, pc.invert(pc.fill_null(fits, False))))
    i = pc.index(bad, True).as_py()
    if i < 0:
        return None
    s, v, m = status[i].as_py(), value[i].as_py(), names[i].as_py()
    if s not in SCORE_STATUS:
        return f"row {i}: status {s!r} is not one of {list(SCORE_STATUS)}"
    if (s == "ok") != (v is not None):
        return f"row {i}: status {s!r} with value {v!r} (a value exactly when status is ok)"
    d = defs[m]
    return f"row {i}: {v!r} is not a valid value of metric {m!r} ({d.kind}, {d.low}..{d.high})"


def conform_scores(table: pa.Table) -> pa.Table:
    """Check a scores table: base columns typed, metrics registered, values in range, one row per key.

    ``scores.parquet`` has one row per (case, trial, variant keys, scorer, metric): ``value``
    is a double whose meaning the metric registry (:mod:`craftmd.metrics`) declares, null
    when ``status`` says the score could not be produced (a failed grader call is never a
    verdict). The variant keys are the task's own columns (CRAFT-MD's ``setting``,
    ``format``, ``with_image``; a conversation-level metric's ``conversation``): any column
    besides :data:`SCORE_COLUMNS` is a variant key. Each scorer's record (identity, the
    inputs it scored, counts) travels in the file's own metadata, so a re-run can tell a
    current score from a stale one.
    """

    missing = [f.name for f in SCORE_COLUMNS if f.name not in table.column_names]
    if missing:
        raise CraftMDError(f"scores: columns missing {missing}")
    variant = variant_keys(table)
    for v in variant:
        if table.schema.field(v).type not in VARIANT_TYPES and table.schema.field(v).type != pa.null():
            raise CraftMDError(f"scores.{v}: a variant key must be text, a flag or an integer, not {table.schema.field(v).type}")
    try:
        base = table.select(SCORE_COLUMNS.names).cast(SCORE_COLUMNS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise CraftMDError(f"scores: does not fit the release schema: {exc}") from None
    cols = {n: base.column(n) for n in SCORE_COLUMNS.names}
    for v in variant:
        col = table.column(v)
        cols[v] = col.cast(pa.string()) if col.type == pa.null() else col
    order = ["case_id", "trial", *variant, "scorer", "metric", "value", "label", "detail", "status"]
    table = pa.table({n: cols[n] for n in order})
    _check_enums(table, {"status": SCORE_STATUS}, "scores")
    for col in ("case_id", "scorer", "metric", "status"):
        if table.column(col).null_count:
            raise CraftMDError(f"scores.{col}: key column has nulls")
    problem = score_row_problem(table)
    if problem:
        raise CraftMDError(f"scores {problem}")
    check_trials(table, "scores")
    return _sort(table, ["case_id", "trial", *variant, "scorer", "metric"], "scores")


#: The role whose model is under test: never part of a protocol (every other role is).
UNDER_TEST = "doctor"
_SHA256 = r"^[0-9a-f]{64}$"


class PromptRef(BaseModel):
    """A prompt set as a run record names it: its name and the sha256 over its prompts (null: not known)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    sha256: str | None = Field(None, pattern=_SHA256)


class GraderRef(BaseModel):
    """The grader whose labels came with a release (upstream's recorded ones): its scorer, model and prompts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    model: str | None = Field(None, max_length=200)
    prompt_set: PromptRef | None = None


class Protocol(BaseModel):
    """What a release's numbers depend on besides the model under test: the protocol it ran. Releases are ranked
    together only when their protocols are equal; :func:`protocol_differences` says, in words, why two are not.

    ``roles``: every role but the doctor (the model under test, :data:`UNDER_TEST`): the patient, summarizer, solver,
    ... whose models shape what the doctor reads. ``images``: whether the doctor was shown cases' images (CRAFT-MD's
    NEJM image jobs, upstream's multimodal path): an image run is another experiment than a text run, never ranked
    with one. ``answer_rules``: the MCQ rules (name -> version) its answers are graded by. ``grader``: only the grader whose labels came with the release (upstream's recorded GPT-4 labels); a
    release graded after it was made names none here, since every grader of its scores, with its prompts' sha256, is
    in its scorer records and the board compares free response per grader (a cell names its grader, and the paired
    tests never cross graders): two releases graded by one grader are comparable on that grader's measure.
    ``options``: the task's options that change what the doctor is asked (declared so in its options class,
    :func:`craftmd.tasks.base.protocol_options`), each only where it is not its default (CRAFT-MD's ``answer_order``):
    absent, the default, so a record written before it stays the protocol it was, and is written without it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    task: str = Field(min_length=1, max_length=200)
    version: int | None = Field(None, ge=0)  # the task's comparability version (Task.version); null: not recorded
    prompt_set: PromptRef | None = None
    roles: dict[str, str] = Field(default_factory=dict)  # role -> provider/model, every role but the doctor
    images: bool = False  # the doctor was shown cases' images (an image run)
    answer_rules: dict[str, int] = Field(default_factory=dict)  # MCQ rule -> its version
    trials: int | None = Field(None, ge=1, le=MAX_TRIALS)
    grader: GraderRef | None = None
    options: dict[str, str | int] = Field(default_factory=dict)  # task option -> value, those not at their default only

    @model_serializer(mode="wrap")
    def _without_default_options(self, handler):
        d = handler(self)
        if not d.get("options"):  # every option at its default: the protocol's bytes (its key, its record) as before
            d.pop("options", None)
        return d

    def key(self) -> str:
        """The protocol as one line of JSON (its recorded grader left out: free response is compared per grader): two
        releases are ranked together exactly when their keys are equal (:func:`protocol_differences` is empty)."""
        return json.dumps(self.model_dump(mode="json", exclude={"grader"}), sort_keys=True, separators=(",", ":"))


def _prompt_ref(prompt_set: dict | None) -> PromptRef | None:
    """A run record's ``prompt_set`` ({name, sha256, ...}) as a :class:`PromptRef` (None when it names none)."""
    if not isinstance(prompt_set, dict) or not prompt_set.get("name"):
        return None
    return PromptRef(name=prompt_set["name"], sha256=prompt_set.get("sha256"))


def run_protocol(
    task: Task,
    prompt_set: dict | None,
    roles: dict[str, str],
    trials: int | None,
    answer_rules: dict[str, int],
    images: bool = False,
    options: dict[str, str | int] | None = None,
) -> Protocol:
    """The protocol of a run of ``task`` (its version) with ``prompt_set`` ({name, sha256}), ``roles`` (role ->
    provider/model: the doctor's is left out), ``trials``, ``answer_rules`` (the MCQ rules and their versions,
    :func:`craftmd.scoring.mcq.answer_rules`: a room's, which the ground does not import), ``images`` (whether a
    job showed the doctor a case's image) and ``options`` (the task's options of the protocol not at their default,
    :func:`craftmd.tasks.base.protocol_options`)."""
    return Protocol(
        task=task.name,
        version=task.version,
        prompt_set=_prompt_ref(prompt_set),
        roles={r: m for r, m in sorted(roles.items()) if r != UNDER_TEST},
        images=images,
        answer_rules=answer_rules,
        trials=trials,
        options=dict(sorted((options or {}).items())),
    )


def protocol_of(manifest: RunRecord) -> Protocol | None:
    """The protocol a release ran: the one its run record holds, or, for a record written before protocols were
    recorded, what it says of one (task, prompt set, roles, trials; the version not known); None: unknown (a
    submission that states none)."""
    if manifest.protocol is not None or manifest.kind == "submission":
        return manifest.protocol
    names = {r.name for r in TASKS[manifest.task].roles} if manifest.task in TASKS else None
    roles = {a: r.get("model") for a, r in manifest.roles.items() if isinstance(r, dict) and isinstance(r.get("model"), str)}
    trials = manifest.counts.get("trials")
    try:
        return Protocol(
            task=manifest.task,
            prompt_set=_prompt_ref(manifest.prompt_set),
            roles={a: m for a, m in sorted(roles.items()) if a != UNDER_TEST and (names is None or a in names)},
            trials=trials if type(trials) is int else None,
        )
    except ValidationError:  # what the old record says is not a protocol: unknown
        return None


def _pair(what: str, ours, theirs) -> str:
    return f"{what} {ours if ours is not None else 'not recorded'} vs {theirs if theirs is not None else 'not recorded'}"


def protocol_differences(p: Protocol | None, reference: Protocol | None, graders: bool = False) -> list[str]:
    """Why a release of protocol ``p`` is not comparable with one of ``reference``, in words (e.g. "prompt set
    craftmd-v1 ≠ craftmd-upstream-3bb2737", "3 trials vs 5"); empty exactly when their keys (:meth:`Protocol.key`) are
    equal. ``graders``: the recorded graders too, where both record one ("grader prompts differ"); the board leaves
    them out, since it compares free response per grader (a cell names its grader; no paired test crosses graders)."""
    if p is None:
        return [] if reference is None else ["unknown protocol (the release states none)"]
    if reference is None:
        return ["the reference's protocol is unknown"]
    out = []
    if p.task != reference.task:
        out.append(f"task {p.task} ≠ {reference.task}")
    if p.version != reference.version:
        out.append(_pair(f"{p.task} version", p.version, reference.version))
    a, b = p.prompt_set, reference.prompt_set
    if a is None or b is None:
        if a != b:
            out.append(_pair("prompt set", a and a.name, b and b.name))
    elif a.name != b.name:
        out.append(f"prompt set {a.name} ≠ {b.name}")
    elif a.sha256 != b.sha256:
        sha = lambda x: f"{x[:12]}…" if x else "not recorded"  # noqa: E731
        out.append(f"prompt set {a.name} differs (sha256 {sha(a.sha256)} vs {sha(b.sha256)})")
    for role in sorted(set(p.roles) | set(reference.roles)):
        if p.roles.get(role) != reference.roles.get(role):
            out.append(_pair(role, p.roles.get(role), reference.roles.get(role)))
    if p.images != reference.images:
        shown = lambda x: "images shown to the doctor" if x.images else "text only"  # noqa: E731
        out.append(f"{shown(p)} vs {shown(reference)}")
    if p.answer_rules != reference.answer_rules:
        rules = lambda d: ", ".join(f"{k} v{v}" for k, v in sorted(d.items())) or None  # noqa: E731
        out.append(_pair("MCQ rules", rules(p.answer_rules), rules(reference.answer_rules)))
    if p.trials != reference.trials:
        out.append(f"{p.trials or 'unrecorded'} trials vs {reference.trials or 'unrecorded'}")
    for key in sorted(set(p.options) | set(reference.options)):  # absent: the option's default
        if p.options.get(key) != reference.options.get(key):
            out.append(f"-T {key}={p.options.get(key, 'default')} vs {reference.options.get(key, 'default')}")
    g, h = p.grader, reference.grader
    if graders and g is not None and h is not None and g != h:  # a release graded after it was made names none
        if g.name != h.name or g.model != h.model:
            out.append(f"grader {g.name} ({g.model}) ≠ {h.name} ({h.model})")
        if g.prompt_set != h.prompt_set:
            out.append("grader prompts differ")
    return out


class RunRecord(BaseModel):
    """What produced a release (``manifest.json``). Sorted keys, no timestamps, no paths, never a secret.

    ``roles`` maps each agent (doctor, patient, grader, solver, judge, ...) to its
    provider/model, the server it was called at (``base_url``) and its sampling settings.
    ``producer`` holds what a machine reads back (ingest version, rule versions); ``notes``
    is prose for people only.
    """

    model_config = ConfigDict(extra="forbid")

    release: str  # the release id, e.g. "gpt4_1106"
    kind: Literal["upstream", "generated", "submission"]
    model: str  # provider/model under test, or upstream's name
    task: str  # the task (craftmd.tasks) whose protocol produced it: a registered name, never a file
    task_sha256: str | None = None  # a task of one's own: the sha256 of the task file that produced it (release_task)
    display_name: str | None = None
    dataset: dict = Field(default_factory=dict)  # {"name": ..., "sha256": ...} of the dataset files it was made from
    source: dict = Field(default_factory=dict)  # Source.describe() of the pinned upstream, or the submission's provenance
    roles: dict[str, dict] = Field(default_factory=dict)  # agent -> {model, base_url, sampling}
    prompt_set: dict | None = None  # {"name": ..., "sha256": ...}
    protocol: Protocol | None = None  # the protocol it ran (absent: not recorded; protocol_of derives what it can)
    sampling: dict | None = None  # temperature, max_tokens, seed, ... per agent
    seed: int | None = None
    models: dict = Field(default_factory=dict)  # agent -> provider/model (doctor, patient, ...)
    producer: dict = Field(default_factory=dict)
    dependencies: dict[str, str] = Field(default_factory=dict)  # versions of the key packages
    git_revision: str | None = None
    counts: dict = Field(default_factory=dict)
    notes: dict = Field(default_factory=dict)
    files: dict = Field(default_factory=dict)  # filled by write_release
    schema_version: int = SCHEMA_VERSION
    package: dict = Field(default_factory=lambda: {"name": "craftmd", "version": __version__})

    @field_validator("release")
    @classmethod
    def _plain_id(cls, v: str) -> str:  # a release id names files and folders (export's logs): one name inside its folder
        if not plain_name(v):
            raise ValueError(
                f"the release id {ascii(v)[:80]} is not a plain name (no separators, no '..', no control characters)"
            )
        return v

    @field_validator("task")
    @classmethod
    def _task_name(cls, v: str) -> str:  # a release names its task; a file is run only when the user names it
        if not plain_name(v) or v.endswith(".py"):
            raise ValueError(f"the task {ascii(v)[:80]} is not a task name (a release names a registered task, never a file)")
        return v

    @field_validator("files")
    @classmethod
    def _plain_files(cls, v: dict) -> dict:  # every file a release lists is one of its own, inside its folder
        bad = [k for k in v if not plain_name(k)]
        if bad:
            raise ValueError(f"the file name {ascii(bad[0])[:80]} is not a plain name inside the release's folder")
        return v

    def to_json(self) -> str:
        d = self.model_dump(mode="json")
        if d["task_sha256"] is None:  # a built-in task: the run record as before
            del d["task_sha256"]
        if d["protocol"] is None:  # none recorded (a record written before protocols were, a submission stating none)
            del d["protocol"]
        return json.dumps(d, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @field_validator("files")
    @classmethod
    def _file_entries(cls, files: dict) -> dict:
        """Each file's entry: its sha256 (64 hex digits) and, if given, its row count."""
        for name, entry in files.items():
            sha = entry.get("sha256") if isinstance(entry, dict) else None
            rows = entry.get("rows") if isinstance(entry, dict) else None
            if (
                not isinstance(sha, str)
                or not re.fullmatch(r"[0-9a-f]{64}", sha)
                or (rows is not None and (type(rows) is not int or rows < 0))
            ):
                raise ValueError(f'the entry of {name!r} is not {{"sha256": 64 hex digits, "rows": a count}}')
        return files

    @classmethod
    def from_dict(cls, d: dict, where: str = "run record") -> RunRecord:
        """The run record ``d`` (a manifest's JSON object); one line naming ``where`` and the first problem when it is not one."""
        if not isinstance(d, dict):
            raise CraftMDError(f"{where}: invalid run record: a JSON object expected, not {type(d).__name__}")
        try:
            return cls.model_validate(d)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(x) for x in first["loc"])
            raise CraftMDError(f"{where}: invalid run record: {loc}: {first['msg'].removeprefix('Value error, ')}") from None


DEPENDENCIES = ("openai", "datasets", "duckdb", "pyarrow", "polars", "vllm")


def release_task(manifest: RunRecord, where: Path | str | None = None) -> Task:
    """The task of a release, resolved without running anything the release names: a built-in task, or one whose
    file the user named (``--task FILE.py``, ``$CRAFTMD_TASKS``) and whose bytes have the sha256 the release records.
    Anything else is refused in one line."""
    name = manifest.task
    at = f"{where}: " if where is not None else ""
    if name not in TASKS:
        builtin_tasks()
    if name not in TASKS:
        raise CraftMDError(
            f"{at}unknown task {name!r}: a release's task runs only when you name its file "
            f"(--task FILE.py or $CRAFTMD_TASKS); known: {', '.join(sorted(TASKS))}"
        )
    file, sha = TASK_FILES.get(name, (None, None))
    if sha != manifest.task_sha256:
        if sha is None:
            raise CraftMDError(
                f"{at}the release records a task file (sha256 {manifest.task_sha256[:12]}…) for {name!r}, "
                "which is built in here; refused"
            )
        made = f"one with sha256 {manifest.task_sha256[:12]}…" if manifest.task_sha256 else "a file it records no hash of"
        raise CraftMDError(
            f"{at}task {name!r}: the task file {file} (sha256 {sha[:12]}…) is not the one that made this release "
            f"({made}); name the same file"
        )
    return TASKS[name]


def dependency_versions(names: tuple[str, ...] = DEPENDENCIES) -> dict[str, str]:
    """The installed versions of the key packages (those installed), for the run record."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            pass
    return out


def git_revision() -> str | None:
    """The package checkout's git commit (with ``-dirty`` when it has uncommitted changes), if any."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if rev.returncode:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def write_release(
    out: Path | str,
    manifest: RunRecord,
    tables: dict[str, pa.Table],
    overwrite: bool = False,
    scores: tuple[pa.Table, dict] | None = None,
) -> Path:
    """Write a release atomically: ``tables`` maps conversations/answers to arrow tables.

    ``scores`` (a scores table and its scorer records) is written beside them when given;
    a record's ``inputs`` get the hash of the answers file written here (``answers_sha256``).

    Writing is atomic (a temporary sibling swapped in whole, :mod:`craftmd.atomic`), one writer
    at a time (a lock beside the folder: concurrent scorers all keep their rows), and deterministic: rows are
    sorted by key, sample ids in natural order (``case_9`` before ``case_10``), parquet
    options fixed, and the manifest holds no timestamps, local paths or secrets. A release
    written by an older schema is refused with a message that says how to rebuild it.
    """
    out = Path(out)
    if manifest.task_sha256 is None:  # a task of one's own: the release records the hash of the file that made it
        if manifest.task not in TASKS:
            builtin_tasks()
        manifest.task_sha256 = TASK_FILES.get(manifest.task, (None, None))[1]
    task = release_task(manifest)
    unknown = set(tables) - set(SCHEMAS) - {t.name for t in task.extra_tables}
    if unknown:
        raise CraftMDError(f"unknown release table(s) {sorted(unknown)}")
    for name in task.required_tables:
        if name not in tables:
            raise CraftMDError(f"a release of task {task.name} needs {name}")
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    conformed = {name: conform(name, t, task) for name, t in tables.items()}
    if not manifest.dependencies:  # the code writing the release records what it ran on
        manifest.dependencies = dependency_versions()
    if manifest.git_revision is None:
        manifest.git_revision = git_revision()
    with locked(out), atomic_dir(out, overwrite=overwrite, owns=RELEASE_OWNS, holds=RELEASE_HOLDS) as tmp:
        files = {}
        for name, table in sorted(conformed.items()):
            path = tmp / f"{name}.parquet"
            pq.write_table(table, path, **PARQUET_OPTIONS)
            files[path.name] = {"sha256": sha256_file(path), "rows": table.num_rows}
        if scores is not None:
            answers_sha = files.get("answers.parquet", files.get("conversations.parquet", {})).get("sha256")
            records = {g: dict(r, inputs=dict(r.get("inputs") or {}, answers_sha256=answers_sha)) for g, r in scores[1].items()}
            data = encode_scores(scores[0], records)
            (tmp / SCORES_FILE).write_bytes(data)
            files[SCORES_FILE] = _file_entry(data)
            note_made_here(files[SCORES_FILE]["sha256"], records)
        manifest.files = dict(sorted(files.items()))
        (tmp / "manifest.json").write_text(manifest.to_json())
    return out


def _file_entry(data: bytes) -> dict:
    """A scores file's entry in the manifest's checksums: its sha256 and row count."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "rows": pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows}


def encode_scores(table: pa.Table, records: dict) -> bytes:
    """A scores table, checked and sorted, with its scorer records in the metadata, as parquet bytes."""
    table = conform_scores(table)
    meta = {SCORERS_METADATA: json.dumps(dict(sorted(records.items())), sort_keys=True, ensure_ascii=False).encode()}
    table = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **PARQUET_OPTIONS)
    return sink.getvalue().to_pybytes()


#: This machine's note of the scores it made: ``$CRAFTMD_CACHE/scores-made-here/<sha256 of a scores file>.json``, the
#: scorer names whose rows in that file were computed (or ingested from the pinned source, or recomputed and found equal)
#: here. A scores file that arrived from elsewhere has no note: its deterministic scorers are recomputed before anything
#: ranks them (:func:`craftmd.scoring.score.check_made_here`).
MADE_HERE = "scores-made-here"


def _made_here_path(sha: str) -> Path:
    from craftmd.source import cache_dir

    return cache_dir() / MADE_HERE / f"{sha}.json"


def made_here(release: Release) -> set[str]:
    """The scorer names whose rows in ``release``'s scores file this machine computed or checked (none when unnoted)."""
    info = release.manifest.files.get(SCORES_FILE)
    if not info or not re.fullmatch(r"[0-9a-f]{64}", str(info.get("sha256"))):
        return set()
    try:
        names = json.loads(_made_here_path(info["sha256"]).read_bytes())
    except (OSError, ValueError):
        return set()
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def note_made_here(sha: str, names) -> None:
    """Note that the rows of scorers ``names`` in the scores file of sha256 ``sha`` were computed or checked here."""
    atomic_write_json(_made_here_path(sha), sorted(set(names)))


def write_scores(release: Release, new: pa.Table, records: dict[str, dict], drop=()) -> Path:
    """Add (or replace) scorers' rows in ``release``'s scores; conversations and answers stay as written.

    Every scorer named in ``records`` has its old rows replaced by its rows in ``new``; the scorers named in ``drop``
    lose their rows and records (those :func:`craftmd.scoring.score.sender_claims` keeps as claims under another name);
    other scorers' rows and records are kept. One writer at a time (:func:`craftmd.atomic.locked`):
    the scores are read again under the lock, so concurrent scorers of one release all keep
    their rows. The new scores file and its checksum in ``manifest.json`` are swapped in together
    with the release folder (its other files hard-linked, not copied), so a failure leaves the
    release as it was.
    """
    where = release.path.resolve()  # a release reached through a symbolic link is updated where it lives
    with locked(where):
        current = read_release(release.path)  # what is on disk now, verified (the caller's, when its files are unchanged)
        old_table, old_records = current.scores_with_records()
        replaced = set(records) | set(drop)
        if old_table is not None:
            keep = old_table.filter(
                pa.compute.invert(pa.compute.is_in(old_table.column("scorer"), pa.array(sorted(replaced), pa.string())))
            )
            new = pa.concat_tables([keep, new], promote_options="permissive") if keep.num_rows else new
        merged = {k: v for k, v in old_records.items() if k not in replaced}
        merged.update(records)
        data = encode_scores(new, merged)
        kept = made_here(current) - replaced  # the rows kept: made here only where the file they come from was
        note_made_here(hashlib.sha256(data).hexdigest(), kept | set(records))
        manifest = current.manifest.model_copy(deep=True)
        manifest.files = dict(sorted({**manifest.files, SCORES_FILE: _file_entry(data)}.items()))
        with atomic_dir(where, owns=RELEASE_OWNS) as tmp:  # the release itself: what else it holds is kept
            for f in sorted(where.iterdir()):
                if f.name in (SCORES_FILE, "manifest.json"):
                    continue
                if f.is_symlink():  # never copied through: what it points to is not the release's
                    raise CraftMDError(
                        f"{f} is a symbolic link inside a release; a release holds its own files (replace the link with the file)"
                    )
                if f.is_dir():
                    shutil.copytree(f, tmp / f.name, symlinks=True)
                    continue
                try:
                    os.link(f, tmp / f.name)  # files are replaced, never changed in place: sharing them is safe
                except OSError:
                    shutil.copy2(f, tmp / f.name)
            (tmp / SCORES_FILE).write_bytes(data)
            (tmp / "manifest.json").write_text(manifest.to_json())
        release.manifest = manifest
        release._scores_cache, release._names = None, None
        release._data = {**current._data, SCORES_FILE: data}
        release._verified = current._verified
        _remember(release)  # under the lock: as the files are now, no other writer between
    return release.path / SCORES_FILE


def _plain_fields(table: pa.Table) -> pa.Table:
    """``table`` without its columns' own metadata: a release's columns carry none, and what a file brings there (an
    extension type's pickled bytes, text that is not UTF-8) is never interpreted, nor handed to polars."""
    if not any(f.metadata for f in table.schema):
        return table
    return table.cast(pa.schema([f.remove_metadata() for f in table.schema], metadata=table.schema.metadata))


@dataclass
class Release:
    """An open release: its run record and, read once, its files' bytes (checked against the run record's hashes when
    opened with ``verify``); every table is parsed from those bytes, so a command reads each file once.

    A release is a folder::

        RELEASE/
          conversations.parquet   what the agents said: one row per (case, trial, conversation kind, image flag)
          answers.parquet         what the model answered: one row per (case, trial, setting, format, image flag)
          scores.parquet          every number scored on them, long form (absent until scored)
          manifest.json           the run record (:class:`RunRecord`): task, dataset, roles, prompts, versions, hashes

    Upstream results are *ingested* into it, new models are *generated* into it,
    submissions are *scored* into it, and analysis only ever *reads* it. Generation writes
    conversations, answers and the manifest once; scoring adds ``scores.parquet`` beside
    them and never rewrites what generation wrote, except the scores file's own checksum in
    the manifest's ``files``: every file of a release is listed there with its sha256 and
    checked when the release is read, so a damaged file (cut short, a flipped bit) is named,
    with how to rebuild it, before anything reads a number from it.
    """

    path: Path
    manifest: RunRecord
    _scores_cache: tuple | None = None
    _data: dict = field(default_factory=dict, repr=False, compare=False)  # file name -> its bytes, read once (:meth:`data`)
    _signature: tuple = field(default=(), repr=False, compare=False)  # its files on disk when read (:func:`_signature`)
    _verified: bool = field(default=False, repr=False, compare=False)
    _names: frozenset | None = field(default=None, repr=False, compare=False)  # its scorer names (:meth:`scorer_names`)

    @property
    def id(self) -> str:
        return self.manifest.release

    @property
    def task(self) -> Task:
        """The release's task (:func:`release_task`: never code the release names)."""
        return release_task(self.manifest, self.path)

    @property
    def display(self) -> str:
        return self.manifest.display_name or self.id

    def data(self, name: str) -> bytes:
        """The bytes of the release's file ``name`` (:func:`read_file`, the one reader), held while the process holds
        fewer than :data:`HELD_BYTES` of releases' files (:func:`_hold`); let go beyond it, and read again and checked
        again against the run record's sha256 when asked for (a file changed on disk since is one line)."""
        got = self._data.get(name)
        if got is None:
            got = read_file(self.path / name)
            want = (self.manifest.files.get(name) or {}).get("sha256") if self._verified else None
            if want is not None and hashlib.sha256(got).hexdigest() != want:
                raise CraftMDError(
                    f"{self.path / name} changed on disk while this command read it (its sha256 is no longer the one "
                    "manifest.json records); run the command again"
                )
            self._data[name] = got
        _hold(self, name, len(got))
        return got

    def table(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """Release table ``name`` (only ``columns``, when given): the one way a release's parquet is read, so that a
        file that is not parquet, or whose columns are not of the release's types, is one line naming it."""
        p = self.path / f"{name}.parquet"
        if not p.exists() and p.name not in self._data:
            raise CraftMDError(f"{self.path}: no {name}.parquet")
        table = self._checked(
            p, _plain_fields(self._read(p, lambda f: pq.read_table(self._buffer(f), columns=columns))), SCHEMAS.get(name)
        )
        if name in SCHEMAS:  # every column a reader may ask for is there (a renamed response, a dropped status: one line)
            wanted = columns if columns is not None else [f.name for f in SCHEMAS[name] if f.name not in OPTIONAL[name]]
            missing = [c for c in wanted if c not in table.column_names]
            if missing:
                raise CraftMDError(
                    f"{p} is damaged (no column {', '.join(missing)}; a release's {name} has "
                    f"{', '.join(SCHEMAS[name].names)}); {rebuild_hint(self.manifest.kind, p.name, self.path)}"
                )
        return table

    def _buffer(self, p: Path) -> pa.BufferReader:
        return pa.BufferReader(self.data(p.name))

    def _read(self, p: Path, reader):
        """``reader(p)``, a damaged file named in one line instead of a parquet error."""
        try:
            return reader(p)
        except pa.ArrowException as exc:
            raise CraftMDError(
                f"{p} is damaged ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                f"{rebuild_hint(self.manifest.kind, p.name, self.path)}"
            ) from None

    def _checked(self, p: Path, table: pa.Table, schema: pa.Schema | None) -> pa.Table:
        """``table`` read from ``p``, refused in one line when a column of ``schema`` has another type or a trial
        number is out of range (:func:`check_trials`)."""
        for f in schema or ():
            if f.name in table.column_names and table.schema.field(f.name).type != f.type:
                raise CraftMDError(
                    f"{p} is damaged (column {f.name} holds {table.schema.field(f.name).type}, a release's holds "
                    f"{f.type}); {rebuild_hint(self.manifest.kind, p.name, self.path)}"
                )
        check_trials(table, str(p))
        return table

    def _score_rows_checked(self, p: Path, table: pa.Table) -> pa.Table:
        """``table`` (the scores file ``p``, or its status, value and metric columns) refused in one line naming the
        release, the file and the first row no scorer writes (:func:`score_row_problem`)."""
        missing = [c for c in ("status", "value", "metric") if c not in table.column_names]
        problem = f"columns missing {missing}" if missing else score_row_problem(table)
        if problem:
            raise CraftMDError(
                f"release {self.id}: {p} is damaged ({problem}); {rebuild_hint(self.manifest.kind, p.name, self.path)}"
            )
        return table

    def _records(self, p: Path, meta: bytes | None) -> dict:
        """The scorer records in a scores file's metadata (``meta``), a damaged one named in one line."""
        try:
            records = json.loads(meta) if meta else {}
        except (ValueError, RecursionError):
            records = None
        if not isinstance(records, dict) or not all(isinstance(r, dict) for r in records.values()):
            raise CraftMDError(
                f"{p} is damaged (its scorer records are not a JSON object of records); "
                f"{rebuild_hint(self.manifest.kind, p.name, self.path)}"
            )
        return records

    def has(self, name: str) -> bool:
        return f"{name}.parquet" in self._data or (self.path / f"{name}.parquet").exists()

    def rows(self, name: str) -> int:
        """How many rows release table ``name`` holds (0 when it has none, or no file)."""
        p = self.path / f"{name}.parquet"
        return self._read(p, lambda f: pq.read_metadata(self._buffer(f)).num_rows) if self.has(name) else 0

    def scores_with_records(self) -> tuple[pa.Table | None, dict]:
        """The scores table (None when unscored) and each scorer's record."""
        if self._scores_cache is None:
            p = self.path / SCORES_FILE
            if not self.has("scores"):
                self._scores_cache = (None, {})
            else:
                t = _plain_fields(self._read(p, lambda f: pq.read_table(self._buffer(f))))
                meta = (t.schema.metadata or {}).get(SCORERS_METADATA)
                t = self._checked(p, t.replace_schema_metadata(None), SCORE_COLUMNS)
                self._scores_cache = (self._score_rows_checked(p, t), self._records(p, meta))
                _hold(self, _SCORES_TABLE, t.nbytes)
        return self._scores_cache

    def scorer_names(self) -> set[str]:
        """Every scorer name of the release's scores: its records' and its rows' (a row may name a scorer no record
        speaks for)."""
        if self._names is None:
            if not self.has("scores"):
                return set()
            p = self.path / SCORES_FILE
            column = self._read(p, lambda f: pq.read_table(self._buffer(f), columns=["scorer"])).column("scorer")
            self._names = frozenset(self.scorer_records()) | {n for n in pc.unique(column).to_pylist() if isinstance(n, str)}
        return set(self._names)

    def scorer_records(self) -> dict[str, dict]:
        """Each scorer's record (identity, inputs, counts), read from the scores file's metadata alone."""
        if self._scores_cache is not None:
            return self._scores_cache[1]
        p = self.path / SCORES_FILE
        if not self.has("scores"):
            return {}
        return self._records(p, (self._read(p, lambda f: pq.read_schema(self._buffer(f))).metadata or {}).get(SCORERS_METADATA))

    def verdicts(self, **where) -> "pl.DataFrame":
        """The ``correct`` scores of answers, one row per answer and scorer, as a polars frame.

        Columns: case_id, trial, setting, format, with_image, grader, resolved,
        resolved_kind, correct (null when the score could not be produced), detail (the
        score's JSON record: ``resolved_kind`` and the scorer's own fields), status. ``where`` filters on columns (``format="frq"``).
        Claims (scorer ``claimed:<name>``, :data:`CLAIM_PREFIX`) are no verdicts and are left out.
        """
        import polars as pl

        t, _ = self.scores_with_records()
        if t is None:
            raise CraftMDError(f"release {self.id}: no {SCORES_FILE} (score it first: craftmd score)")
        df = pl.from_arrow(t)
        missing = [f for f in ANSWER_VARIANT if f.name not in df.columns]  # a conversation task's scores: no answer's keys
        df = df.with_columns(pl.Series(f.name, pa.nulls(df.height, f.type)) for f in missing)
        df = df.filter(
            pl.col("metric") == "correct", pl.col("setting").is_not_null(), ~pl.col("scorer").str.starts_with(CLAIM_PREFIX)
        )
        df = df.select(
            "case_id",
            "trial",
            "setting",
            "format",
            "with_image",
            pl.col("scorer").alias("grader"),
            pl.col("label").alias("resolved"),
            pl.col("detail").str.json_path_match("$.resolved_kind").alias("resolved_kind"),
            (pl.col("value") == 1).alias("correct"),
            "detail",
            "status",
        )
        for k, v in where.items():
            df = df.filter(pl.col(k) == v)
        return df


#: The most bytes a release's run record (manifest.json) may hold: a few kilobytes of record, its prompts and hashes.
MAX_MANIFEST_BYTES = 16 << 20


def read_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a release's file: the one reader of a release's files (its hash and its tables come from one read),
    a regular file of bounded size (:func:`craftmd.atomic.read_regular`: a FIFO or ``/dev/zero`` is one line)."""
    return read_regular(path, limit) if limit is not None else read_regular(path)


#: The most bytes of releases' files and decoded scores tables this process holds (:meth:`Release.data`,
#: :meth:`Release.scores_with_records`): beyond it the least recently used are let go, and read again when asked for, so
#: a board of a thousand releases holds a bounded part of them rather than all (a release is a few MB of them, and its
#: decoded scores table tens: `make leaderboard` over the six upstream releases holds 248 MB, and reads each once).
HELD_BYTES = 256 << 20
_SCORES_TABLE = "(scores table)"  # the decoded scores' entry among the files
_HELD_LRU: OrderedDict[tuple[int, str], tuple[weakref.ref, int]] = OrderedDict()  # (id(release), file) -> (it, bytes)
_HELD_TOTAL = [0]
_HELD_LOCK = threading.Lock()


def _hold(release: Release, name: str, size: int) -> None:
    """Note that ``release`` holds ``size`` bytes of ``name`` (most recently used), and let go of the least recently
    used bytes of any release beyond :data:`HELD_BYTES` (never the ones just noted)."""
    key = (id(release), name)
    with _HELD_LOCK:
        old = _HELD_LRU.pop(key, None)
        if old is not None:
            _HELD_TOTAL[0] -= old[1]
        _HELD_LRU[key] = (weakref.ref(release), size)
        _HELD_TOTAL[0] += size
        while _HELD_TOTAL[0] > HELD_BYTES and len(_HELD_LRU) > 1:
            (_, gone), (ref, n) = _HELD_LRU.popitem(last=False)
            _HELD_TOTAL[0] -= n
            r = ref()
            if r is None:
                continue
            if gone == _SCORES_TABLE:
                r._scores_cache = None
            else:
                r._data.pop(gone, None)


#: The releases open in this process, by folder: reading one again (the same command's next step) takes the one already
#: read while its files are unchanged on disk (:func:`_signature`), so its files are read and hashed once a command.
_OPEN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _signature(path: Path, names) -> tuple:
    """What changes when any of a release's files is written, replaced or swapped: each file's inode, size and times."""
    out = []
    for name in ("manifest.json", SCORES_FILE, *names):
        try:
            st = os.stat(path / name)
        except OSError:
            out.append((name, None))
            continue
        out.append((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


#: While a command runs (:func:`one_reading`), every release it opened: held, so that its next step finds them open.
_HELD: list | None = None


@contextmanager
def one_reading():
    """Hold every release opened inside (one command: ``craftmd.commands.cli.main``) until it ends, so that each release's
    files are read and hashed once in the command, however many of its steps open the release again."""
    global _HELD
    outer = _HELD
    if outer is None:
        _HELD = []
    try:
        yield
    finally:
        if outer is None:
            _HELD = None


def _remember(release: Release) -> None:
    """Keep ``release`` as the open release of its folder, as its files are now."""
    release._signature = _signature(release.path, release.manifest.files)
    _OPEN[str(release.path)] = release
    if _HELD is not None:
        _HELD.append(release)


def read_release(path: Path | str, verify: bool = True) -> Release:
    """Open a release folder, checking its run record and (by default) its file hashes.

    Within one process a release whose files are unchanged since it was last opened is that same :class:`Release`
    (its files already read and checked), so a command reads and hashes each file once."""
    path = Path(path)
    held = _OPEN.get(str(path))
    if held is not None and held._signature == _signature(path, held.manifest.files) and (held._verified or not verify):
        return held
    mf = path / "manifest.json"
    if not mf.exists():
        raise CraftMDError(f"{path}: not a release (no manifest.json)")
    try:
        raw = json.loads(read_file(mf, MAX_MANIFEST_BYTES).decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, or a number of more digits than Python converts
        raise CraftMDError(f"{mf}: unreadable manifest ({' '.join(str(exc).split())[:200]})") from None
    except RecursionError:
        raise CraftMDError(f"{mf}: unreadable manifest (nested too deeply; a run record is a few levels deep)") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != SCHEMA_VERSION:
        raise CraftMDError(
            f"{path}: release schema {version}, this craftmd reads {SCHEMA_VERSION}; rebuild it "
            "(upstream: craftmd ingest --overwrite, or make leaderboard; generated: craftmd generate again over its cache; "
            "submitted: craftmd submit again)"
        )
    manifest = RunRecord.from_dict(raw, str(mf))
    release_task(manifest, path)  # its task known (never a file it names) before anything reads it
    release = Release(path, manifest)
    if verify:
        found = _signature(path, manifest.files)
        if not _noted_checked(release, found):
            _note_checked(release, found, _verify(release))
    release._verified = verify
    _remember(release)
    return release


#: The files a release hashes as it reads them, without keeping their bytes: the conversations' text is the bulk of a
#: release, read only by a scorer that runs and by the analysis (column by column, from disk).
STREAMED = ("conversations.parquet",)


def _file_sha256(release: Release, name: str) -> str:
    """The sha256 of a release's file: of its bytes, kept for its tables (:meth:`Release.data`), or streamed."""
    if name in STREAMED and name not in release._data:
        return sha256_file(release.path / name)
    return hashlib.sha256(release.data(name)).hexdigest()


def _verify(release: Release) -> set[str]:
    """Read every file the run record lists, once, and check it against the sha256 recorded there; the scores' rows are
    checked too (:func:`score_row_problem`), and their scorer names noted. The names of the metrics checked."""
    path, manifest = release.path, release.manifest
    metrics: set[str] = set()
    for name, info in manifest.files.items():
        f = inside(path, name, "file name")
        if not f.exists():
            if name == SCORES_FILE:
                continue  # removed to be scored again: the release reads as unscored
            raise CraftMDError(f"{f} is missing (manifest.json lists it); {rebuild_hint(manifest.kind, name, path)}")
        if _file_sha256(release, name) != info["sha256"]:
            release._data.pop(name, None)
            raise CraftMDError(
                f"{f} is damaged (its sha256 is not the one manifest.json records); {rebuild_hint(manifest.kind, name, path)}"
            )
        if name == SCORES_FILE:  # its rows are checked where it is read: the analysis reads it from disk, not from here
            cols = ["status", "value", "metric", "scorer"]
            read = lambda p: pq.read_table(release._buffer(p), columns=cols, read_dictionary=cols[:1] + cols[2:])  # noqa: E731
            rows = release._score_rows_checked(f, release._read(f, read))
            release._names = frozenset(release.scorer_records()) | _words(rows.column("scorer"))
            metrics = _words(rows.column("metric"))
    if SCORES_FILE not in manifest.files and (path / SCORES_FILE).exists():
        raise CraftMDError(
            f"{path / SCORES_FILE} is not in manifest.json's checksums (written by an older craftmd, or added by hand); "
            f"{rebuild_hint(manifest.kind, SCORES_FILE, path)}"
        )
    return metrics


#: This machine's notes of the releases it checked: ``$CRAFTMD_CACHE/releases-checked/<digest>.json``, the digest of a
#: release folder's path and of its files' inodes, sizes and times (:func:`_signature`) when every file was hashed
#: against the run record and the scores' rows were checked (:func:`_verify`). A release whose files are those same
#: files is not hashed again: a file written, replaced or linked since has another time of change, so it is. Held
#: where :data:`MADE_HERE` is held, and trusted as those notes are.
CHECKED = "releases-checked"
#: A file changed this recently is hashed each time, never noted: a write in the same tick of the file system's clock
#: would leave its times as they were.
SETTLED_NS = 2_000_000_000


def _checked_path(release: Release, signature: tuple) -> Path:
    from craftmd.source import cache_dir

    key = repr((str(release.path.resolve()), signature, SCHEMA_VERSION, __version__)).encode()
    return cache_dir() / CHECKED / f"{hashlib.blake2b(key, digest_size=20).hexdigest()}.json"


def _metric_terms(names) -> dict[str, list]:
    """Each metric's kind and range, as the scores' rows were checked against them (:func:`score_row_problem`)."""
    from craftmd.metrics import metric

    return {m: [metric(m).kind, float(metric(m).low), float(metric(m).high)] for m in sorted(names)}


def _noted_checked(release: Release, signature: tuple) -> bool:
    """Whether this machine checked ``release``'s files as they are (:data:`CHECKED`), against the metrics as they are
    declared now; its scorer names then come from the note."""
    try:
        note = json.loads(_checked_path(release, signature).read_bytes())
        names, terms = note["scorer_names"], note["metrics"]
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and isinstance(terms, dict)):
            return False
        if _metric_terms(terms) != terms:
            return False
    except (OSError, ValueError, KeyError, TypeError, RecursionError, CraftMDError):
        return False
    release._names = frozenset(names)
    return True


def _note_checked(release: Release, signature: tuple, metrics: set[str]) -> None:
    """Note that ``release``'s files, as ``signature`` found them before :func:`_verify` read them, were checked
    (against ``metrics``' terms): only when they are still those files and none changed within :data:`SETTLED_NS`."""
    import time

    changed = [entry[4] for entry in signature if entry[1] is not None]
    if not changed or time.time_ns() - max(changed) < SETTLED_NS or _signature(release.path, release.manifest.files) != signature:
        return
    try:
        atomic_write_json(_checked_path(release, signature), {"scorer_names": sorted(release.scorer_names()),
                                                              "metrics": _metric_terms(metrics)})  # fmt: skip
    except OSError:
        pass  # (a cache that cannot be written: the next command hashes again)


def rebuild_hint(kind: str, name: str, path: Path | str) -> str:
    """How to write a release's file ``name`` again, for a release of ``kind``."""
    if kind == "upstream":
        return "rebuild it: craftmd ingest --overwrite (or make leaderboard)"
    if kind == "submission":
        return "rebuild it: craftmd score the submission again with --overwrite"
    if name == SCORES_FILE:
        return f"rebuild it: remove {Path(path) / name} and score the release again (craftmd score {path} --dataset DIR, with every scorer it had)"
    return f"rebuild it: craftmd generate {path} again with --overwrite (the request cache answers what was asked before)"


#: The tables that hold a run's own output: one run under two ids holds the same of either.
OUTPUT_TABLES = ("answers.parquet", "conversations.parquet")


def _content(release: Release) -> list[tuple[str, str]]:
    """What a release holds, by content: its model's output, the answers and the conversations that have rows, by name
    and sha256. Two releases that share one are one run. (A task's other tables, such as the encounters' closures, may
    be equal in two runs of different models.)"""
    return sorted((n, i["sha256"]) for n, i in release.manifest.files.items() if n in OUTPUT_TABLES and i.get("rows"))


def copies_allowed() -> bool:
    """``CRAFTMD_ALLOW_COPIES=1``: releases holding the same tables under other ids are read, each as its own release.
    For benchmarks alone (``bench/bench_board.py`` measures boards of hard-linked copies); never set it for a board
    whose numbers anyone reads: one run under two ids is then ranked twice."""
    return os.environ.get("CRAFTMD_ALLOW_COPIES") == "1"


def find_releases(root: Path | str) -> list[Release]:
    """Every release folder directly under ``root``, sorted by id."""
    root = Path(root)
    if not root.is_dir():
        raise CraftMDError(f"no releases folder at {root}")
    found = [read_release(p) for p in sorted(root.iterdir()) if (p / "manifest.json").exists()]
    seen: dict[str, Release] = {}
    runs: dict[str, Release] = {}
    held: dict[tuple[str, str], Release] = {}
    for r in found:
        if r.id in seen:  # two releases of one id would be counted as one model: refused, never merged
            raise CraftMDError(f"two releases have the id {r.id!r}: {seen[r.id].path} and {r.path}; remove one")
        seen[r.id] = r
        for name, sha in () if copies_allowed() else _content(r):  # one run under two ids would be ranked twice
            other = held.setdefault((name, sha), r)
            if other is not r:
                raise CraftMDError(
                    f"two releases hold the same {name.removesuffix('.parquet')}, byte for byte: {other.path} ({other.id!r}) "
                    f"and {r.path} ({r.id!r}); one run is one release: remove one"
                )
        inspect = r.manifest.producer.get("inspect")
        run = inspect.get("eval_id") if isinstance(inspect, dict) else None
        if run is not None:  # one inspect run ingested twice (into two folders): its answers would count twice
            if run in runs:
                raise CraftMDError(
                    f"two releases are ingests of one inspect run ({run}): {runs[run].path} and {r.path}; remove one"
                )
            runs[run] = r
    return sorted(found, key=lambda r: r.id)
