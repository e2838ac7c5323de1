"""The pinned source: accepted as archive or folder, refused when any read file differs."""

from __future__ import annotations

import shutil
import tarfile

import pytest

from craftmd import CraftMDError
from craftmd.source import Source

CSV = "data/usmle_and_derm_dataset.csv"


@pytest.fixture(scope="module")
def small_tree(source, tmp_path_factory):
    """The data/ files of the pinned source, unpacked as upstream's archive would be."""
    root = tmp_path_factory.mktemp("src") / "craft-md-x"
    for rel, data in source.read_files(["data/*"]).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_archive_reads_verified_files(source):
    files = source.read_files(["data/*"])
    assert sorted(files) == ["data/nejm_imagechallenge_dataset.csv", CSV]
    assert files[CSV].startswith(b",case_vignette,choice_1")
    assert source.describe()["commit"] == source.commit
    assert len(source.describe()["content_sha256"]) == 64


def test_unpacked_folder_and_repacked_archive_verify_alike(source, small_tree, tmp_path):
    assert Source(small_tree).read(CSV) == source.read(CSV)
    assert Source(small_tree.parent).read(CSV) == source.read(CSV)
    repacked = tmp_path / "other-bytes.tar.gz"
    with tarfile.open(repacked, "w:gz") as tar:
        tar.add(small_tree, arcname="craft-md-upstream")
    assert Source(repacked).read(CSV) == source.read(CSV)


def test_one_changed_byte_is_refused_naming_the_file(small_tree, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(small_tree, bad)
    data = bytearray((bad / CSV).read_bytes())
    data[100] ^= 1
    (bad / CSV).write_bytes(bytes(data))
    with pytest.raises(CraftMDError, match=f"{CSV} does not match the pinned sha256"):
        Source(bad).read(CSV)


def test_missing_and_truncated_sources_are_refused(small_tree, tmp_path):
    gone = tmp_path / "gone"
    shutil.copytree(small_tree, gone)
    (gone / CSV).unlink()
    with pytest.raises(CraftMDError, match=f"missing file {CSV}"):
        Source(gone).read(CSV)
    with pytest.raises(CraftMDError, match="source not found"):
        Source(tmp_path / "nowhere.tar.gz")
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(small_tree, arcname="craft-md-x")
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(CraftMDError, match="unreadable archive|missing file"):
        Source(cut).read(CSV)
