"""Build the CRAFT-MD Hugging Face dataset from the pinned upstream source.

``build_dataset(source, out)`` reads the pinned files once (verified by content),
turns every case into a typed record with the pure functions of
:mod:`craftmd.dataset_builder.transform`, and writes ``out`` as a Hugging Face
dataset repo::

    OUT/
      README.md                         card: YAML configs + features, licence, citation, provenance
      build_manifest.json               version, source, file sha256s
      build_report.md                   counts, split check, MedQA filter recall
      {config}/test-00000-of-00001.parquet

Everything is written into a temporary sibling folder that replaces ``out`` only at
the end, so a failed build leaves nothing (or the previous build) at ``out``. The same
source and builder version give byte-identical files.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import DatasetInfo
from datasets.info import DatasetInfosDict
from datasets.splits import SplitDict, SplitInfo
from huggingface_hub import DatasetCardData
from tqdm.auto import tqdm

from craftmd import CraftMDError, __version__
from craftmd.atomic import atomic_dir, sha256_file
from craftmd.cards.render import render_card
from craftmd.dataset_builder import medqa as M
from craftmd.dataset_builder import golden as G
from craftmd.dataset_builder import craftmd_train as CT
from craftmd.dataset_builder import mediq as MQ
from craftmd.dataset_builder import transform as T
from craftmd.dataset_builder import upstream as U
from craftmd.dataset_builder.report import BuildReport, SplitCheck
from craftmd.dataset_builder.schema import (
    CONFIG_SOURCES,
    CONFIGS,
    FEATURES,
    SOURCES,
    TRAIN_CONFIGS,
    build_order,
    config_licence,
    image_row,
    text_row,
)
from craftmd.release import natural_key
from craftmd.samples import Sample
from craftmd.dataset import config_file
from craftmd.source import Source

SPLIT = "test"
MANIFEST = "build_manifest.json"
REPORT = "build_report.md"
CARD = "README.md"
PARQUET_OPTIONS = dict(compression="zstd", compression_level=9, use_dictionary=True, write_statistics=True)
CONFIG_DOC = {
    "medqa_usmle": "MedQA-USMLE diagnosis vignettes",
    "derm_public": "dermatology cases from public online sources (named in the CRAFT-MD paper's Methods)",
    "derm_private": "dermatology cases written by board-certified dermatologists",
    "all": "all text cases (the three above)",
    "nejm_image": "NEJM Image Challenge cases with their image (no answer choices)",
    "diagnoses": "the many-choice options: distinct diagnoses answering the text cases, with counts",
    "facts": "MediQ's atomic facts of the text cases it re-used (CC BY 4.0, Li et al. 2024)",
    "consult_train": "golden consultations for training a doctor (split `train`; no benchmark case)",
    "craftmd_train": "MedQA training cases posed as CRAFT-MD vignettes (split `train`; no benchmark case)",
}
SINGLE_DX_DOC = (
    "the dermatologists' quality-control label of the vignette "
    "(`results/expert_annotations/case_vignette_qc.csv`): true when the answer is the only possible "
    "diagnosis or, if not, still the single most likely one; false when neither; null where not "
    "annotated (every MedQA case). The file's `public_caseNN` is `case_{NN-1}` and `private_caseNN` is "
    "`case_{NN+99}`, the CSV's order of the derm cases. (The per-conversation question Q1 of the "
    "`validation_clinicalllm_patientai_*.xlsx` sheets judges conversations, not vignettes, and is not used.)"
)
SPLIT_DOC = (
    'The question is the last sentence of the upstream text when it ends with "?"; the rest is the '
    'vignette. The dermatology cases carry no question and are asked "{q}", as upstream. '
    'A premise clause that states a measured value before the question word ("If the likelihood ratio '
    '... is 0.04, what is ...") stays with the vignette. MedQA stems that end with ":" instead of "?" '
    "stay in the vignette, as upstream did. `build_report.md` lists every case where the vignette differs "
    "from upstream's own split."
).format(q=T.DEFAULT_QUESTION)


def builder_sha256() -> str:
    """sha256 of the code that decides a built dataset's bytes: this folder's modules and the dataset card.

    Recorded in the build manifest so that a dataset built by other builder code (an older
    checkout, another schema) is never taken for current (see ``craftmd.commands.leaderboard``).
    """
    import hashlib
    import inspect

    from craftmd import overlap, text
    from craftmd.dataset_builder.golden import doctor_system_file
    from craftmd.tasks import builtin_tasks, in_order

    here = Path(__file__).resolve().parent
    hooks = {Path(inspect.getfile(t.cases)) for t in in_order(builtin_tasks()) if t.cases is not None}
    files = sorted(here.glob("*.py")) + [
        here.parent / "cards" / "dataset_card.md.j2",
        here.parent / "cards" / "render.py",
        doctor_system_file(),
        Path(text.__file__),  # the rule that says a candidate is a benchmark case
        Path(overlap.__file__),  # the registered tasks' cases merged into one benchmark
        *sorted(hooks),  # what each registered task gives as its test cases: what the training configs are kept apart from
    ]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def check_version(version: str) -> str:
    if not re.fullmatch(r"\d+\.\d+\.\d+([.-]?[0-9A-Za-z.]+)?", version):
        raise CraftMDError(f"version {version!r} is not X.Y.Z")
    return version


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def read_source(source: Source, progress: bool = True) -> dict:
    """Everything the builder needs from the source, parsed, in one verified pass."""
    wanted = source.pinned(U.PATTERNS)
    got: dict = {"rows": None, "qc": None, "refs": {}, "images": [], "multi_image": []}
    with tqdm(total=len(wanted), desc="reading source", unit="file", disable=not progress, file=sys.stderr) as bar:
        for f in source.iter_files(U.PATTERNS, progress=bar):
            if f.path == U.CASES_CSV:
                got["rows"] = U.parse_cases(f.path, f.data)
            elif f.path == U.QC_CSV:
                got["qc"] = U.parse_qc(f.path, f.data)
            elif f.path.startswith("results/gpt4_1106/"):
                ref = U.parse_reference(f.path, f.data)
                got["refs"][ref.case_id] = ref
            elif f.path.startswith("results/gpt4v/"):
                case, distinct = U.parse_image_case(f.path, f.data)
                got["images"].append(case)
                if distinct > 1:
                    got["multi_image"].append(case.case_id)
    return got


# ---------------------------------------------------------------------------
# Checks against upstream
# ---------------------------------------------------------------------------


def split_check(cases: list[tuple[Sample, str | None]], refs: dict[str, U.Reference], texts: dict[str, str]) -> SplitCheck:
    """Compare each vignette with upstream's ``case_vignette``; explain each difference."""
    check = SplitCheck()
    for case, raw_q in cases:
        ref = refs.get(case.case_id)
        if ref is None:
            continue
        check.compared += 1
        if T.normalize_ws(case.vignette) == T.normalize_ws(ref.vignette):
            check.agreeing += 1
            continue
        text = texts[case.case_id]
        if ref.question == T.DEFAULT_QUESTION and raw_q is not None:
            why = "upstream did not split off the final question (the text ends with whitespace after it)"
        elif ref.question.replace("  ", " of the following ") not in (raw_q or "") and ref.question in text.replace(
            "of the following", ""
        ):
            why = "upstream took an earlier question inside the vignette (a quoted remark) for the question"
        else:
            why = "upstream split the question sentence at another place"
        check.disagreements.append(
            {"case_id": case.case_id, "ours_question": raw_q or T.DEFAULT_QUESTION, "upstream_question": ref.question, "why": why}
        )
    return check


