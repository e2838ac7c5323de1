"""The LLM grader's default prompt set (upstream's protocol, read from the pinned code) replayed on the recorded GPT-4
grader-AI's own replies: it sends upstream's messages and reproduces the recorded ``upstream-gpt4`` labels; its retry
bound and yes/no parse; and ``craftmd score`` exits non-zero when the grader's model answered nothing."""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from craftmd.release import read_release, write_release
from craftmd.scoring.llm_grader import UPSTREAM, UPSTREAM_ATTEMPTS, LLMGrader, parse_evaluation, prompt_set_record
from craftmd.scoring.score import score_release
from craftmd.scoring.scorers import load_cases
from craftmd.upstream_prompts import upstream_prompt, upstream_prompts_sha256

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer, text_of  # noqa: E402

GRADER = "llm:openai/loopback"
#: The recorded releases replayed: their first FIRST cases, and every case holding an answer upstream did not grade.
MODELS = ("gpt4_1106", "gpt3_1106", "llama2-7b", "mistral-v1", "mistral-v2")
FIRST = 6
KEY = ["case_id", "trial", "setting", "format", "with_image"]
AMBIGUOUS = "ambiguous: one of its requests got other replies in other trials"
EMPTY = "not asked: recorded 0 (an empty answer, kept as missing by ingest)"


def extract_prompt(answer: str) -> str:
    return upstream_prompt("get_extract_diagnosis_name_prompt", answer)


def evaluate_prompt(correct: str, extracted: str) -> str:
    return upstream_prompt("get_diagnosis_evaluation_prompt", correct, extracted)


def subset(release_dir: Path, out: Path, cases: list[str]) -> Path:
    """A copy of a release holding only ``cases`` (answers, conversations and scores)."""
    rel = read_release(release_dir)
    keep = pa.array(cases)
    tables = {n: rel.table(n).filter(pc.is_in(rel.table(n).column("case_id"), keep)) for n in ("conversations", "answers")}
    scores, records = rel.scores_with_records()
    write_release(out, rel.manifest, tables, scores=(scores.filter(pc.is_in(scores.column("case_id"), keep)), records))
    return out


def recorded_rows(release_dir: Path, dataset_dir: Path) -> pl.DataFrame:
    """Each FRQ answer of the release with upstream's correct answer (``key``) and the recorded label (``ev``, ``ex``)."""
    rel = read_release(release_dir)
    answers = pl.from_arrow(rel.table("answers")).filter(pl.col("format") == "frq")
    rec = rel.verdicts(grader="upstream-gpt4").select(*KEY, "detail")
    cases = load_cases(dataset_dir)[0]
    df = answers.join(rec, on=KEY, how="left")
    details = [json.loads(d) for d in df["detail"]]
    keys = [(cases[(c, w)][2] or cases[(c, w)][1]).lower() for c, w in zip(df["case_id"], df["with_image"])]
    return df.with_columns(
        pl.Series("ev", [d["evaluation"] for d in details]),
        pl.Series("ex", [d["extracted_ans"] for d in details]),
        pl.Series("key", keys),
    ).drop("detail")


class RecordedGraderAI:
    """Answers upstream's two grader requests as the recorded GPT-4 grader-AI did: an extraction request (one system
    message, rendered through the parser from a recorded answer) with that answer's recorded ``extracted_ans``, an
    evaluation request with Yes / No as its recorded ``evaluation``. A request the recorded replies disagree on (GPT-4
    was sampled at upstream's default temperature, so the same request got other replies in other trials) gets the
    most frequent. Anything else is noted in ``unexpected`` and refused (HTTP 400)."""

    def __init__(self, rows: pl.DataFrame):
        extract, evaluate = defaultdict(Counter), defaultdict(Counter)
        for r in rows.filter(pl.col("response").is_not_null()).iter_rows(named=True):
            extract[extract_prompt(r["response"])][r["ex"]] += 1
            evaluate[evaluate_prompt(r["key"], r["ex"].lower())]["Yes" if r["ev"] == 1 else "No"] += 1
        self.replies = {p: c.most_common(1)[0][0] for p, c in (extract | evaluate).items()}
        self.ambiguous = {p for p, c in (extract | evaluate).items() if len(c) > 1}
        self.unexpected: list = []
        self.asked: Counter = Counter()

    def __call__(self, req: dict) -> str:
        msgs = req["messages"]
        text = text_of(msgs[0]["content"]) if len(msgs) == 1 and msgs[0]["role"] == "system" else None
        if text not in self.replies:
            self.unexpected.append(msgs)
            raise ValueError("not a request of upstream's grader for a recorded answer")
        self.asked[text] += 1
        return self.replies[text]


