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
#: task -> the configs a run of it poses from (the dataset's ``config`` option of the runner; None: the task has one).
CONFIGS = {"craftmd": "all", "consultation": "all", "encounters": None}


@dataclass
class Split:
    """What a split gives the runner: the folder it reads (``dataset``) and, for a view, the temporary folder holding it.

    Each task's runner reads its cases from a built dataset folder, in the benchmark's own configs (split ``test``). A
    training split is posed by the same runner and scored by the same scorers, from a **view**: a folder of the
    environment's own (temporary, kept while the environment lives) in which the training cases stand where the
    benchmark's would, in the benchmark's columns:

    * ``craftmd`` on ``train``: the ``craftmd_train`` config (MedQA items posed as CRAFT-MD vignettes, split ``train``) as
      the ``all`` config;
    * ``consultation`` on ``train``: the cases of ``consult_train`` (the golden consultations, split ``train``), one per
      case: its question, options and answer posed as a text case by the transforms ``craftmd_train`` uses
      (:func:`craftmd.dataset_builder.craftmd_train.sample`, ids ``train_mediq_<id>`` / ``train_medqa_<line>``) as the
      ``all`` config, and its key-value items and initial request (the scripted dialogue's, else the first writer's) as the
      ``keyinfo`` config;
    * ``encounters`` on ``train``: the training packets (``craftmd encounters build --split train``, checked against the
      benchmark's packets by the build, its report says so) as the ``packets`` config.
    """

    dataset: Path
    config: str | None
    view: tempfile.TemporaryDirectory | None = None
    cases: int = 0  # the training cases the view holds (0: the benchmark)


def train_file(dataset: Path, config: str) -> Path:
    return Path(dataset) / config / "train-00000-of-00001.parquet"


def open_split(task: str, split: str, dataset: Path | str) -> Split:
    """The folder ``task``'s runner and scorers read for ``split`` (one line when it is not built or not disjoint).

    The CRAFT-MD and consultation training cases are checked against the benchmark of the same dataset folder when the
    environment is made: no training id is a benchmark id, and no training vignette is a benchmark case by the golden
    build's decontamination rule (:func:`craftmd.dataset_builder.golden.check_disjoint`); a case that is one is refused
    with one line naming it.
    """
    from craftmd.dataset import config_file

    if split not in SPLITS:
        raise CraftMDError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    dataset = Path(dataset)
    if not dataset.is_dir():
        raise CraftMDError(f"dataset {dataset} does not exist: run {build_command(task, split, dataset)}")
    if split == "test":
        config = CONFIGS[task] or "packets"
        if not config_file(dataset, config).exists():
            raise CraftMDError(
                f"split 'test' of {task} (config {config}) is not built in {dataset}: run {build_command(task, split, dataset)}"
            )
        return Split(dataset, CONFIGS[task])
    return {"craftmd": craftmd_view, "consultation": consultation_view, "encounters": encounters_view}[task](dataset)


def build_command(task: str, split: str, dataset: Path) -> str:
    if task == "encounters":
        train = " --split train --against BENCHMARK_PACKETS" if split == "train" else ""
        return f"craftmd encounters build --out {dataset}{train}"
    return f"craftmd build --out {dataset}"


def _source(task: str, dataset: Path, config: str) -> Path:
    path = train_file(dataset, config)
    if not path.exists():
        raise CraftMDError(
            f"split 'train' of {task} (config {config}) is not built in {dataset}: run {build_command(task, 'train', dataset)}"
        )
    return path


def _view(prefix: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=f"craftmd-env-{prefix}-")


def _link(view: Path, config: str, source: Path) -> None:
    from craftmd.dataset import config_file

    target = config_file(view, config)
    target.parent.mkdir(parents=True)
    target.symlink_to(source.resolve())


def craftmd_view(dataset: Path) -> Split:
    import pyarrow.parquet as pq

    from craftmd.dataset_builder import craftmd_train as CT
    from craftmd.dataset_builder import golden as G

    source = _source("craftmd", dataset, CT.CONFIG)
    rows = pq.read_table(source, columns=["case_id", "vignette"]).to_pylist()
    G.check_disjoint(f"{source}", {r["case_id"]: r["vignette"] or "" for r in rows}, G.benchmark_texts(dataset))
    view = _view("craftmd-train")
    _link(Path(view.name), "all", source)
    return Split(Path(view.name), "all", view, len(rows))


def consultation_cases(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """``consult_train`` rows -> (one text case per training case, its keyinfo row), in the rows' order. A case's key-value
    items and initial request are its scripted dialogue's (else its first writer's)."""
    from craftmd.dataset_builder import craftmd_train as CT
    from craftmd.dataset_builder import golden as G
    from craftmd.dataset_builder.schema import text_row

    chosen: dict[str, dict] = {}
    for r in rows:
        if r["case"] not in chosen or (r["writer"] == G.WRITER_SCRIPT and chosen[r["case"]]["writer"] != G.WRITER_SCRIPT):
            chosen[r["case"]] = r
    cases, keyinfo = [], []
    for case, r in chosen.items():
        try:
            row = text_row(CT.sample(G.candidate(r)))
        except (KeyError, ValueError, TypeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise CraftMDError(f"consult_train: case {case} cannot be posed as a consultation case ({why})") from None
        if not r["items"] or not r["initial_request"]:
            raise CraftMDError(f"consult_train: case {case} has no key-value items or no initial request")
        cases.append(row)
        keyinfo.append(
            {
                "case_id": row["case_id"],
                "items": [{"key": i["key"], "value": i["value"]} for i in r["items"]],
                "initial_request": r["initial_request"],
                "status": "ok",
                "error": None,
                "model": f"consult_train:{r['writer']}",
                "prompt_sha256": None,
            }
        )
    return cases, keyinfo


def consultation_view(dataset: Path) -> Split:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from craftmd.dataset import config_file
    from craftmd.dataset_builder import golden as G
    from craftmd.dataset_builder.schema import TEXT_FEATURES
    from craftmd.keyinfo import CONFIG as KEYINFO, SCHEMA as KEYINFO_SCHEMA

    source = _source("consultation", dataset, G.CONFIG)
    cases, keyinfo = consultation_cases(pq.read_table(source).to_pylist())
    G.check_disjoint(f"{source}", {r["case_id"]: r["vignette"] for r in cases}, G.benchmark_texts(dataset))
    view = _view("consultation-train")
    root = Path(view.name)
    for config, rows, schema in (("all", cases, TEXT_FEATURES.arrow_schema), (KEYINFO, keyinfo, KEYINFO_SCHEMA)):
        path = config_file(root, config)
        path.parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return Split(root, "all", view, len(cases))


def encounters_view(dataset: Path) -> Split:
    from craftmd.dataset_builder.packets import load_packets

    source = _source("encounters", dataset, "packets")
    packets = load_packets(dataset, split="train")  # a malformed file: one line
    view = _view("encounters-train")
    _link(Path(view.name), "packets", source)
    return Split(Path(view.name), None, view, len(packets))


__all__ = ["Split", "open_split", "consultation_cases", "SPLITS"]
