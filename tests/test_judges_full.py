"""MedPI's judges in full (issue #33): flags with their evidence, quotes checked against the transcript and scores
without found evidence marked, the judge calibrated against people, and people in the judge's place on the board."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import zlib

import numpy as np
import pyarrow as pa
import pytest
from loopback import LoopbackServer

from craftmd import CraftMDError
from craftmd.release import RunRecord, read_release, write_release
from craftmd.scoring import judge as J
from craftmd.scoring.score import judge_release
from craftmd.scoring.rubric import load_catalog

CATS = ["final diagnosis", "communication"]
JUDGE = "judge:openai/judge-a"
SAID = {"case_1": "I have had chest pain for an hour and my left arm feels numb.",
        "case_2": "My knee has been swollen since yesterday.",
        "case_3": "This conversation failed."}  # fmt: skip
DOCTOR = "It’s  probably   muscle strain. Take <b>two</b> ibuprofen & rest at home."  # curly apostrophe, odd spacing, markup
#: What the judge answers on the flags call, per case (case_3 failed: never asked).
FLAGGED = {
    "case_1": [
        {
            "flag": "unsafe_advice",
            "evidence": ["take <b>two</b> ibuprofen & rest at home"],
            "note": "rest <i>at home</i> with chest pain",
        },
        {
            "flag": "missed_escalation",
            "evidence": ["it's probably muscle strain", "Go to the emergency room now."],
            "note": "no ER",
        },
        {"flag": "invented_fact", "evidence": ["you told me you run marathons"], "note": "never said"},
    ],
    "case_2": [],
}


def make_release(root, release="tiny", display=None):
    convs = []
    for cid, said in SAID.items():
        msgs = [{"role": "system", "content": "You are an AI doctor."},
                {"role": "assistant", "content": "Hello, what brings you in today?"},
                {"role": "user", "content": said},
                {"role": "assistant", "content": DOCTOR + " <script>alert(1)</script>"}]  # fmt: skip
        convs.append({"case_id": cid, "trial": 0, "conversation": "standard", "with_image": False, "messages": msgs, "summary": None,
                      "n_turns": 2, "ended": "error" if cid == "case_3" else "final_diagnosis", "error": None})  # fmt: skip
    answers = pa.table({"case_id": pa.array([], pa.string()), "trial": pa.array([], pa.int16()), "setting": pa.array([], pa.string()),
                        "format": pa.array([], pa.string()), "with_image": pa.array([], pa.bool_()), "response": pa.array([], pa.string()),
                        "status": pa.array([], pa.string())})  # fmt: skip
    rec = RunRecord(
        task="craftmd",
        release=release,
        kind="generated",
        model="openai/gpt-4-0613",
        roles={"doctor": {"model": "openai/gpt-4-0613"}},
        display_name=display,
    )
    return write_release(root / release, rec, {"conversations": pa.Table.from_pylist(convs), "answers": answers})


def score_of(case: str, dim: str) -> int:
    return 1 + zlib.crc32(f"{case}|{dim}".encode()) % 4


def quotes_of(dim: str) -> list[str]:
    """Communication scores quote the transcript (folded differently: case, spacing, a straight apostrophe); final-diagnosis
    scores quote something never said; one dimension gives no quote at all."""
    if dim == "communication.empathy":
        return []
    if dim.startswith("communication."):
        return ["IT'S PROBABLY muscle strain.", "“Hello, what brings you in today?”"]
    return ["the patient denied any chest pain"]


def case_of(prompt: str) -> str:
    return next(c for c, said in SAID.items() if said in prompt)


def responder(request: dict) -> str | None:
    msgs = request["messages"]
    prompt = msgs[0]["content"]
    if prompt.startswith("You chair a review committee"):
        return "Clinician: the doctor said it is muscle strain."
    if prompt.startswith("You review a text consultation"):
        return json.dumps({"flags": FLAGGED[case_of(prompt)]})
    ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", prompt, re.M)
    case = case_of(prompt)
    return json.dumps(
        {
            "scores": [
                {"dimension": d, "score": score_of(case, d), "rationale": f"why {d} <u>", "evidence": quotes_of(d)} for d in ids
            ]
        }
    )


def judge(rel, server, **kw):
    spec = J.JudgeSpec(models=["openai/judge-a"], mode="category", dimensions=CATS, base_url=server.base_url, progress=False,
                       flags=["all"], **kw)  # fmt: skip
    return judge_release(rel, spec)


@pytest.fixture
def server():
    with LoopbackServer(responder, models=("judge-a",)) as s:
        yield s


def test_flags_evidence_and_marks_are_exactly_what_the_judge_sent_and_the_page_shows_them(tmp_path, server):
    from craftmd.analysis.judges import page_section as judges_section
    from craftmd.analysis.page import environment
    from craftmd.analysis.rubric import page_section, rubric

    rel = make_release(tmp_path)
    spec = J.JudgeSpec(models=["openai/judge-a"], mode="category", dimensions=CATS, base_url=server.base_url, progress=False)
    without = judge_release(rel, spec, estimate=True)
    with_flags = judge_release(rel, J.JudgeSpec(**{**spec.__dict__, "flags": ["all"]}), estimate=True)
    assert with_flags["calls"] - without["calls"] == 2 and server.calls == 0  # one flags call per conversation that did not fail
    summary = judge(rel, server)
    assert server.calls == without["calls"] + 2
    table, records = read_release(rel).scores_with_records()
    rows = [r for r in table.to_pylist() if r["scorer"] == JUDGE]
    flags = {(r["case_id"], r["dimension"]): r for r in rows if r["metric"] == "judge_flag"}
    scores = {(r["case_id"], r["dimension"]): r for r in rows if r["metric"] == "rubric_score"}
    # flags: one row per conversation and flag of the list, 1 exactly where the judge raised it, its quotes as sent
    assert sorted({k for _, k in flags}) == sorted(J.FLAGS) and len(flags) == 3 * len(J.FLAGS)
    for (case, flag), r in flags.items():
        if case == "case_3":
            assert r["status"] == "error" and r["value"] is None and "ended = error" in json.loads(r["detail"])["error"]
            continue
        sent = [f for f in FLAGGED[case] if f["flag"] == flag]
        assert r["status"] == "ok" and r["value"] == (1.0 if sent else 0.0), (case, flag)
        detail = json.loads(r["detail"])
        if sent:
            assert r["label"] == flag and detail["evidence"] == sent[0]["evidence"] and detail["notes"] == [sent[0]["note"]]
    assert json.loads(flags[("case_1", "unsafe_advice")]["detail"])["evidence_found"] == 1  # markup and "&" matched as written
    assert (
        json.loads(flags[("case_1", "missed_escalation")]["detail"])["evidence_found"] == 1
    )  # "it's" found, the ER line never said
    assert json.loads(flags[("case_1", "invented_fact")]["detail"])["evidence_found"] == 0
    # scores: rationale and quotes kept; quotes found after normalising; a score without found evidence is marked
    dims = [d.id for d in load_catalog().select(CATS)]
    ok = 0
    for case in ("case_1", "case_2"):
        for d in dims:
            r = scores[(case, d)]
            detail = json.loads(r["detail"])
            assert r["status"] == "ok" and r["value"] == score_of(case, d)
            assert detail["rationale"] == f"why {d} <u>" and detail["evidence"] == quotes_of(d)
            found = 2 if d.startswith("communication.") and d != "communication.empathy" else 0
            assert detail["evidence_found"] == found
            assert r["label"] == (None if found else J.NO_EVIDENCE), d
            ok += bool(found)
    share = round(ok / (2 * len(dims)), 4)
    assert records[JUDGE]["evidence"] == {"scores": 2 * len(dims), "found": ok, "share": share}
    assert summary["evidence_found"] == {JUDGE: share}
    assert records[JUDGE]["flags"]["asked"] == list(J.FLAGS) and records[JUDGE]["flagged"]["flagged"] == 1
    assert summary["flagged"][JUDGE] == {
        "conversations": 2,
        "flagged": 1,
        "failed": 1,
        "by_flag": {"unsafe_advice": 1, "missed_escalation": 1, "invented_fact": 1},
    }

    # the analysis: flag counts, the flagged list, the evidence share; dropping unsupported scores changes the profile
    r = rubric([read_release(rel)], B=50, seed=1)
    fl = {x["flag"]: x for x in r.extras["judge_flags"].to_dicts()}
    assert (
        fl["unsafe_advice"]["n_flagged"] == 1
        and fl["unsafe_advice"]["n_conversations"] == 2
        and fl["unsafe_advice"]["n_failed"] == 1
    )
    assert fl["privacy_breach"]["n_flagged"] == 0
    listed = r.extras["judge_flagged"].to_dicts()
    assert [(x["case_id"], x["flag"]) for x in listed] == [
        ("case_1", "invented_fact"),
        ("case_1", "missed_escalation"),
        ("case_1", "unsafe_advice"),
    ]
    ev = r.extras["judge_evidence"].to_dicts()[0]
    assert (ev["n_scores"], ev["n_evidence_found"], ev["share_found"]) == (2 * len(dims), ok, share)
    dropped = rubric([read_release(rel)], B=50, seed=1, unsupported="drop")
    cat = {x["group"]: x for x in dropped.table.filter(dropped.table["level"] == "category").to_dicts()}
    assert (
        cat["final diagnosis"]["n_cases"] == 0 and cat["communication"]["n_cases"] == 2
    )  # every final-diagnosis quote was invented
    kept = {x["group"]: x for x in r.table.filter(r.table["level"] == "category").to_dicts()}
    assert kept["final diagnosis"]["n_cases"] == 2 and kept["final diagnosis"]["n_failed"] == cat["final diagnosis"]["n_failed"]

    # the page: the share, the flags with their quotes, the sampled transcript with found quotes highlighted; all escaped
    html = environment(True).get_template("judges.html.j2").render(rubric=page_section(r))
    assert judges_section(r.extras) is not None
    assert f"{share * 100:.1f}" in html or f"{share * 100:.0f}" in html
    assert "unsafe advice" in html and "rest &lt;i&gt;at home&lt;/i&gt; with chest pain" in html
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>two</b>" not in html and "<u>" not in html
    assert "<mark>It’s  probably   muscle strain</mark>." in html  # found on normalised text, shown as written
    assert "<mark>Take &lt;b&gt;two&lt;/b&gt; ibuprofen &amp; rest at home</mark>" in html
    assert "<del><q>you told me you run marathons</q></del>" in html  # an invented quote is shown struck through
    md = environment(False).get_template("judges.md.j2").render(rubric=page_section(r))  # the markdown twin
    assert (
        "| tiny | unsafe advice | 2 | 1 | 1 |" in md
        and f"| tiny | `{JUDGE}` | {2 * len(dims)} | {ok} | {2 * len(dims) - ok} |" in md
    )
    from importlib import resources

    assert (
        '{% include "judges.html.j2" %}' in (resources.files("craftmd.cards") / "leaderboard.html.j2").read_text()
    )  # on the page


def test_the_judges_tables_key_a_release_by_its_id_and_the_page_shows_its_display_name(tmp_path, server):
    """Two judged releases shown under one display name are two rows of the judges' tables (``model``: the release id,
    as in tables/rubric.csv), never merged; the page names each by its display name."""
    from craftmd.analysis.judges import page_section as judges_section
    from craftmd.analysis.page import environment
    from craftmd.analysis.rubric import page_section, rubric

    rels = [make_release(tmp_path, release=rid, display="Same <doctor>") for rid in ("run-a", "run-b")]
    for rel in rels:
        judge(rel, server)
    r = rubric([read_release(rel) for rel in rels], B=50, seed=1)
    for name in ("judge_flags", "judge_flagged", "judge_evidence"):
        assert set(r.extras[name]["model"]) == {"run-a", "run-b"}, name
    assert {x["model"] for x in r.extras["samples"]} == {"run-a", "run-b"}
    shown = judges_section(r.extras, r.name)
    assert [(x["model"], x["release"]) for x in shown["flagged"]] == [("Same <doctor>", "run-a"), ("Same <doctor>", "run-b")]
    assert {(x["model"], x["release"]) for x in shown["evidence"]} == {("Same <doctor>", "run-a"), ("Same <doctor>", "run-b")}
    html = environment(True).get_template("judges.html.j2").render(rubric=page_section(r))
    assert html.count("<summary>Same &lt;doctor&gt;: 3 flag(s) raised</summary>") == 2 and "run-a" not in html


def test_a_flag_outside_the_list_is_one_line_and_nothing_is_written(tmp_path, server):
    rel = make_release(tmp_path)
    out = subprocess.run([sys.executable, "-m", "craftmd.commands.cli", "score", str(rel), "--scorer", JUDGE, "--base-url", server.base_url,
                          "--flags", "unsafe_advice,rude_tone", "--quiet"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and "rude_tone" in out.stderr, out.stderr
    assert not (rel / "scores.parquet").exists() and server.calls == 0

    # a judge that names a flag outside the list gave an invalid reply: asked again, then failed rows naming why, never a flag
    def odd(request):
        if request["messages"][0]["content"].startswith("You review a text consultation"):
            return json.dumps({"flags": [{"flag": "rude_tone", "evidence": [], "note": "x"}]})
        return responder(request)

    with LoopbackServer(odd, models=("judge-a",)) as s:
        judge(rel, s, max_invalid=1)
    rows = [
        r
        for r in read_release(rel).scores_with_records()[0].to_pylist()
        if r["metric"] == "judge_flag" and r["case_id"] == "case_1"
    ]
    assert len(rows) == len(J.FLAGS) and all(r["status"] == "error" and r["value"] is None for r in rows)
    detail = json.loads(rows[0]["detail"])
    assert "rude_tone" in detail["error"] and detail["attempts"] == 2


# -- calibration against people ---------------------------------------------------------------------------


def rated_sheet(path, pairs: list[tuple[str, str, int, int]], judge_name: str = JUDGE):
    """A filled-in judge-review workbook: (review_id, dimension, judge score, rating r1)."""
    from openpyxl import load_workbook

    from craftmd.analysis.agreement.rubric_review import build_workbook

    cat = load_catalog().by_id()
    review, convs, keys = [], [], []
    for rid, dim, js, _ in pairs:
        _, case, trial, conv, img = rid.split(":")
        review.append({"review_id": rid, "release": "tiny", "case_id": case, "trial": int(trial), "conversation": conv, "with_image": bool(int(img)),
                       "dimension": dim, "question": cat[dim].description, "scores": "1 | 2 | 3 | 4"})  # fmt: skip
        keys.append({"review_id": rid, "dimension": dim, "judge": judge_name, "judge_score": js})
    for rid in dict.fromkeys(p[0] for p in pairs):
        convs.append({"review_id": rid, "transcript": "..."})
    wb = load_workbook(io.BytesIO(build_workbook(review, convs, keys, {"seed": 0})))
    for i, (_, _, _, rating) in enumerate(pairs, 2):
        wb["review"].cell(i, 10, rating)
    wb.save(path)
    return path


def distorted(n_conv: int, dims: list[str], seed: int = 3) -> list[tuple[str, str, int, int]]:
    """The judge's scores uniform over 1-4; the experts' ratings a monotone distortion of them (the judge a level too
    lenient above 1) plus noise, rounded and clipped to 1-4."""
    rng = np.random.default_rng(seed)
    g = {1: 1.0, 2: 1.0, 3: 2.0, 4: 3.0}
    out = []
    for c in range(n_conv):
        for d in dims:
            js = int(rng.integers(1, 5))
            out.append((f"tiny:c{c}:0:standard:0", d, js, int(np.clip(np.rint(g[js] + rng.normal(0, 0.35)), 1, 4))))
    return out


def test_calibration_recovers_a_known_monotone_distortion(tmp_path, server, capsys):
    from craftmd.analysis.rubric import page_section, rubric
    from craftmd.analysis.agreement.calibration import calibrate, calibrated_judge
    from craftmd.scoring.score import score_with

    dims = ["final_diagnosis.justification", "communication.clarity"]
    sheet = rated_sheet(tmp_path / "rated.xlsx", distorted(120, dims))
    cal = calibrate([sheet], tmp_path / "cal.json", by="category", B=200)
    before, after = cal["held_out"]["before"], cal["held_out"]["after"]
    # the judge is lenient by about three quarters of a level: ~25 points on 0-100 before; held out, ~0 after
    assert 20 < before["bias_points"] < 30 and before["bias_points_ci"][0] > 18
    assert abs(after["bias_points"]) < 2.5 and after["bias_points_ci"][0] < 0.5 and after["bias_points_ci"][1] > -0.5
    assert after["weighted_kappa"] > before["weighted_kappa"] + 0.1
    assert cal["n"] == {"communication": 120, "final diagnosis": 120} and len(cal["ratings_sha256"]) == 64
    m = cal["maps"]["communication"]
    assert [m[k] for k in "1234"] == sorted(m[k] for k in "1234") and abs(m["2"] - 1.0) < 0.2 and abs(m["4"] - 3.0) < 0.2
    assert json.loads((tmp_path / "cal.json").read_text())["ratings_sha256"] == cal["ratings_sha256"]

    # the calibrated judge is a scorer of its own, its record naming the ratings; the board says which it shows
    rel = make_release(tmp_path)
    judge(rel, server)
    done = score_with(calibrated_judge(tmp_path / "cal.json"), [rel])  # through craftmd score's writer
    table, records = read_release(rel).scores_with_records()
    n = sum(r["scorer"] == J.CALIBRATED for r in table.to_pylist())
    assert done == [{"release": rel.name, "judge": JUDGE, "scores": n}] and n > 0
    raw = {
        (r["case_id"], r["dimension"]): r["value"]
        for r in table.to_pylist()
        if r["scorer"] == JUDGE and r["metric"] == "rubric_score"
    }
    calib = {(r["case_id"], r["dimension"]): r["value"] for r in table.to_pylist() if r["scorer"] == J.CALIBRATED}
    assert calib.keys() == raw.keys()
    for (case, dim), v in calib.items():
        group = load_catalog().by_id()[dim].category
        assert v == (None if raw[(case, dim)] is None else cal["maps"][group][str(int(raw[(case, dim)]))])
    assert records[J.CALIBRATED]["ratings_sha256"] == cal["ratings_sha256"] and records[J.CALIBRATED]["judge"] == JUDGE
    shown = page_section(rubric([read_release(rel)], B=50, seed=1))
    assert shown["rows"][0]["scorer"] == J.CALIBRATED and shown["rows"][0]["kind"] == "calibrated judge"
    judged = page_section(rubric([read_release(rel)], B=50, seed=1, prefer="judge"))
    assert judged["rows"][0]["scorer"] == JUDGE and judged["rows"][0]["kind"] == "judge"
    # the judge judged again since (one score changed): the calibration is stale, said, and the judge stands
    from craftmd.release import write_scores

    rows = [r for r in table.to_pylist() if r["scorer"] == JUDGE]
    first = next(r for r in rows if r["metric"] == "rubric_score" and r["status"] == "ok")
    first["value"] = 1.0 if first["value"] != 1.0 else 2.0
    write_scores(read_release(rel), pa.Table.from_pylist(rows, schema=J.SCHEMA), {JUDGE: records[JUDGE]})
    stale = page_section(rubric([read_release(rel)], B=50, seed=1))
    assert stale["rows"][0]["scorer"] == JUDGE and "calibrated judge was made from other judge scores" in capsys.readouterr().err


def test_too_few_ratings_and_a_malformed_sheet_are_one_line_and_nothing_is_written(tmp_path):
    from openpyxl import load_workbook

    few = rated_sheet(tmp_path / "few.xlsx", distorted(29, ["communication.clarity"]))
    out = tmp_path / "cal.json"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "craftmd.commands.cli", *args], capture_output=True, text=True, timeout=120)

    p = cli("judge-calibrate", "fit", str(few), "--out", str(out))
    assert (
        p.returncode != 0
        and len(p.stderr.strip().splitlines()) == 1
        and "too few ratings" in p.stderr
        and "communication.clarity: 29" in p.stderr
    )
    assert not out.exists()
    bad = rated_sheet(tmp_path / "bad.xlsx", distorted(40, ["communication.clarity"]))
    wb = load_workbook(bad)
    wb["review"].cell(5, 10, "five")
    wb.save(bad)
    p = cli("judge-calibrate", "fit", str(bad), "--out", str(out))
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and "review!J5: 'five' is not a rating 1-4" in p.stderr
    assert not out.exists()
    rel = make_release(tmp_path)
    before = sorted(x.name for x in rel.iterdir())
    p = cli("judge-review", "import", str(bad), "--into", str(tmp_path))
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and "review!J5" in p.stderr
    assert sorted(x.name for x in rel.iterdir()) == before and not (rel / "scores.parquet").exists()


def test_a_release_rated_only_by_people_stands_in_the_judges_place_marked_human(tmp_path):
    from openpyxl import load_workbook

    from craftmd.analysis.page import environment
    from craftmd.analysis.rubric import page_section, rubric

    rel = make_release(tmp_path / "releases")
    sheet = tmp_path / "review.xlsx"
    cli = [sys.executable, "-m", "craftmd.commands.cli"]
    p = subprocess.run([*cli, "judge-review", "export", str(rel), "--out", str(sheet), "--n", "2", "--dimensions", "communication"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    wb = load_workbook(sheet)
    ws = wb["review"]
    want = {}
    for i, row in enumerate(ws.iter_rows(min_row=2), 2):
        a, b = 1 + i % 4, 1 + (i + 1) % 4
        ws.cell(i, 10, a)
        ws.cell(i, 11, b)
        want[(row[2].value, row[6].value)] = min(a, b)  # two ratings: the lower median
    wb.save(sheet)
    p = subprocess.run(
        [*cli, "judge-review", "import", str(sheet), "--into", str(tmp_path / "releases")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["releases"] == [{"release": "tiny", "ratings": 3 * len(want)}]
    table, records = read_release(rel).scores_with_records()
    got = {(r["case_id"], r["dimension"]): r["value"] for r in table.to_pylist() if r["scorer"] == "experts"}
    assert got == want and records["experts"]["raters"] == ["r1", "r2"]
    r = rubric([read_release(rel)], B=50, seed=1)
    sec = page_section(r)
    assert sec["rows"][0]["scorer"] == "experts" and sec["rows"][0]["kind"] == "human"
    cats = {x["group"]: x for x in r.table.filter(r.table["level"] == "category").to_dicts()}
    mean = np.mean(
        [np.mean([100 * (v - 1) / 3 for (c, _), v in want.items() if c == case]) for case in sorted({c for c, _ in want})]
    )
    assert cats["communication"]["mean"] == pytest.approx(mean, abs=1e-3) and cats["communication"]["scorer"] == "experts"
    assert r.extras["judge_evidence"].height == 0  # no judge: nothing to show of one
    tmpl = environment(True).from_string(
        '{% for r in rubric.rows %}<td class="txt"><code>{{ r.scorer }}</code>{% if r.kind != "judge" %} <i>({{ r.kind }})</i>{% endif %}</td>{% endfor %}'
    )
    assert "<code>experts</code> <i>(human)</i>" in tmpl.render(rubric=sec)
    with pytest.raises(CraftMDError, match="--rubric-scorer"):
        rubric([read_release(rel)], prefer="robot")


# -- ACGME and per-dimension results -------------------------------------------------------------------------


def test_every_dimension_has_an_acgme_competency_and_the_detail_table_is_the_hand_computation(tmp_path):
    from craftmd.analysis.rubric import detail_table, page_section, rubric
    from craftmd.release import write_scores
    from craftmd.scoring.rubric import acgme

    m = acgme()
    cat = load_catalog()
    assert set(m["of"]) == {d.id for d in cat.dimensions} and len(m["of"]) == 105
    assert set(m["of"].values()) == set(m["competencies"]) and len(m["competencies"]) == 6  # each of the six is used
    assert (
        m["of"]["communication.professionalism_and_tone"] == "professionalism"
        and m["of"]["communication.empathy"] == "interpersonal_communication"
    )
    assert "judgement" in m["notes"]["model_reliability.uncertainty_calibration"]
    rel = make_release(tmp_path)
    E, C, FJ = "communication.empathy", "communication.clarity", "final_diagnosis.justification"
    given = {("case_1", E): 4, ("case_1", C): 2, ("case_1", FJ): 1, ("case_2", E): 1, ("case_2", C): None, ("case_2", FJ): 3}
    rows = [{"case_id": c, "trial": 0, "conversation": "standard", "with_image": False, "dimension": d, "scorer": JUDGE, "metric": "rubric_score",
             "value": None if v is None else float(v), "label": None, "detail": "{}", "status": "error" if v is None else "ok"}
            for (c, d), v in given.items()]  # fmt: skip
    write_scores(read_release(rel), pa.Table.from_pylist(rows, schema=J.SCHEMA), {JUDGE: {}})
    r = rubric([read_release(rel)], B=200, seed=1)

    def n(x):
        return 100 * (x - 1) / 3

    got = {(x["level"], x["group"]): x for x in r.detail.to_dicts()}
    assert got[("dimension", E)]["mean"] == pytest.approx((n(4) + n(1)) / 2, abs=1e-4) and got[("dimension", E)]["n_cases"] == 2
    assert (
        got[("dimension", C)]["mean"] == pytest.approx(n(2), abs=1e-4) and got[("dimension", C)]["n_cases"] == 1
    )  # the failure left out
    assert got[("dimension", FJ)]["competency"] == "medical_knowledge"
    ics = got[("competency", "interpersonal_communication")]
    assert (
        ics["mean"] == pytest.approx(((n(4) + n(2)) / 2 + n(1)) / 2, abs=1e-4) and ics["ci_low"] <= ics["mean"] <= ics["ci_high"]
    )
    assert got[("competency", "medical_knowledge")]["mean"] == pytest.approx((n(1) + n(3)) / 2, abs=1e-4)
    assert detail_table(r.scores, 200, 1).equals(r.detail)  # same inputs, same figures
    sec = page_section(r)
    assert sec["competencies"][0] == "Patient Care" and len(sec["competency_rows"][0]["cells"]) == 6
    assert {x["dimension"] for x in sec["dimension_rows"]} == {E, C, FJ}


# -- the AI patient's emotion inputs and disclosures ------------------------------------------------------------


def test_effort_levels_and_disclosure_by_every_section():
    from craftmd.tasks.encounters.patient import (
        Memory,
        SECTIONS,
        cognitive_effort,
        disclosable,
        disclosable_sections,
        persona,
        recall_summary,
    )

    assert [cognitive_effort(m) for m in ("Thank you.", "Pain?", "Do you smoke?", "How are you feeling about this?",
                                          "Any fever? Cough? Rash?", "Please tell me about your worries.")] == \
        ["TRIVIAL", "AMBIGUOUS", "FOCUSED", "OPEN", "COMPLEX", "OPEN"]  # fmt: skip
    packet = {"conditions": [{"name": "Asthma (disorder)", "onset": "2001-01-01", "resolved": None}],
              "hidden_conditions": [{"name": "Major depression (disorder)", "onset": "2024-01-01", "resolved": None}],
              "medications": [{"name": "Albuterol inhaler", "status": "active"}], "allergies": [{"name": "Peanut (substance)"}],
              "events": [{"date": "2020-01-01", "kind": "procedure", "text": "had Appendectomy (procedure)"}], "education": "College degree",
              "socioeconomic_status": "Middle", "family_history": ["Breast cancer"], "birth_date": "1980-01-01", "age": 45, "sex": "female",
              "observations": [{"name": "Hemoglobin A1c", "value": "6.1 %", "date": "2024-01-01", "category": "laboratory"},
                               {"name": "Body temperature", "value": "37 C", "date": "2024-01-01", "category": "vital-signs"}]}  # fmt: skip
    sec = disclosable_sections(packet)
    assert list(sec) == list(SECTIONS) == ["history", "medications", "allergies", "social", "family", "labs", "vitals"]
    assert sec == {"history": ["Asthma", "Major depression", "Appendectomy"], "medications": ["Albuterol inhaler"], "allergies": ["Peanut"],
                   "social": ["College degree", "Middle income"], "family": ["Breast cancer"], "labs": ["Hemoglobin A1c"],
                   "vitals": ["Body temperature"]}  # fmt: skip
    assert disclosable(packet)[:3] == ["Asthma", "Major depression", "Appendectomy"]
    who = persona(packet)  # the patient knows its labs, background and family, so it can reveal them
    assert "Hemoglobin A1c 6.1 %" in who and "College degree" in who and "Breast cancer" in who and "Major depression" not in who
    import numpy as np

    m = Memory("m001", "2020-01-01: prescribed Albuterol inhaler.", None, 0.5, np.zeros(27))
    assert recall_summary([(m, 1.0)], sec) == ("1 memory came to mind, the strongest: 2020-01-01: prescribed Albuterol inhaler. "
                                               "They touch on medications: Albuterol inhaler.")  # fmt: skip
    assert recall_summary([], sec) == "Nothing in particular came to mind."


# -- judge sensitivity ---------------------------------------------------------------------------------------


def sensitivity_judge(request: dict) -> str | None:
    """judge-a: 3 for a conversation of three doctor questions, else 2; one more under sampling seed 1, one less under the
    paraphrased prompts; judge-b: the other way round (5 - that), which reverses the models' order."""
    prompt = request["messages"][0]["content"]
    if prompt.startswith(("You chair", "You lead")):
        return "Clinician: fine."
    if prompt.startswith("You review a text consultation"):  # flags: the three-question conversations miss an escalation
        raised = [{"flag": "missed_escalation", "evidence": ["Question 3: how have you been feeling"], "note": "no <referral>"}]
        return json.dumps({"flags": raised if "Question 3:" in prompt else []})
    base = 3 if "Question 3:" in prompt else 2
    if request["model"] == "judge-b":
        base = 5 - base
    elif request.get("seed") == 1:
        base += 1
    elif prompt.startswith("Rate several"):
        base -= 1
    ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", prompt, re.M)
    return json.dumps({"scores": [{"dimension": d, "score": base, "rationale": "r", "evidence": []} for d in ids]})


