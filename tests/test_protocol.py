"""The protocol a release ran, in its run record: written, read back byte for byte, derived for a record written before
protocols were recorded, refused in one line when it is not one; and why two protocols differ, in words."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from craftmd import CraftMDError
from craftmd.generation.ingest import upstream_protocol
from craftmd.release import PromptRef, Protocol, RunRecord, protocol_differences, protocol_of, read_release, write_release

ROWS = {"case_id": ["case_1"], "trial": [0], "setting": ["vignette"], "format": ["frq"], "with_image": [False],
        "response": ["Psoriasis"], "status": ["ok"]}  # fmt: skip


def _written(tmp_path, **fields):
    record = RunRecord(
        release="toy", kind="generated", model="openai/toy", source={"commit": "x"}, **{"task": "craftmd", **fields}
    )
    return write_release(tmp_path / "toy", record, {"answers": pa.table(ROWS)})


def test_the_protocol_survives_write_and_read_byte_for_byte(tmp_path):
    paper = upstream_protocol()
    out = _written(tmp_path, protocol=paper)
    text = (out / "manifest.json").read_bytes()
    assert json.loads(text)["protocol"]["prompt_set"]["name"] == "craftmd-upstream-3bb2737"
    back = read_release(out).manifest
    assert back.protocol == paper and back.protocol.key() == paper.key()
    assert back.to_json().encode() == text  # read and written again: the same bytes
    assert RunRecord.from_dict(json.loads(text)).to_json().encode() == text


def test_a_record_without_a_protocol_reads_and_says_what_it_can(tmp_path):
    out = _written(tmp_path, prompt_set={"name": "craftmd-v1", "sha256": "a" * 64},
                   roles={"doctor": {"model": "openai/toy"}, "patient": {"model": "openai/p"}}, counts={"trials": 3})  # fmt: skip
    text = (out / "manifest.json").read_bytes()
    assert "protocol" not in json.loads(text)  # as an older craftmd wrote it
    m = read_release(out).manifest
    assert m.protocol is None and m.to_json().encode() == text  # nothing added when written again
    derived = protocol_of(m)
    assert derived == Protocol(task="craftmd", prompt_set=PromptRef(name="craftmd-v1", sha256="a" * 64),
                               roles={"patient": "openai/p"}, trials=3)  # fmt: skip
    assert protocol_differences(derived, upstream_protocol()) == [
        "craftmd version not recorded vs 2",
        "prompt set craftmd-v1 ≠ craftmd-upstream-3bb2737",
        "patient openai/p vs openai/gpt-4-1106-preview",
        "summarizer not recorded vs openai/gpt-3.5-turbo-1106",
        "MCQ rules not recorded vs paper v4, strict v4",
        "3 trials vs 5",
    ]
    submitted = RunRecord(task="craftmd", release="s", kind="submission", model="acme/x")
    assert protocol_of(submitted) is None  # a submission that states none: unknown
    assert protocol_differences(None, upstream_protocol()) == ["unknown protocol (the release states none)"]


@pytest.mark.parametrize(
    "protocol, where",
    [
        ({"task": "craftmd", "trials": 999}, "protocol.trials"),
        ({"task": "craftmd", "prompt_set": {"name": "x", "sha256": "not hex"}}, "protocol.prompt_set.sha256"),
        ({"task": "craftmd", "surprise": 1}, "protocol.surprise"),
        (["craftmd"], "protocol"),
    ],
)
def test_a_protocol_that_is_not_one_is_one_line(tmp_path, protocol, where):
    out = _written(tmp_path)
    raw = json.loads((out / "manifest.json").read_text())
    raw["protocol"] = protocol
    (out / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(CraftMDError, match=rf"invalid run record: {where}") as e:
        read_release(out)
    assert "\n" not in str(e.value)


def test_the_differences_in_words():
    paper = upstream_protocol()
    assert protocol_differences(paper, paper) == []
    other = paper.model_copy(update={"version": 1, "roles": {**paper.roles, "patient": "openai/gpt-4o"}, "grader": None})
    assert protocol_differences(other, paper) == ["craftmd version 1 vs 2", "patient openai/gpt-4o vs openai/gpt-4-1106-preview"]
    # an image run (the doctor shown the cases' images: upstream's multimodal path) is another experiment than a text run
    image = paper.model_copy(update={"images": True})
    assert protocol_differences(image, paper) == ["images shown to the doctor vs text only"] and image.key() != paper.key()
    assert protocol_differences(paper, image) == ["text only vs images shown to the doctor"]
    resha = paper.model_copy(update={"prompt_set": PromptRef(name=paper.prompt_set.name, sha256="b" * 64)})
    assert paper.prompt_set.sha256 and len(paper.prompt_set.sha256) == 64  # upstream's prompt set, as a run records it
    assert protocol_differences(resha, paper) == [
        f"prompt set craftmd-upstream-3bb2737 differs (sha256 bbbbbbbbbbbb… vs {paper.prompt_set.sha256[:12]}…)"
    ]
    # the board compares free response per grader; a comparison of two recorded graders names theirs
    regraded = paper.model_copy(update={"grader": paper.grader.model_copy(update={"prompt_set": PromptRef(name="grader-v1")})})
    assert protocol_differences(regraded, paper) == [] and regraded.key() == paper.key()
    assert protocol_differences(regraded, paper, graders=True) == ["grader prompts differ"]


def test_a_submission_states_its_protocol_in_a_file_or_is_refused_in_one_line(tmp_path):
    from craftmd.scoring.submission import read_protocol

    good = tmp_path / "p.json"
    good.write_text(upstream_protocol().model_dump_json())
    assert read_protocol(good) == upstream_protocol()
    for name, text, what in (("bad.json", "{", "not a JSON object"), ("list.json", "[]", "not a JSON object"),
                             ("typo.json", '{"task": "craftmd", "trails": 5}', "trails")):  # fmt: skip
        (tmp_path / name).write_text(text)
        with pytest.raises(CraftMDError, match=what) as e:
            read_protocol(tmp_path / name)
        assert "\n" not in str(e.value)
    with pytest.raises(CraftMDError, match="cannot read it"):
        read_protocol(tmp_path / "missing.json")