def diagnoses(cases: list[Sample]) -> list[dict]:
    """The many-choice options: the distinct answers (ignoring case and spacing) that name a diagnosis
    (:func:`transform.names_a_diagnosis`), each in its most frequent spelling, with the cases that have it."""
    spellings: dict[str, Counter] = {}
    for c in (c for c in cases if T.names_a_diagnosis(c.question, c.answer)):
        key = T.normalize_ws(c.answer).casefold()
        spellings.setdefault(key, Counter())[T.normalize_ws(c.answer)] += 1
    rows = []
    for key in sorted(spellings):
        counts = spellings[key]
        best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        rows.append({"diagnosis": best, "count": sum(counts.values())})
    return rows


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def write_config(root: Path, config: str, rows: list[dict], split: str = SPLIT) -> Path:
    path = config_file(root, config, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = FEATURES[config].arrow_schema
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path, row_group_size=100 if config == "nejm_image" else 10_000, **PARQUET_OPTIONS)
    return path


def card_text(
    version: str, source: dict, rows: dict[str, int], sizes: dict[str, int], mediq: dict, train: dict | None = None
) -> str:
    """The card; ``train`` (config -> rows) adds the training configs (split ``train``) after the test configs."""
    train = train or {}
    data = DatasetCardData(
        language=["en"],
        license="other",  # the configs' sources have their own terms, one of them unknown: see the card's Licences
        license_name="per-source",
        pretty_name="CRAFT-MD",
        task_categories=["question-answering", "text-generation"],
        tags=["medical", "clinical-reasoning", "diagnosis", "conversational", "benchmark"],
        size_categories=["1K<n<10K"],
    )
    infos = {}
    for c in CONFIGS:
        splits = SplitDict()
        splits.add(SplitInfo(name=SPLIT, num_bytes=sizes[c], num_examples=rows[c]))
        infos[c] = DatasetInfo(features=FEATURES[c], config_name=c, splits=splits)
    for c, n in train.items():
        splits = SplitDict()
        splits.add(SplitInfo(name=G.SPLIT, num_bytes=sizes[c], num_examples=n))
        infos[c] = DatasetInfo(features=FEATURES[c], config_name=c, splits=splits)
    DatasetInfosDict(infos).to_dataset_card_data(data)
    data["configs"] = [
        {"config_name": c, "data_files": [{"split": SPLIT, "path": f"{c}/{SPLIT}-00000-of-00001.parquet"}]} for c in CONFIGS
    ] + [{"config_name": c, "data_files": [{"split": G.SPLIT, "path": f"{c}/{G.SPLIT}-00000-of-00001.parquet"}]} for c in train]
    context = {
        "version": version,
        "config_table": "\n".join(f"| `{c}` | {rows[c]:,} | {CONFIG_DOC[c]} | {config_licence(c)} |" for c in CONFIGS),
        "licence_configs": "\n".join(
            f"| `{c}` | {config_licence(c)} | {', '.join(SOURCES[s].name for s in CONFIG_SOURCES[c])} |" for c in CONFIGS
        ),
        "sources": SOURCES,
        "load_path": "ORG/NAME",
        "aliases": "; ".join(f"{a} → {b}" for a, b in T.SPECIALTY_ALIASES.items()),
        "default_question": T.DEFAULT_QUESTION,
        "task_types": ", ".join(f"`{t}`" for t in T.TASK_TYPES),
        "single_dx_doc": SINGLE_DX_DOC,
        "diagnoses_rule": T.DIAGNOSIS_OPTION_RULE,
        "diagnoses_rows": f"{rows['diagnoses']:,}",
        "nejm_rows": rows["nejm_image"],
        "split_doc": SPLIT_DOC,
        "source_location": source["location"],
        "source_commit": source["commit"],
        "source_content_sha256": source["content_sha256"],
        "facts_rows": rows["facts"],
        "facts_match_doc": MQ.MATCH_DOC,
        "mediq_attribution": MQ.ATTRIBUTION,
        "mediq_commit": mediq["commit"],
        "mediq_content_sha256": mediq["content_sha256"],
        "consult_train_rows": train.get(G.CONFIG),
        "consult_train_licence": config_licence(G.CONFIG),
        "decontamination_doc": G.DECONTAMINATION_DOC,
        "key_rules": ", ".join(k for k, _ in G.KEY_RULES) + f", else {G.OTHER_KEY}",
        "craftmd_train_rows": train.get(CT.CONFIG),
        "craftmd_train_licence": config_licence(CT.CONFIG),
        "craftmd_train_prefix": CT.PREFIX,
    }
    return render_card("dataset_card", context, data)


