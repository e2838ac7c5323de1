"""The rubric judge (issue #15): MedPI's catalog, the two-stage committee judge against a loopback server that
answers well-formed, malformed and refusing replies, the committee's median and agreement, the objectives."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from loopback import LoopbackServer

from craftmd import CraftMDError
from craftmd.release import RunRecord, read_release, write_release
from craftmd.scoring import judge as J
from craftmd.scoring.score import judge_release
from craftmd.scoring.scorers import judges_stale
from craftmd.scoring.rubric import OBJECTIVES, applicable, case_objectives, load_catalog
from craftmd.tasks import get_task

CATS = ["final diagnosis", "communication"]  # 4 + 5 dimensions, both apply to diagnosis encounters


# -- the catalog -------------------------------------------------------------------------------------


def test_catalog_has_the_papers_counts_and_fields():
    cat = load_catalog()
    assert len(cat.dimensions) == 105
    assert len(cat.categories) == 29
    assert len({d.meta_category for d in cat.dimensions}) == 7
    assert len({d.id for d in cat.dimensions}) == 105  # ids unique though names such as "completeness" recur
    assert sum(d.dimension == "completeness" for d in cat.dimensions) == 4
    for d in cat.dimensions:
        assert all(o in ("all", *OBJECTIVES) for o in d.objectives)
        assert len(d.anchors) == 4 and all(a.strip() for a in d.anchors) and d.description.strip()
    # the paper's Table 5: 46 dimensions for every encounter, 16 for diagnosis only
    assert sum(d.objectives == ("all",) for d in cat.dimensions) == 46
    assert len(applicable(cat.dimensions, "diagnosis")) == 62
    assert {d.category for d in cat.dimensions if d.meta_category == "Technical Reliability"} == {
        "model reliability",
        "operational competence",
    }
    assert len(cat.sha256) == 64


def test_catalog_command_prints_json_lines():
    out = subprocess.run(
        [sys.executable, "-m", "craftmd.commands.cli", "judge", "--catalog"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert len(rows) == 105
    assert {"dimension", "category", "meta_category", "objectives"} <= set(rows[0])
    # each dimension's ACGME core competency (issue #48), as the rubric's mapping gives it
    from craftmd.scoring.rubric import acgme

    m = acgme()
    assert all(r["acgme_competency"] == m["of"][r["id"]] for r in rows)
    assert all(r["acgme_competency_name"] == m["competencies"][r["acgme_competency"]] for r in rows)
    assert set(m["competencies"]) == {r["acgme_competency"] for r in rows}  # all six appear


def test_a_bad_catalog_line_is_one_clear_error(tmp_path):
    good = [json.dumps(d.to_dict()) for d in load_catalog().dimensions]
    bad = tmp_path / "rubric.jsonl"
    row = json.loads(good[0])
    row["objectives"] = ["surgery"]
    bad.write_text("\n".join([json.dumps(row)] + good[1:]) + "\n")
    with pytest.raises(CraftMDError, match=r"rubric.jsonl:1: objectives"):
        load_catalog(str(bad))
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(good[:-1]) + "\n")
    with pytest.raises(CraftMDError, match="counts"):
        load_catalog(str(short))


def test_selection_by_id_category_and_meta_category():
    cat = load_catalog()
    assert len(cat.select(["final diagnosis"])) == 4
    assert len(cat.select(["Technical Reliability"])) == 7
    assert [d.id for d in cat.select(["model_reliability.consistency"])] == ["model_reliability.consistency"]
    with pytest.raises(CraftMDError, match="no dimension id"):
        cat.select(["bedside manner"])


# -- objectives ---------------------------------------------------------------------------------------


def test_objectives_craftmd_is_diagnosis_and_other_tasks_read_packets(tmp_path):
    assert case_objectives(get_task("craftmd"), ["a", "b"], None) == {"a": "diagnosis", "b": "diagnosis"}
    (tmp_path / "packets").mkdir()
    pq.write_table(
        pa.table({"case_id": ["p1", "p2"], "objective": ["lifestyle_advice", "medication_advice"]}),
        tmp_path / "packets" / "test-00000-of-00001.parquet",
    )
    assert case_objectives(get_task("encounters"), ["p2", "p1"], tmp_path) == {
        "p2": "medication_advice",
        "p1": "lifestyle_advice",
    }
    with pytest.raises(CraftMDError, match="no objective for case"):
        case_objectives(get_task("encounters"), ["p3"], tmp_path)
    with pytest.raises(CraftMDError, match="--dataset is needed"):
        case_objectives(get_task("encounters"), ["p1"], None)
    cat = load_catalog()
    life = applicable(cat.dimensions, "lifestyle_advice")
    assert len(life) == 46 + 10 and not any("diagnosis" in d.objectives for d in life)


# -- agreement ----------------------------------------------------------------------------------------


def test_krippendorff_alpha_matches_the_published_worked_example():
    """Krippendorff (2011), 'Computing Krippendorff's alpha-reliability': 4 observers, 12 units, missing values."""
    from craftmd.agreement import krippendorff_alpha

    n = np.nan
    data = [[1, 2, 3, 3, 2, 1, 4, 1, 2, n, n, n], [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, n, 3],
            [n, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, n], [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, n]]  # fmt: skip
    assert round(krippendorff_alpha(data, "nominal"), 3) == 0.743
    assert round(krippendorff_alpha(data, "ordinal"), 3) == 0.815
    assert round(krippendorff_alpha(data, "interval"), 3) == 0.849
    assert krippendorff_alpha([[2, 2, 2], [2, 2, 2]]) is None  # no variation: undefined, not 1


def test_weighted_kappa_is_the_textbook_formula():
    from craftmd.agreement import weighted_kappa

    a = [1, 2, 3, 4, 4, 3, 2, 1, 2, 3]
    b = [1, 2, 4, 4, 3, 3, 1, 1, 2, 2]
    obs = np.zeros((4, 4))
    for x, y in zip(a, b):
        obs[x - 1, y - 1] += 1
    exp = np.outer(obs.sum(1), obs.sum(0)) / obs.sum()
    w = np.array([[(i - j) ** 2 for j in range(4)] for i in range(4)], float)
    assert weighted_kappa(a, b) == pytest.approx(1 - (w * obs).sum() / (w * exp).sum())


# -- the judge against a loopback server ----------------------------------------------------------------

CASES = {"case_1": "I have had a red itchy rash on my elbows for two months.",
         "case_2": "My knee has been swollen and hot since yesterday.",
         "case_3": "This conversation failed."}  # fmt: skip
