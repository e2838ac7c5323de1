"""The release: the one contract every part of the package meets at.

A release is a folder::

    RELEASE/
      conversations.parquet   one row per (case, trial, conversation kind, image flag)
      answers.parquet         one row per (case, trial, setting, format, image flag)
      grades.parquet          one row per answer and grader  (absent until graded)
      manifest.json           what produced it: model, source, prompts, sampling, hashes

Upstream results are *ingested* into it, new models are *generated* into it,
submissions are *scored* into it, and analysis only ever *reads* it. A new column
goes into the schemas below with a bump of ``SCHEMA_VERSION``.

Writing is atomic: everything goes to a temporary sibling folder that is renamed
into place at the end, so a failed run leaves nothing at the destination. Bytes are
deterministic: rows are sorted by key, parquet options are fixed, and the manifest
holds no timestamps or local paths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from craftmd import CraftMDError, __version__
from craftmd.atomic import atomic_dir, sha256_file

SCHEMA_VERSION = 1

#: How the case reaches the model before the question is asked.
SETTINGS = (
    "vignette",  # the whole vignette
    "multiturn",  # the doctor-patient conversation, final-diagnosis turn removed
    "singleturn",  # the patient's first turn only
    "summarized",  # a third-person summary of the patient's turns
    "exam",  # the physical-exam findings only
    "multiturn_no_exam",  # a conversation where the patient knows the history only
    "multiturn_plus_exam",  # the conversation with the exam findings appended
)
#: How the question is asked.
FORMATS = ("mcq4", "mcq_many", "frq", "top3")
#: Which conversation a row of conversations.parquet is.
CONVERSATIONS = ("standard", "no_exam")
#: Why a conversation stopped.
ENDINGS = ("final_diagnosis", "no_question", "max_turns", "refusal", "error")
#: What became of an answer request.
ANSWER_STATUS = ("ok", "missing", "non_text", "refusal", "error")
#: What a grader resolved an answer to.
RESOLVED_KINDS = ("single", "multiple", "none")
#: Release kinds.
KINDS = ("upstream", "generated", "submission")

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
ANSWERS_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("trial", pa.int16()),
        ("setting", pa.string()),
        ("format", pa.string()),
        ("with_image", pa.bool_()),
        ("response", pa.string()),  # null when status != ok
        ("status", pa.string()),
        ("error", pa.string()),  # why the answer failed (status refusal/error): HTTP status, code, message; else null
    ]
)
GRADES_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("trial", pa.int16()),
        ("setting", pa.string()),
        ("format", pa.string()),
        ("with_image", pa.bool_()),
        ("grader", pa.string()),  # e.g. paper, strict, upstream-gpt4, offline, llm:openai/gpt-4o
        ("resolved", pa.string()),  # the choice or extracted diagnosis; null when none
        ("resolved_kind", pa.string()),  # single | multiple | none
        ("correct", pa.bool_()),
        ("detail", pa.string()),  # grader's raw outputs (JSON text) or null
    ]
)
SCHEMAS = {"conversations": CONVERSATIONS_SCHEMA, "answers": ANSWERS_SCHEMA, "grades": GRADES_SCHEMA}
KEYS = {
    "conversations": ["case_id", "trial", "conversation", "with_image"],
    "answers": ["case_id", "trial", "setting", "format", "with_image"],
    "grades": ["case_id", "trial", "setting", "format", "with_image", "grader"],
}
ENUMS = {
    "conversations": {"conversation": CONVERSATIONS, "ended": ENDINGS},
    "answers": {"setting": SETTINGS, "format": FORMATS, "status": ANSWER_STATUS},
    "grades": {"setting": SETTINGS, "format": FORMATS, "resolved_kind": RESOLVED_KINDS},
}
#: Columns a writer may leave out: they are filled with nulls.
OPTIONAL = {"conversations": ("error",), "answers": ("error",), "grades": ()}
PARQUET_OPTIONS = dict(compression="zstd", compression_level=9, use_dictionary=True, write_statistics=True)


def case_number(case_id: str) -> int:
    """``case_123`` -> 123 (cases sort by number, not as text)."""
    try:
        return int(case_id.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        raise CraftMDError(f"malformed case id {case_id!r} (expected case_<n>)") from None


def conform(name: str, table: pa.Table) -> pa.Table:
    """Check a table against its schema and enums, cast it, and sort it by key."""
    schema = SCHEMAS[name]
    for col in OPTIONAL[name]:
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
    for col, allowed in ENUMS[name].items():
        values = {v for v in table.column(col).to_pylist() if v is not None}
        bad = sorted(values - set(allowed))
        if bad:
            raise CraftMDError(f"{name}.{col}: unknown value(s) {bad}; allowed {list(allowed)}")
    for col in KEYS[name]:
        if table.column(col).null_count:
            raise CraftMDError(f"{name}.{col}: key column has nulls")
    # Sort by key, cases by number.
    nums = pa.array([case_number(c) for c in table.column("case_id").to_pylist()], pa.int64())
    keyed = table.append_column("__n", nums)
    order = [("__n", "ascending")] + [(k, "ascending") for k in KEYS[name][1:]]
    keyed = keyed.sort_by(order)
    dup = keyed.select(KEYS[name]).group_by(KEYS[name]).aggregate([([], "count_all")])
    if dup.num_rows != keyed.num_rows:
        raise CraftMDError(f"{name}: duplicate rows for the key {KEYS[name]}")
    return keyed.drop_columns(["__n"])


@dataclass
class Manifest:
    """What produced a release. Serialised with sorted keys, no timestamps, no paths."""

    release: str  # the release id, e.g. "gpt4_1106"
    kind: str  # upstream | generated | submission
    model: str  # provider/model, or upstream's name
    source: dict  # Source.describe() of the pinned upstream, or the dataset's provenance
    prompt_set: dict | None = None  # {"name": ..., "sha256": ...}
    sampling: dict | None = None  # temperature, max_tokens, seed, ... per agent
    seed: int | None = None
    models: dict = field(default_factory=dict)  # agent -> provider/model (doctor, patient, ...)
    counts: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)  # filled by write_release
    schema_version: int = SCHEMA_VERSION
    package: dict = field(default_factory=lambda: {"name": "craftmd", "version": __version__})

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def write_release(out: Path | str, manifest: Manifest, tables: dict[str, pa.Table], overwrite: bool = False) -> Path:
    """Write a release atomically. ``tables`` maps conversations/answers/grades to arrow tables."""
    out = Path(out)
    if manifest.kind not in KINDS:
        raise CraftMDError(f"manifest kind {manifest.kind!r} not in {KINDS}")
    unknown = set(tables) - set(SCHEMAS)
    if unknown:
        raise CraftMDError(f"unknown release table(s) {sorted(unknown)}")
    if "answers" not in tables:
        raise CraftMDError("a release needs answers")
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    conformed = {name: conform(name, t) for name, t in tables.items()}
    with atomic_dir(out) as tmp:
        files = {}
        for name, table in sorted(conformed.items()):
            path = tmp / f"{name}.parquet"
            pq.write_table(table, path, **PARQUET_OPTIONS)
            files[path.name] = {"sha256": sha256_file(path), "rows": table.num_rows}
        manifest.files = files
        (tmp / "manifest.json").write_text(manifest.to_json())
    return out


@dataclass
class Release:
    path: Path
    manifest: Manifest

    @property
    def id(self) -> str:
        return self.manifest.release

    def table(self, name: str) -> pa.Table:
        p = self.path / f"{name}.parquet"
        if not p.exists():
            raise CraftMDError(f"{self.path}: no {name}.parquet")
        return pq.read_table(p)

    def has(self, name: str) -> bool:
        return (self.path / f"{name}.parquet").exists()


def read_release(path: Path | str, verify: bool = True) -> Release:
    """Open a release folder, checking its manifest and (by default) its file hashes."""
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.exists():
        raise CraftMDError(f"{path}: not a release (no manifest.json)")
    try:
        manifest = Manifest.from_dict(json.loads(mf.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise CraftMDError(f"{mf}: unreadable manifest ({exc})") from None
    if manifest.schema_version != SCHEMA_VERSION:
        raise CraftMDError(f"{path}: schema version {manifest.schema_version}, this package reads {SCHEMA_VERSION}")
    if verify:
        for name, info in manifest.files.items():
            f = path / name
            if not f.exists() or sha256_file(f) != info["sha256"]:
                raise CraftMDError(f"{path}: {name} does not match its manifest hash")
    return Release(path, manifest)


def find_releases(root: Path | str) -> list[Release]:
    """Every release folder directly under ``root``, sorted by id."""
    root = Path(root)
    if not root.is_dir():
        raise CraftMDError(f"no releases folder at {root}")
    found = [read_release(p) for p in sorted(root.iterdir()) if (p / "manifest.json").exists()]
    return sorted(found, key=lambda r: r.id)
