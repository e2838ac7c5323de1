"""Schema 2: a release's scores.parquet (checked on write, replaced per scorer), the refusal of
schema-1 releases, self-grading refused unless allowed, and failed grader calls that are no verdicts."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from craftmd import CraftMDError
from craftmd.release import SCHEMA_VERSION, RunRecord, read_release, sha256_file, write_release, write_scores
from craftmd.scoring.scorers import ScoreRows, Verdict, rank_frq, scores_from_grades

sys.path.insert(0, str(Path(__file__).parent))
from conftest import frozen  # noqa: E402
from loopback import LoopbackServer, text_of  # noqa: E402

KEY = {"setting": "vignette", "format": "frq", "with_image": False}


def _answers(rows):
    cols = ["case_id", "trial", "setting", "format", "with_image", "response", "status"]
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})


ANSWERS = [("case_1", 0, "vignette", "frq", False, "Psoriasis", "ok"), ("case_2", 0, "vignette", "frq", False, "Eczema", "ok")]


def _manifest():
    return RunRecord(task="craftmd", release="toy", kind="generated", model="openai/toy", source={})


def _grade(case_id, grader, correct, trial=0, **kw):
    return {"case_id": case_id, "trial": trial, **KEY, "grader": grader, "resolved": kw.get("resolved"),
            "resolved_kind": kw.get("resolved_kind", "single"), "correct": correct, "detail": kw.get("detail")}  # fmt: skip


def _scores(**override) -> pa.Table:
    """One valid ``correct`` score row, with columns overridden."""
    row = {"case_id": "case_1", "trial": 0, **KEY, "scorer": "offline", "metric": "correct", "value": 1.0,
           "label": "Psoriasis", "detail": None, "status": "ok"}  # fmt: skip
    row.update(override)
    t = scores_from_grades([_grade("case_1", "offline", True)])
    return pa.Table.from_pylist([row], schema=t.schema)


# -- (1) a schema-1 release is refused, saying how to rebuild it ---------------------------------
def test_schema_1_release_is_refused_with_a_one_line_message_on_how_to_rebuild(tmp_path):
    out = write_release(tmp_path / "old", _manifest(), {"answers": _answers(ANSWERS)})
    raw = json.loads((out / "manifest.json").read_text())
    raw["schema_version"] = 1
    raw["notes"]["graders"] = {"offline": {}}  # what a schema-1 manifest carried
    (out / "manifest.json").write_text(json.dumps(raw))
    (out / "grades.parquet").write_bytes(b"PAR1")
    with pytest.raises(CraftMDError) as err:
        read_release(out)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"release schema 1, this craftmd reads {SCHEMA_VERSION}" in msg
    assert "rebuild it" in msg and "craftmd ingest --overwrite" in msg and "craftmd submit" in msg
    # A manifest with no schema version at all is refused the same way.
    del raw["schema_version"]
    (out / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(CraftMDError, match=r"release schema None, this craftmd reads 2; rebuild it"):
        read_release(out)


# -- (2) scores are checked when written -----------------------------------------------------------
def test_a_valid_scores_table_is_written_with_its_records(tmp_path):
    grades = [_grade("case_2", "offline", False), _grade("case_1", "offline", True, resolved="Psoriasis")]
    out = write_release(tmp_path / "r", _manifest(), {"answers": _answers(ANSWERS)},
                        scores=(scores_from_grades(grades), {"offline": {"table_sha256": "x"}}))  # fmt: skip
    rel = read_release(out)
    v = rel.verdicts(grader="offline")
    assert v["case_id"].to_list() == ["case_1", "case_2"] and v["correct"].to_list() == [True, False]
    assert v["resolved"].to_list() == ["Psoriasis", None] and set(v["resolved_kind"]) == {"single"}
    rec = rel.scorer_records()["offline"]
    assert rec["table_sha256"] == "x" and rec["inputs"]["answers_sha256"] == rel.manifest.files["answers.parquet"]["sha256"]
    # The scores file is among the release's checksums, like every other file of it.
    assert rel.manifest.files["scores.parquet"] == {"sha256": sha256_file(out / "scores.parquet"), "rows": 2}


@pytest.mark.parametrize(
    "override, message",
    [
        ({"metric": "accuracy_ish"}, "unknown metric 'accuracy_ish'"),
        ({"value": 2.0}, "is not a valid value of metric 'correct'"),
        ({"value": -1.0}, "is not a valid value of metric 'correct'"),
        ({"value": 0.5}, "is not a valid value of metric 'correct'"),  # binary: 0 or 1
        ({"metric": "meld_similarity", "value": 1.5}, "is not a valid value of metric 'meld_similarity'"),
        ({"metric": "expert_rating", "value": 0.5}, "is not a valid value of metric 'expert_rating'"),  # ordinal levels
        ({"status": "error"}, "status 'error' with value 1.0"),
        ({"value": None}, "status 'ok' with value None"),
        ({"status": "maybe"}, "unknown value"),
        ({"scorer": None}, "scores.scorer: key column has nulls"),
    ],
)
def test_scores_refuse_bad_rows_and_nothing_is_written(tmp_path, override, message):
    with pytest.raises(CraftMDError, match=re.escape(message) if "unknown value" not in message else message):
        write_release(tmp_path / "r", _manifest(), {"answers": _answers(ANSWERS)}, scores=(_scores(**override), {"offline": {}}))
    assert list(tmp_path.iterdir()) == []  # no release, no leftover temporary folder


def test_scores_refuse_duplicate_keys(tmp_path):
    dup = pa.concat_tables([_scores(), _scores(value=0.0)])
    with pytest.raises(CraftMDError, match="duplicate rows"):
        write_release(tmp_path / "r", _manifest(), {"answers": _answers(ANSWERS)}, scores=(dup, {"offline": {}}))
    assert list(tmp_path.iterdir()) == []
    # The same answer scored by two scorers, or for two metrics, is no duplicate.
    ok = pa.concat_tables([_scores(), _scores(scorer="paper"), _scores(metric="meld_flagged", value=0.0)])
    write_release(tmp_path / "r", _manifest(), {"answers": _answers(ANSWERS)}, scores=(ok, {"offline": {}, "paper": {}}))
    assert read_release(tmp_path / "r").scores_with_records()[0].num_rows == 3


def test_an_error_score_has_no_value_and_says_why(tmp_path):
    rows = ScoreRows()
    rows.add(
        {"case_id": "case_1", "trial": 0, **KEY},
        "llm:openai/x",
        Verdict(None, "none", None, '{"extract": null}', "HTTP 400: nope"),
    )
    t = rows.table()
    assert t.column("status").to_pylist() == ["error"] and t.column("value").to_pylist() == [None]
    out = write_release(tmp_path / "r", _manifest(), {"answers": _answers(ANSWERS)}, scores=(t, {"llm:openai/x": {}}))
    v = read_release(out).verdicts()
    assert v["status"].to_list() == ["error"] and v["correct"].to_list() == [None]
    assert json.loads(v["detail"][0]) == {"resolved_kind": "none", "error": "HTTP 400: nope", "extract": None}


# -- (3) write_scores replaces only the named scorers ----------------------------------------------
def test_write_scores_replaces_only_the_named_scorers(tmp_path):
    grades = [
        _grade(c, g, ok) for c in ("case_1", "case_2") for g, ok in (("offline", True), ("paper", False), ("upstream-gpt4", True))
    ]
    out = write_release(tmp_path / "r", _manifest(), {"answers": _answers(ANSWERS)},
                        scores=(scores_from_grades(grades), {"offline": {"v": 1}, "paper": {"v": 1}, "upstream-gpt4": {"v": 1}}))  # fmt: skip
    frozen = {n: (out / n).read_bytes() for n in ("answers.parquet",)}
    record = json.loads((out / "manifest.json").read_text())
    rel = read_release(out)
    before = rel.verdicts()
    # offline re-scored (case_2 now right), paper replaced by fewer rows; upstream-gpt4 untouched.
    new = scores_from_grades(
        [_grade("case_1", "offline", True), _grade("case_2", "offline", True), _grade("case_1", "paper", True)]
    )
    write_scores(rel, new, {"offline": {"v": 2}, "paper": {"v": 2}})
    assert {n: (out / n).read_bytes() for n in frozen} == frozen  # conversations/answers never rewritten
    # The run record is as written, but for the scores file's own checksum.
    now = json.loads((out / "manifest.json").read_text())
    assert (
        now["files"]["scores.parquet"]["sha256"]
        == sha256_file(out / "scores.parquet")
        != record["files"]["scores.parquet"]["sha256"]
    )
    assert {k: v for k, v in now.items() if k != "files"} == {k: v for k, v in record.items() if k != "files"}
    assert {k: v for k, v in now["files"].items() if k != "scores.parquet"} == {
        k: v for k, v in record["files"].items() if k != "scores.parquet"
    }
    after = read_release(out)
    v = after.verdicts().sort("grader", "case_id")
    assert v.filter(pl.col("grader") == "offline")["correct"].to_list() == [True, True]
    assert v.filter(pl.col("grader") == "paper")["case_id"].to_list() == ["case_1"]  # replaced, not merged
    key = ["case_id", "grader"]
    up = before.filter(pl.col("grader") == "upstream-gpt4").sort(key)
    assert up.equals(v.filter(pl.col("grader") == "upstream-gpt4").sort(key))
    rec = after.scorer_records()
    assert rec["offline"] == {"v": 2} and rec["paper"] == {"v": 2}
    assert rec["upstream-gpt4"]["v"] == 1 and "answers_sha256" in rec["upstream-gpt4"]["inputs"]  # kept as written
    # The same write again gives the same bytes.
    once = (out / "scores.parquet").read_bytes()
    write_scores(read_release(out), new, {"offline": {"v": 2}, "paper": {"v": 2}})
    assert (out / "scores.parquet").read_bytes() == once
    # A bad table is refused and the old file stays.
    with pytest.raises(CraftMDError, match="unknown metric"):
        write_scores(read_release(out), _scores(metric="nope"), {"offline": {}})
    assert (out / "scores.parquet").read_bytes() == once


# -- (4) and (5): an LLM grader against the loopback server ----------------------------------------
GRADER = "llm:openai/loopback"
OWN = {"grader_prompts": "grader-v1"}  # the Responder speaks the package's own grader wording
CASES = 4
FAIL = "**Final Diagnosis:**"  # answers written this way make the grader's server fail (HTTP 400)


class Responder:
    """A grader-AI that extracts the text after the diagnosis marker and judges by exact name;
    it raises (the server answers HTTP 400, not retried) on answers written with ``FAIL``."""

    def __call__(self, req: dict) -> str:
        prompt = text_of(req["messages"][-1]["content"])
        if "Answer of the clinical AI" in prompt:
            answer = prompt.split('"""')[1].strip()
            if answer.startswith(FAIL):
                raise ValueError("grader refuses this request")
            return answer.split(":", 1)[1].strip().rstrip(".")
        m = re.search(r"Now decide\. Clinical AI's diagnosis = (.*), correct answer = (.*)\.\nReply", prompt, re.S)
        assert m, "unexpected grader prompt"
        return "correct" if m.group(1).strip().lower() == m.group(2).strip().lower() else "incorrect"


