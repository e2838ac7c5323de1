"""The MedQA filter as code, `craftmd build --medqa`, and the build/publish/pin CLI."""

from __future__ import annotations

import re

from pathlib import Path

import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main
from craftmd.dataset import load_config
from craftmd.dataset_builder import medqa as M
from craftmd.dataset_builder.build import REPORT, build_dataset
from craftmd.dataset_builder.upstream import CASES_CSV, parse_cases

SAMPLE = Path(__file__).parent / "fixtures" / "medqa" / "medqa_sample.jsonl"


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    "text, keep, reason",
    [
        (
            "A 45-year-old woman has burning on urination. Urinalysis shows nitrites. Which of the following is the "
            "most appropriate treatment for this patient's most likely diagnosis?",
            False,
            "treatment question",
        ),
        (
            "A 60-year-old man has crushing chest pain. Which of the following is the most appropriate next step in management?",
            False,
            "question not about a diagnosis (treatment)",
        ),
        (
            "A 25-year-old man wheezes after exercise. Which of the following is the mechanism of this patient's most likely diagnosis?",
            False,
            "mechanism question",
        ),
        (
            "A 62-year-old man on warfarin has an INR of 6.2 after starting an antibiotic. Which of the following drugs "
            "is most likely responsible?",
            False,
            "question not about a diagnosis (treatment)",
        ),
        (
            "A 16-year-old girl asks that her parents not be told about her visit. Which of the following is the most "
            "appropriate response by the physician?",
            False,
            "question not about a diagnosis (other)",
        ),
        (
            "A 30-year-old man has a fever and a stiff neck. Which of the following is the most likely diagnosis?",
            True,
            "diagnosis vignette (diagnosis)",
        ),
        (
            "A 30-year-old man has a fever and a stiff neck. Which of the following is the most likely causal organism?",
            True,
            "diagnosis vignette (organism)",
        ),
        (
            "Which of the following enzymes is deficient in the most common form of this diagnosis?",
            False,
            "not a patient vignette",
        ),
        ("A 40-year-old man has a cough and weight loss.", False, "no question sentence"),
    ],
)
def test_rule_verdicts(text, keep, reason):
    v = M.select(text)
    assert (v.keep, v.reason) == (keep, reason)


def test_rule_on_the_fixture_file():
    items = M.read_jsonl(SAMPLE)
    assert len(items) == 8
    verdicts = [M.select(i.question) for i in items]
    # The first three are diagnosis items (diagnosis, next diagnostic step, confirming test); the others
    # are treatment, mechanism, pharmacology, ethics and a non-vignette basic-science item.
    assert [v.keep for v in verdicts] == [True, True, True, False, False, False, False, False]
    cases, reasons = M.pick(items)
    assert [c.case_id for c in cases] == ["medqa_1", "medqa_2", "medqa_3"]
    assert sum(reasons.values()) == 8
    c = cases[0]
    assert c.specialty is None and c.source == "medqa_usmle" and c.single_dx is None
    assert c.answer == "Systemic lupus erythematosus" and c.choices[c.answer_index] == c.answer
    assert c.question == "Which is the most likely diagnosis?"
    assert "Laboratory studies show a positive antinuclear antibody test." in c.physical_exam


