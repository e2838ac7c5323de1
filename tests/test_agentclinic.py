"""AgentClinic's OSCE cases under the package's protocol, against a loopback server that plays every role (doctor,
patient, measurement agent, moderator, each under its own model name): a requested test's result reaches the doctor,
the budget is told and enforced (a doctor without a diagnosis when it is spent ran out of budget), a bias reaches the
prompt of its role only, the moderator's verdict is the score; bad input is one line with nothing written; the NEJM
cases never go out without their image; generate -> score -> analyse -> page through the command line; an environment's
rewards are `craftmd score`'s of the release it writes; the prompts are the package's own words."""

from __future__ import annotations

import ast
import asyncio
import io
import json
import re
import tarfile
from pathlib import Path

import polars as pl
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.release import read_release
from craftmd.tasks.agentclinic.cases import ARCHIVE, COMMIT, load_cases, parse_cases

from helpers import generate_argv
from loopback import LoopbackServer, text_of

SOURCES = Path(__file__).resolve().parents[1].parent / "shared" / "sources"
pytestmark = pytest.mark.skipif(not (SOURCES / ARCHIVE).is_file(), reason=f"the pinned {ARCHIVE} is not in {SOURCES}")
MODELS = ("doc", "pat", "meas", "mod")
ROLE_OF = {"You are a physician": "doctor", "You are taking the part": "patient", "You report the findings": "measurement",
           "You decide whether": "moderator"}  # fmt: skip
TRUTH = {"medqa_1": "Myasthenia gravis"}


def role_of(request: dict) -> str:
    first = text_of(request["messages"][0]["content"])
    return next(r for p, r in ROLE_OF.items() if first.startswith(p))


class Script:
    """Every role: the doctor orders a test, asks the patient, then gives ``diagnoses[case]`` (or never does, with
    ``diagnose=False``); the measurement agent reads the first test result of its record; the patient answers; the
    moderator says Yes exactly when the two diagnoses are the same words (``moderator``: a fixed reply instead)."""

    def __init__(self, diagnoses: dict | None = None, diagnose: bool = True, moderator: str | None = None):
        self.diagnoses, self.diagnose, self.moderator = diagnoses or {}, diagnose, moderator

    def __call__(self, req: dict) -> str:
        role, msgs = role_of(req), req["messages"]
        if role == "doctor":
            asked = sum(m["role"] == "assistant" for m in msgs)
            if asked == 0:
                return "REQUEST TEST: [Acetylcholine receptor antibodies]"
            if asked == 1 or not self.diagnose:
                return "Does it get worse as the day goes on?"
            case = "medqa_1" if "double vision" in msgs[0]["content"] else "other"  # the objective tells the case
            if "cancer" in msgs[0]["content"]:  # a doctor given a bias towards cancer follows it
                return "DIAGNOSIS READY: Lung cancer"
            return f"DIAGNOSIS READY: {self.diagnoses.get(case, 'Tension headache')}."
        if role == "measurement":
            record = msgs[0]["content"].split("The record:", 1)[1]
            found = [ln.strip() for ln in record.splitlines() if "Antibodies" in ln]
            return "RESULTS: " + (found[0] if found else "within normal limits")
        if role == "patient":
            return "Yes, I notice my double vision more in the evening."
        if self.moderator is not None:
            return self.moderator
        user = msgs[1]["content"]
        ref = re.search(r"Reference diagnosis: (.*)", user).group(1).strip().lower()
        dx = re.search(r"The doctor's diagnosis: (.*)", user).group(1).strip().lower()
        return "Yes" if ref == dx else "No"


def generate(server, out, *options, cases=("medqa_1", "medqa_2"), cache=None) -> int:
    argv = generate_argv(SOURCES, "-T", "budget=5", *options, task="agentclinic", doctor="openai/doc", patient="openai/pat",
                         base_url=server.base_url, cache=cache or out.parent / "cache.sqlite", out=out)  # fmt: skip
    argv += ["--role", "measurement=openai/meas", "--role", "moderator=openai/mod", *(["--cases", *cases] if cases else [])]
    return cli_main(argv)


def requests(server, role: str) -> list[dict]:
    return [r for r in server.log if role_of(r) == role]


