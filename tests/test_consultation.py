"""The consultation protocol, offline: key-value extraction, the keyinfo scorer, and generation with a solver.

A tiny dataset is made from the pinned source (a few recorded cases); the loopback server plays
every model: the extracting model (JSON derived from the vignette's sentences, one case answering
prose and one answering HTTP 400, so failures are recorded), the doctor, the lazy patient and the
solver.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError
from craftmd.cli import main as cli_main

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer, pick_upstream, text_of, write_replay_dataset  # noqa: E402

N_CASES = 4


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=\.)\s+", text.strip()) if s]


class Models:
    """A responder for every agent of the protocol; ``bad`` maps a vignette to how its extraction fails."""

    def __init__(self, bad: dict[str, str] | None = None):
        self.bad = bad or {}

    def __call__(self, req: dict) -> str:
        msgs = req["messages"]
        system = text_of(msgs[0]["content"])
        last = text_of(msgs[-1]["content"])
        if system.startswith("You turn a clinical case"):
            vignette = last.split("Case description:\n", 1)[1].rsplit("\n\nJSON:", 1)[0]
            how = self.bad.get(vignette)
            if how == "prose":
                return "Sure! The patient is unwell and has several findings."
            if how == "raise":
                raise ValueError("cannot extract")
            items = [{"key": " ".join(s.split()[:3]), "value": s} for s in sentences(vignette)]
            return "```json\n" + json.dumps({"initial_request": "I feel unwell, can you help me?", "items": items}) + "\n```"
        return self.other(req, system, last)

    def other(self, req: dict, system: str, last: str) -> str:
        raise ValueError(f"unexpected request: {system[:60]!r}")


@pytest.fixture(scope="module")
def upstream(source):
    return pick_upstream(source, N_CASES, seed=11, max_messages=14)


def make_dataset(upstream, out: Path) -> Path:
    write_replay_dataset(upstream, out)
    return out


@pytest.fixture()
def tiny(upstream, tmp_path) -> Path:
    return make_dataset(upstream, tmp_path / "data")


def vignettes(dataset: Path) -> dict[str, str]:
    df = pl.read_parquet(dataset / "all" / "test-00000-of-00001.parquet")
    return dict(zip(df["case_id"], df["vignette"]))


def extract(dataset: Path, url: str, cache: Path, *extra: str) -> int:
    return cli_main(["keyinfo", "extract", "--dataset", str(dataset), "--model", "openai/loopback", "--base-url", url,
                     "--cache", str(cache), "--max-retries", "1", "--quiet", *extra])


def test_extraction_writes_the_config_and_records_every_failure(tiny, tmp_path, capsys):
    from craftmd.dataset_builder.keyinfo import load_keyinfo, prompts

    v = vignettes(tiny)
    ids = sorted(v)
    bad = {v[ids[1]]: "prose", v[ids[2]]: "raise"}
    # a built dataset's card and manifest: the new config is listed in both, nothing else of them changes
    (tiny / "README.md").write_text("---\nconfigs:\n- config_name: all\n  data_files:\n  - split: test\n    path: all/test-00000-of-00001.parquet\n"
                                    "pretty_name: CRAFT-MD\n---\n\n# CRAFT-MD\n\nbody text\n")
    (tiny / "build_manifest.json").write_text(json.dumps({"version": "1", "files": {"all/test-00000-of-00001.parquet": {}}}))
    with LoopbackServer(Models(bad)) as server:
        assert extract(tiny, server.base_url, tmp_path / "c.sqlite") == 0
        first = server.calls
        err = capsys.readouterr().err
        # a re-run over the cache sends nothing and writes the same bytes
        before = (tiny / "keyinfo" / "test-00000-of-00001.parquet").read_bytes()
        assert extract(tiny, server.base_url, tmp_path / "c.sqlite") == 0
        assert server.calls == first
    assert (tiny / "keyinfo" / "test-00000-of-00001.parquet").read_bytes() == before
    rows = {r["case_id"]: r for r in pq.read_table(tiny / "keyinfo" / "test-00000-of-00001.parquet").to_pylist()}
    assert set(rows) == set(ids)
    assert rows[ids[1]]["status"] == "invalid" and "invalid reply" in rows[ids[1]]["error"] and rows[ids[1]]["items"] == []
    assert rows[ids[2]]["status"] == "error" and "cannot extract" in rows[ids[2]]["error"]
    ok = rows[ids[0]]
    assert ok["status"] == "ok" and ok["error"] is None and ok["initial_request"] == "I feel unwell, can you help me?"
    assert [i["value"] for i in ok["items"]] == sentences(v[ids[0]])
    assert {r["model"] for r in rows.values()} == {"openai/loopback"}
    assert {r["prompt_sha256"] for r in rows.values()} == {prompts().sha256}
    assert f"{N_CASES}: {N_CASES - 2} extracted, 2 failed" in err and ids[1] in err and ids[2] in err
    assert set(load_keyinfo(tiny)) == {ids[0], ids[3]}
    card = (tiny / "README.md").read_text()
    assert "config_name: keyinfo" in card and "path: keyinfo/test-00000-of-00001.parquet" in card and "body text" in card
    manifest = json.loads((tiny / "build_manifest.json").read_text())
    assert "keyinfo/test-00000-of-00001.parquet" in manifest["files"] and manifest["configs"]["keyinfo"] == N_CASES
    assert manifest["keyinfo"]["model"] == "openai/loopback" and manifest["keyinfo"]["ok"] == N_CASES - 2


def test_extraction_errors_are_one_line(tiny, tmp_path, capsys):
    from craftmd.dataset_builder.keyinfo import load_keyinfo

    with pytest.raises(CraftMDError, match="run `craftmd keyinfo extract"):
        load_keyinfo(tiny)
    assert cli_main(["keyinfo", "extract", "--dataset", str(tiny), "--model", "nope", "--quiet"]) == 2
    assert "expected PROVIDER/MODEL" in capsys.readouterr().err
    with LoopbackServer(Models()) as server:
        assert extract(tiny, server.base_url, tmp_path / "c.sqlite", "--cases", "case_no_such") == 2
    assert "unknown case id" in capsys.readouterr().err
    assert not (tiny / "keyinfo").exists()


def test_reply_parsing():
    from craftmd.dataset_builder.keyinfo import parse_reply

    got, why = parse_reply('{"initial_request": " Help ", "items": [{"key": "Age", "value": "61"}]}')
    assert why is None and got.initial_request == "Help" and got.items[0].key == "Age"
    for bad, where in [('{"initial_request": "x", "items": []}', "items"), ('{"items": [{"key": "a", "value": "b"}]}', "initial_request"),
                       ('{"initial_request": "x", "items": [{"key": "", "value": "b"}]}', "items.0.key"), ("no json", "reply"),
                       ('{"initial_request": "x", "items": [{"key": "a", "value": "b"}], "extra": 1}', "extra")]:
        got, why = parse_reply(bad)
        assert got is None and why.startswith(f"invalid reply: {where}"), (bad, why)