@pytest.fixture
def llm_release(dataset_dir, tmp_path):
    """A generated release of ``openai/loopback``: 4 cases x 2 trials of vignette FRQ answers.
    Case 0 trial 1 is written with ``FAIL`` (its grading call fails); case 3 trial 0 is wrong."""
    from craftmd.dataset import load_config

    ds = load_config(dataset_dir, "all").head(CASES)
    rows = []
    for i, (cid, ans) in enumerate(ds.select("case_id", "answer").iter_rows()):
        ans = ans.strip().strip('"').strip()
        for t in (0, 1):
            text = f"Final Diagnosis: {ans}"
            if (i, t) == (0, 1):
                text = f"{FAIL} {ans}"
            if (i, t) == (3, 0):
                text = "Final Diagnosis: Something else entirely"
            rows.append((cid, t, "vignette", "frq", False, text, "ok"))
    releases = tmp_path / "releases"
    manifest = RunRecord(task="craftmd", release="loopback", kind="generated", model="openai/loopback", source={})
    out = write_release(releases / "loopback", manifest, {"answers": _answers(rows)})
    return out, ds["case_id"].to_list()


def test_an_llm_grader_never_grades_its_own_model_unless_allowed(llm_release, dataset_dir, capsys):
    from craftmd.commands.cli import main
    from craftmd.scoring.scorers import self_graders
    from craftmd.scoring.score import score_release

    path, _ = llm_release
    before = frozen(path)
    assert self_graders(read_release(path).manifest, ["offline", GRADER]) == [GRADER]
    with LoopbackServer(Responder()) as server:
        with pytest.raises(
            CraftMDError, match=r"grader llm:openai/loopback would grade its own model \(openai/loopback\).*--allow-self"
        ):
            score_release(path, dataset_dir, [GRADER], base_url=server.base_url, progress=False, force=True)
        assert (
            main(["score", str(path), "--data", str(dataset_dir), "--scorer", GRADER, "--base-url", server.base_url, "--quiet"])
            == 2
        )
        assert "would grade its own model" in capsys.readouterr().err
        assert server.calls == 0 and not (path / "scores.parquet").exists()  # refused before any call or write
        score_release(
            path, dataset_dir, ["offline", GRADER], base_url=server.base_url, progress=False, allow_self=True, force=True,
            options=OWN,
        )  # fmt: skip
        assert server.calls > 0
    rec = read_release(path).scorer_records()
    assert rec[GRADER]["self_graded"] is True and "self_graded" not in rec["offline"]
    assert frozen(path) == before
    # The board never ranks by a self-grader, however it was measured.
    assert rank_frq([GRADER, "offline"], self_graders={GRADER})[-1] == GRADER
    # The command line's --allow-self does the same.
    with LoopbackServer(Responder()) as server:
        assert main(["score", str(path), "--data", str(dataset_dir), "--scorer", GRADER, "--base-url", server.base_url,
                     "--allow-self", "--grader-prompts", "grader-v1", "--quiet"]) == 0  # fmt: skip
    assert read_release(path).scorer_records()[GRADER]["self_graded"] is True