def test_a_test_result_reaches_the_doctor_each_role_on_its_model_and_the_moderator_verdict_is_the_score(tmp_path):
    with LoopbackServer(Script(TRUTH), models=MODELS) as server:
        assert generate(server, tmp_path / "rel") == 0
    for role, model in zip(("doctor", "patient", "measurement", "moderator"), MODELS):
        assert requests(server, role) and {r["model"] for r in requests(server, role)} == {model}
    # the measurement agent holds the case's test results, and its reply reaches the doctor's next view
    assert any("Acetylcholine Receptor Antibodies: Present (elevated)" in r["messages"][0]["content"]
               for r in requests(server, "measurement"))  # fmt: skip
    second = [r for r in requests(server, "doctor") if len(r["messages"]) == 4]
    assert any("Result of Acetylcholine receptor antibodies: RESULTS: Acetylcholine Receptor Antibodies: Present (elevated)"
               in r["messages"][3]["content"] for r in second)  # fmt: skip
    # the patient never sees the test requests, and holds the patient's facts, not the diagnosis
    for r in requests(server, "patient"):
        assert not any("REQUEST TEST" in m["content"] for m in r["messages"][1:])
        assert "Myasthenia" not in r["messages"][0]["content"]
    rel = read_release(tmp_path / "rel")
    osce = {r["case_id"]: r for r in rel.table("osce").to_pylist()}
    assert osce["medqa_1"]["tests"] == ["Acetylcholine receptor antibodies"] and osce["medqa_1"]["tests_requested"] == 1
    assert osce["medqa_1"]["questions_used"] == 3 and osce["medqa_1"]["diagnosis"] == "Myasthenia gravis"
    assert [osce[c]["moderator_verdict"] for c in ("medqa_1", "medqa_2")] == ["yes", "no"]
    conv = rel.table("conversations").to_pylist()
    assert [c["ended"] for c in conv] == ["diagnosis", "diagnosis"] and conv[0]["n_turns"] == 3
    assert "not comparable with AgentClinic's published numbers" in rel.manifest.notes["protocol"]
    assert cli_main(["score", str(tmp_path / "rel"), "--dataset", str(SOURCES), "--quiet"]) == 0
    scores = read_release(tmp_path / "rel").table("scores").to_pylist()
    got = {(r["scorer"], r["case_id"]): r["value"] for r in scores}
    assert got[("agentclinic-moderator", "medqa_1")] == 1.0 and got[("agentclinic-moderator", "medqa_2")] == 0.0
    assert got[("agentclinic-offline", "medqa_1")] == 1.0  # the offline grader beside it


@pytest.mark.parametrize(
    "reply, verdict",
    [("Yes", "yes"), ("no.", "no"), ("**Yes**, the same disease; no doubt.", "yes"), ("The correct answer is Yes.", "yes"),
     ("The answer to that question is no.", "no"), ("Perhaps.", None), ("It could be yes or no.", None), ("Yesterday", None)],
)  # fmt: skip
def test_the_moderators_verdict_is_read_from_its_reply(reply, verdict):
    from craftmd.tasks.agentclinic.protocol import verdict_of

    assert verdict_of(reply) == verdict


def test_a_moderator_that_says_neither_yes_nor_no_gives_no_score(tmp_path):
    with LoopbackServer(Script(TRUTH, moderator="Perhaps."), models=MODELS) as server:
        assert generate(server, tmp_path / "rel", cases=("medqa_1",)) == 0
    assert cli_main(["score", str(tmp_path / "rel"), "--dataset", str(SOURCES), "--quiet"]) != 0  # nothing scored: said
    (row,) = [r for r in read_release(tmp_path / "rel").table("scores").to_pylist() if r["scorer"] == "agentclinic-moderator"]
    assert row["value"] is None and row["status"] == "error" and "neither Yes nor No" in row["detail"]


