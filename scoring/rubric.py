"""MedPI's rubric: 105 behavioural dimensions of a whole doctor–patient conversation, each scored 1–4.

The catalog (``scoring/data/medpi_rubric_v1.jsonl``, one JSON line per dimension) holds, for each
dimension, its ``id`` (``category.dimension``, snake case: names such as *completeness* recur across
categories), the paper's ``dimension``, ``category`` and ``meta_category`` names, the encounter
``objectives`` it applies to (``all``, or one of :data:`OBJECTIVES`) and a ``description`` and four
``anchors`` written for this package. The counts are the paper's (Fajardo et al. 2025, Appendix C
and D): 105 dimensions in 29 categories and 7 meta-categories; :func:`load_catalog` checks them, and
its sha256 goes into every judge's record.

The judge itself is :mod:`craftmd.scoring.judge`; this module is the data and the small pure
functions around it (which dimensions apply to an objective, a case's objective, the 0–100 scale).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from craftmd import CraftMDError
from craftmd.registry import slug

CATALOG_FILE = "medpi_rubric_v1.jsonl"
CATALOG_VERSION = 1
#: The encounter objectives of MedPI's task matrix (the packets config's ``objective`` values).
OBJECTIVES = ("diagnosis", "lifestyle_advice", "medical_screening", "medication_advice", "treatment_advice")
#: The paper's counts.
COUNTS = {"dimensions": 105, "categories": 29, "meta_categories": 7}
#: The meta-categories in the paper's order (its Table 6).
META_CATEGORIES = ("Core Medical Competence", "Therapeutic Management", "Preventive Care & Screening", "Communication Skills",
                   "Patient Safety & Care", "Contextual & System Integration", "Technical Reliability")  # fmt: skip
FIELDS = ("id", "dimension", "category", "meta_category", "objectives", "description", "anchors")


@dataclass(frozen=True)
class Dimension:
    id: str
    dimension: str
    category: str
    meta_category: str
    objectives: tuple[str, ...]
    description: str
    anchors: tuple[str, str, str, str]  # what a 1, 2, 3 and 4 look like

    def applies(self, objective: str) -> bool:
        return "all" in self.objectives or objective in self.objectives

    def to_dict(self) -> dict:
        return {"id": self.id, "dimension": self.dimension, "category": self.category, "meta_category": self.meta_category,
                "objectives": list(self.objectives), "description": self.description,
                "anchors": {str(i + 1): a for i, a in enumerate(self.anchors)}}  # fmt: skip


@dataclass(frozen=True)
class Catalog:
    dimensions: tuple[Dimension, ...]
    sha256: str
    path: str  # inside the package, for the record

    def by_id(self) -> dict[str, Dimension]:
        return {d.id: d for d in self.dimensions}

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.category for d in self.dimensions))

    def meta_of(self) -> dict[str, str]:
        """category -> its meta-category."""
        return {d.category: d.meta_category for d in self.dimensions}

    def select(self, names: list[str] | None) -> tuple[Dimension, ...]:
        """The dimensions named by ids, category names or meta-category names (all when ``names`` is empty)."""
        if not names:
            return self.dimensions
        out: dict[str, Dimension] = {}
        for n in names:
            hit = [d for d in self.dimensions if n in (d.id, d.category, d.meta_category)]
            if not hit:
                raise CraftMDError(f"--dimensions: {n!r} is no dimension id, category or meta-category of the rubric "
                                   "(craftmd judge --catalog lists them)")  # fmt: skip
            out.update((d.id, d) for d in hit)
        return tuple(d for d in self.dimensions if d.id in out)

    def record(self) -> dict:
        return {"name": "medpi", "version": CATALOG_VERSION, "file": self.path, "sha256": self.sha256}


def parse_catalog(data: bytes, where: str) -> tuple[Dimension, ...]:
    """Catalog lines -> dimensions, every field checked; a bad line is a one-line error naming it."""
    dims = []
    from craftmd.jsonl import json_lines

    for i, r in json_lines(data, where):
        at = f"{where}:{i}"
        if not isinstance(r, dict) or sorted(r) != sorted(FIELDS):
            raise CraftMDError(f"{at}: fields must be {list(FIELDS)}")
        text = ("id", "dimension", "category", "meta_category", "description")
        if any(not isinstance(r[k], str) or not r[k].strip() for k in text):
            raise CraftMDError(f"{at}: {', '.join(text)} must be non-empty text")
        if r["id"] != f"{slug(r['category'], lower=True)}.{slug(r['dimension'], lower=True)}":
            raise CraftMDError(f"{at}: id {r['id']!r} is not category.dimension in snake case")
        objs = r["objectives"]
        if (
            not isinstance(objs, list)
            or not objs
            or any(o not in ("all", *OBJECTIVES) for o in objs)
            or ("all" in objs and len(objs) > 1)
        ):
            raise CraftMDError(f"{at}: objectives must be ['all'] or some of {list(OBJECTIVES)}")
        a = r["anchors"]
        if (
            not isinstance(a, dict)
            or sorted(a) != ["1", "2", "3", "4"]
            or any(not isinstance(v, str) or not v.strip() for v in a.values())
        ):
            raise CraftMDError(f"{at}: anchors must give text for each of 1, 2, 3, 4")
        if r["meta_category"] not in META_CATEGORIES:
            raise CraftMDError(f"{at}: unknown meta-category {r['meta_category']!r}")
        dims.append(Dimension(r["id"], r["dimension"], r["category"], r["meta_category"], tuple(objs), r["description"],
                              (a["1"], a["2"], a["3"], a["4"])))  # fmt: skip
    return tuple(dims)


def check_catalog(dims: tuple[Dimension, ...], where: str) -> None:
    """The paper's counts, unique ids, and one meta-category per category."""
    ids = [d.id for d in dims]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise CraftMDError(f"{where}: duplicate dimension ids {dup}")
    metas: dict[str, set] = {}
    for d in dims:
        metas.setdefault(d.category, set()).add(d.meta_category)
    split = sorted(c for c, m in metas.items() if len(m) > 1)
    if split:
        raise CraftMDError(f"{where}: categories in several meta-categories: {split}")
    got = {"dimensions": len(dims), "categories": len(metas), "meta_categories": len({d.meta_category for d in dims})}
    if got != COUNTS:
        raise CraftMDError(f"{where}: counts {got}, the rubric has {COUNTS}")