#: (case, dimension) -> how the judges answer it (anything else: a valid score). "bad_json" and "refuse" spoil the whole
#: reply (in category mode, every dimension of the category); "out_of_range" and "fixed_on_retry" one item.
FAULTS = {
    ("case_1", "final_diagnosis.justification"): "bad_json",
    ("case_2", "communication.empathy"): "refuse",
    ("case_1", "final_diagnosis.data_consistency"): "out_of_range",
    ("case_2", "final_diagnosis.data_consistency"): "out_of_range",
    ("case_1", "communication.clarity"): "fixed_on_retry",
    ("case_2", "communication.clarity"): "fixed_on_retry",
}
WHOLE = ("bad_json", "refuse")


def expected_fault(mode: str, case: str, dim: str) -> str | None:
    f = FAULTS.get((case, dim))
    if mode == "category" and f not in WHOLE:
        cat = dim.split(".")[0]
        whole = [k for (c, d), k in FAULTS.items() if c == case and d.split(".")[0] == cat and k in WHOLE]
        f = whole[0] if whole else f
    return f


def make_release(root, model="openai/gpt-4-0613", release="tiny"):
    convs = []
    for i, (cid, said) in enumerate(CASES.items()):
        msgs = [{"role": "system", "content": "You are an AI doctor."},
                {"role": "assistant", "content": "Hello, what brings you in today?"},
                {"role": "user", "content": said},
                {"role": "assistant", "content": "Final diagnosis: psoriasis. I would like {category} to be literal."}]  # fmt: skip
        convs.append(
            {
                "case_id": cid,
                "trial": 0,
                "conversation": "standard",
                "with_image": False,
                "messages": msgs,
                "summary": None,
                "n_turns": 2,
                "ended": "error" if cid == "case_3" else "final_diagnosis",
                "error": None,
            }
        )
    answers = pa.table({"case_id": pa.array([], pa.string()), "trial": pa.array([], pa.int16()), "setting": pa.array([], pa.string()),
                        "format": pa.array([], pa.string()), "with_image": pa.array([], pa.bool_()), "response": pa.array([], pa.string()),
                        "status": pa.array([], pa.string())})  # fmt: skip
    rec = RunRecord(task="craftmd", release=release, kind="generated", model=model, roles={"doctor": {"model": model}})
    return write_release(root / release, rec, {"conversations": pa.Table.from_pylist(convs), "answers": answers})


def true_score(model: str, case_id: str, dim: str) -> int:
    return 1 + zlib.crc32(f"{model}|{case_id}|{dim}".encode()) % 4


def responder(request: dict) -> str | None:
    msgs = request["messages"]
    prompt = msgs[0]["content"]
    model = request["model"]
    case = next(c for c, said in CASES.items() if said in prompt)
    if prompt.startswith("You chair a review committee"):
        return f'Clinician: the doctor asked "Hello, what brings you in today?" ({model}, {case}).'
    retry = len(msgs) > 1
    ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", prompt, re.M) or re.findall(r"^Aspect: ([a-z_]+\.[a-z_]+) ", prompt, re.M)

    def item(d):
        return {
            "dimension": d,
            "score": true_score(model, case, d),
            "rationale": "ok",
            "evidence": ["Hello, what brings you in today?"],
        }

    items = []
    for d in ids:
        f = FAULTS.get((case, d))
        if f == "refuse":
            return None  # a content-filter block: the whole reply refused
        if f == "bad_json":
            return "Sure! Here are my scores: {scores: [oops"
        if f == "out_of_range":
            items.append(dict(item(d), score=7))
        elif f == "fixed_on_retry" and not retry:
            items.append(dict(item(d), score="four"))
        else:
            items.append(item(d))
    if prompt.startswith("You score several aspects"):
        return json.dumps({"scores": items})
    return json.dumps(items[0])


def run_judge(release, server, mode, models=("judge-a",), **kw):
    spec = J.JudgeSpec(models=[f"openai/{m}" for m in models], mode=mode, dimensions=CATS, base_url=server.base_url,
                       progress=False, **kw)  # fmt: skip
    return judge_release(release, spec)


@pytest.fixture
def server():
    with LoopbackServer(responder, models=("judge-a", "judge-b", "gpt-4o")) as s:
        yield s


@pytest.mark.parametrize("mode", ["dimension", "category"])
def test_scores_table_holds_exactly_the_valid_scores(tmp_path, server, mode):
    rel = make_release(tmp_path)
    summary = run_judge(rel, server, mode)
    t = read_release(rel).scores_with_records()[0].to_pylist()
    rows = {(r["case_id"], r["dimension"]): r for r in t if r["scorer"] == "judge:openai/judge-a"}
    dims = [d.id for d in load_catalog().select(CATS)]
    assert len(rows) == 3 * len(dims)  # every applicable dimension of every conversation has a row
    for (case, dim), r in rows.items():
        detail = json.loads(r["detail"])
        if case == "case_3":
            assert r["status"] == "error" and "ended = error" in detail["error"]
            continue
        fault = expected_fault(mode, case, dim)
        if fault in (None, "fixed_on_retry"):
            assert r["status"] == "ok" and r["value"] == true_score("judge-a", case, dim), (case, dim)
            assert detail["evidence_found"] == 1
            if mode == "dimension":
                assert detail["attempts"] == (2 if fault else 1)
        else:
            assert r["status"] == "error" and r["value"] is None, (case, dim)
            assert detail["error"]
            if fault == "refuse":
                assert detail["error"].startswith("refusal")
            if fault == "bad_json":
                assert "not JSON" in detail["error"] and detail["attempts"] == 3  # asked again twice, then recorded failed
            if fault == "out_of_range":
                assert "maximum" in detail["error"]
    ok = sum(r["status"] == "ok" for r in rows.values())
    assert summary["scores"]["judge:openai/judge-a"] == {"scored": ok, "failed": len(rows) - ok}
    record = read_release(rel).scorer_records()["judge:openai/judge-a"]
    assert record["mode"] == mode and record["catalog"]["sha256"] == load_catalog().sha256
    assert record["inputs"]["conversations_sha256"] and record["prompt_set"]["sha256"]["discussion"]
    assert record["response_format"] == {"requested": "json_schema", "used": "json_schema", "refused": None}