# ---------------------------------------------------------------------------
# The build
# ---------------------------------------------------------------------------


def build_dataset(
    source: Source,
    out: Path | str,
    *,
    version: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    medqa: Path | str | None = None,
    mediq=None,
    medqa_train: Path | str | None = None,
    golden_writer=None,
    against: list[Path | str] = (),
) -> BuildReport:
    """Build every config into ``out`` (atomically) and return the report.

    ``medqa``: a MedQA JSONL file; its items picked by the MedQA rule replace the
    upstream MedQA cases in ``medqa_usmle`` and ``all``. ``mediq``: the pinned MediQ data (a
    :class:`~craftmd.source.Source` or its location; default ``$CRAFTMD_MEDIQ``, else
    ``../shared/sources``) whose atomic facts make the ``facts`` config. The ``consult_train`` config (split
    ``train``, :mod:`craftmd.dataset_builder.golden`) holds the scripted golden consultations of MediQ's MedQA lines
    and of ``medqa_train`` (a MedQA-format JSONL file), less every benchmark case; ``golden_writer`` (a callable,
    :func:`craftmd.generation.golden.writer`) adds model-written ones.

    A benchmark case is a test case of any registered task (:func:`benchmark`): the test configs this build writes are
    written first and read back through each task's :attr:`~craftmd.tasks.Task.cases`, then ``against`` (other dataset
    folders: a task's cases built elsewhere) in order; the report names the tasks checked and those whose cases were not
    at hand.
    """
    started = time.perf_counter()
    out = Path(out)
    version = check_version(version or __version__)
    _check_out(out, overwrite)
    medqa_items = M.read_jsonl(medqa) if medqa is not None else None
    train_items = M.read_jsonl(medqa_train) if medqa_train is not None else None
    mediq_src = mediq if isinstance(mediq, Source) else MQ.open_mediq(mediq)
    mediq_files = mediq_src.read_files(MQ.FILES)
    mediq_items = [it for f in MQ.FILES for it in MQ.parse(f, mediq_files[f])]

    got = read_source(source, progress)
    if got["rows"] is None or got["qc"] is None:
        raise CraftMDError(f"source {source.location}: missing {U.CASES_CSV if got['rows'] is None else U.QC_CSV}")
    rows: list[U.UpstreamRow] = got["rows"]
    built = [U.build_case(r, got["qc"], got["refs"][r.case_id].answer if r.case_id in got["refs"] else None) for r in rows]
    quality = _source_quality(rows, got["refs"], built)

    cases, medqa_file = _with_medqa_file([c for c, _ in built], medqa, medqa_items)
    cases.sort(key=build_order)
    images: list[Sample] = sorted(got["images"], key=lambda c: natural_key(c.case_id))
    table_rows, facts_info = _table_rows(cases, images, mediq_src, mediq_items)
    counts = {c: len(table_rows[c]) for c in CONFIGS}
    source_info = source.describe()
    against = [Path(a) for a in against]
    for a in against:
        if not a.is_dir():
            raise CraftMDError(f"--against {a}: not a folder (a built dataset folder holding another task's cases)")

    with atomic_dir(
        out, overwrite=overwrite, owns=(MANIFEST,), holds=(MANIFEST, REPORT, CARD, *CONFIGS, *TRAIN_CONFIGS)
    ) as tmp:  # an output that appeared meanwhile is refused at the swap too
        files = _write_configs(tmp, table_rows, progress)
        bench = benchmark([tmp, *against])
        train_rows, train_info, ct_info = _train_rows(bench, mediq_files, train_items, golden_writer)
        if medqa_train is not None:
            train_info["inputs"] = {
                k if k != "--medqa-train" else Path(medqa_train).name: v for k, v in train_info["inputs"].items()
            }
        table_rows |= train_rows
        files |= _write_train_configs(tmp, table_rows)
        train_counts = {c: len(table_rows[c]) for c in TRAIN_CONFIGS}
        sizes = {c: files[f"{c}/{SPLIT}-00000-of-00001.parquet"]["bytes"] for c in CONFIGS}
        sizes.update({c: files[f"{c}/{G.SPLIT}-00000-of-00001.parquet"]["bytes"] for c in TRAIN_CONFIGS})
        (tmp / CARD).write_text(
            card_text(version, source_info, counts, sizes, facts_info["source"], train_counts), encoding="utf-8"
        )
        files[CARD] = {"sha256": sha256_file(tmp / CARD), "bytes": (tmp / CARD).stat().st_size}
        report = _report(
            out, version, source_info, counts, cases, quality, images, got, medqa_file, facts_info, files, train_info, ct_info
        )
        report.benchmark = {"tasks": bench.counts(), "not_checked": bench.missing, "against": [a.name for a in against]}
        (tmp / REPORT).write_text(report.to_markdown(), encoding="utf-8")
        files[REPORT] = {"sha256": sha256_file(tmp / REPORT), "bytes": (tmp / REPORT).stat().st_size}
        manifest = _manifest(report, version, train_counts, files)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    report.seconds = time.perf_counter() - started
    return report


