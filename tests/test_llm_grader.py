"""The LLM grader-AI (two steps, through the model layer) against the loopback server,
and craftmd score's bookkeeping of answer scorers, on recorded upstream answers."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from craftmd import CraftMDError
from craftmd.release import read_release, write_release, write_scores
from craftmd.scoring.score import score_release, stale
from craftmd.scoring.scorers import check_scorers
from craftmd.scoring.llm_grader import load_prompts, parse_extraction, parse_judgement
from craftmd.scoring.offline import OfflineGrader, extract

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer, text_of  # noqa: E402

GRADER = "llm:openai/loopback"
#: The package's own wording (the default is upstream's protocol: tests/test_grader_upstream.py).
OWN = {"options": {"grader_prompts": "grader-v1"}}


class GraderResponder:
    """Answers like a grader-AI: step 1 extracts, step 2 judges (with the offline grader's rules)."""

    def __init__(self):
        self.offline = OfflineGrader()
        self.steps = {"extract": 0, "judge": 0}

    def __call__(self, req: dict) -> str:
        prompt = text_of(req["messages"][-1]["content"])
        if "Answer of the clinical AI" in prompt:
            self.steps["extract"] += 1
            answer = prompt.split('"""')[1].strip("\n")
            ex = extract(answer)
            return ex.kind if ex.kind != "single" else f"{ex.diagnosis}"
        m = re.search(r"Now decide\. Clinical AI's diagnosis = (.*), correct answer = (.*)\.\nReply", prompt, re.S)
        assert m, "unexpected grader prompt"
        self.steps["judge"] += 1
        return "correct" if self.offline.equivalent(m.group(1), m.group(2)) else "incorrect"


@pytest.fixture
def small_release(releases_dir, tmp_path):
    """The first 30 cases of the recorded GPT-3.5 release (all its answers and scores)."""
    rel = read_release(releases_dir / "gpt3_1106")
    keep = pa.array([f"case_{i}" for i in range(30)])
    import pyarrow.compute as pc

    tables = {n: rel.table(n).filter(pc.is_in(rel.table(n).column("case_id"), keep)) for n in ("conversations", "answers")}
    scores, records = rel.scores_with_records()
    scores = scores.filter(pc.is_in(scores.column("case_id"), keep))
    out = tmp_path / "gpt3_small"
    write_release(out, rel.manifest, tables, scores=(scores, records))
    return out


def _frozen(release) -> dict:
    """What generation (here: ingest) wrote, which grading must never rewrite (the run record but for the scores' checksum)."""
    from conftest import frozen

    return frozen(release)


def test_prompts_mirror_the_paper_examples():
    p = load_prompts()
    assert "{response}" in p["extract"] and "multiple" in p["extract"] and "none" in p["extract"]
    for example in ("toe nail fungus", "verruca vulgaris", "hodgkin's lymphoma", "onychomycosis"):
        assert example in p["judge"]
    assert "{diagnosis}" in p["judge"] and "{answer}" in p["judge"]


@pytest.mark.parametrize(
    "text, expected",
    [("Psoriasis", ("Psoriasis", "single")), ("multiple", (None, "multiple")), ("None", (None, "none")),
     ("Diagnosis: Acute appendicitis.", ("Acute appendicitis", "single")), ("", (None, "none")), (None, (None, "none")),
     ("Multiple sclerosis", ("Multiple sclerosis", "single")), ("Multiple myeloma", ("Multiple myeloma", "single")),
     ("Multiple.", (None, "multiple")), ("multiple diagnoses", (None, "multiple"))],
)  # fmt: skip
def test_parse_extraction(text, expected):
    assert parse_extraction(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [("correct", True), ("Incorrect.", False), ("Correct - synonyms", True), ("no", False), ("maybe", None), (None, None)],
)
def test_parse_judgement(text, expected):
    assert parse_judgement(text) is expected


def test_llm_grader_on_recorded_answers(small_release, dataset_dir, tmp_path):
    responder = GraderResponder()
    cache = tmp_path / "grader-cache.sqlite"
    frozen = _frozen(small_release)
    with LoopbackServer(responder) as server:
        score_release(
            small_release,
            dataset_dir,
            [GRADER, "offline"],
            base_url=server.base_url,
            cache=cache,
            progress=False,
            force=True,
            **OWN,
        )
        first_calls, url = server.calls, server.base_url
        # The grader's record is current (same model, prompts, sampling and answers, no failed call): nothing to do.
        before = (small_release / "scores.parquet").read_bytes()
        assert stale(small_release, dataset_dir, [GRADER, "offline"], **OWN) == []
        # Another prompt set (the default) would grade again.
        assert stale(small_release, dataset_dir, [GRADER, "offline"]) == [GRADER]
        # Forced, a second run answers from the cache: no new calls, same bytes. (Same server: the LLM
        # grader's record keeps the base_url it was called at.)
        server.reset_counters()
        score_release(
            small_release, dataset_dir, [GRADER], base_url=server.base_url, cache=cache, progress=False, force=True, **OWN
        )
        assert server.calls == 0
    assert (small_release / "scores.parquet").read_bytes() == before
    assert _frozen(small_release) == frozen  # grading writes scores.parquet beside the release, nothing else
    rel = read_release(small_release)
    g = rel.verdicts()
    answers = pl.from_arrow(rel.table("answers")).filter(pl.col("format") == "frq")
    llm = g.filter(pl.col("grader") == GRADER).sort("case_id", "trial", "setting")
    off = g.filter(pl.col("grader") == "offline").sort("case_id", "trial", "setting")
    assert llm.height == answers.height == off.height == 30 * 5 * 4
    assert (llm["status"] == "ok").all() and llm["correct"].null_count() == 0  # no call failed: every row a verdict
    # Both steps' raw outputs are kept.
    details = [json.loads(d) for d in llm["detail"]]
    assert all({"extract", "judge"} <= d.keys() for d in details)
    singles = llm.filter(pl.col("resolved_kind") == "single")
    assert singles.height > 0 and all(json.loads(d)["judge"] in ("correct", "incorrect") for d in singles["detail"])
    # multiple / none score 0 and skip step 2.
    others = llm.filter(pl.col("resolved_kind") != "single")
    assert others.height > 0 and not others["correct"].any()
    assert all(json.loads(d)["judge"] is None for d in others["detail"])
    # The responder judges with the offline rules, so the two graders must agree row for row.
    assert llm["correct"].to_list() == off["correct"].to_list()
    assert llm["resolved_kind"].to_list() == off["resolved_kind"].to_list()
    # Identical requests are asked once; recorded graders are kept; the scorer records say what graded.
    assert responder.steps["extract"] == len({r for r in answers["response"].to_list() if r})
    assert {"paper", "strict", "upstream-gpt4", "offline", GRADER} <= set(g["grader"])
    info = rel.scorer_records()[GRADER]
    assert info["model"] == "openai/loopback" and info["prompt_set"]["name"] == "grader-v1" and info["failures"] == 0
    assert info["graded"] == llm.height
    assert "self_graded" not in info  # another model's answers
    assert info["base_url"] == url
    assert first_calls > 0


def test_llm_grader_survives_server_faults(small_release, dataset_dir, tmp_path):
    clean, flaky = tmp_path / "clean", tmp_path / "flaky"
    shutil.copytree(small_release, clean)
    shutil.copytree(small_release, flaky)
    with LoopbackServer(GraderResponder()) as server:
        score_release(clean, dataset_dir, [GRADER], base_url=server.base_url, progress=False, force=True, **OWN)
    with LoopbackServer(GraderResponder(), error_rate=0.2, error_kinds=("429", "500")) as server:
        score_release(flaky, dataset_dir, [GRADER], base_url=server.base_url, progress=False, force=True, **OWN)
        assert sum(server.faults.values()) > 0
    a = read_release(clean).verdicts(grader=GRADER)
    b = read_release(flaky).verdicts(grader=GRADER)
    assert a.height == 30 * 5 * 4 and (b["status"] == "ok").all()  # retried faults end as verdicts
    assert a.equals(b)


def test_regrading_replaces_rows_and_keeps_others(small_release, dataset_dir):
    frozen = _frozen(small_release)
    before = read_release(small_release).verdicts()
    recorded_before = read_release(small_release).scorer_records()["upstream-gpt4"]
    score_release(small_release, dataset_dir, ["paper", "strict"], progress=False, force=True)
    assert _frozen(small_release) == frozen  # answers, conversations and manifest untouched
    after = read_release(small_release).verdicts()
    assert after.height == before.height  # replaced, not duplicated
    assert read_release(small_release).scorer_records()["upstream-gpt4"] == recorded_before  # other records kept
    # The same grading again writes the same bytes.
    once = (small_release / "scores.parquet").read_bytes()
    score_release(small_release, dataset_dir, ["paper", "strict"], progress=False, force=True)
    assert (small_release / "scores.parquet").read_bytes() == once
    assert _frozen(small_release) == frozen
    key = ["case_id", "trial", "setting", "format", "with_image", "grader"]
    recorded = before.filter(pl.col("grader") == "upstream-gpt4").sort(key)
    assert recorded.equals(after.filter(pl.col("grader") == "upstream-gpt4").sort(key))
    # The strict rule uses the dataset's answer, as ingest does: identical rows.
    assert before.filter(pl.col("grader") == "strict").sort(key).equals(after.filter(pl.col("grader") == "strict").sort(key))


def test_only_stale_graders_run_again(small_release, dataset_dir, tmp_path):
    """A grader whose record matches the answers, the dataset and its own version is skipped; a change re-runs it."""
    score_release(small_release, dataset_dir, ["offline", "paper"], progress=False, force=True)
    rec = read_release(small_release).scorer_records()
    assert rec["offline"]["inputs"]["answers_sha256"] == read_release(small_release).manifest.files["answers.parquet"]["sha256"]
    assert rec["paper"]["rules_version"] >= 1 and rec["offline"]["table_sha256"]
    assert stale(small_release, dataset_dir, ["offline", "paper", GRADER]) == [GRADER]  # never run on this release
    frozen = _frozen(small_release)
    before = (small_release / "scores.parquet").read_bytes()
    mtime = (small_release / "scores.parquet").stat().st_mtime_ns
    score_release(small_release, dataset_dir, ["offline", "paper"], progress=False)
    assert (small_release / "scores.parquet").read_bytes() == before  # nothing rewritten
    assert (small_release / "scores.parquet").stat().st_mtime_ns == mtime
    assert _frozen(small_release) == frozen

    # Changed answers: one response edited -> both graders are stale and their rows follow the new answer.
    rel = read_release(small_release)
    answers = pl.from_arrow(rel.table("answers"))
    i = answers.with_row_index().filter(pl.col("format") == "frq")["index"][0]
    edited = answers.row(int(i), named=True)
    answers = answers.with_columns(
        pl.when(pl.int_range(pl.len()) == i).then(pl.lit("Not sure.")).otherwise(pl.col("response")).alias("response")
    )
    # The answers change under the existing scores (their records name the old answers file).
    old_scores, old_records = rel.scores_with_records()
    tables = {"conversations": rel.table("conversations"), "answers": answers.to_arrow().cast(rel.table("answers").schema)}
    write_release(small_release, rel.manifest, tables, overwrite=True)
    write_scores(read_release(small_release), old_scores, old_records)
    assert stale(small_release, dataset_dir, ["offline", "paper"]) == ["offline", "paper"]
    score_release(small_release, dataset_dir, ["offline", "paper"], progress=False)
    assert stale(small_release, dataset_dir, ["offline", "paper"]) == []
    row = read_release(small_release).verdicts(
        grader="offline", case_id=edited["case_id"], trial=edited["trial"], setting=edited["setting"], format="frq"
    )
    assert row.height == 1 and row["resolved_kind"][0] == extract("Not sure.").kind and row["correct"][0] is False

    # A different dataset (one answer key changed) makes every deterministic grader stale.
    import shutil

    other = tmp_path / "data2"
    shutil.copytree(dataset_dir, other)
    f = other / "all" / "test-00000-of-00001.parquet"
    ds = pl.read_parquet(f)
    pl.concat([ds.head(1).with_columns(pl.lit("Something else").alias("answer")), ds.slice(1)]).write_parquet(f)
    assert stale(small_release, other, ["offline", "paper"]) == ["offline", "paper"]


@pytest.mark.parametrize(
    "name, message", [("upstream-gpt4", "cannot be re-run"), ("gpt4", "unknown scorer"), ("llm:gpt-4o", "llm:PROVIDER/MODEL")]
)
def test_bad_grader_names(name, message):
    with pytest.raises(CraftMDError, match=message):
        check_scorers([name])


def test_score_cli(small_release, dataset_dir, capsys):
    from craftmd.commands.cli import main

    assert main(["score", str(small_release), "--data", str(dataset_dir), "--scorer", "offline", "--quiet"]) == 0
    assert "offline" in set(read_release(small_release).verdicts()["grader"])
    assert main(["score", str(small_release), "--data", str(dataset_dir), "--scorer", "bogus"]) == 2
    assert "unknown scorer 'bogus'" in capsys.readouterr().err
    assert main(["score", str(small_release), "--scorer", "offline"]) == 2  # the answer keys are the dataset's
    assert "scorer offline needs the built dataset (--dataset DIR)" in capsys.readouterr().err