def test_rule_recall_on_the_upstream_picks(source, dataset_dir):
    rows = parse_cases(CASES_CSV, source.read(CASES_CSV))
    picks = {r.case_id: r.text for r in rows if r.dataset == "MedQA_USMLE"}
    recall = M.recall_on(picks)
    assert recall.picks == 1804
    assert recall.recall >= 0.95
    # Every drop is a question type the rule must leave out, and the build report lists each one.
    assert {reason for _, reason, _ in recall.dropped} <= {
        "treatment question",
        "mechanism question",
        "statistics question",
        "not a patient vignette",
        "question not about a diagnosis (mechanism)",
        "question not about a diagnosis (treatment)",
    }
    report = (dataset_dir / REPORT).read_text()
    assert f"{recall.kept:,} of the 1,804 upstream picks" in report
    for cid, reason, _ in recall.dropped:
        assert f"| {cid} | {reason} |" in report


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not JSON"),
        ('{"question": "A man?", "options": {"A": "x", "B": "y"}, "answer_idx": "C"}', "answer_idx"),
        ('{"question": "A man?", "options": {"A": "x", "B": "y"}, "answer": "y", "answer_idx": "A"}', "does not match"),
        ('{"options": {"A": "x"}}', "missing 'question'"),
    ],
)
def test_bad_medqa_file_is_refused(tmp_path, line, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(CraftMDError, match=rf"bad.jsonl:1: .*{message}"):
        M.read_jsonl(f)


def test_build_from_a_medqa_file(source, tmp_path):
    out = tmp_path / "data"
    report = build_dataset(source, out, medqa=SAMPLE, progress=False)
    medqa = load_config(out, "medqa_usmle")
    assert medqa["case_id"].to_list() == ["medqa_1", "medqa_2", "medqa_3"]
    assert medqa["specialty"].null_count() == 3
    assert load_config(out, "all").height == 203
    assert report.medqa_file == {"path": "medqa_sample.jsonl", "items": 8, "picked": 3, "reasons": report.medqa_file["reasons"]}
    assert "medqa_sample.jsonl" in (out / REPORT).read_text()


# --------------------------------------------------------------------------- CLI


def test_cli_build_refuses_existing_out(tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    assert main(["build", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "exists" in err and "--overwrite" in err


def test_cli_build_last_line_says_how_to_load(tmp_path, capsys):
    out = tmp_path / "data"
    assert main(["build", "--out", str(out), "--quiet", "--version", "0.1.0"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert str(out) in last and f'load_dataset("{out}", "medqa_usmle")' in last


def test_cli_publish_dry_run_prints_the_plan(dataset_dir, capsys):
    assert main(["publish", str(dataset_dir), "--repo", "someone/craft-md", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "someone/craft-md" in text and "repo_type=dataset" in text and "v0.1.0" in text
    for rel in ("build_manifest.json", "medqa_usmle/test-00000-of-00001.parquet"):
        size = (dataset_dir / rel).stat().st_size
        assert f"{size:,}  {rel}" in text
    # the card as published (it says why the NEJM images are left out), and the images left out unless asked for
    assert re.search(r"^ +[\d,]+  README\.md$", text, re.M)
    assert "left out      nejm_image/test-00000-of-00001.parquet: © Massachusetts Medical Society" in text
    assert "nothing uploaded" in text


def test_cli_publish_without_token_is_one_line(dataset_dir, monkeypatch, capsys):
    import craftmd.dataset_builder.publish as P

    monkeypatch.delenv("HF_TOKEN", raising=False)  # the key comes from HF_TOKEN only (never a stored login or an argument)
    monkeypatch.setattr(P, "HfApi", lambda **kw: pytest.fail("no API call without a token"))
    assert main(["publish", str(dataset_dir), "--repo", "someone/craft-md"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no Hugging Face token" in err and "HF_TOKEN" in err


def test_publish_network_failure_is_one_line(dataset_dir, monkeypatch):
    import craftmd.dataset_builder.publish as P

    class DownApi:
        def __init__(self, **kw):
            pass

        def list_repo_refs(self, *a, **kw):
            raise ConnectionError("Name or service not known\nmore detail")

    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setattr(P, "HfApi", DownApi)
    with pytest.raises(CraftMDError, match="no network") as exc:
        P.publish(dataset_dir, "someone/craft-md")
    assert "\n" not in str(exc.value)


def test_publish_refuses_a_folder_that_is_not_a_build(tmp_path):
    import craftmd.dataset_builder.publish as P

    with pytest.raises(CraftMDError, match="not a built dataset"):
        P.publish(tmp_path, "someone/craft-md", dry_run=True)
    with pytest.raises(CraftMDError, match="ORG/NAME"):
        P.publish(tmp_path, "no-slash", dry_run=True)


def test_cli_pin_writes_sha256sum_lines(tmp_path, capsys):
    rel = tmp_path / "rel"
    (rel / "data").mkdir(parents=True)
    (rel / "data" / "a.csv").write_text("x\n")
    (rel / "src.py").write_text("code\n")  # not pinned: upstream code is not read
    dest = tmp_path / "pin.sha256"
    assert main(["pin", str(rel), "--commit", "abc", "--dest", str(dest)]) == 0
    import hashlib

    assert dest.read_text() == f"{hashlib.sha256(b'x' + bytes([10])).hexdigest()}  data/a.csv\n"
    assert "pinned 1 files" in capsys.readouterr().out
