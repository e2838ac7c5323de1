"""Submissions: every kind of bad input is refused with its line and nothing written;
unanswered cases are scored as wrong; upstream GPT-3.5 answers resubmitted score exactly
as the GPT-3.5 release does."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from craftmd.commands.cli import main
from craftmd.release import find_releases, read_release
from craftmd.tasks import get_task
from craftmd.scoring.submission import (
    MAX_PROBLEMS,
    MAX_RESPONSE_CHARS,
    SubmissionError,
    schema,
    submission_id,
    validate_submission,
)

from helpers import submit_argv

ROW = {"case_id": "case_1", "trial": 0, "setting": "vignette", "format": "frq", "response": "Psoriasis"}
KEY = ["case_id", "trial", "setting", "format", "with_image"]


def line(**kw) -> str:
    return json.dumps(dict(ROW, **kw))


def write(tmp_path, text: str | bytes, name="sub.jsonl"):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def refused(capsys, tmp_path, path, dataset_dir, *expected):
    """Run both commands; each must fail with status 2, name every expected problem, write nothing."""
    out = tmp_path / "out"
    assert main(["validate", str(path), "--dataset", str(dataset_dir)]) == 2
    err = capsys.readouterr().err
    for e in expected:
        assert e in err, f"{e!r} not in:\n{err}"
    assert main(submit_argv(path, dataset_dir, "x/y", out)) == 2
    err2 = capsys.readouterr().err
    for e in expected:
        assert e in err2
    assert not out.exists()
    return err


@pytest.mark.parametrize(
    "content, expected",
    [
        ("", ["empty file"]),
        ("\n\n", ["empty file"]),
        (line() + "\n{not json}\n", ["sub.jsonl:2: not JSON"]),
        (line() + "\n" + line(trial=1)[:-9], ["sub.jsonl:2: truncated line"]),
        (line() + "\n[1, 2]\n", ["sub.jsonl:2: expected a JSON object"]),
        (line() + "\n\n" + line(trial=1) + "\n", ["sub.jsonl:2: empty line"]),
        (json.dumps({k: v for k, v in ROW.items() if k != "response"}) + "\n", ["sub.jsonl:1: 'response' is missing"]),
        (json.dumps({k: v for k, v in ROW.items() if k != "setting"}) + "\n", ["sub.jsonl:1: 'setting' is missing"]),
        (line(trial="0") + "\n", ["sub.jsonl:1: field 'trial' has the wrong type"]),
        (line(response=["a"]) + "\n", ["sub.jsonl:1: field 'response' has the wrong type"]),
        (line(with_image="yes") + "\n", ["sub.jsonl:1: field 'with_image' has the wrong type"]),
        (line(case_id="case_999999") + "\n", ["sub.jsonl:1: unknown case 'case_999999'"]),
        (line(case_id="patient 7") + "\n", ["sub.jsonl:1: case_id 'patient 7' is not a case id"]),
        (line(setting="telepathy") + "\n", ["sub.jsonl:1: unknown setting 'telepathy'"]),
        (line(format="essay") + "\n", ["sub.jsonl:1: unknown format 'essay'"]),
        (
            line() + "\n" + line(response="Eczema") + "\n",
            ["sub.jsonl:2: duplicate row: case_1 trial 0 vignette/frq already on line 1"],
        ),
        (line(response="x" * (MAX_RESPONSE_CHARS + 1)) + "\n", ["sub.jsonl:1: response is too long"]),
        (line(extra=1) + "\n", ["sub.jsonl:1: unexpected field(s)"]),
    ],
)
def test_bad_jsonl(capsys, tmp_path, dataset_dir, content, expected):
    refused(capsys, tmp_path, write(tmp_path, content), dataset_dir, *expected)


def test_non_utf8(capsys, tmp_path, dataset_dir):
    data = (
        line() + "\n"
    ).encode() + b'{"case_id": "case_2", "trial": 0, "setting": "vignette", "format": "frq", "response": "Ps\xf6riasis"}\n'
    refused(capsys, tmp_path, write(tmp_path, data), dataset_dir, "sub.jsonl:2: not UTF-8 (byte 0xf6")


def test_all_problems_are_listed_up_to_the_limit(capsys, tmp_path, dataset_dir):
    lines = [line(trial=t, setting="nowhere") for t in range(MAX_PROBLEMS + 5)]
    lines.insert(3, "garbage")
    err = refused(
        capsys,
        tmp_path,
        write(tmp_path, "\n".join(lines) + "\n"),
        dataset_dir,
        "sub.jsonl:1: unknown setting",
        "sub.jsonl:4: not JSON",
        "... and 6 more",
    )
    assert f"{MAX_PROBLEMS + 6} problem(s)" in err
    assert err.count("  sub.jsonl:") == MAX_PROBLEMS


def test_bad_parquet(capsys, tmp_path, dataset_dir):
    p = tmp_path / "sub.parquet"
    pq.write_table(
        pa.table(
            {
                "case_id": ["case_1", "case_1"],
                "trial": ["0", "1"],
                "setting": ["vignette"] * 2,
                "format": ["frq"] * 2,
                "response": ["a", "b"],
            }
        ),
        p,
    )
    refused(capsys, tmp_path, p, dataset_dir, "sub.parquet:1: field 'trial' has the wrong type", "sub.parquet:2: field 'trial'")
    junk = write(tmp_path, b"PAR1 not really", "junk.parquet")
    refused(capsys, tmp_path, junk, dataset_dir, "not a readable parquet file")
    txt = write(tmp_path, line(), "sub.txt")
    refused(capsys, tmp_path, txt, dataset_dir, "a submission is a .jsonl or .parquet file")


def test_schema_is_shipped_and_matches_the_release_contract(capsys):
    assert main(["submit", "--schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == schema()
    props = printed["properties"]
    task = get_task("craftmd")
    assert tuple(props["setting"]["enum"]) == task.settings and tuple(props["format"]["enum"]) == task.formats
    assert set(printed["required"]) == {"case_id", "trial", "setting", "format", "response"}


def test_missing_cases_are_reported_and_scored_wrong(tmp_path, dataset_dir, capsys):
    from craftmd.dataset import load_config

    cases = load_config(dataset_dir, "derm_public")["case_id"].to_list()
    ds = load_config(dataset_dir, "all")
    answers = dict(ds.select("case_id", "answer").iter_rows())
    answered = cases[:60]
    rows = [line(case_id=c, response=f"**Final Diagnosis:** {answers[c]}") for c in answered]
    rows.append(line(case_id=cases[60], response=None))  # an answer row with no response
    p = write(tmp_path, "\n".join(rows) + "\n")
    v = validate_submission(p, dataset_dir, config="derm_public")
    assert v.missing.height == len(cases) - 61
    assert main(["validate", str(p), "--dataset", str(dataset_dir), "--config", "derm_public"]) == 0
    assert f"{len(cases) - 61} answer(s)" in capsys.readouterr().err
    out = tmp_path / "out"
    submit = submit_argv(p, dataset_dir, "acme/derm-1", out, config="derm_public")
    assert main(submit) == 0
    rel = read_release(out / submission_id("acme/derm-1"))
    assert rel.manifest.kind == "submission"
    a = pl.from_arrow(rel.table("answers"))
    assert a.height == len(cases) and a.filter(pl.col("status") == "missing").height == len(cases) - 60
    assert rel.manifest.display_name == "acme/derm-1 (submission)"
    g = rel.verdicts(grader="offline")
    assert g.height == len(cases)
    assert (g["status"] == "ok").all()  # a missing answer is a verdict (wrong), never a failed score
    assert rel.scorer_records()["offline"]["graded"] == len(cases)
    assert g["correct"].sum() == 60  # every answered case right, every unanswered one wrong
    scores = json.loads((out / "scores.json").read_text())
    overall = [r for r in scores["accuracy"] if r["group_by"] == "all" and r["grader"] == "offline"]
    assert len(overall) == 1 and overall[0]["accuracy"] == pytest.approx(60 / len(cases), abs=1e-6)
    assert overall[0]["ci_low"] <= overall[0]["accuracy"] <= overall[0]["ci_high"]
    assert scores["submission"]["missing_answers"] == len(cases) - 61
    # Next to the score: the offline grader's measured agreement with the GPT-4 grader-AI and the dermatologists.
    from craftmd.scoring.measured import recorded_agreement

    rec, said = recorded_agreement(), scores["grader_reliability"]["offline"]
    assert f"kappa {rec['overall']['held-out']['kappa']:.3f}" in said
    assert (
        f"dermatologists' verdicts on GPT-4's vignette answers (310 Dermatology cases x 5 trials) {rec['dermatologists']['offline']['agreement']:.1%}"
        in said
    )
    assert (out / "scores.csv").exists() and pl.read_csv(out / "scores.csv").height == len(scores["accuracy"])
    # Scoring again without --overwrite is refused; with it, the same bytes come out.
    before = {
        n: (out / submission_id("acme/derm-1") / n).read_bytes() for n in ("scores.parquet", "answers.parquet", "manifest.json")
    }
    assert main(submit) == 2
    assert main([*submit, "--overwrite"]) == 0
    assert {n: (out / submission_id("acme/derm-1") / n).read_bytes() for n in before} == before
    # No --protocol: the submission's protocol is unknown (the board lists it apart from the paper's runs); stated, kept.
    from craftmd.generation.ingest import upstream_protocol
    from craftmd.release import protocol_of

    assert rel.manifest.protocol is None and protocol_of(rel.manifest) is None
    stated = tmp_path / "protocol.json"
    stated.write_text(upstream_protocol().model_dump_json())
    assert (
        main([*submit_argv(p, dataset_dir, "acme/derm-1", tmp_path / "stated", config="derm_public"), "--protocol", str(stated)])
        == 0
    )
    assert read_release(tmp_path / "stated" / submission_id("acme/derm-1")).manifest.protocol == upstream_protocol()
    stated.write_text('{"task": "craftmd", "trials": 0}')
    assert (
        main([*submit_argv(p, dataset_dir, "acme/derm-1", tmp_path / "refused", config="derm_public"), "--protocol", str(stated)])
        == 2
    )
    assert "--protocol" in capsys.readouterr().err and not (tmp_path / "refused").exists()


@pytest.fixture(scope="module")
def gpt35(releases_dir, dataset_dir, tmp_path_factory):
    """The GPT-3.5 release with the offline grader added (a copy)."""
    from craftmd.scoring.score import score_release

    d = tmp_path_factory.mktemp("gpt35") / "gpt3_1106"
    shutil.copytree(releases_dir / "gpt3_1106", d)
    score_release(d, dataset_dir, ["offline"], progress=False, force=True)
    return read_release(d)


def test_round_trip_gpt35(gpt35, source, dataset_dir, tmp_path):
    """Upstream GPT-3.5 answers resubmitted score exactly as the GPT-3.5 release does."""
    answers = pl.from_arrow(gpt35.table("answers"))
    sub = answers.select("case_id", "trial", "setting", "format", "response")
    p = tmp_path / "gpt35.parquet"
    sub.write_parquet(p)
    out = tmp_path / "out"
    assert main(submit_argv(p, dataset_dir, "openai/gpt-3.5-turbo-1106", out)) == 0
    rel = find_releases(out)[0]
    assert rel.manifest.kind == "submission"
    mine = rel.verdicts()
    theirs = gpt35.verdicts()
    a2 = pl.from_arrow(rel.table("answers"))
    assert (
        a2.height == answers.height
        and a2.filter(pl.col("status") == "missing").height == answers.filter(pl.col("status") != "ok").height
    )
    # Every grade row equal, paper included: ingest and submissions both grade paper against the
    # dataset's paper_answer (upstream's recorded key) and strict/offline against its answer.
    for grader in ("paper", "strict", "offline"):
        x = mine.filter(pl.col("grader") == grader).sort(KEY)
        y = theirs.filter(pl.col("grader") == grader).sort(KEY)
        assert x.height == y.height > 0
        assert x.equals(y), grader
    # Same accuracy figures as the release, per setting, for every grader.
    from craftmd.analysis.tables import compute

    graders = ["paper", "strict", "offline"]
    scores = json.loads((out / "scores.json").read_text())
    acc = pl.DataFrame(scores["accuracy"]).filter((pl.col("group_by") == "all") & pl.col("grader").is_in(graders))
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    shutil.copytree(gpt35.path, ref_dir / "gpt3_1106")
    ref = compute(ref_dir, dataset_dir, B=200).accuracy.filter((pl.col("group_by") == "all") & pl.col("grader").is_in(graders))
    j = acc.join(ref, on=["setting", "format", "grader", "with_image"], suffix="_ref")
    assert j.height == acc.height == ref.height == 12
    assert (j["accuracy"] == j["accuracy_ref"]).all()
    assert (j["n_cases"] == j["n_cases_ref"]).all()


def test_submission_error_lists_problems(tmp_path, dataset_dir):
    p = write(tmp_path, line(setting="x") + "\n" + line(format="y") + "\n")
    with pytest.raises(SubmissionError) as e:
        validate_submission(p, dataset_dir)
    assert e.value.total == 2 and [n for n, _ in e.value.problems] == [1, 2]


def test_top3_and_mcq_many_are_graded(tmp_path, dataset_dir):
    from craftmd.dataset import load_config
    from craftmd.commands.submit import score_submission

    ds = load_config(dataset_dir, "derm_public").head(3)
    rows = []
    for c, ans, ch in ds.select("case_id", "answer", "choices").iter_rows():
        rows.append(line(case_id=c, format="top3", response=f"1. Lichen planus\n2. {ans}\n3. Psoriasis"))
        rows.append(line(case_id=c, format="mcq_many", response=f"Final Diagnosis: {ans}"))
    p = write(tmp_path, "\n".join(rows) + "\n")
    score_submission(p, dataset_dir, "acme/t3", tmp_path / "out", config="derm_public", B=200, progress=False)
    g = read_release(tmp_path / "out" / submission_id("acme/t3")).verdicts()
    answered = set(ds["case_id"])
    top3 = g.filter((pl.col("format") == "top3") & (pl.col("grader") == "offline"))
    assert top3.filter(pl.col("case_id").is_in(answered))["correct"].all()
    assert not top3.filter(~pl.col("case_id").is_in(answered))["correct"].any()
    many = g.filter((pl.col("format") == "mcq_many") & pl.col("case_id").is_in(answered))
    assert set(many["grader"]) == {"paper", "strict"} and many["correct"].all()


def test_one_schema_validator_names_the_field(capsys, tmp_path, dataset_dir):
    """The submission schema is checked by one validator (jsonschema-rs, the fast one) whose errors are worded per field,
    a value nested deep (past its recursion limit) included."""
    import ast

    import craftmd.scoring.submission as sub

    imported = {a.name for n in ast.walk(ast.parse(open(sub.__file__).read())) if isinstance(n, ast.Import) for a in n.names}
    assert "jsonschema_rs" in imported and "jsonschema" not in imported
    deep = "{" + '"case_id": "case_1", "a": ' + '{"a":' * 900 + "1" + "}" * 900 + "}"
    content = "\n".join([line(trial=63), line(trial=-1, response=7), deep]) + "\n"
    refused(
        capsys,
        tmp_path,
        write(tmp_path, content),
        dataset_dir,
        "sub.jsonl:1: trial: 63 is greater than the maximum of 62",
        "sub.jsonl:2: field 'response' has the wrong type: 7 is not of type ['string', 'null']",
        "sub.jsonl:2: trial: -1 is less than the minimum of 0",
        "sub.jsonl:3: 'trial' is missing (required field)",
        "sub.jsonl:3: unexpected field(s): 'a'",
    )