def test_category_mode_keeps_valid_items_and_fails_only_the_bad_ones(tmp_path):
    """A category reply with one out-of-range score and one missing dimension: the rest stand."""

    def partial(request):
        prompt = request["messages"][0]["content"]
        if prompt.startswith("You chair"):
            return 'The doctor said "Hello, what brings you in today?".'
        ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", prompt, re.M)
        items = [{"dimension": d, "score": 3, "rationale": "r", "evidence": []} for d in ids]
        items[0]["score"] = 0
        return json.dumps({"scores": items[:-1]})

    rel = make_release(tmp_path)
    with LoopbackServer(partial, models=("judge-a",)) as s:
        spec = J.JudgeSpec(models=["openai/judge-a"], mode="category", dimensions=["final diagnosis"], base_url=s.base_url,
                           progress=False, max_invalid=1)  # fmt: skip
        judge_release(rel, spec, cases=["case_1"])
        calls = s.calls
    rows = read_release(rel).scores_with_records()[0].to_pylist()
    assert calls == 1 + 2  # the discussion, then the reply and one retry
    assert sorted(r["status"] for r in rows) == ["error", "error", "ok", "ok"]
    errors = sorted(json.loads(r["detail"])["error"] for r in rows if r["status"] == "error")
    assert any("missing" in e for e in errors) and any("minimum" in e for e in errors)
    assert all(r["value"] == 3 for r in rows if r["status"] == "ok")


def test_one_schema_validator_checks_the_replies_one_line_each():
    """The judges' replies are checked by the submissions' validator (jsonschema-rs, not a second library): the first
    problem of an item or a flags reply is one line naming where it is, a reply nested past the validator's recursion
    limit is an invalid reply (asked again), never a crash."""
    import ast

    imported = {a.name for n in ast.walk(ast.parse(open(J.__file__).read())) if isinstance(n, ast.Import) for a in n.names}
    assert "jsonschema_rs" in imported and "jsonschema" not in imported
    item = {"dimension": "a.b", "score": 5, "rationale": "r", "evidence": []}
    assert J.validate_reply(json.dumps(item), ["a.b"], "dimension") == ({}, {"a.b": "score: 5 is greater than the maximum of 4"})
    deep = dict(item, score=3, evidence=json.loads("[" * 300 + "]" * 300))
    assert J.validate_reply(json.dumps(deep), ["a.b"], "dimension") == ({}, {"a.b": "item: nested too deeply"})
    assert J.validate_reply(json.dumps(dict(item, score=3)), ["a.b"], "dimension")[0] == {"a.b": dict(item, score=3)}
    raised, wrong = J.validate_flags(json.dumps({"flags": [{"flag": "rude", "evidence": [], "note": ""}]}), list(J.FLAGS))
    assert raised is None and wrong.startswith('flags.0.flag: "rude" is not one of ') and "\n" not in wrong
    assert J.validate_flags(
        json.dumps({"flags": [{"flag": "invented_fact", "evidence": ["q"], "note": "n"}]}), ["invented_fact"]
    ) == (
        {"invented_fact": {"evidence": ["q"], "notes": ["n"]}},
        None,
    )


def test_committee_median_and_agreement_match_a_hand_computation(tmp_path, server):
    rel = make_release(tmp_path)
    summary = run_judge(rel, server, "dimension", models=("judge-a", "judge-b"), seeds=1)
    t = read_release(rel).scores_with_records()[0].to_pylist()
    by = {}
    for r in t:
        by.setdefault((r["case_id"], r["dimension"]), {})[r["scorer"]] = r
    checked = 0
    for (case, dim), rs in by.items():
        a, b = rs["judge:openai/judge-a"], rs["judge:openai/judge-b"]
        c = rs[J.COMMITTEE]
        valid = [x["value"] for x in (a, b) if x["status"] == "ok"]
        if valid:
            assert c["status"] == "ok" and c["value"] == min(valid) == statistics.median_low(valid)
            assert json.loads(c["detail"])["median"] == statistics.median(valid)
            checked += 1
        else:
            assert c["status"] == "error" and c["value"] is None
    assert checked > 0
    rec = read_release(rel).scorer_records()[J.COMMITTEE]
    assert rec["members"] == ["judge:openai/judge-a", "judge:openai/judge-b"]
    from craftmd.agreement import weighted_kappa

    pairs = [(rs["judge:openai/judge-a"]["value"], rs["judge:openai/judge-b"]["value"]) for rs in by.values()
             if rs["judge:openai/judge-a"]["status"] == "ok" and rs["judge:openai/judge-b"]["status"] == "ok"]  # fmt: skip
    got = rec["agreement"]["overall"]["pairs"][0]
    assert got["n"] == len(pairs)
    assert got["weighted_kappa"] == pytest.approx(
        weighted_kappa([int(x) for x, _ in pairs], [int(y) for _, y in pairs]), abs=1e-6
    )
    assert summary["agreement"]["units"] == len(pairs)


def test_estimate_counts_the_calls_a_run_sends(tmp_path, server):
    rel = make_release(tmp_path)
    spec = J.JudgeSpec(models=["openai/judge-a"], mode="dimension", dimensions=CATS, base_url=server.base_url, progress=False,
                       max_invalid=0, price=(1.0, 2.0))  # fmt: skip
    est = judge_release(rel, spec, estimate=True)
    assert server.calls == 0  # nothing sent
    assert est["calls"] == 2 * (2 + 9) and est["dimension_scores"] == 2 * 9 and est["failed_conversations"] == 1
    assert est["cost_usd_at_most"] > 0
    judge_release(rel, spec)
    assert server.calls == est["calls"]  # with no second asking, the estimate is exact


def test_shuffled_order_is_seeded_and_recorded(tmp_path, server):
    rel = make_release(tmp_path)
    judge_release(rel, J.JudgeSpec(models=["openai/judge-a"], mode="category", dimensions=["communication"],
                                     base_url=server.base_url, progress=False, seed=5, max_invalid=0), cases=["case_1"])  # fmt: skip
    first = [re.findall(r"^- ([a-z_.]+) \(", r["messages"][0]["content"], re.M) for r in server.log]
    server.reset_counters()
    judge_release(rel, J.JudgeSpec(models=["openai/judge-a"], mode="category", dimensions=["communication"],
                                     base_url=server.base_url, progress=False, seed=5, max_invalid=0), cases=["case_1"])  # fmt: skip
    again = [re.findall(r"^- ([a-z_.]+) \(", r["messages"][0]["content"], re.M) for r in server.log]
    assert first == again and sorted(first[0]) == sorted(d.id for d in load_catalog().select(["communication"]))
    assert first[0] != [d.id for d in load_catalog().select(["communication"])]  # seed 5 does not keep the catalog order
    assert "I would like {category} to be literal." in server.log[0]["messages"][0]["content"]  # placeholders filled once
    assert read_release(rel).scorer_records()["judge:openai/judge-a"]["shuffle_seed"] == 5