def _report(
    out, version, source_info, counts, cases, quality, images, got, medqa_file, facts_info, files, train_info, ct_info
) -> BuildReport:
    """The build's report: rows per config, the cases by source, specialty and task type, the source's quality."""
    return BuildReport(
        out=out,
        version=version,
        source=source_info,
        rows=counts,
        by_source=dict(Counter(c.source for c in cases).most_common()),
        by_specialty=dict(sorted(Counter(c.specialty or "(none)" for c in cases).items(), key=lambda kv: (-kv[1], kv[0]))),
        by_task_type=dict(sorted(Counter(c.task_type for c in cases).items(), key=lambda kv: (-kv[1], kv[0]))),
        single_dx={str(k).lower() if k is not None else "null": v for k, v in Counter(c.single_dx for c in cases).most_common()},
        **quality,
        nejm={"rows": len(images), "multi_image": sorted(got["multi_image"])},
        medqa_file=medqa_file,
        facts=facts_info,
        files=dict(files),
        empty_vignettes=[c.case_id for c in cases if not c.vignette.strip()],
        consult_train=train_info,
        craftmd_train=ct_info,
    )


def _check_out(out: Path, overwrite: bool) -> None:
    """``out`` may be replaced: absent, or a built dataset (or empty) with ``overwrite``."""
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    if out.exists() and not (out / MANIFEST).exists() and any(out.iterdir()):
        raise CraftMDError(f"{out} exists and is not a built dataset (no {MANIFEST}); refusing to replace it")