def test_the_budget_is_told_and_enforced_and_running_out_is_counted_not_correct(tmp_path):
    with LoopbackServer(Script(diagnose=False), models=MODELS) as server:
        assert generate(server, tmp_path / "rel", "-T", "budget=3", cases=("medqa_1",)) == 0
    doctor = requests(server, "doctor")
    assert len(doctor) == 3  # the budget: three doctor messages, then the conversation stops
    assert "You have 3 messages in all" in doctor[0]["messages"][0]["content"]
    notes = [text_of(r["messages"][-1]["content"]) for r in doctor]
    assert "[0 of your 3 messages used; 3 left.]" in notes[0] and "[1 of your 3 messages used; 2 left.]" in notes[1]
    assert "[2 of your 3 messages used; 1 left.]" in notes[2] and "your last" in notes[2] and "your last" not in notes[1]
    assert not requests(server, "moderator")
    (osce,) = read_release(tmp_path / "rel").table("osce").to_pylist()
    assert osce["ended"] == "out_of_budget" and osce["questions_used"] == 3 and osce["diagnosis"] is None
    assert osce["moderator_status"] == "not_asked"
    assert cli_main(["score", str(tmp_path / "rel"), "--dataset", str(SOURCES), "--quiet"]) == 0
    rows = read_release(tmp_path / "rel").table("scores").to_pylist()
    assert {r["scorer"]: r["value"] for r in rows} == {"agentclinic-moderator": 0.0, "agentclinic-offline": 0.0}
    assert all("no diagnosis within the budget" in r["detail"] for r in rows)


@pytest.mark.parametrize(
    "option, role, text",
    [("doctor_bias=confirmation", "doctor", "you are fairly sure this patient has cancer"),
     ("patient_bias=self_diagnosis", "patient", "has convinced you that you have cancer")],
)  # fmt: skip
def test_a_bias_reaches_its_roles_prompt_and_no_other(tmp_path, option, role, text):
    with LoopbackServer(Script(TRUTH), models=MODELS) as server:
        assert generate(server, tmp_path / "rel", "-T", option, cases=("medqa_1",)) == 0
    for r in server.log:
        assert (text in r["messages"][0]["content"]) == (role_of(r) == role), role_of(r)
    rel = read_release(tmp_path / "rel")
    assert rel.manifest.protocol.options == {"budget": 5, option.split("=")[0]: option.split("=")[1]}


@pytest.mark.parametrize(
    "options, line",
    [(["-T", "doctor_bias=anger"], "unknown doctor bias 'anger'; known: none, recency"),
     (["-T", "patient_bias=status_quo"], "unknown patient bias 'status_quo'"),
     (["-T", "budget=0"], "option budget='0'"),
     (["-T", "case_set=medmcqa"], "unknown case set 'medmcqa'"),
     (["--config", "nejm_image"], "are chosen with -T case_set=NAME, not --config"),
     (["--cases", "medqa_999"], "unknown case id(s) in case set 'medqa': medqa_999")],
)  # fmt: skip
def test_bad_options_are_one_line_and_nothing_is_written(tmp_path, capsys, options, line):
    with LoopbackServer(Script(), models=MODELS) as server:
        assert generate(server, tmp_path / "rel", *options, cases=() if "--cases" in options else ("medqa_1",)) != 0
        assert server.calls == 0
    err = capsys.readouterr().err.strip()
    assert line in err and len(err.splitlines()) == 1 and not (tmp_path / "rel").exists()


def _case(**drop) -> str:
    case = {"OSCE_Examination": {"Objective_for_Doctor": "Assess the patient.", "Patient_Actor": {"History": "A cough."},
                                 "Physical_Examination_Findings": {"Lungs": "Crackles"}, "Test_Results": {"X-ray": "Infiltrate"},
                                 "Correct_Diagnosis": "Pneumonia"}}  # fmt: skip
    for k in drop:
        del case["OSCE_Examination"][k]
    return json.dumps(case)


def test_a_case_file_with_a_missing_field_is_one_line_naming_the_file_the_line_and_the_field(tmp_path, capsys):
    bad = tmp_path / "mine.jsonl"
    bad.write_text(_case() + "\n\n" + _case(Correct_Diagnosis=1) + "\n")
    with LoopbackServer(Script(), models=MODELS) as server:
        assert generate(server, tmp_path / "rel", "-T", f"case_set={bad}", cases=()) != 0
        assert server.calls == 0
    err = capsys.readouterr().err.strip()
    assert "mine.jsonl:3: OSCE_Examination: no Correct_Diagnosis" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "rel").exists()
    with pytest.raises(CraftMDError, match=r"x.jsonl:1: not JSON"):
        parse_cases(b"{", "x.jsonl", "x", "x", "osce")
    with pytest.raises(CraftMDError, match=r"n.jsonl:1: answers mark 2 correct choices"):
        two = {"image_url": "https://x/y?id=A", "question": "Q?", "patient_info": "p", "physical_exams": "e",
               "answers": [{"text": "a", "correct": True}, {"text": "b", "correct": True}]}  # fmt: skip
        parse_cases(json.dumps(two).encode(), "n.jsonl", "n", "n", "nejm")