def test_own_family_judge_is_refused_unless_forced(tmp_path, server):
    rel = make_release(tmp_path, model="openai/gpt-4-0613")
    spec = J.JudgeSpec(
        models=["openai/gpt-4o"], mode="category", dimensions=["final diagnosis"], base_url=server.base_url, progress=False
    )
    with pytest.raises(CraftMDError, match="own model family"):
        judge_release(rel, spec)
    spec.force = True
    judge_release(rel, spec, cases=["case_2"])
    assert read_release(rel).scorer_records()["judge:openai/gpt-4o"]["self_judge"] is True


def test_a_server_without_response_format_is_asked_without_it(tmp_path):
    def strict(request):
        if "response_format" in request:
            raise ValueError("response_format is not supported")
        return responder(request)

    rel = make_release(tmp_path)
    with LoopbackServer(strict, models=("judge-a",)) as s:
        spec = J.JudgeSpec(models=["openai/judge-a"], mode="category", dimensions=["final diagnosis"], base_url=s.base_url,
                           progress=False, max_invalid=0)  # fmt: skip
        judge_release(rel, spec, cases=["case_2"])
    rec = read_release(rel).scorer_records()["judge:openai/judge-a"]
    assert rec["response_format"]["used"] == "none" and "not supported" in rec["response_format"]["refused"]


def test_sampling_without_response_format_keeps_its_cache_key():
    from craftmd.models import Sampling

    assert "response_format" not in Sampling().to_dict()
    assert Sampling(response_format='{"type": "json_object"}').with_seed(3).response_format == '{"type": "json_object"}'


# -- analysis ------------------------------------------------------------------------------------------


def test_profiles_match_a_hand_computation(tmp_path):
    """Two models' committee scores (m1: case_1 with two trials and case_2; m2: case_1): 0-100, categories, meta-categories,
    case means, failures counted apart, CIs around the mean; tables and figures written."""
    import polars as pl

    from craftmd.analysis.rubric import page_section, rubric, write_figures, write_tables
    from craftmd.release import write_scores
    from craftmd.scoring.judge import SCHEMA

    FJ, FD, MF, CE = (
        "final_diagnosis.justification",
        "final_diagnosis.data_consistency",
        "medical_knowledge.factuality",
        "communication.empathy",
    )
    scores = {  # (model, case, trial) -> dimension -> score (None: failed)
        ("m1", "case_1", 0): {FJ: 4, FD: 2, MF: 3, CE: 1},
        ("m1", "case_1", 1): {FJ: 1, FD: None, MF: 4, CE: 2},
        ("m1", "case_2", 0): {FJ: 3, FD: 3, MF: None, CE: 4},
        ("m2", "case_1", 0): {FJ: 2, FD: 2, MF: 2, CE: 2},
    }
    releases = []
    for model in ("m1", "m2"):
        rel = read_release(make_release(tmp_path, model=f"openai/{model}", release=model))
        rows = [{"case_id": c, "trial": t, "conversation": "standard", "with_image": False, "dimension": d, "scorer": "judge-committee",
                 "metric": "rubric_score", "value": None if v is None else float(v), "label": None, "detail": "{}",
                 "status": "error" if v is None else "ok"}
                for (m, c, t), ds in scores.items() if m == model for d, v in ds.items()]  # fmt: skip
        write_scores(rel, pa.Table.from_pylist(rows, schema=SCHEMA), {"judge-committee": {}})
        releases.append(read_release(rel.path))
    r = rubric(releases, B=500, seed=1)

    def n(x):
        return 100 * (x - 1) / 3

    def get(model, level, group):
        return r.table.filter(pl.col("model") == model, pl.col("level") == level, pl.col("group") == group).to_dicts()[0]

    # m1, final diagnosis: case_1 = mean(conv t0 mean(n4, n2), conv t1 n1); case_2 = mean(n3, n3)
    fd_c1 = (((n(4) + n(2)) / 2) + n(1)) / 2
    fd_c2 = n(3)
    g = get("m1", "category", "final diagnosis")
    assert g["mean"] == pytest.approx((fd_c1 + fd_c2) / 2, abs=1e-4)
    assert g["n_cases"] == 2 and g["n_conversations"] == 3 and g["n_failed"] == 1
    assert g["ci_low"] <= g["mean"] <= g["ci_high"]
    # m1, Core Medical Competence = mean of its categories per conversation (final diagnosis, medical knowledge)
    core_c1 = (((n(4) + n(2)) / 2 + n(3)) / 2 + (n(1) + n(4)) / 2) / 2
    core_c2 = n(3)  # medical knowledge failed there: only final diagnosis
    g = get("m1", "meta_category", "Core Medical Competence")
    assert g["mean"] == pytest.approx((core_c1 + core_c2) / 2, abs=1e-4) and g["n_failed"] == 2
    g = get("m2", "meta_category", "Communication Skills")
    assert g["mean"] == pytest.approx(n(2), abs=1e-4) and g["n_cases"] == 1 and g["ci_low"] == g["ci_high"] == g["mean"]
    raw = {(m, s): k for m, _, s, k, _ in r.raw.iter_rows()}
    assert raw[("m1", "failed")] == 2 and raw[("m1", "4")] == 3 and raw[("m2", "2")] == 4
    paths = write_tables(r, tmp_path / "board") + write_figures(r, tmp_path / "board" / "figures")
    assert [p.name for p in paths] == [
        "rubric.csv",
        "rubric_raw.csv",
        "rubric_detail.csv",
        "judge_evidence.csv",
        "rubric_meta.png",
        "rubric_categories.png",
        "rubric_dimensions.png",
        "rubric_raw.png",
    ]
    assert all(p.stat().st_size > 0 for p in paths)
    sec = page_section(r)
    assert [row["model"] for row in sec["rows"]] == ["m1", "m2"] and sec["rows"][0]["failed"] == 2
    again = rubric(releases, B=500, seed=1)
    assert again.table.equals(r.table)  # same inputs, same figures


# -- against the dermatologists ---------------------------------------------------------------------------