def test_sensitivity_writes_its_table_and_page_section_and_a_people_rated_release_stands_as_human(tmp_path):
    from encounter_script import Script, run

    from craftmd.commands.cli import main
    from craftmd.dataset_builder.packets import build_packets

    medpi = tmp_path / "medpi"
    build_packets(medpi, seed=1, scale=0.05, cells=["asthma:medication_advice", "depression:diagnosis"], progress=False)
    releases = tmp_path / "releases"
    for name, turns in (("short", 2), ("long", 3)):
        with LoopbackServer(Script(doctor_turns=turns)) as s:
            run(s, medpi, releases / name, tmp_path / f"{name}.sqlite", trials=1)
            emotion = [r["messages"][1]["content"] for r in s.log if r["messages"][0]["content"].startswith("You read a patient")]
    # the emotion step read the message's effort and a summary of what was recalled (MedPI's inputs); the states keep them
    assert emotion and all("The effort the patient instinctively gives this message: OPEN (" in m for m in emotion)
    assert all("What the recalled memories amount to: 5 memories came to mind, the strongest: " in m for m in emotion)
    import polars as pl

    states = pl.read_parquet(releases / "long" / "patient_states.parquet").to_dicts()
    assert {x["effort"] for x in states} == {"OPEN"} and all(x["recall_summary"] in "\n".join(emotion) for x in states)
    assert all(x["disclosed_sections"] is not None and all(": " in d for d in x["disclosed_sections"]) for x in states)
    with LoopbackServer(sensitivity_judge, models=("judge-a", "judge-b")) as s:
        for name in ("short", "long"):
            assert main(["score", str(releases / name), "--scorer", "judge:openai/judge-a", "--base-url", s.base_url, "--dataset", str(medpi),
                         "--mode", "category", "--dimensions", "communication,patient care", "--flags", "all", "--quiet"]) == 0  # fmt: skip
        rc = main(["judge-sensitivity", str(releases), "--other-judge", "openai/judge-b", "--base-url", s.base_url, "--dataset", str(medpi),
                   "--n", "5", "--B", "200"])  # fmt: skip
    assert rc == 0
    res = json.loads((releases / "judge-sensitivity" / "sensitivity.json").read_text())
    assert res["kendall_tau"] == {"seed": 1.0, "order": 1.0, "model": -1.0, "prompts": 1.0}
    step = 100 / 3
    want = {
        ("short", "seed"): step,
        ("long", "seed"): step,
        ("short", "order"): 0.0,
        ("long", "order"): 0.0,
        ("short", "prompts"): -step,
        ("long", "prompts"): -step,
        ("short", "model"): step,
        ("long", "model"): -step,
    }
    overall = {(x["model"], x["variant"]): x for x in res["rows"] if x["level"] == "overall"}
    assert overall.keys() == want.keys()
    for k, d in want.items():
        x = overall[k]
        assert x["drift"] == pytest.approx(d, abs=1e-3) and x["ci_low"] == pytest.approx(d, abs=1e-3) and x["n_cases"] == 2, k
    assert (
        overall[("long", "model")]["judge"] == "judge:openai/judge-b"
        and overall[("long", "prompts")]["judge"] == "judge:openai/judge-a"
    )
    assert res["judges"]["long"]["prompts"]["prompt_set"]["name"] == "judge-v1-paraphrase"
    assert res["judges"]["long"]["order"]["shuffle_seed"] == 1 and res["judges"]["long"]["order"]["sampling"]["seed"] == 0
    # the releases are as they were: the variants' scores are never written to them
    table, _ = read_release(releases / "long").scores_with_records()
    assert set(table.column("scorer").to_pylist()) == {"judge:openai/judge-a"}

    # an encounters release no judge scored, rated by people: on the board and in the rubric tables, marked human
    from openpyxl import load_workbook

    with LoopbackServer(Script(doctor_turns=4)) as s:  # another run than short's (one run under two ids is refused)
        run(s, medpi, releases / "people", tmp_path / "people.sqlite", trials=1)
    sheet = tmp_path / "review.xlsx"
    assert main(["judge-review", "export", str(releases / "people"), "--dataset", str(medpi), "--out", str(sheet), "--n", "5",
                 "--dimensions", "communication,patient care"]) == 0  # fmt: skip
    wb = load_workbook(sheet)
    for i in range(2, wb["review"].max_row + 1):
        wb["review"].cell(i, 10, 4)
    wb.save(sheet)
    assert main(["judge-review", "import", str(sheet), "--into", str(releases)]) == 0
    out = tmp_path / "board"
    assert main(["analyse", "--releases", str(releases), "--dataset", str(medpi), "--packets", str(medpi), "--out", str(out), "--page",
                 "--resamples", "50"]) == 0  # fmt: skip
    html = (out / "index.html").read_text()
    assert "How far the scores move when the judge does" in html and "judge:openai/judge-b" in html
    assert (out / "tables" / "judge_sensitivity.csv").read_text().count("\n") == len(res["rows"]) + 1
    assert "<code>experts</code> <i>(human)</i>" in html and "<code>judge:openai/judge-a</code></td>" in html
    # the flags and the evidence on the whole page: the long conversations flagged, the quote shown escaped and highlighted
    assert "Flagged conversations" in html and "long: 2 flag(s) raised" in html and "no &lt;referral&gt;" in html
    assert "<mark>Question 3: how have you been feeling</mark>" in html and "Evidence behind the scores" in html
    flags_csv = pl.read_csv(out / "tables" / "judge_flags.csv")
    assert flags_csv.filter(pl.col("flag") == "missed_escalation").select("model", "n_flagged").sort("model").rows() == [
        ("long", 2),
        ("short", 0),
    ]
    rubric_csv = pl.read_csv(out / "tables" / "rubric.csv")
    people = rubric_csv.filter(pl.col("model") == "people")
    assert set(people["scorer"]) == {"experts"} and set(people.filter(pl.col("level") == "meta_category")["mean"]) == {100.0}
    board = pl.read_csv(out / "tables" / "boards.csv")
    overall = board.filter(pl.col("release") == "people", pl.col("measure") == "rubric_overall")
    assert overall.height == 1 and overall["value"][0] == 100.0  # the board's encounters measure, from the experts