def _with_medqa_file(cases: list, medqa, medqa_items: list | None) -> tuple[list, dict | None]:
    """The cases, with a MedQA file's picks in place of upstream's MedQA cases when one is given, and what it gave."""
    if medqa_items is None:
        return cases, None
    picks, file_reasons = M.pick(medqa_items)
    cases = [c for c in cases if c.source != "medqa_usmle"] + picks
    return cases, {"path": Path(medqa).name, "items": len(medqa_items), "picked": len(picks), "reasons": file_reasons}


def _source_quality(rows: list[U.UpstreamRow], refs: dict[str, U.Reference], built: list) -> dict:
    """What the build report says of upstream's cases: the question split's check, the MedQA rule's recall, stems
    ending in a colon, answers renamed, stray quotes removed, where the paper's answer key came from."""
    texts = {r.case_id: r.text for r in rows}
    texts_answer = {r.case_id: r.answer for r in rows}
    renamed = [
        f"{c.case_id} ({T.clean_option(texts_answer[c.case_id])} → {c.answer})"
        for c, _ in built
        if T.clean_option(texts_answer[c.case_id]).casefold() != c.answer.casefold()
    ]
    stray = lambda text: T.normalize_ws(text) != T.clean_option(text)  # noqa: E731
    cleaned = {
        "answers": [r.case_id for r in rows if stray(r.answer)],
        "choice_cases": [r.case_id for r in rows if any(stray(c) for c in r.choices)],
        "choice_values": sum(stray(c) for r in rows for c in r.choices),
    }
    paper_key = {
        "from_results": sum(r.case_id in refs for r in rows),
        "from_csv": sum(r.case_id not in refs for r in rows),
        "differs": [c.case_id for c, _ in built if c.paper_answer != c.answer.lower()],
    }
    colon = [c.case_id for c, q in built if q is None and c.source == "medqa_usmle" and texts[c.case_id].rstrip().endswith(":")]
    recall = M.recall_on({r.case_id: r.text for r in rows if T.map_source(r.dataset) == "medqa_usmle"})
    return {"split": split_check(built, refs, texts),
            "medqa_rule": {"picks": recall.picks, "kept": recall.kept, "recall": recall.recall, "dropped": recall.dropped,
                           "reasons": recall.reasons},
            "colon_stems": colon, "answers_renamed": renamed, "cleaned": cleaned, "paper_key": paper_key}  # fmt: skip


def _table_rows(cases, images, mediq_src, mediq_items) -> tuple[dict, dict]:
    """Every test config's rows, and what the facts config was made from."""
    all_rows = [text_row(c) for c in cases]
    table_rows = {
        "medqa_usmle": [r for r in all_rows if r["source"] == "medqa_usmle"],
        "derm_public": [r for r in all_rows if r["source"] == "derm_public"],
        "derm_private": [r for r in all_rows if r["source"] == "derm_private"],
        "all": all_rows,
        "nejm_image": [image_row(c) for c in images],
        "diagnoses": diagnoses(cases),
    }
    table_rows["facts"], facts_files = MQ.match(mediq_items, {c.case_id: c.vignette for c in cases})
    facts_info = {"source": mediq_src.describe(), "rule": MQ.MATCH_DOC, "files": facts_files, "cases": len(table_rows["facts"])}
    return table_rows, facts_info