def test_a_case_file_of_ones_own_runs_and_is_named_by_its_name_and_content(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(_case() + "\n")
    with LoopbackServer(Script({"other": "Pneumonia"}), models=MODELS) as server:
        assert generate(server, tmp_path / "rel", "-T", f"case_set={mine}", cases=()) == 0
    rel = read_release(tmp_path / "rel")
    assert (
        rel.manifest.protocol.options["case_set"].startswith("mine.jsonl@sha256:")
        and str(tmp_path) not in rel.manifest.model_dump_json()
    )
    assert cli_main(["score", str(tmp_path / "rel"), "--dataset", str(tmp_path), "--quiet"]) == 0
    assert {r["scorer"]: r["value"] for r in rel.table("scores").to_pylist()} == {
        "agentclinic-moderator": 1.0,
        "agentclinic-offline": 1.0,
    }


def test_a_source_that_is_not_the_pinned_one_is_refused_in_one_line(tmp_path, monkeypatch):
    from craftmd.tasks.agentclinic import cases

    assert cases.locate(tmp_path) == SOURCES / ARCHIVE  # another folder (a leaderboard's dataset): the shared sources
    monkeypatch.setattr(cases, "shared_sources", lambda: ())
    with pytest.raises(CraftMDError, match="no pinned AgentClinic source in"):
        load_cases(tmp_path, "medqa")
    top = tmp_path / "src" / f"AgentClinic-{COMMIT}"
    with tarfile.open(SOURCES / ARCHIVE) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    f = top / "agentclinic_medqa.jsonl"
    f.write_bytes(f.read_bytes().replace(b"Myasthenia gravis", b"Myasthenia Gravis", 1))
    with pytest.raises(CraftMDError, match="agentclinic_medqa.jsonl does not match the pinned sha256"):
        load_cases(tmp_path / "src", "medqa")
    assert len(load_cases(tmp_path / "src", "medqa_extended")[0]) == 214  # an unpacked copy is read as the archive


def test_the_nejm_cases_are_refused_without_their_image_and_shown_with_it(tmp_path, capsys, monkeypatch):
    import urllib.request

    def offline(*a, **k):
        raise OSError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with LoopbackServer(Script(), models=MODELS) as server:
        assert generate(server, tmp_path / "rel", "-T", "case_set=nejm", cases=("nejm_1",)) != 0
        err = capsys.readouterr().err.strip()
        assert "case nejm_1: its image cannot be had from csvc.nejm.org (network is unreachable)" in err
        assert len(err.splitlines()) == 1 and server.calls == 0 and not (tmp_path / "rel").exists()
        images = tmp_path / "images"
        images.mkdir()
        assert generate(server, tmp_path / "rel", "-T", "case_set=nejm", "-T", f"image_dir={images}", cases=("nejm_1",)) != 0
        assert "no image IC20240111.* in" in capsys.readouterr().err
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (8, 8), "brown").save(buf, "PNG")
        (images / "IC20240111.png").write_bytes(buf.getvalue())
        assert generate(server, tmp_path / "rel", "-T", "case_set=nejm", "-T", f"image_dir={images}", cases=("nejm_1",)) == 0
    first = requests(server, "doctor")[0]["messages"][1]["content"]
    assert [p["type"] for p in first] == ["text", "image_url"] and first[1]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )
    rel = read_release(tmp_path / "rel")
    assert rel.manifest.protocol.images is True and rel.table("osce").to_pylist()[0]["with_image"] is True
    assert str(images) not in rel.manifest.model_dump_json()  # the folder by its name only


