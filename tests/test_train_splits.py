"""Issue 35: training splits that never touch the benchmark.

``craftmd_train`` (split ``train``): MediQ's MedQA items posed as CRAFT-MD vignettes by the benchmark's own transforms,
decontaminated by the rule of ``consult_train``; training packets (``craftmd encounters build --split train``): patients
from another seed and population of the generator, checked against the benchmark's packets. Each split is disjoint from
the benchmark by id and by text, and a planted duplicate is caught.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.dataset_builder import craftmd_train as CT
from craftmd.dataset_builder import golden as G
from craftmd.dataset_builder.schema import TEXT_FEATURES, text_row

sys.path.insert(0, str(Path(__file__).parent))
from test_consult_train import FRESH, benchmark_texts, hashes, medqa_line  # noqa: E402

TRAIN = f"{CT.CONFIG}/{CT.SPLIT}-00000-of-00001.parquet"


# --------------------------------------------------------------------------- craftmd_train


def test_craftmd_train_is_medqa_posed_as_benchmark_vignettes_disjoint_from_the_benchmark(dataset_dir, tmp_path):
    import datasets
    from huggingface_hub import DatasetCard

    from craftmd.dataset_builder.mediq import open_mediq

    ds = datasets.load_dataset(str(dataset_dir), CT.CONFIG, split="train", cache_dir=str(tmp_path / "hf"))
    rows = ds.to_list()
    assert ds.features == TEXT_FEATURES  # the columns and types of the benchmark's text configs
    bench_table = pq.read_table(dataset_dir / "medqa_usmle" / "test-00000-of-00001.parquet")
    assert pq.read_table(dataset_dir / TRAIN).schema.equals(bench_table.schema, check_metadata=False)
    manifest = json.loads((dataset_dir / "build_manifest.json").read_text())
    assert len(rows) == manifest["train_configs"][CT.CONFIG] == manifest["craftmd_train"]["rows"] > 100

    # each row is its MediQ line through the benchmark's transforms: question apart, history/exam split, task type
    lines = {c.case: c for c in G.mediq_candidates(open_mediq().read_files([G.MEDIQ_FILE])[G.MEDIQ_FILE])}
    for r in rows:
        assert r["case_id"].startswith("train_mediq_")
        c = lines[f"mediq:{r['case_id'].removeprefix('train_mediq_')}"]
        assert r == text_row(CT.sample(c))
        assert r["vignette"] == c.vignette and r["question"] not in r["vignette"] and "of the following" not in r["question"]
        assert r["answer"] == r["choices"][r["answer_index"]] == r["paper_answer"] and r["source"] == "medqa_usmle"
        assert r["history"] and r["task_type"] in (
            "diagnosis",
            "next_step",
            "confirm_test",
            "cause",
            "organism",
            "associated_finding",
            "risk_factor",
        )
    # disjoint by id: no training id is a benchmark id (text and image cases)
    bench = benchmark_texts(dataset_dir)
    assert not {r["case_id"] for r in rows} & set(bench)
    # disjoint by text: no row is within the decontamination thresholds of any benchmark case
    cands = [G.Candidate(r["case_id"], "mediq", r["vignette"], (), "", (), "") for r in rows]
    for cid, sim, share in G.nearest(cands, bench):
        assert sim < G.LEVENSHTEIN_THRESHOLD and share < G.NGRAM_THRESHOLD, (cid, sim, share)
    # the MediQ lines that are CRAFT-MD cases (the facts config's match) are none of the rows, and each is listed
    facts = pl.read_parquet(dataset_dir / "facts" / "test-00000-of-00001.parquet").filter(pl.col("mediq_file") == G.MEDIQ_FILE)
    craft = {f"train_mediq_{i}" for i in facts["mediq_id"].to_list()}
    assert len(craft) > 100 and not craft & {r["case_id"] for r in rows}
    report = (dataset_dir / "build_report.md").read_text()
    section = report[report.index("## CRAFT-MD training cases") :]
    listed = {ln.split(" | ")[0].removeprefix("| ") for ln in section.splitlines() if ln.startswith("| mediq:")}
    assert {f"mediq:{i}" for i in facts["mediq_id"].to_list()} <= listed
    assert len(listed) == manifest["craftmd_train"]["dropped"]
    # the card: a config of split train, its licence, a sentence that it is for training and excludes the benchmark
    card = DatasetCard.load(dataset_dir / "README.md")
    cfg = {c["config_name"]: c for c in card.data.to_dict()["configs"]}
    assert cfg[CT.CONFIG]["data_files"] == [{"split": "train", "path": TRAIN}]
    assert "It is for training and excludes the benchmark" in card.text.replace("\n", " ")
    assert "| `craftmd_train` | mixed: CC BY 4.0 · MIT" in card.text


def test_planted_benchmark_case_is_dropped_and_listed_and_the_rebuild_is_byte_identical(source, dataset_dir, tmp_path):
    """A --medqa-train file with a benchmark case (verbatim and lightly reworded) and a fresh item: only the fresh one
    becomes a training case (id train_medqa_<line>); the rebuild is byte-identical; the test configs are unchanged."""
    from craftmd.dataset_builder.build import build_dataset
    from craftmd.dataset_builder.medqa import select

    medqa = pl.read_parquet(dataset_dir / "medqa_usmle" / "test-00000-of-00001.parquet").iter_rows(named=True)
    bench = next(r for r in medqa if select(f"{r['vignette']} {r['question']}").keep and len(r["vignette"]) > 400)
    reworded = bench["vignette"].replace(" and ", " & ", 2).replace("year-old", "yr-old", 1)
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join([
        medqa_line(f"{bench['vignette']} {bench['question']}", list(bench["choices"]), bench["answer_index"]),
        medqa_line(FRESH, ["Seminoma", "Yolk sac tumor", "Hydrocele", "Varicocele"], 1),
        medqa_line(f"{reworded} {bench['question']}", list(bench["choices"]), bench["answer_index"]),
    ]) + "\n")  # fmt: skip
    out = tmp_path / "built"
    build_dataset(source, out, progress=False, medqa_train=f)
    rows = pl.read_parquet(out / TRAIN).to_dicts()
    medqa_rows = [r for r in rows if r["case_id"].startswith("train_medqa_")]
    assert [r["case_id"] for r in medqa_rows] == ["train_medqa_2"] and medqa_rows[0]["answer"] == "Yolk sac tumor"
    assert rows[-1] == medqa_rows[0]  # MediQ's rows first, then the file's
    report = (out / "build_report.md").read_text()
    section = report[report.index("## CRAFT-MD training cases") :]
    dropped = {ln.split(" | ")[0].removeprefix("| "): ln for ln in section.splitlines() if ln.startswith("| medqa-train:")}
    assert set(dropped) == {"medqa-train:1", "medqa-train:3"}
    # the case, the tasks whose test case it is (both pose the CRAFT-MD dataset), and both scores
    assert f"| {bench['case_id']} | craftmd, consultation | 1.0000 | 1.0000 |" in dropped["medqa-train:1"]
    # the benchmark's configs are byte for byte those of the build without the file; the rebuild is identical
    base = hashes(dataset_dir)
    built = hashes(out)
    assert {k: v for k, v in built.items() if k.endswith("test-00000-of-00001.parquet")} == {
        k: v for k, v in base.items() if k.endswith("test-00000-of-00001.parquet")
    }
    again = tmp_path / "again"
    build_dataset(source, again, progress=False, medqa_train=f)
    assert hashes(again) == built


def test_a_training_id_that_is_a_benchmark_id_is_refused():
    c = G.Candidate(
        "mediq:7",
        "mediq",
        FRESH.rsplit(" Which", 1)[0],
        ("x",),
        "Which is the most likely diagnosis?",
        ("Seminoma", "Yolk sac tumor"),
        "Yolk sac tumor",
    )
    rows, report = CT.build_rows([c], {"case_1": "An unrelated case of a child with a rash on the elbows for a week."})
    assert [r["case_id"] for r in rows] == ["train_mediq_7"] and report["dropped"] == []
    with pytest.raises(CraftMDError, match="craftmd_train: training id.*train_mediq_7 are benchmark ids"):
        CT.build_rows([c], {"train_mediq_7": "An unrelated case of a child with a rash on the elbows for a week."})


# --------------------------------------------------------------------------- training packets

CELL = "wellness_checkup:lifestyle_advice"  # anyone alive: the cheapest cell to draw


@pytest.fixture(scope="module")
def packets(tmp_path_factory):
    """A small benchmark build (seed 0) and a small training build checked against it."""
    from craftmd.dataset_builder.packets import build_packets

    root = tmp_path_factory.mktemp("packets")
    build_packets(root / "bench", cells=[CELL], count=3, progress=False)
    assert cli_main(["encounters", "build", "--out", str(root / "train"), "--split", "train", "--count", "3", "--cells", CELL,
                     "--against", str(root / "bench"), "--quiet"]) == 0  # fmt: skip
    return root


def test_training_packets_are_disjoint_from_the_benchmarks_and_the_check_is_reported(packets, tmp_path):
    from craftmd.dataset_builder.packets import TRAIN_SEED, build_packets, history_text, load_packets

    again = tmp_path / "again"
    build_packets(again, split="train", cells=[CELL], count=3, against=packets / "bench", progress=False)
    assert hashes(again) == hashes(packets / "train")  # the same options build the same bytes

    bench = load_packets(packets / "bench")
    train = load_packets(packets / "train", split="train")
    assert len(bench) == len(train) == 3
    assert [r["case_id"] for r in train] == ["medpi_train_0001", "medpi_train_0002", "medpi_train_0003"]
    # no patient (id), no record (bundle, name and birth date), no near-identical history in common
    assert not {r["case_id"] for r in train} & {r["case_id"] for r in bench}
    assert not {r["fhir_sha256"] for r in train} & {r["fhir_sha256"] for r in bench}
    assert not {(r["name"], r["birth_date"]) for r in train} & {(r["name"], r["birth_date"]) for r in bench}
    cands = [G.Candidate(r["case_id"], "packets", history_text(r), (), "", (), "") for r in train]
    for cid, sim, share in G.nearest(cands, {b["case_id"]: history_text(b) for b in bench}):
        assert not G.contaminated(sim, share), (cid, sim, share)
    report = json.loads((packets / "train" / "build_report.json").read_text())
    assert report["split"] == "train" and report["seed"] == TRAIN_SEED
    check = report["benchmark_check"]
    assert check["benchmark"]["packets"] == 3 and check["checked"] == 3 and check["dropped"] == []
    assert "near-identical history" in check["rule"] and str(G.NGRAM_THRESHOLD) in check["rule"]
    manifest = json.loads((packets / "train" / "build_manifest.json").read_text())
    assert "packets/train-00000-of-00001.parquet" in manifest["files"] and manifest["split"] == "train"
    card = (packets / "train" / "README.md").read_text()
    assert "split: train" in card and "for training, never the benchmark" in card
    # the benchmark build is still split test, with no trace of the training options
    bench_manifest = json.loads((packets / "bench" / "build_manifest.json").read_text())
    assert "split" not in bench_manifest and "packets/test-00000-of-00001.parquet" in bench_manifest["files"]
    assert "benchmark_check" not in json.loads((packets / "bench" / "build_report.json").read_text())


def test_planted_duplicate_packets_are_caught(packets, tmp_path):
    from craftmd.dataset_builder.packets import PACKET_SCHEMA, build_packets, load_packets, overlap

    bench = load_packets(packets / "bench")
    train = load_packets(packets / "train", split="train")
    assert overlap(train, bench) == []
    # a copy of a training patient under another id and name (the same history) / the same person in another record
    copy = {**train[0], "case_id": "medpi_0099", "name": "Someone Else", "fhir_sha256": "0" * 64}
    same_person = {
        **bench[0],
        "case_id": "medpi_0098",
        "name": train[1]["name"],
        "birth_date": train[1]["birth_date"],
        "fhir_sha256": "1" * 64,
    }
    same_record = {**bench[1], "case_id": "medpi_0097", "fhir_sha256": train[2]["fhir_sha256"]}
    hits = {d["case"]: d for d in overlap(train, bench + [copy, same_person, same_record])}
    assert (
        hits["medpi_train_0001"]["why"] == "near-identical history" and hits["medpi_train_0001"]["benchmark_case"] == "medpi_0099"
    )
    assert hits["medpi_train_0001"]["similarity"] == 1.0 and hits["medpi_train_0001"]["ngram_share"] == 1.0
    assert hits["medpi_train_0002"]["why"] == "same record (name and birth date)"
    assert hits["medpi_train_0003"]["why"] == "same record (fhir_sha256)"
    # the build drops a planted benchmark packet and lists it: the benchmark here holds the training build's own packets
    planted = tmp_path / "planted"
    (planted / "packets").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([{**r, "case_id": f"medpi_{i:04d}"} for i, r in enumerate(train, 1)], PACKET_SCHEMA),
        planted / "packets" / "test-00000-of-00001.parquet",
    )
    again = tmp_path / "again"
    result = build_packets(again, split="train", cells=[CELL], count=3, against=planted, progress=False)
    check = json.loads((again / "build_report.json").read_text())["benchmark_check"]
    assert [d["case"] for d in check["dropped"]] == [r["case_id"] for r in train] and len(result.dropped) == 3
    assert {d["why"] for d in check["dropped"]} == {"same record (fhir_sha256)"}
    assert load_packets(again, split="train") == [] and result.patients == 0


def test_a_training_packet_that_is_another_tasks_case_is_dropped(packets, tmp_path):
    """Training packets are kept apart from every registered task's test cases, not only the benchmark's packets: a
    packet whose history is a CRAFT-MD case of a folder given with --against is dropped, listed with the tasks whose case
    it is; a build given no such folder says which tasks it did not check."""
    from craftmd.dataset_builder.packets import build_packets, history_text, load_packets

    from craftmd.tasks import builtin_tasks

    empty = tmp_path / "empty"
    empty.mkdir()
    # the tasks whose cases are read from a pinned source wherever the build looks (AgentClinic's): always checked
    anywhere = {t.name: len(t.cases(empty)) for t in builtin_tasks().values() if t.cases and t.cases(empty) is not None}
    alone = json.loads((packets / "train" / "build_report.json").read_text())["benchmark_check"]
    assert alone["other_tasks"] == anywhere and {"craftmd", "consultation"} <= set(alone["not_checked"])
    train = load_packets(packets / "train", split="train")
    craft = tmp_path / "craft"  # a dataset folder of the two configs the CRAFT-MD tasks read their cases from
    for config, cases in (("all", {"case_1": history_text(train[0])}), ("nejm_image", {"case_9": "A woman has a lip ulcer."})):
        (craft / config).mkdir(parents=True)
        pl.DataFrame({"case_id": list(cases), "vignette": list(cases.values())}).write_parquet(
            craft / config / "test-00000-of-00001.parquet"
        )
    again = tmp_path / "again"
    result = build_packets(again, split="train", cells=[CELL], count=3, against=[packets / "bench", craft], progress=False)
    check = json.loads((again / "build_report.json").read_text())["benchmark_check"]
    assert [(d["case"], d["benchmark_case"], d["why"], d["tasks"]) for d in check["dropped"]] == [
        (train[0]["case_id"], "case_1", "another task's test case", ["craftmd", "consultation"])
    ]
    assert check["dropped"][0]["similarity"] == 1.0 and check["benchmark"]["packets"] == 3  # the packets still from bench
    assert check["other_tasks"] == {"craftmd": 2, "consultation": 1, **anywhere} and "craftmd" not in check["not_checked"]
    assert "another registered task" in check["rule"]
    assert [r["case_id"] for r in load_packets(again, split="train")] == [r["case_id"] for r in train[1:]]
    assert result.patients == 2 and "and against the other registered tasks' test cases: craftmd (2), consultation (1)" in (
        result.summary()
    )
    assert all(f"{name} ({n:,})" in result.summary() for name, n in anywhere.items())


def test_training_packets_bad_inputs_are_one_line(packets, tmp_path, capsys):
    from craftmd.dataset_builder.packets import allocate, build_packets, load_matrix, load_packets, select_cells

    with pytest.raises(CraftMDError, match="needs --against DIR"):
        build_packets(tmp_path / "x", split="train", cells=[CELL], count=1)
    with pytest.raises(CraftMDError, match="unknown packets split 'dev'"):
        build_packets(tmp_path / "x", split="dev")
    with pytest.raises(CraftMDError, match="--against is for a training packets build"):
        build_packets(tmp_path / "x", against=packets / "bench")
    with pytest.raises(CraftMDError, match="--count 0 must be at least 1"):
        build_packets(tmp_path / "x", split="train", count=0, against=packets / "bench")
    with pytest.raises(CraftMDError, match="no packets"):
        load_packets(packets / "bench", split="train")
    assert not (tmp_path / "x").exists()
    assert cli_main(["encounters", "build", "--out", str(tmp_path / "y"), "--split", "train", "--count", "2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs --against DIR" in err[0]
    # --count spreads the patients over the cells in proportion to the matrix's counts
    cells = select_cells(load_matrix())
    spread = allocate(cells, 40)
    assert sum(n for *_, n in spread) == 40 and all(n >= 1 for *_, n in spread)
    full = allocate(cells, 366)
    assert full == cells