@pytest.fixture(scope="module")
def replayed(releases_dir, dataset_dir, tmp_path_factory):
    """Per model: the replayed subset's recorded rows, the responder, and the grader's rows (graded through craftmd's
    scoring, against a loopback server answering as the recorded grader-AI did)."""
    out = {}
    for model in MODELS:
        rows = recorded_rows(releases_dir / model, dataset_dir)
        ungraded = rows.filter(pl.col("response").is_null())["case_id"].unique().to_list()
        cases = [f"case_{i}" for i in range(1, FIRST + 1)] + ungraded
        rel = subset(releases_dir / model, tmp_path_factory.mktemp("replay") / model, sorted(set(cases)))
        rows = rows.filter(pl.col("case_id").is_in(cases))
        responder = RecordedGraderAI(rows)
        cache = tmp_path_factory.mktemp("cache") / "requests.sqlite"
        with LoopbackServer(responder) as server:
            score_release(rel, dataset_dir, [GRADER], base_url=server.base_url, cache=cache, progress=False, force=True)
            calls = server.calls
        mine = read_release(rel).verdicts(grader=GRADER).select(*KEY, "resolved", "resolved_kind", "correct", "detail", "status")
        recorded = read_release(rel).verdicts(grader="upstream-gpt4").select(*KEY, "resolved", "resolved_kind", "correct")
        both = rows.join(mine, on=KEY, how="left").join(recorded, on=KEY, how="left", suffix="_recorded")
        out[model] = {"rows": both, "responder": responder, "calls": calls, "release": rel}
    return out


def _ambiguous(row: dict, responder: RecordedGraderAI) -> bool:
    """Whether the recorded replies disagree on one of the requests grading ``row`` sends (or would have sent)."""
    if row["response"] is None:
        return False
    extracted = responder.replies[extract_prompt(row["response"])].lower()
    return bool({extract_prompt(row["response"]), evaluate_prompt(row["key"], extracted)} & responder.ambiguous) or (
        extracted != row["ex"].lower()
    )


def test_the_grader_sends_upstreams_messages_and_reproduces_the_recorded_labels(replayed):
    totals = Counter()
    for model, r in replayed.items():
        rows, responder = r["rows"], r["responder"]
        assert responder.unexpected == []  # every request: one system message, upstream's prompt for a recorded answer
        # Upstream's two requests for each answer, each answered Yes / No at once (no retry), each distinct request
        # sent once (the request cache); none for an answer upstream did not grade.
        expected = set()
        for response, key in rows.filter(pl.col("response").is_not_null()).select("response", "key").iter_rows():
            extracted = responder.replies[extract_prompt(response)].lower()
            expected |= {extract_prompt(response), evaluate_prompt(key, extracted)}
        assert set(responder.asked) == expected and r["calls"] == len(expected) == sum(responder.asked.values())
        assert (rows["status_right"] == "ok").all()
        for row in rows.iter_rows(named=True):
            detail = json.loads(row["detail"])
            label = (detail["evaluation"], detail.get("extracted_ans"))
            if row["response"] is None:
                # Upstream grades no missing answer: -1, "None", no call. Ingest keeps an empty recorded answer as a
                # missing one (null response): upstream asked GPT-4 about those (recorded 0), the replay cannot.
                assert label == (-1, "None") and detail["attempts"] == 0
                totals["not asked: recorded -1" if row["ev"] == -1 else EMPTY] += 1
                assert row["correct"] is False is row["correct_recorded"]
                assert row["resolved_kind"] == "none" and row["resolved_kind_recorded"] == "none"
                continue
            same = label == (row["ev"], row["ex"].lower()) and (
                row["resolved"],
                row["resolved_kind"],
                row["correct"],
            ) == (row["resolved_recorded"], row["resolved_kind_recorded"], row["correct_recorded"])
            if _ambiguous(row, responder):
                # The exceptions: the recorded grader-AI gave one of this row's requests, byte for byte, other replies
                # elsewhere (GPT-4 sampled at upstream's default temperature); a replay answers each request one way.
                totals[AMBIGUOUS] += 1
                totals["ambiguous: label agrees anyway"] += same
                totals["ambiguous: correct agrees anyway"] += row["correct"] == row["correct_recorded"]
                continue
            assert same, (model, row)  # every other answer: the recorded label exactly
            totals["agree"] += 1
    n = totals["agree"] + totals[AMBIGUOUS] + totals[EMPTY] + totals["not asked: recorded -1"]
    print(f"\n{n} recorded answers of {len(replayed)} models replayed: {dict(totals)}")
    assert n == sum(r["rows"].height for r in replayed.values())
    assert totals["agree"] > 0 and totals["not asked: recorded -1"] > 0 and totals[EMPTY] > 0
    assert totals[AMBIGUOUS] < 0.1 * n


def test_the_grader_records_its_prompt_set(replayed):
    rel = read_release(replayed["gpt4_1106"]["release"])
    info = rel.scorer_records()[GRADER]
    names = ("get_diagnosis_evaluation_prompt", "get_extract_diagnosis_name_prompt")
    assert info["prompt_set"]["name"] == UPSTREAM == "grader-upstream-3bb2737"
    assert info["prompt_set"]["sha256"] == upstream_prompts_sha256(names) == prompt_set_record()["sha256"]
    assert info["sampling"]["max_tokens"] == 150  # upstream's call_gpt4_api cap
    assert info["failures"] == 0 and info["asked"] == rel.verdicts(grader=GRADER).height - sum(
        pl.from_arrow(rel.table("answers")).filter(pl.col("format") == "frq")["response"].is_null()
    )