def test_generate_score_analyse_page_through_the_command_line(tmp_path):
    """Three cases, an unbiased and a biased run of one doctor: the measures with CIs, the bias test, the board and the
    page's section, and the board saying the protocol is the package's own."""
    rels = tmp_path / "releases"
    cases = ("medqa_1", "medqa_2", "medqa_3")
    with LoopbackServer(Script(TRUTH), models=MODELS) as server:
        assert generate(server, rels / "plain", cases=cases) == 0
        assert generate(server, rels / "biased", "-T", "doctor_bias=recency", cases=cases) == 0
    for r in ("plain", "biased"):
        assert cli_main(["score", str(rels / r), "--dataset", str(SOURCES), "--quiet"]) == 0
    out = tmp_path / "page"
    argv = ["analyse", "--releases", str(rels), "--dataset", str(SOURCES), "--out", str(out), "--page", "--resamples", "200"]
    assert cli_main(argv) == 0
    m = pl.read_csv(out / "tables" / "agentclinic_measures.csv")
    plain = {r["measure"]: r for r in m.filter(pl.col("model") == "plain").iter_rows(named=True)}
    assert plain["moderator_accuracy"]["value"] == pytest.approx(1 / 3) and plain["moderator_accuracy"]["n_cases"] == 3
    assert plain["moderator_accuracy"]["ci_low"] <= 1 / 3 <= plain["moderator_accuracy"]["ci_high"]
    assert plain["tests_per_case"]["value"] == 1.0 and plain["questions_used"]["value"] == 3.0
    assert plain["out_of_budget"]["value"] == 0.0 and plain["agreement"]["value"] == 1.0
    t = pl.read_csv(out / "tables" / "agentclinic_bias_tests.csv").to_dicts()
    assert len(t) == 1 and t[0]["model"] == "biased" and t[0]["baseline"] == "plain" and t[0]["bias"] == "recency"
    assert t[0]["accuracy"] == 0.0 and t[0]["baseline_accuracy"] == pytest.approx(1 / 3) and t[0]["n_cases"] == 3
    assert t[0]["diff"] == pytest.approx(-1 / 3) and t[0]["ci_low"] <= t[0]["diff"] <= t[0]["ci_high"] <= 0
    assert 0 < t[0]["p_value"] <= t[0]["p_adjusted"] <= 1
    boards = pl.read_csv(out / "tables" / "boards.csv")
    assert set(boards.filter(pl.col("task") == "agentclinic")["measure"]) >= {"moderator_accuracy", "out_of_budget"}
    html = (out / "index.html").read_text()
    assert 'id="agentclinic"' in html and "not comparable with AgentClinic&#39;s published numbers" in html
    assert "Accuracy with a bias against without" in html
    assert "AgentClinic" in (out / "leaderboard.md").read_text()


def test_an_environments_rewards_are_craftmd_score_of_its_release(tmp_path, monkeypatch):
    from craftmd.envs.core import episodes

    script = Script(TRUTH)
    with LoopbackServer(script, models=MODELS) as server:
        monkeypatch.setenv("SIM_BASE_URL", server.base_url)
        env = episodes("agentclinic", "test", dataset=SOURCES, patient="openai-api/sim/pat", cases=["medqa_1", "medqa_2"],
                       roles={"moderator": "openai-api/sim/mod"}, task_options={"budget": 4}, cache=tmp_path / "c.sqlite")  # fmt: skip

        async def play() -> list:
            out = []
            for i, dx in ((0, "Myasthenia gravis"), (1, "Myasthenia gravis")):
                s = await env.reset(i)
                assert "You have 4 messages in all" in s.messages[0]["content"]
                s = await env.step("REQUEST TEST: Acetylcholine receptor antibodies")
                assert s.messages[-1]["content"].startswith("Result of Acetylcholine receptor antibodies: RESULTS:")
                s = await env.step(f"DIAGNOSIS READY: {dx}")
                assert s.done and s.messages is None
                out.append((env.case_id(i), s.reward))
            await env.aclose()
            return out

        got = asyncio.run(play())
    assert [r for _, r in got] == [1.0, 0.0]
    assert {r["model"] for r in requests(server, "moderator")} == {"mod"}
    rel = env.write_release(tmp_path / "rollouts")
    assert cli_main(["score", str(rel), "--dataset", str(SOURCES), "--quiet", "--scorer", "agentclinic-moderator"]) == 0
    back = {r["case_id"]: r["value"] for r in read_release(rel).table("scores").to_pylist()}
    for case, reward in got:
        assert back[case].hex() == reward.hex()
    with pytest.raises(CraftMDError, match="has no training split"):
        episodes("agentclinic", "train", dataset=SOURCES, patient="openai-api/sim/pat")
    with pytest.raises(CraftMDError, match="has no role 'judge' to bind"):
        episodes("agentclinic", "test", dataset=SOURCES, patient="openai-api/sim/pat", roles={"judge": "x/y"})


