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


def test_a_large_board_holds_a_bounded_part_of_its_files_and_reads_the_rest_again_checked(tmp_path, monkeypatch):
    """Beyond ``HELD_BYTES`` the least recently read files of the open releases are let go (a board of a thousand would
    hold gigabytes): reading one again gives the same table, read again from disk and checked against the run record;
    a file replaced on disk since it was checked is one line naming it."""
    import craftmd.release as R

    monkeypatch.setattr(R, "HELD_BYTES", 1)  # nothing but the file just read is held
    paths = [write_release(tmp_path / f"r{i}", _manifest().model_copy(update={"release": f"r{i}"}), {"answers": _answers(ROWS[: i + 1])})
             for i in range(3)]  # fmt: skip
    rels = [read_release(p) for p in paths]
    assert sum(len(r._data) for r in rels) == 1  # the other releases' bytes let go
    assert [r.table("answers").num_rows for r in rels] == [1, 2, 3]  # read again, checked, the same
    assert R._HELD_TOTAL[0] == len(rels[2].data("answers.parquet"))
    (paths[0] / "answers.parquet").write_bytes((paths[1] / "answers.parquet").read_bytes())  # replaced behind its back
    with pytest.raises(CraftMDError, match=r"r0/answers.parquet changed on disk while this command read it"):
        rels[0].table("answers")