def benchmark(folders: list[Path]):
    """Every registered task's test cases as one benchmark (:func:`craftmd.overlap.benchmark`), each task's read from the
    first of ``folders`` holding them; one line when none is."""
    from craftmd.overlap import benchmark as merged, task_cases

    bench = merged(task_cases(folders))
    if not bench.texts:
        raise CraftMDError(f"no registered task's test cases in {folders[0]}: nothing to keep the training configs apart from")
    return bench


def _train_rows(bench, mediq_files, train_items, golden_writer) -> tuple[dict, dict, dict]:
    """The training configs' rows (``consult_train``, ``craftmd_train``), each less every case of ``bench`` (a dropped
    candidate listed with the tasks its case is in), and what they were made from."""
    rows = {}
    rows[G.CONFIG], train_info = G.build_rows(mediq_files[G.MEDIQ_FILE], train_items, bench.texts, golden_writer)
    ct_candidates = G.mediq_candidates(mediq_files[G.MEDIQ_FILE]) + (
        G.medqa_candidates(train_items) if train_items is not None else []
    )
    rows[CT.CONFIG], ct_info = CT.build_rows(ct_candidates, bench.texts)  # the benchmark's n-gram index is made once
    for info in (train_info, ct_info):
        for d in info["dropped"]:
            d["tasks"] = list(bench.tasks[d["benchmark_case"]])
    return rows, train_info, ct_info


def _write_configs(tmp: Path, table_rows: dict, progress: bool) -> dict[str, dict]:
    """Write every test config's parquet file into ``tmp``: relative path -> {sha256, bytes}."""
    files: dict[str, dict] = {}
    for c in tqdm(CONFIGS, desc="writing configs", unit="config", disable=not progress, file=sys.stderr):
        path = write_config(tmp, c, table_rows[c])
        files[path.relative_to(tmp).as_posix()] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return files


def _write_train_configs(tmp: Path, table_rows: dict) -> dict[str, dict]:
    """Write the training configs' parquet files (split ``train``) into ``tmp``: relative path -> {sha256, bytes}."""
    files: dict[str, dict] = {}
    for c in TRAIN_CONFIGS:
        path = write_config(tmp, c, table_rows[c], G.SPLIT)
        files[path.relative_to(tmp).as_posix()] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return files


def _manifest(report: BuildReport, version: str, train_counts: dict, files: dict) -> dict:
    """The build manifest (``build_manifest.json``): what was built from what, by which code, and every file's hash."""
    train_info, ct_info, facts_info = report.consult_train, report.craftmd_train, report.facts
    return {
        "name": "craftmd",
        "version": version,
        "builder": {
            "package": "craftmd",
            "version": __version__,
            "code_sha256": builder_sha256(),
            "pyarrow": pa.__version__,
            "datasets": datasets.__version__,
        },
        "source": report.source,
        "configs": report.rows,
        "split": SPLIT,
        "train_configs": train_counts,
        "consult_train": {
            "inputs": train_info["inputs"],
            "rows": train_info["rows"],
            "by_writer": train_info["by_writer"],
            "dropped": len(train_info["dropped"]),
            "decontamination": train_info["decontamination"],
            "writer": None
            if train_info["writer"] is None
            else {k: v for k, v in train_info["writer"].items() if k != "failed"}
            | {"failed": len(train_info["writer"]["failed"])},
        },
        "craftmd_train": {"rows": ct_info["rows"], "dropped": len(ct_info["dropped"]), "id_prefix": CT.PREFIX},
        "medqa_file": report.medqa_file,
        "mediq": {**facts_info["source"], "files": facts_info["files"], "facts_cases": facts_info["cases"]},
        "question_split_agreement": round(report.split.agreement, 6),
        "medqa_rule_recall": round(report.medqa_rule["recall"], 6),
        "stray_quotes_removed": {"answers": len(report.cleaned["answers"]), "choices": report.cleaned["choice_values"]},
        "files": dict(sorted(files.items())),
    }