def test_the_prompts_are_the_packages_own_words():
    """No run of eight words of the reference runner's string literals (read from the pinned archive, never run) is in
    the prompt set."""
    import warnings

    with tarfile.open(SOURCES / ARCHIVE) as tar:
        code = tar.extractfile(f"AgentClinic-{COMMIT}/agentclinic.py").read().decode()
    words = lambda s: re.findall(r"[a-z]+", s.lower())  # noqa: E731
    theirs = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # its regular expressions' escapes
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            w = words(node.value)
            theirs |= {tuple(w[i : i + 8]) for i in range(len(w) - 7)}
    folder = Path(__file__).resolve().parents[1] / "craftmd" / "tasks" / "agentclinic" / "prompts" / "agentclinic-v1"
    for f in sorted(folder.iterdir()):
        w = words(f.read_text())
        shared = [" ".join(g) for g in (tuple(w[i : i + 8]) for i in range(len(w) - 7)) if g in theirs]
        assert not shared, f"{f.name}: {shared[:3]}"


def test_under_inspect_eval_it_is_the_release_generate_writes(tmp_path, monkeypatch):
    """``inspect eval craftmd/agentclinic`` (every role on the loopback server) ingested = ``craftmd generate``'s release:
    the conversations and the osce table; its inspect dataset is the case set's cases, each with its reference diagnosis
    as the target; `craftmd score` scores the ingested release as the generated one."""
    import os
    import subprocess
    import sys

    from craftmd.inspect_bridge.tasks import inspect_task

    m = "openai-api/loop/doc"
    with LoopbackServer(Script(TRUTH), models=("doc",)) as server:
        monkeypatch.setenv("LOOP_BASE_URL", server.base_url)
        monkeypatch.setenv("LOOP_API_KEY", "k")
        monkeypatch.setenv("INSPECT_EVAL_MODEL", m)  # the inspect dataset, as inspect eval gets it
        t = inspect_task("agentclinic", dataset=str(SOURCES), cases="medqa_1,medqa_2")
        assert [(s.id, s.target) for s in t.dataset] == [("medqa_1", "Myasthenia gravis"), ("medqa_2", t.dataset[1].target)]
        assert t.dataset[1].target and "double vision" in t.dataset[0].input
        inspect = str(Path(sys.executable).with_name("inspect"))
        argv = [inspect, "eval", "craftmd/agentclinic", "--model", m, "--model-role", f"patient={m}", "-T", f"dataset={SOURCES}",
                "-T", "cases=medqa_1,medqa_2", "-T", "budget=5", "--log-dir", str(tmp_path / "logs"), "--display", "plain",
                "--log-format", "eval"]  # fmt: skip
        proc = subprocess.run(argv, env=dict(os.environ), cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        argv = generate_argv(SOURCES, "-T", "budget=5", task="agentclinic", doctor=m, patient=m, cache=tmp_path / "c.sqlite",
                             out=tmp_path / "gen")  # fmt: skip
        assert cli_main([*argv, "--cases", "medqa_1", "medqa_2"]) == 0
    out = tmp_path / "via-inspect"
    assert cli_main(["ingest", "--inspect", str(next((tmp_path / "logs").glob("*.eval"))), "--out", str(out)]) == 0
    ours, theirs = read_release(out), read_release(tmp_path / "gen")
    assert ours.manifest.task == "agentclinic"
    for table in ("conversations", "osce"):
        assert ours.table(table).num_rows == 2 and ours.table(table).equals(theirs.table(table)), table
    for rel in (out, tmp_path / "gen"):
        assert cli_main(["score", str(rel), "--dataset", str(SOURCES), "--quiet"]) == 0
    assert read_release(out).table("scores").equals(read_release(tmp_path / "gen").table("scores"))
