"""The release contract: schemas, atomic deterministic writing, verified reading."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from craftmd import CraftMDError
from craftmd.release import RunRecord, find_releases, read_release, sha256_file, write_release


def _answers(rows):
    cols = ["case_id", "trial", "setting", "format", "with_image", "response", "status"]
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})


ROWS = [
    ("case_10", 0, "vignette", "frq", False, "Psoriasis", "ok"),
    ("case_2", 1, "multiturn", "mcq4", False, None, "missing"),
    ("case_2", 0, "multiturn", "mcq4", False, "B", "ok"),
]


def _manifest():
    return RunRecord(task="craftmd", release="toy", kind="generated", model="openai/toy", source={"commit": "x"})


def test_write_sorts_cases_by_number_and_is_byte_identical(tmp_path):
    a = write_release(tmp_path / "a", _manifest(), {"answers": _answers(ROWS)})
    b = write_release(tmp_path / "b", _manifest(), {"answers": _answers(list(reversed(ROWS)))})
    rel = read_release(a)
    ids = rel.table("answers").column("case_id").to_pylist()
    trials = rel.table("answers").column("trial").to_pylist()
    assert ids == ["case_2", "case_2", "case_10"]  # by number, not as text
    assert trials == [0, 1, 0]
    assert sha256_file(a / "answers.parquet") == sha256_file(b / "answers.parquet")
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["files"]["answers.parquet"]["rows"] == 3
    assert manifest["schema_version"] == 2
    assert not (a / "scores.parquet").exists()  # unscored until graded


@pytest.mark.parametrize(
    "rows, message",
    [
        ([("case_1", 0, "telepathy", "frq", False, "x", "ok")], "unknown value"),
        ([("case_1", 0, "vignette", "frq", False, "x", "ok")] * 2, "duplicate"),
        ([(None, 0, "vignette", "frq", False, "x", "ok")], "key column has nulls"),
        ([("case_1", 0, "vignette", "essay", False, "x", "ok")], "unknown value"),
        ([("case_1", 0, "vignette", "frq", False, "x", "fine")], "unknown value"),
    ],
)
def test_bad_tables_are_refused_and_nothing_is_written(tmp_path, rows, message):
    with pytest.raises(CraftMDError, match=message):
        write_release(tmp_path / "r", _manifest(), {"answers": _answers(rows)})
    assert list(tmp_path.iterdir()) == []  # no release, no leftover temporary folder


def test_sample_ids_are_opaque_and_sorted_in_natural_order(tmp_path):
    rows = [(c, 0, "vignette", "frq", False, "x", "ok") for c in ("b10", "1", "b9", "a", "case_10", "case_9")]
    out = write_release(tmp_path / "r", _manifest(), {"answers": _answers(rows)})
    assert read_release(out).table("answers").column("case_id").to_pylist() == ["1", "a", "b9", "b10", "case_9", "case_10"]


def test_run_record_refuses_unknown_fields(tmp_path):
    out = write_release(tmp_path / "r", _manifest(), {"answers": _answers(ROWS)})
    raw = json.loads((out / "manifest.json").read_text())
    raw["notes_typo"] = {}
    (out / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(CraftMDError, match="invalid run record: notes_typo"):
        read_release(out)


def test_existing_release_is_kept_unless_overwrite(tmp_path):
    out = write_release(tmp_path / "r", _manifest(), {"answers": _answers(ROWS)})
    with pytest.raises(CraftMDError, match="exists"):
        write_release(out, _manifest(), {"answers": _answers(ROWS[:1])})
    assert read_release(out).table("answers").num_rows == 3
    write_release(out, _manifest(), {"answers": _answers(ROWS[:1])}, overwrite=True)
    assert read_release(out).table("answers").num_rows == 1
    assert [p.name for p in tmp_path.iterdir()] == ["r"]


def test_tampered_release_is_refused_on_read(tmp_path):
    out = write_release(tmp_path / "r", _manifest(), {"answers": _answers(ROWS)})
    write_release(tmp_path / "other", _manifest(), {"answers": _answers(ROWS[:1])})
    (out / "answers.parquet").write_bytes((tmp_path / "other" / "answers.parquet").read_bytes())
    with pytest.raises(CraftMDError, match="answers.parquet is damaged"):
        read_release(out)
    with pytest.raises(CraftMDError, match="answers.parquet is damaged"):
        find_releases(tmp_path)