@cache
def load_catalog(path: str | None = None) -> Catalog:
    """The rubric catalog (the packaged one, or ``path``), checked; its sha256 is over the file's bytes."""
    if path is None:
        data = (resources.files("craftmd.scoring") / "data" / CATALOG_FILE).read_bytes()
        where = f"scoring/data/{CATALOG_FILE}"
    else:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise CraftMDError(f"{path}: cannot read the rubric catalog ({exc.strerror})") from None
        where = str(path)
    dims = parse_catalog(data, where)
    check_catalog(dims, where)
    return Catalog(dims, hashlib.sha256(data).hexdigest(), where)


def catalog_lines(catalog: Catalog | None = None) -> list[str]:
    """The catalog as JSON lines (what ``craftmd judge --catalog`` prints): each dimension with its ACGME core
    competency (:func:`acgme`: ``acgme_competency``, its id, and ``acgme_competency_name``)."""
    catalog = catalog or load_catalog()
    m = acgme()
    return [
        json.dumps(
            {**d.to_dict(), "acgme_competency": m["of"][d.id], "acgme_competency_name": m["competencies"][m["of"][d.id]]},
            ensure_ascii=False,
            sort_keys=False,
        )
        for d in catalog.dimensions
    ]


def applicable(dims: tuple[Dimension, ...] | list[Dimension], objective: str) -> list[Dimension]:
    """Those of ``dims`` that apply to an encounter with ``objective``."""
    if objective not in OBJECTIVES:
        raise CraftMDError(f"unknown encounter objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    return [d for d in dims if d.applies(objective)]


def has_packets(task) -> bool:
    """Whether ``task`` (a :class:`craftmd.tasks.Task`) poses patient packets: its dataset has a ``packets`` config (the
    encounters'), whose packets give each case's encounter objective and record."""
    from craftmd.samples import dataset

    return any(c.kind == "packets" for c in dataset(task.dataset).configs)


def case_objectives(task, case_ids: list[str], dataset_dir: Path | str | None) -> dict[str, str]:
    """case_id -> encounter objective, for a release of ``task`` (a :class:`craftmd.tasks.Task`). A case of a dataset
    without packets (CRAFT-MD's) is a diagnosis encounter; a packet's objective is in the dataset's ``packets`` config
    (columns ``case_id``, ``objective``)."""
    if not has_packets(task):
        return dict.fromkeys(case_ids, "diagnosis")
    if dataset_dir is None:
        raise CraftMDError(
            f"a release of task {task.name!r}: --dataset is needed (its packets config gives each case's objective)"
        )
    import pyarrow.parquet as pq

    from craftmd.dataset import config_file

    path = config_file(dataset_dir, "packets")
    if not path.exists():
        raise CraftMDError(f"{dataset_dir}: no packets config (expected {path}); it gives each encounter's objective")
    t = pq.read_table(path)
    if not {"case_id", "objective"} <= set(t.column_names):
        raise CraftMDError(f"{path}: needs columns case_id and objective")
    got = dict(zip(t.column("case_id").to_pylist(), t.column("objective").to_pylist()))
    bad = sorted({o for o in got.values() if o not in OBJECTIVES}, key=str)
    if bad:
        raise CraftMDError(f"{path}: unknown objective(s) {bad}; known: {', '.join(OBJECTIVES)}")
    missing = sorted(set(case_ids) - set(got))
    if missing:
        raise CraftMDError(f"{path}: no objective for case(s) {missing[:5]}{' …' if len(missing) > 5 else ''}")
    return {c: got[c] for c in case_ids}


ACGME_FILE = "medpi_acgme_v1.json"


@cache
def acgme() -> dict:
    """The rubric's ACGME mapping (``scoring/data/medpi_acgme_v1.json``): ``competencies`` (id -> name, the six core
    competencies in ACGME's order), ``of`` (dimension id -> competency id: its own, else its category's), ``notes``
    (dimension id -> why, where it is a judgement call) and ``sha256``. Every dimension of the catalog must map."""
    data = (resources.files("craftmd.scoring") / "data" / ACGME_FILE).read_bytes()
    m = json.loads(data)
    comps = m["competencies"]
    cat = load_catalog()
    of, notes = {}, {}
    for d in cat.dimensions:
        c = m["dimensions"].get(d.id) or m["categories"].get(d.category) or {}
        if c.get("competency") not in comps:
            raise CraftMDError(f"scoring/data/{ACGME_FILE}: dimension {d.id} maps to no ACGME competency")
        of[d.id] = c["competency"]
        note = c.get("note") or (m["categories"].get(d.category) or {}).get("note")
        if note:
            notes[d.id] = note
    unknown = sorted(set(m["dimensions"]) - set(of)) + sorted(set(m["categories"]) - set(cat.categories))
    if unknown:
        raise CraftMDError(f"scoring/data/{ACGME_FILE}: not in the catalog: {unknown[:4]}")
    return {"competencies": dict(comps), "of": of, "notes": notes, "sha256": hashlib.sha256(data).hexdigest()}


def normalise(score: float) -> float:
    """A 1–4 score on the 0–100 scale: ``100 (s - 1) / 3``."""
    return 100.0 * (score - 1.0) / 3.0


__all__ = [
    "acgme",
    "Dimension",
    "Catalog",
    "load_catalog",
    "catalog_lines",
    "applicable",
    "case_objectives",
    "normalise",
    "OBJECTIVES",
    "META_CATEGORIES",
    "COUNTS",
    "CATALOG_FILE",
]