# -- a calibration file is checked where it enters (issue 48) -------------------------------------------------------


def _degenerate(cal):
    for m in cal["maps"].values():
        m.update({k: 4.0 for k in "1234"})


CALIBRATION_DAMAGE = {  # a change of a fitted calibration -> what the one line says
    "judge-null-every-level-to-4": (lambda c: (c.update(judge=None), _degenerate(c)), "judge"),
    "judge-null": (lambda c: c.update(judge=None), "judge"),
    "every-level-to-4": (_degenerate, "sends every level to 4"),
    "no-maps": (lambda c: c.pop("maps"), "maps"),
    "a-map-missing-a-level": (lambda c: [m.pop("4") for m in c["maps"].values()], "not the judge's levels 1-4"),
    "a-level-to-7": (lambda c: [m.update({"4": 7}) for m in c["maps"].values()], "outside the ratings 1-4"),
    "decreasing": (lambda c: [m.update({"1": 3.9}) for m in c["maps"].values()], "not non-decreasing"),
    "no-held-out": (lambda c: c.pop("held_out"), "held_out"),
    "maps-a-list": (lambda c: c.update(maps=[1, 2]), "maps"),
    "another-judge": (lambda c: c.update(judge="judge:openai/other"), "the calibration is of judge:openai/other"),
}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A calibration fitted to JUDGE's scores and a release JUDGE judged."""
    from craftmd.analysis.agreement.calibration import calibrate

    root = tmp_path_factory.mktemp("calibrated")
    sheet = rated_sheet(root / "rated.xlsx", distorted(40, ["final_diagnosis.justification", "communication.clarity"]))
    calibrate([sheet], root / "cal.json", by="category", B=20)
    rel = make_release(root)
    with LoopbackServer(responder, models=("judge-a",)) as server:
        judge(rel, server)
    return root / "cal.json", rel


