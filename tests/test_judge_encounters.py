"""The rubric judge on patient-led encounters (issues #15 and the encounters issue's "the rubric judge scores them"):
an encounters release generated against the loopback server, judged through ``craftmd score --scorer judge:...``: each conversation
gets exactly the dimensions of its packet's objective, failures stay failures, and the analysis profiles it."""

from __future__ import annotations

import json
import re
import zlib

import pytest
from encounter_script import medpi, patient_down, run  # noqa: F401  (medpi: the fixture)
from loopback import LoopbackServer

from craftmd.commands.cli import main
from craftmd.dataset_builder.packets import load_packets
from craftmd.release import read_release
from craftmd.scoring.rubric import applicable, load_catalog

JUDGE = "judge:openai/judge-a"


def judge_reply(request: dict) -> str | None:
    """A category-mode judge: a score from the dimension and the transcript; the communication category of an advice
    encounter refused, the final-diagnosis category of a diagnosis encounter never valid JSON."""
    prompt = request["messages"][0]["content"]
    if prompt.startswith("You chair"):
        return "Clinician: the doctor asked about medicines."
    objective = re.search(r"^Encounter objective: (.+)$", prompt, re.M).group(1)
    category = re.search(r"^Area: (.+)$", prompt, re.M).group(1)
    if objective == "medication advice" and category == "communication":
        return None
    if objective == "diagnosis" and category == "final diagnosis":
        return "{scores: oops"
    ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", prompt, re.M)
    return json.dumps(
        {"scores": [{"dimension": d, "score": 1 + zlib.crc32(d.encode()) % 4, "rationale": "r", "evidence": []} for d in ids]}
    )


@pytest.fixture(scope="module")
def encounters(medpi, tmp_path_factory):  # noqa: F811
    """Two trials of each packet; the diagnosis packet's second trial fails (its patient's model is down)."""
    play = patient_down(medpi)  # the diagnosis packet's second trial fails
    out = tmp_path_factory.mktemp("enc") / "rel"
    with LoopbackServer(play) as server:
        report = run(server, medpi, out, out.parent / "cache.sqlite", trials=2)
    assert report.endings == {"doctor_closed": 3, "error": 1}
    return out


def test_the_judge_scores_encounters_by_their_objectives(medpi, encounters, capsys):  # noqa: F811
    from craftmd.analysis.rubric import page_section, rubric

    with LoopbackServer(judge_reply, models=("judge-a",)) as server:
        rc = main(["score", str(encounters), "--scorer", "judge:openai/judge-a", "--base-url", server.base_url, "--dataset", str(medpi),
                   "--mode", "category", "--max-invalid", "1", "--quiet"])  # fmt: skip
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])["summaries"][JUDGE]
    rel = read_release(encounters)
    assert rel.manifest.task == "encounters"
    objectives = {p["case_id"]: p["objective"] for p in load_packets(medpi)}
    assert sorted(objectives.values()) == ["diagnosis", "medication_advice"]
    cat = load_catalog()
    table, records = rel.scores_with_records()
    rows = [r for r in table.to_pylist() if r["scorer"] == JUDGE]
    by_conv: dict = {}
    for r in rows:
        by_conv.setdefault((r["case_id"], r["trial"], r["conversation"], r["with_image"]), []).append(r)
    assert len(by_conv) == 4 and {k[2] for k in by_conv} == {"encounter"}
    for (case, trial, _, _), rs in by_conv.items():
        objective = objectives[case]
        want = {d.id for d in applicable(cat.dimensions, objective)}
        assert sorted(r["dimension"] for r in rs) == sorted(want)  # each once: all-objective ones and its own
        other = {d.id for d in cat.dimensions if "all" not in d.objectives and objective not in d.objectives}
        assert other and not want & other
        for r in rs:
            d = cat.by_id()[r["dimension"]]
            detail = json.loads(r["detail"])
            if objective == "diagnosis" and trial == 1:  # the conversation failed: every score failed, none invented
                assert r["status"] == "error" and r["value"] is None and "ended = error" in detail["error"]
            elif objective == "medication_advice" and d.category == "communication":
                assert r["status"] == "error" and r["value"] is None and detail["error"].startswith("refusal")
            elif objective == "diagnosis" and d.category == "final diagnosis":
                assert r["status"] == "error" and r["value"] is None and "not JSON" in detail["error"] and detail["attempts"] == 2
            else:
                assert r["status"] == "ok" and r["value"] == 1 + zlib.crc32(d.id.encode()) % 4
    failed = sum(r["status"] == "error" for r in rows)
    assert summary["scores"][JUDGE] == {"scored": len(rows) - failed, "failed": failed}
    assert records[JUDGE]["failed"] == failed and records[JUDGE]["inputs"]["conversations_sha256"]

    # the analysis profiles it: the objectives' own categories, failures counted apart
    r = rubric([rel], B=200, seed=1)
    cats = {g["group"]: g for g in r.table.filter(r.table["level"] == "category").to_dicts()}
    dx_only = {d.category for d in cat.dimensions if d.objectives == ("diagnosis",)}
    med_only = {d.category for d in cat.dimensions if d.objectives == ("medication_advice",)}
    assert med_only and dx_only - {"final diagnosis"}
    for c in med_only:
        assert cats[c]["n_cases"] == 1 and cats[c]["n_conversations"] == 2  # the advice packet's two trials
    for c in dx_only - {"final diagnosis"}:
        assert cats[c]["n_cases"] == 1 and cats[c]["n_conversations"] == 1  # its failed trial has no value
    n_fd, n_comm = len(cat.select(["final diagnosis"])), len(cat.select(["communication"]))
    assert cats["final diagnosis"]["n_cases"] == 0 and cats["final diagnosis"]["n_failed"] == 2 * n_fd  # both trials
    assert (
        cats["communication"]["n_conversations"] == 1 and cats["communication"]["n_failed"] == 3 * n_comm
    )  # advice x2, failed dx
    assert sum(cats[c]["n_failed"] for c in cats) == failed
    sec = page_section(r)
    assert [row["model"] for row in sec["rows"]] == [rel.display] and sec["rows"][0]["failed"] == failed