@pytest.mark.parametrize(
    "reply, label",
    [("Yes", 1), ("No.", 0), ("yes, they are synonymous", 1), ("Not the same", 0), ("I don't know", 0), ("Unknown", 0),
     ("Maybe", -1), ("", -1), ("Nope? yes", 1)],
)  # fmt: skip
def test_upstreams_yes_no_parse(reply, label):
    assert parse_evaluation(reply) == label


def test_an_unreadable_evaluation_is_asked_again_up_to_upstreams_bound(tmp_path):
    """Upstream asks both steps again while the evaluation holds neither yes nor no (depth 0..11: 12 times), then -1."""
    seen = []

    def maybe(req):
        seen.append((req["messages"][0]["content"], req.get("seed")))
        return "psoriasis" if req["messages"][0]["content"] == extract_prompt("Psoriasis.") else "Maybe"

    with LoopbackServer(maybe) as server:
        lg = LLMGrader("openai/loopback", base_url=server.base_url, cache=tmp_path / "c.sqlite")
        g = lg.grade_many([("Psoriasis.", "Plaque Psoriasis")], progress=False)[0]
    detail = json.loads(g.detail)
    assert detail["evaluation"] == -1 and detail["attempts"] == UPSTREAM_ATTEMPTS == 12
    assert (g.resolved_kind, g.correct, g.failed) == ("none", False, False)  # as ingest maps a recorded -1
    evaluation = evaluate_prompt("plaque psoriasis", "psoriasis")  # the correct answer lower-cased, as upstream does
    assert [s for t, s in seen if t == evaluation] == list(range(12))  # attempt k with seed k: a retry is a new request
    assert len(seen) == 24

    answers = iter(["Maybe", "Maybe", "Yes"])
    with LoopbackServer(lambda req: "psoriasis" if "Query Paragraph" in req["messages"][0]["content"] else next(answers)) as s:
        g = LLMGrader("openai/loopback", base_url=s.base_url).grade_many([("Psoriasis.", "psoriasis")], progress=False)[0]
    assert json.loads(g.detail)["attempts"] == 3 and g.correct and g.resolved == "psoriasis"


def test_none_and_multiple_are_evaluated_as_upstream_does():
    """Upstream still asks the evaluation for an extraction of "none" or "multiple" (its prompt has examples for both)."""
    sent = []

    async def call(messages, sampling):
        from craftmd.models.base import Completion

        sent.append(messages)
        text = messages[0]["content"]
        return Completion("Multiple" if "Query Paragraph" in text else "No", "ok", "stop", 1, 1)

    g = LLMGrader("openai/x", call=call).grade_many([("Eczema or psoriasis", "Eczema")], progress=False)[0]
    assert [m[0]["role"] for m in sent] == ["system", "system"]
    assert sent[1][0]["content"] == evaluate_prompt("eczema", "multiple")
    assert (g.resolved, g.resolved_kind, g.correct) == (None, "multiple", False)


def test_score_exits_non_zero_when_the_graders_model_answered_nothing(releases_dir, dataset_dir, tmp_path, capsys):
    """Issue 48: a grader that got nothing but HTTP 500 exited 0, its missing answers (scored without a call) counted as
    scored. Now: exit 2, one line, and every failure written with its reason."""
    from craftmd.commands.cli import main

    rows = recorded_rows(releases_dir / "gpt3_1106", dataset_dir)
    missing = rows.filter(pl.col("response").is_null())["case_id"][0]
    rel = subset(releases_dir / "gpt3_1106", tmp_path / "rel", ["case_1", missing])
    argv = ["score", str(rel), "--dataset", str(dataset_dir), "--scorer", GRADER, "--cache", str(tmp_path / "c.sqlite")]
    with LoopbackServer(lambda req: "yes", error_rate=1.0, error_kinds=("500",)) as server:
        assert main([*argv, "--base-url", server.base_url, "--max-retries", "0", "--quiet"]) == 2
        assert server.calls > 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("craftmd score: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"craftmd score: error: nothing scored: {GRADER} on {rel}: the model answered none")
    assert "HTTP 500" in lines[0]
    v = read_release(rel).verdicts(grader=GRADER)
    asked = v.filter(pl.col("status") == "error")
    assert asked.height == rows.filter(pl.col("case_id").is_in(["case_1", missing]), pl.col("response").is_not_null()).height
    assert v.filter(pl.col("status") == "ok")["detail"].str.contains('"attempts": 0').all()  # the missing answers only
    with LoopbackServer(lambda req: "Yes" if "Query Diagnosis" in req["messages"][0]["content"] else "psoriasis") as server:
        assert main([*argv, "--base-url", server.base_url, "--quiet"]) == 0  # the server is back: graded