def _compute():
    from craftmd.analysis.tables import compute

    return compute


def test_a_failed_grader_call_is_no_verdict_and_analysis_leaves_it_out(llm_release, dataset_dir):
    from craftmd.scoring.score import score_release

    path, cases = llm_release
    with LoopbackServer(Responder()) as server:
        score_release(
            path, dataset_dir, [GRADER], base_url=server.base_url, progress=False, allow_self=True, force=True, options=OWN
        )
    rel = read_release(path)
    v = rel.verdicts(grader=GRADER).sort("case_id", "trial")
    assert v.height == CASES * 2
    failed = v.filter(pl.col("status") == "error")
    assert failed.select("case_id", "trial").rows() == [(cases[0], 1)]
    assert failed["correct"].to_list() == [None]  # null, not wrong
    detail = json.loads(failed["detail"][0])
    assert "HTTP 400" in detail["error"] and "grader refuses this request" in detail["error"]
    raw = pl.from_arrow(rel.scores_with_records()[0]).filter(pl.col("status") == "error")
    assert raw.height == 1 and raw["value"].to_list() == [None]
    ok = v.filter(pl.col("status") == "ok")
    assert ok["correct"].null_count() == 0 and ok["correct"].sum() == CASES * 2 - 2  # case 3 trial 0 is wrong
    assert rel.scorer_records()[GRADER]["failures"] == 1 and rel.scorer_records()[GRADER]["graded"] == CASES * 2

    # Accuracy: the mean over cases of each case's share of correct trials, the failed trial left out.
    acc = _compute()(path.parent, dataset_dir, B=200).accuracy
    row = acc.filter((pl.col("grader") == GRADER) & (pl.col("group_by") == "all") & (pl.col("setting") == "vignette"))
    assert row.height == 1
    assert row["n_cases"][0] == CASES
    left_out = (1 / 1 + 2 / 2 + 2 / 2 + 1 / 2) / CASES  # case 0: its one graded trial; case 3: one of two right
    counted_wrong = (1 / 2 + 2 / 2 + 2 / 2 + 1 / 2) / CASES
    assert row["accuracy"][0] == pytest.approx(left_out) and left_out != counted_wrong