def test_validity_aucs_are_the_judges_scores_against_the_dermatologists_labels(dataset_dir, source):
    """The rated conversations judged by a loopback judge (score from the transcript's length; some refused): each AUC is
    the Mann-Whitney AUC of the valid scores for the resolved labels, refusals are counted, the history AUCs stand beside."""
    from craftmd.agreement import auc
    from craftmd.analysis.agreement.judge_validity import judge_validity, judge_validity_audit, rated_units

    def length_judge(request):
        p = request["messages"][0]["content"]
        if p.startswith("You chair"):
            return "Clinician: fine."
        text = p.split("<transcript>\n")[1].split("\n</transcript>")[0]
        if zlib.crc32(text.encode()) % 10 == 0:
            return None  # refused
        ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", p, re.M)
        return json.dumps(
            {"scores": [{"dimension": d, "score": 1 + min(3, len(text) // 1500), "rationale": "", "evidence": []} for d in ids]}
        )

    units, labels = rated_units(dataset_dir, source)
    assert len(units) > 100 and all(u.objective == "diagnosis" for u in units)
    with LoopbackServer(length_judge, models=("judge-a",)) as s:
        spec = J.JudgeSpec(models=["openai/judge-a"], mode="category", dimensions=["final diagnosis"], base_url=s.base_url, progress=False,
                           max_invalid=0)  # fmt: skip
        res = judge_validity(dataset_dir, source, spec, B=200)
    rows = {(r["measure"], r["question"]): r for r in res["rows"]}
    for q in ("doctor_one_dx", "doctor_history"):
        use = [
            (u, labels[(u.conversation, q)]["value"])
            for u in units
            if (labels.get((u.conversation, q)) or {}).get("value") is not None
        ]
        refused = [u for u, _ in use if zlib.crc32(u.transcript.encode()) % 10 == 0]
        kept = [(1 + min(3, len(u.transcript) // 1500), y) for u, y in use if u not in refused]
        r = rows[("final_diagnosis.justification", f"{'Q1' if q == 'doctor_one_dx' else 'Q2'} {q}")]
        assert r["n"] == len(kept) and r["failed"] == len(refused) > 0
        assert r["auc"] == pytest.approx(auc([v for v, y in kept if y], [v for v, y in kept if not y]))
        assert r["ci_low"] <= r["auc"] <= r["ci_high"]
    assert ("patient_info_recall (vs history)", "Q2 doctor_history") in rows  # the history metrics beside
    assert ("mean of information-gathering dimensions", "Q1 doctor_one_dx") not in rows  # none of them judged
    audit = judge_validity_audit(res, B=200)
    assert audit["id"] == "judge_validity" and len(audit["tables"][0]["rows"]) == len(res["rows"])


# -- the expert-review loop -------------------------------------------------------------------------------


def test_review_sheet_round_trip_and_agreement(tmp_path, server):
    """Export a sheet of judged conversations, fill it as two raters would, import it: every figure is the hand
    computation on the same pairs; a rating that is not 1-4 is reported with its cell and nothing is written."""
    import io

    from openpyxl import load_workbook

    from craftmd.agreement import krippendorff_alpha, weighted_kappa

    rel = make_release(tmp_path)
    run_judge(rel, server, "dimension", models=("judge-a", "judge-b"))
    sheet = tmp_path / "review.xlsx"
    out = subprocess.run([sys.executable, "-m", "craftmd.commands.cli", "judge-review", "export", str(rel), "--out", str(sheet), "--n", "2",
                          "--dimensions", "final diagnosis"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    again = tmp_path / "again.xlsx"
    from craftmd.analysis.agreement.rubric_review import export_rubric_review, import_rubric_review

    export_rubric_review([rel], again, n=2, seed=15, dimensions=["final diagnosis"])
    assert again.read_bytes() == sheet.read_bytes()  # same inputs, same bytes
    wb = load_workbook(io.BytesIO(sheet.read_bytes()))
    assert wb["key"].sheet_state == "hidden"
    key = {(r[0], r[1]): r[3] for r in wb["key"].iter_rows(min_row=2, values_only=True)}
    ws = wb["review"]
    assert ws.max_row - 1 == 2 * 4  # two conversations (the failed one is never sampled) x the 4 final-diagnosis dimensions
    r1s, r2s, judged, sheet_rows = [], [], [], {}
    for i, row in enumerate(ws.iter_rows(min_row=2), 2):
        rid, dim = row[0].value, row[6].value
        a = 1 + (i % 4)
        b = a if i % 3 else 1 + ((a + 1) % 4)
        ws.cell(i, 10, a)
        ws.cell(i, 11, str(b))
        r1s.append(a)
        r2s.append(b)
        judged.append((statistics.median_low([a, b]), key[(rid, dim)]))
        unit = (
            row[1].value,
            row[2].value,
            row[3].value,
            row[4].value,
            row[5].value,
            dim,
        )  # release, case, trial, conversation, image
        sheet_rows.update({(*unit, "rater:r1"): a, (*unit, "rater:r2"): b, (*unit, "experts"): statistics.median_low([a, b])})
    filled = tmp_path / "filled.xlsx"
    wb.save(filled)
    res = tmp_path / "results.json"
    import_rubric_review([filled], res, B=100)
    got = json.loads(res.read_text())["agreement"][0]
    assert got["dimension"] == "all" and got["experts_n"] == 8
    assert got["experts_weighted_kappa"] == pytest.approx(weighted_kappa(r1s, r2s), abs=1e-4)
    assert got["experts_alpha_ordinal"] == pytest.approx(krippendorff_alpha([r1s, r2s], "ordinal", (1, 2, 3, 4)), abs=1e-4)
    pairs = [p for p in judged if p[1] is not None]
    assert got["experts_vs_judge_n"] == len(pairs)
    ci = got["experts_weighted_kappa_ci"]
    assert ci[0] <= got["experts_weighted_kappa"] <= ci[1]
    # the ratings as scores rows beside the JSON: each rater's and the resolved one, keyed as the judge's rows
    from craftmd.release import SCORERS_METADATA

    scores_file = tmp_path / "results.scores.parquet"
    st = pq.read_table(scores_file)
    assert {"release", "conversation", "with_image", "dimension"} <= set(st.column_names)
    got_rows = {(r["release"], r["case_id"], r["trial"], r["conversation"], r["with_image"], r["dimension"], r["scorer"]): r["value"]
                for r in st.to_pylist() if r["metric"] == "expert_rubric_rating" and r["status"] == "ok"}  # fmt: skip
    assert got_rows == sheet_rows and st.num_rows == len(sheet_rows)
    records = json.loads(st.schema.metadata[SCORERS_METADATA])
    assert records["experts"]["raters"] == ["r1", "r2"] and {"rater:r1", "rater:r2"} <= set(records)
    judge_rows = {(r["case_id"], r["trial"], r["conversation"], r["with_image"], r["dimension"])
                  for r in read_release(rel).scores_with_records()[0].to_pylist()}  # fmt: skip
    assert {k[1:6] for k in got_rows} <= judge_rows  # the same keys as the judge's scores: joinable
    ws.cell(3, 10, "5")
    ws.cell(4, 11, "good")
    wb.save(filled)
    res.unlink()
    scores_file.unlink()
    with pytest.raises(CraftMDError, match=r"2 problem\(s\).*review!J3: '5' is not a rating 1-4.*review!K4"):
        import_rubric_review([filled], res, B=100)
    assert not res.exists() and not scores_file.exists()


def test_the_page_lists_the_judges_validity_beside_the_history_metrics(tmp_path):
    """A hand-made judge-validity audit (the audit builder's shape, no model) given to the page: the history section's
    validity table keeps its rows and adds the judge's information-gathering and diagnosis measures' Q2 and Q1 AUCs."""
    import re as _re

    import pyarrow as pa
    from test_analysis import N_CASES, _all_trials, _dataset, _release

    from craftmd.analysis.page import context, write_page
    from craftmd.analysis.tables import compute
    from craftmd.release import write_scores
    from craftmd.analysis.agreement.judge_validity import COMPOSITES, judge_validity_audit, page_measures

    data = _dataset(tmp_path)
    rels = tmp_path / "releases"
    for rid in ("a", "b"):
        rel = read_release(_release(rels, rid, {"vignette": _all_trials(range(20)), "multiturn": _all_trials(range(5))}))
        rows = [{"case_id": f"case_{c}", "trial": t, "conversation": "standard", "with_image": False, "scorer": "history",
                 "metric": "patient_info_recall", "value": ((c * 7 + t) % 10) / 10, "label": None, "detail": None, "status": "ok"}
                for c in range(N_CASES) for t in range(2)]  # fmt: skip
        write_scores(rel, pa.Table.from_pylist(rows), {"history": {}})
    a = compute(rels, data, B=100)
    history_audit = {"id": "history_validity", "title": "History metrics against the dermatologists", "tables": [
        {"name": "ROC AUC of each metric for the dermatologists' labels", "columns": ["measure", "question", "conversations", "n", "auc", "ci_low", "ci_high"],
         "rows": [["patient_info_recall (vs vignette)", "doctor_history", c, n, 0.61, 0.52, 0.7] for c, n in (("all resolved", 180), ("rated by both", 60))]},
        {"name": "The dermatologists' own agreement", "columns": ["question", "n", "agreement", "kappa", "auc"], "rows": [["doctor_history", 60, 0.8, 0.5, 0.58]]}]}  # fmt: skip
    gathering, diagnosis = "review_of_symptoms.completeness", "final_diagnosis.justification"
    assert {gathering, diagnosis} <= set(page_measures())

    def row(measure, q, auc, source="judge:openai/judge-a"):
        return {"measure": measure, "source": source, "question": q, "n": 150, "n_yes": 90, "failed": 3, "auc": auc,
                "ci_low": auc - 0.1, "ci_high": auc + 0.1}  # fmt: skip

    composite = next(iter(COMPOSITES))
    res = {"judges": ["judge:openai/judge-a"], "scorer": "judge:openai/judge-a", "mode": "category", "rows": [
        row(gathering, "Q1 doctor_one_dx", 0.55), row(diagnosis, "Q1 doctor_one_dx", 0.72), row(composite, "Q1 doctor_one_dx", 0.6),
        row(gathering, "Q2 doctor_history", 0.66), row(diagnosis, "Q2 doctor_history", 0.57), row(composite, "Q2 doctor_history", 0.64),
        row("communication.empathy", "Q2 doctor_history", 0.5),  # judged, but no information-gathering or diagnosis measure
        row("patient_info_recall (vs history)", "Q2 doctor_history", 0.63, source="history")]}  # fmt: skip
    judge_audit = judge_validity_audit(res, B=100)
    assert judge_audit["id"] == "judge_validity"

    jv = context(a, [history_audit, judge_audit])["history"]["judge_validity"]
    assert jv["judge"] == "openai/judge-a"
    got = {r["measure"]: (r["q2"]["auc"], r["q1"]["auc"]) for r in jv["rows"]}
    assert got == {gathering: (0.66, 0.55), diagnosis: (0.57, 0.72), composite: (0.64, 0.6)}
    assert jv["rows"][0]["q2"]["ci_low"] == pytest.approx(0.56) and jv["rows"][0]["q2"]["failed"] == 3
    assert context(a, [history_audit])["history"]["judge_validity"] is None

    def validity_table(html: str) -> str:
        return _re.search(r'<p id="history-validity">.*?</table>', html, _re.S).group(0)

    before = validity_table(write_page(a, tmp_path / "before", [history_audit]).read_text())
    after = validity_table(write_page(a, tmp_path / "after", [history_audit, judge_audit]).read_text())
    head, _, added = after.partition('<tbody id="history-validity-judge">')
    assert head.rstrip() + "</table>" == before  # the history rows as they were
    assert added.count("judge: openai/judge-a") == 1 + 3 and "communication.empathy" not in added
    assert "0.66<span" in added and "0.55<span" in added and "0.56–0.76" in added  # Q2, Q1, a CI
    md = (tmp_path / "after" / "leaderboard.md").read_text()
    assert (
        f"\n- `{diagnosis}` against the dermatologists' Q2: ROC AUC 0.57 (0.47–0.67, n=150); Q1: 0.72 (0.62–0.82, n=150); judge: openai/judge-a\n"
        in md
    )

    def history_md(text: str) -> str:
        return text[text.index("## How each doctor") : text.index("Tables: `tables/history_tests.csv`")]

    assert history_md(md).replace("".join(x for x in md.splitlines(True) if "judge: openai/judge-a" in x), "") == history_md(
        (tmp_path / "before" / "leaderboard.md").read_text()
    )  # only the judge's lines added
    only_judge = write_page(
        a, tmp_path / "judge", [judge_audit]
    ).read_text()  # without the history audit, the judge's rows still show
    assert 'id="history-validity-judge"' in only_judge


# -- pinned versions and staleness ---------------------------------------------------------------------------


def test_the_record_holds_the_served_model_and_an_alias_is_warned_about(tmp_path, capsys):
    """The judge names an undated alias the server answers as a dated model: the record holds the served name and
    stderr one warning line; a dated name that is served as itself warns nothing; completions cached before the served
    name was kept still answer (no request sent), and their name is unknown."""
    import sqlite3

    rel = make_release(tmp_path)
    cache = tmp_path / "cache.sqlite"
    with LoopbackServer(responder, models=("judge-a", "judge-b-2025-01-31"), served_as={"judge-a": "judge-a-2025-01-31"}) as s:
        for model in ("judge-a", "judge-b-2025-01-31"):
            judge_release(rel, J.JudgeSpec(models=[f"openai/{model}"], mode="category", dimensions=["final diagnosis"], base_url=s.base_url,
                                             progress=False, max_invalid=0, cache=cache), cases=["case_1"])  # fmt: skip
        sent = s.calls
        err = capsys.readouterr().err
        records = read_release(rel).scorer_records()
        assert records["judge:openai/judge-a"]["served_models"] == ["judge-a-2025-01-31"]
        assert records["judge:openai/judge-b-2025-01-31"]["served_models"] == ["judge-b-2025-01-31"]
        warnings = [x for x in err.splitlines() if x.startswith("warning:")]
        assert len(warnings) == 1 and "openai/judge-a" in warnings[0] and "judge-a-2025-01-31" in warnings[0]
        # a cache written before completions kept the served name
        with sqlite3.connect(cache) as db:
            rows = db.execute("select key, response from requests").fetchall()
            assert rows and all(json.loads(r)["model"] for _, r in rows)
            for k, r in rows:
                old = {a: b for a, b in json.loads(r).items() if a != "model"}
                db.execute("update requests set response = ? where key = ?", (json.dumps(old), k))
        judge_release(rel, J.JudgeSpec(models=["openai/judge-a"], mode="category", dimensions=["final diagnosis"], base_url=s.base_url,
                                         progress=False, max_invalid=0, cache=cache), cases=["case_1"])  # fmt: skip
        assert s.calls == sent  # every request answered by the old cache
    assert read_release(rel).scorer_records()["judge:openai/judge-a"]["served_models"] == []
    assert "warning" not in capsys.readouterr().err
    assert J.alias_warning("openai/gpt-4o", {"gpt-4o-2024-08-06"}) and not J.alias_warning(
        "openai/gpt-4-0613", {"gpt-4-0613-azure"}
    )
    assert not J.alias_warning("openai/claude-3-5-sonnet-20241022", {"x"}) and not J.alias_warning("openai/gpt-4o", set())


def test_a_current_judgement_is_not_redone_unless_overwritten_and_a_changed_input_is_stale(tmp_path, server, capsys, monkeypatch):
    import dataclasses

    from craftmd.commands.cli import main

    rel = make_release(tmp_path)
    cache = tmp_path / "cache.sqlite"
    argv = [str(rel), "--scorer", "judge:openai/judge-a", "--base-url", server.base_url, "--dimensions", "final diagnosis", "--mode", "category",
            "--cache", str(cache), "--quiet"]  # fmt: skip
    assert main(["score", *argv]) == 0
    assert (
        json.loads(capsys.readouterr().out)["summaries"]["judge:openai/judge-a"]["scores"]["judge:openai/judge-a"]["scored"] > 0
    )
    first, sent = (rel / "scores.parquet").read_bytes(), server.calls
    assert main(["score", *argv]) == 0  # nothing changed: nothing done
    out = capsys.readouterr()
    assert "judge:openai/judge-a current, nothing to do" in out.err and json.loads(out.out)["current"] == ["judge:openai/judge-a"]
    assert server.calls == sent and (rel / "scores.parquet").read_bytes() == first
    assert main(["score", *argv, "--estimate", "--force"]) == 0  # what judging again would send; nothing sent or written
    est = capsys.readouterr().out  # the estimate's table (the layout of generate --estimate)
    assert (
        str(rel) in est
        and "judge:openai/judge-a" in est
        and server.calls == sent
        and (rel / "scores.parquet").read_bytes() == first
    )
    assert main(["score", *argv, "--force"]) == 0  # judged again, the cache answering: the same bytes, nothing sent
    assert server.calls == sent and (rel / "scores.parquet").read_bytes() == first
    assert "nothing to do" not in capsys.readouterr().err

    spec = J.JudgeSpec(
        models=["openai/judge-a"], mode="category", dimensions=["final diagnosis"], base_url=server.base_url, progress=False
    )
    assert not judges_stale(rel, spec)
    assert judges_stale(rel, dataclasses.replace(spec, mode="dimension"))  # another setting
    assert judges_stale(rel, dataclasses.replace(spec, models=["openai/judge-b"]))  # another judge: no record
    assert judges_stale(rel, spec, cases=["case_1"])  # another selection
    record = read_release(rel).scorer_records()["judge:openai/judge-a"]
    with monkeypatch.context() as m:  # another prompt set
        m.setattr(
            J,
            "prompt_set_record",
            lambda: dict(record["prompt_set"], sha256={**record["prompt_set"]["sha256"], "dimension": "0" * 64}),
        )
        assert judges_stale(rel, spec)
    with monkeypatch.context() as m:  # another catalog
        m.setattr(J, "load_catalog", lambda: dataclasses.replace(load_catalog(), sha256="0" * 64))
        assert judges_stale(rel, spec)
    from craftmd.release import write_scores

    table, _ = read_release(rel).scores_with_records()
    mine = table.filter(pa.compute.equal(table["scorer"], "judge:openai/judge-a"))
    write_scores(
        read_release(rel),
        mine,
        {"judge:openai/judge-a": dict(record, inputs=dict(record["inputs"], conversations_sha256="0" * 64))},
    )
    assert judges_stale(rel, spec)  # the conversations it judged are not these
    write_scores(read_release(rel), mine, {"judge:openai/judge-a": record})
    assert not judges_stale(rel, spec)
    # a transient failure is not cached: a re-run would ask again, so the scores are not current
    with LoopbackServer(responder, models=("judge-a",), error_rate=1.0, error_kinds=("500",)) as down:
        flaky = dataclasses.replace(spec, base_url=down.base_url, max_retries=0)
        judge_release(rel, flaky)
    assert read_release(rel).scorer_records()["judge:openai/judge-a"]["transient_failures"] > 0 and judges_stale(rel, flaky)


def test_judges_named_together_are_one_committee_and_a_judge_of_the_doctor_family_is_refused_first(tmp_path, server, capsys):
    """``craftmd score --scorer judge:A --scorer judge:B`` runs one committee; a judge of the doctor's family is refused
    before any call or write; a second run with nothing changed sends nothing."""
    from craftmd.commands.cli import main

    rel = make_release(tmp_path)  # the doctor: openai/gpt-4-0613
    base = ["score", str(rel), "--base-url", server.base_url, "--dimensions", "final diagnosis", "--mode", "category", "--quiet"]
    assert main([*base, "--scorer", "judge:openai/judge-a", "--scorer", "judge:openai/gpt-4o"]) == 2
    assert "judge openai/gpt-4o is of the doctor's own model family" in capsys.readouterr().err
    assert server.calls == 0 and not (rel / "scores.parquet").exists()
    two = [*base, "--scorer", "judge:openai/judge-a", "--scorer", "judge:openai/judge-b"]
    assert main(two) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scored"] == ["judge-committee"] and out["skipped"] == {}
    records = read_release(rel).scorer_records()
    assert {"judge:openai/judge-a", "judge:openai/judge-b", "judge-committee"} <= set(records)
    assert records["judge-committee"]["members"] == ["judge:openai/judge-a", "judge:openai/judge-b"]
    sent, first = server.calls, (rel / "scores.parquet").read_bytes()
    assert main(two) == 0 and json.loads(capsys.readouterr().out)["current"] == ["judge-committee"]
    assert server.calls == sent and (rel / "scores.parquet").read_bytes() == first


def test_a_judge_returns_its_rows_and_records_and_only_craftmd_score_writes_them(tmp_path, server):
    """The judges are a scorer like any other: run, they return the committee's rows, each judge's record and the run's
    summary, and leave the release as it was; craftmd score (score_release) writes what they returned."""
    from craftmd.scoring.score import score_release
    from craftmd.scoring.scorers import Context, Judges, ScorerResult

    rel = make_release(tmp_path)
    before = {p.name: p.read_bytes() for p in rel.iterdir() if p.is_file()}
    ctx = Context(None, base_url=server.base_url, progress=False, options={"mode": "category", "dimensions": CATS})
    judges = Judges(["openai/judge-a", "openai/judge-b"])
    result = judges.run(read_release(rel), ctx)
    assert isinstance(result, ScorerResult)
    assert {p.name: p.read_bytes() for p in rel.iterdir() if p.is_file()} == before  # nothing written
    assert set(result.records) == {"judge:openai/judge-a", "judge:openai/judge-b", J.COMMITTEE}
    assert set(result.rows.column("scorer").to_pylist()) == set(result.records)
    assert result.summary["judges"] == ["judge:openai/judge-a", "judge:openai/judge-b"] and result.summary["conversations"] == 3
    report = score_release(
        rel,
        None,
        ["judge:openai/judge-a", "judge:openai/judge-b"],
        base_url=server.base_url,
        progress=False,
        options={"mode": "category", "dimensions": CATS},
    )
    assert report["scored"] == [J.COMMITTEE] and report["summaries"][J.COMMITTEE]["judges"] == result.summary["judges"]
    written, records = read_release(rel).scores_with_records()
    assert written.num_rows == result.rows.num_rows and set(records) >= set(result.records)


# -- a rating sheet is bound to what was exported (issue 48) ----------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A judged release and its exported rating sheet (two conversations x the 4 final-diagnosis dimensions)."""
    from craftmd.analysis.agreement.rubric_review import export_rubric_review

    root = tmp_path_factory.mktemp("sheet")
    rel = make_release(root)
    with LoopbackServer(responder, models=("judge-a", "judge-b", "gpt-4o")) as s:
        run_judge(rel, s, "dimension")
    sheet = root / "review.xlsx"
    export_rubric_review([rel], sheet, n=2, seed=15, dimensions=["final diagnosis"])
    return sheet


def _filled(wb, raters=(10, 11)):
    for i in range(2, wb["review"].max_row + 1):
        for j in raters:
            wb["review"].cell(i, j, 1 + (i + j) % 4)


def _third_rater(wb):
    wb["review"].cell(1, 12, "r3")
    wb["review"].cell(2, 12, 4)


def _repeated(wb):
    ws = wb["review"]
    ws.append([c.value for c in ws[2]])


SHEET_DAMAGE = {  # a change of a filled-in sheet -> what the one line says
    "no-key-sheet": (lambda wb: wb.remove(wb["key"]), "no key sheet"),
    "no-review-sheet": (lambda wb: wb.remove(wb["review"]), "no review sheet"),
    "a-judge-score-of-7": (lambda wb: wb["key"].cell(2, 4, 7), "the judge's score 7 is not 1-4"),
    "a-judge-score-as-text": (lambda wb: wb["key"].cell(3, 4, "high"), "the judge's score 'high' is not 1-4"),
    "release-column-edited": (lambda wb: wb["review"].cell(2, 2, "other-release"), "not the one its review id"),
    "case-column-edited": (lambda wb: wb["review"].cell(3, 3, "case_9"), "not the one its review id"),
    "a-repeated-row": (_repeated, "is row 2 again"),
    "a-third-rater": (_third_rater, "a column 'r3'"),
    "a-formula-rating": (lambda wb: wb["review"].cell(2, 10, "=1+2"), "a formula (=1+2)"),
    "a-rating-of-7": (lambda wb: wb["review"].cell(2, 10, 7), "7 is not a rating 1-4"),
    "a-rating-true": (lambda wb: wb["review"].cell(2, 10, True), "True is not a rating 1-4"),
}


@pytest.mark.parametrize("how", list(SHEET_DAMAGE))
def test_a_damaged_rating_sheet_is_one_line_and_nothing_is_written(exported, tmp_path, capsys, how):
    from openpyxl import load_workbook

    from craftmd.commands.cli import main

    change, says = SHEET_DAMAGE[how]
    wb = load_workbook(exported)
    _filled(wb)
    change(wb)
    filled = tmp_path / "filled.xlsx"
    wb.save(filled)
    out = tmp_path / "results.json"
    assert main(["judge-review", "import", str(filled), "--out", str(out), "--B", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and says in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["filled.xlsx"]


def test_a_sheet_of_one_rater_is_imported(exported, tmp_path, capsys):
    from openpyxl import load_workbook

    from craftmd.commands.cli import main

    wb = load_workbook(exported)
    _filled(wb, raters=(10,))
    wb.save(tmp_path / "filled.xlsx")
    assert main(["judge-review", "import", str(tmp_path / "filled.xlsx"), "--out", str(tmp_path / "r.json"), "--B", "20"]) == 0
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["ratings"] == 8 and got["agreement"][0]["experts_n"] == 0  # no second rater: no agreement between raters