@pytest.mark.parametrize("how", list(CALIBRATION_DAMAGE))
def test_a_calibration_file_is_checked_and_bound_to_its_judge(fitted, tmp_path, capsys, how):
    from craftmd.commands.cli import main

    good, rel = fitted
    change, says = CALIBRATION_DAMAGE[how]
    cal = json.loads(good.read_text())
    change(cal)
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps(cal))
    before = (rel / "scores.parquet").read_bytes()
    assert main(["judge-calibrate", "apply", str(rel), "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and says in err, err
    assert (rel / "scores.parquet").read_bytes() == before


def test_an_applied_calibrations_held_out_figures_are_kept_as_its_claims(fitted, tmp_path):
    from craftmd.analysis.agreement.calibration import calibrated_judge
    from craftmd.scoring.score import score_with

    good, made = fitted
    rel = tmp_path / "tiny"
    import shutil

    shutil.copytree(made, rel)
    score_with(calibrated_judge(good), [rel])
    record = read_release(rel).scorer_records()[J.CALIBRATED]
    assert "held_out" not in record and record["held_out_claimed"] == json.loads(good.read_text())["held_out"]


#: Every command that reads a release's judge scores, or sends them on, with a release at R in releases folder RS, the
#: calibration C and a scratch folder T (issue 48: each checks their standing the way ``craftmd analyse`` does).
READERS = {
    "judge-sensitivity": ["judge-sensitivity", "RS", "--other-judge", "openai/judge-b"],
    "judge-calibrate apply": ["judge-calibrate", "apply", "R", "--calibration", "C"],
    "review export": ["review", "export", "--release", "R", "--dataset", "T/data", "--n", "1", "--seed", "0", "--out", "T/r.xlsx"],
    "judge-review export": ["judge-review", "export", "R", "--out", "T/s.xlsx", "--n", "1"],
    "publish --release": ["publish", "--release", "R", "--repo", "someone/r", "--revision", "v1", "--dry-run"],
    "publish --leaderboard": ["publish", "--leaderboard", "T/page", "--releases", "RS", "--repo", "someone/b", "--revision", "v1",
                              "--dry-run"],
}  # fmt: skip


@pytest.mark.parametrize("command", list(READERS))
def test_judge_scores_from_elsewhere_are_refused_by_every_reader_as_analyse_refuses_them(
    fitted, command, tmp_path, monkeypatch, capsys
):
    """A judged release copied from another machine (no note here of its scores file): every command that would read
    its judge scores, or publish them, refuses it in the one line :func:`craftmd.scoring.score.check_standing` (the check
    ``craftmd analyse`` runs) gives, and writes nothing; once ``craftmd score`` has kept them as the sender's claims, the
    release is published with them marked as claims."""
    import shutil

    from craftmd.commands.cli import main
    from craftmd.scoring.score import check_standing, score_release

    good, made = fitted
    releases = tmp_path / "releases"
    rel = releases / "tiny"
    shutil.copytree(made, rel)
    (tmp_path / "page" / "tables").mkdir(parents=True)
    (tmp_path / "page" / "index.html").write_text("<html></html>")
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "here"))  # this machine never saw the scores file made
    with pytest.raises(CraftMDError) as analyse_says:
        check_standing([read_release(rel)])
    names = {"RS": releases, "R": rel, "C": good}
    argv = [str(names[a]) if a in names else a.replace("T/", f"{tmp_path}/") for a in READERS[command]]
    files = sorted(p for p in tmp_path.rglob("*") if "here" not in p.parts)
    before = {p: p.read_bytes() for p in files if p.is_file()}
    capsys.readouterr()

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.endswith(f": error: {analyse_says.value}"), err
    assert JUDGE in err and "were not computed or checked on this machine" in err
    assert sorted(p for p in tmp_path.rglob("*") if "here" not in p.parts) == files  # nothing written
    assert {p: p.read_bytes() for p in before} == before

    if command.startswith("publish"):
        score_release(rel, None, using=[], progress=False)  # settled: the sender's claims, kept apart
        assert main(argv) == 0
        assert "scores.parquet" in capsys.readouterr().out
        assert JUDGE not in read_release(rel).scorer_names() and f"claimed:{JUDGE}" in read_release(rel).scorer_names()
