"""Issue 48, part C: nothing read without a bound, nothing written half, one line for every bad input.

* A release's files and an inspect log are regular files of bounded size (and a log's JSON of bounded depth), checked
  before anything parses them: a FIFO, ``/dev/zero`` or a log of nested brackets is one line, never a hang or a
  memory blow-up.
* Bad values where data enters (a manifest's 5000-digit number, nonsense command-line numbers, a lock timeout that is
  no number) are one line and a non-zero exit.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from craftmd.commands.cli import main
from craftmd.release import RunRecord, write_release


def _release(path: Path, dataset_dir: Path, n: int = 3) -> Path:
    """A small CRAFT-MD release: vignette FRQ answers for ``n`` derm cases, written by the package."""
    from craftmd.dataset import load_config

    ids = load_config(dataset_dir, "derm_public")["case_id"].to_list()[:n]
    rows = [
        {
            "case_id": c,
            "trial": 0,
            "setting": "vignette",
            "format": "frq",
            "with_image": False,
            "response": "Psoriasis",
            "status": "ok",
        }
        for c in ids
    ]
    return write_release(
        path, RunRecord(release=path.name, kind="generated", model="acme/tiny"), {"answers": pa.Table.from_pylist(rows)}
    )


def one_line(capsys, says: str = "") -> str:
    err = capsys.readouterr().err.strip()
    assert err and err.count("\n") == 0 and "Traceback" not in err and says in err, err
    return err


# -- bounded reads ----------------------------------------------------------------------------------------------------


def _fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


def _zero(p: Path) -> None:
    p.unlink()
    p.symlink_to("/dev/zero")


def _folder(p: Path) -> None:
    p.unlink()
    p.mkdir()


@pytest.mark.parametrize(("how", "says"), [(_fifo, "a FIFO"), (_zero, "a device"), (_folder, "a folder")])
def test_a_release_file_that_is_no_regular_file_is_one_line_never_read(dataset_dir, tmp_path, capsys, how, says):
    rel = _release(tmp_path / "r", dataset_dir)
    how(rel / "answers.parquet")
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, f"not a regular file ({says})")
    assert not (rel / "scores.parquet").exists()


def test_a_manifest_that_is_a_fifo_or_too_large_is_one_line(dataset_dir, tmp_path, capsys):
    rel = _release(tmp_path / "r", dataset_dir)
    _fifo(rel / "manifest.json")
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, "not a regular file (a FIFO)")
    rel = _release(tmp_path / "s", dataset_dir)
    with open(rel / "manifest.json", "ab") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of nothing after the record
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, "too large")


def test_a_manifest_with_a_5000_digit_number_is_one_line(dataset_dir, tmp_path, capsys):
    rel = _release(tmp_path / "r", dataset_dir)
    text = (rel / "manifest.json").read_text()
    (rel / "manifest.json").write_text(text.replace('"schema_version": 2', '"schema_version": ' + "9" * 5000))
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, "unreadable manifest")
