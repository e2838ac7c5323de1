"""The tasks as training environments (craftmd.envs): episodes over the task's own patient and scorers, rewards
that `craftmd score` of the written release gives back to the bit, one-line bad inputs, and OpenEnv's own server
and client running two episodes in the side venv (.venv-rl, `make rl`)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import openenv_episodes, sim_episodes  # noqa: E402
from loopback import LoopbackServer, text_of  # noqa: E402

from craftmd import CraftMDError  # noqa: E402
from craftmd.commands.cli import main as cli_main  # noqa: E402
from craftmd.envs.core import episodes  # noqa: E402
from craftmd.release import read_release  # noqa: E402

PATIENT = "openai-api/sim/loopback"
REPLAY = {"n": 2, "seed": 3, "max_messages": 12}


@pytest.fixture(scope="module")
def data(upstream, tmp_path_factory):
    """Two recorded cases as a dataset the graders read (with the paper's answer key, as craftmd build writes it)."""
    from loopback import write_replay_dataset

    out = write_replay_dataset(upstream, tmp_path_factory.mktemp("env") / "data")
    f = out / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer").str.to_lowercase()).write_parquet(f)
    return out


def patient_says(request: dict) -> str:
    """The loopback patient: a fixed complaint (the doctor's side is the test's)."""
    return "I have had a cough and a fever for three days."


def answers(dataset: Path) -> dict[str, str]:
    df = pl.read_parquet(dataset / "all" / "test-00000-of-00001.parquet")
    return dict(zip(df["case_id"], df["answer"]))


def scored(release: Path, dataset: Path, *scorers: str) -> dict[str, float]:
    """``case_id`` -> the value ``craftmd score`` writes (one answer per case)."""
    args = ["score", str(release), "--dataset", str(dataset), "--quiet"]
    for s in scorers:
        args += ["--scorer", s]
    assert cli_main(args) == 0
    rows = read_release(release).table("scores").to_pylist()
    return {r["case_id"]: r["value"] for r in rows if r["scorer"] in scorers}


def test_two_episodes_rewards_are_craftmd_score_of_the_written_release(data, tmp_path, monkeypatch):
    """The doctor asks, the loopback patient answers, the doctor closes and answers the question; the reward is
    the offline grader's verdict, and `craftmd score` of the release the episodes write gives it back exactly."""
    monkeypatch.setenv("SIM_BASE_URL", "")
    truth = answers(data)
    with LoopbackServer(patient_says) as server:
        monkeypatch.setenv("SIM_BASE_URL", server.base_url)
        env = episodes("craftmd", "test", dataset=data, patient=PATIENT, cache=tmp_path / "c.sqlite")
        import asyncio

        async def play() -> list:
            out = []
            for i, right in ((0, True), (1, False)):
                s = await env.reset(i)
                case = env.jobs[i][0].case_id
                assert s.messages[0]["role"] == "system" and not s.done  # the doctor's view: its system prompt first
                s = await env.step("How long have you had it?")
                assert s.messages[-1] == {"role": "user", "content": patient_says({})}  # the task's patient answered
                s = await env.step(f"Final Diagnosis: {truth[case] if right else 'sunburn'}")
                assert "Final Diagnosis" not in text_of(s.messages[-1]["content"])  # the question turn follows
                s = await env.step(truth[case] if right else "sunburn")
                assert s.done and s.messages is None
                out.append((case, s.reward))
            await env.aclose()
            return out

        got = asyncio.run(play())
    assert [r for _, r in got] == [1.0, 0.0]
    rel = env.write_release(tmp_path / "rollouts")
    conv = read_release(rel).table("conversations").to_pylist()
    assert [c["ended"] for c in conv] == ["final_diagnosis", "final_diagnosis"]
    back = scored(rel, data, "offline")
    for case, reward in got:
        assert back[case].hex() == reward.hex()


def test_reward_weights_scale_the_reward(data, tmp_path, monkeypatch):
    truth = answers(data)
    with LoopbackServer(patient_says) as server:
        options = {"patient": PATIENT, "reward_weights": {"offline/correct": 0.25}}
        env = sim_episodes(monkeypatch, server, "craftmd", "test", data, tmp_path, **options)
        import asyncio

        async def play():
            await env.reset(0)
            await env.step("Final Diagnosis: x")
            s = await env.step(truth[env.jobs[0][0].case_id])
            await env.aclose()
            return s

        s = asyncio.run(play())
    assert s.info["scores"]["offline/correct"] == [1.0]
    assert s.reward == 0.25


@pytest.fixture(scope="module")
def consult_data(upstream, tmp_path_factory):
    """The two cases with a keyinfo config (the consultation's initial request and key-value items)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from loopback import write_replay_dataset

    from craftmd.dataset import config_file
    from craftmd.keyinfo import SCHEMA

    out = write_replay_dataset(upstream, tmp_path_factory.mktemp("consult") / "data")
    f = out / "all" / "test-00000-of-00001.parquet"
    df = pl.read_parquet(f).with_columns(paper_answer=pl.col("answer").str.to_lowercase())
    df.write_parquet(f)
    rows = [
        {
            "case_id": c,
            "items": [{"key": "fever", "value": "a fever for three days"}, {"key": "cough", "value": "a dry cough"}],
            "initial_request": "Doctor, I feel unwell.",
            "status": "ok",
            "error": None,
            "model": "openai/x",
            "prompt_sha256": "0" * 64,
        }
        for c in df["case_id"]
    ]
    path = config_file(out, "keyinfo")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, SCHEMA), path)
    return out


def test_consultation_episodes_reward_the_solver_and_the_keys_and_craftmd_score_agrees(consult_data, tmp_path, monkeypatch):
    """The patient opens with the initial request; the doctor who asks about the fever gets the solver's right answer
    (and recalls a key), the one who does not gets neither; reward = 1.0 × accuracy + 0.5 × doctor-key recall, and
    `craftmd score` of the written release gives both rewards back to the bit."""
    truth = answers(consult_data)

    def respond(request: dict) -> str:
        if request["model"] == "solver":
            seen = text_of(request["messages"][-1]["content"])
            return truth[order[0]] if "Do you have a fever?" in seen else "sunburn"
        return patient_says(request)

    weights = {"offline/correct": 1.0, "keyinfo/doctor_key_recall": 0.5}
    with LoopbackServer(respond, models=("patient", "solver")) as server:
        options = {"patient": "openai-api/sim/patient", "solver": "openai-api/sim/solver", "reward_weights": weights}
        env = sim_episodes(monkeypatch, server, "consultation", "test", consult_data, tmp_path, **options)
        order = [j[0].case_id for j in env.jobs]
        import asyncio

        async def play() -> list:
            out = []
            for i, question in ((0, "Do you have a fever?"), (1, "Where do you live?")):
                s = await env.reset(i)
                assert s.messages[-1] == {"role": "user", "content": "Doctor, I feel unwell."}  # the patient opened
                s = await env.step(question)
                assert not s.done and s.messages[-1]["content"] == patient_says({})
                s = await env.step("Thank you, that is all.")  # no question: the consultation ends
                assert s.done
                out.append((order[i], s.reward, s.info["scores"]))
            await env.aclose()
            return out

        got = asyncio.run(play())
    assert got[0][2]["offline/correct"] == [1.0] and got[1][2]["offline/correct"] == [0.0]
    assert got[0][2]["keyinfo/doctor_key_recall"][0] > got[1][2]["keyinfo/doctor_key_recall"][0]
    rel = env.write_release(tmp_path / "rollouts")
    assert (
        cli_main(["score", str(rel), "--dataset", str(consult_data), "--scorer", "offline", "--scorer", "keyinfo", "--quiet"])
        == 0
    )
    rows = read_release(rel).table("scores").to_pylist()
    for case, reward, _ in got:
        assert weighted(rows, case, weights).hex() == reward.hex()


def weighted(rows: list[dict], case: str, weights: dict[str, float]) -> float:
    """The reward from `craftmd score`'s rows of ``case`` (one episode): Σ weight × the value of each scorer/metric."""
    back = 0.0
    for key, w in weights.items():
        scorer, metric = key.split("/")
        (v,) = [r["value"] for r in rows if r["case_id"] == case and r["scorer"] == scorer and r["metric"] == metric]
        back += w * v
    return back


@pytest.mark.parametrize(
    "kwargs,line",
    [
        ({"task": "chess"}, "unknown task 'chess'"),
        ({"split": "dev"}, "unknown split 'dev'"),
        ({"patient": None}, "needs its patient bound"),
        ({"reward_weights": {"offline/correct": float("nan")}}, "not a finite number"),
        ({"reward_weights": {"offline/correct": "1"}}, "not a finite number"),
        ({"reward_weights": {"correct": 1.0}}, "name it scorer/metric"),
        ({"reward_weights": {"paper/correct": 1.0}}, "does not score this environment's episodes"),
        ({"reward_weights": {"offline/recall": 1.0}}, "not recall"),
        ({"reward_weights": {}}, "is empty"),
        ({"split": "train"}, "is not built"),
        ({"grader": "nonsense"}, "unknown scorer"),
        ({"task": "consultation"}, "needs its solver bound"),
        ({"colour": "red"}, "unknown environment option 'colour'"),
        ({"base_url": "file:///etc/passwd"}, "base_url 'file:///etc/passwd' is not an http(s) URL"),  # issue #48
        ({"base_url": "gopher://127.0.0.1:70/v1"}, "is not an http(s) URL"),
        ({"base_url": "http://user:pw@127.0.0.1:9/v1"}, "base_url has credentials in it"),
    ],
)
def test_bad_inputs_are_one_line(data, tmp_path, monkeypatch, kwargs, line):
    from craftmd.envs import load_environment

    monkeypatch.setenv("SIM_BASE_URL", "http://127.0.0.1:9")
    args = {"task": "craftmd", "split": "test", "dataset": data, "patient": PATIENT, "cache": tmp_path / "c", **kwargs}
    with pytest.raises(CraftMDError) as e:
        load_environment(**args)
    assert line in str(e.value) and "\n" not in str(e.value)


def test_import_craftmd_pulls_no_environment_and_no_rl_library():
    code = (
        "import sys, craftmd; print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('openenv', 'verifiers', 'fastapi', 'gradio', 'uvicorn') or m.startswith('craftmd.envs')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("task", ["craftmd", "consultation"])
def test_openenv_serves_two_episodes_and_craftmd_score_agrees(task, data, consult_data, tmp_path):
    """OpenEnv's own server (create_app) and client (GenericEnvClient) run two episodes of the task's environment,
    the doctor a model on a loopback server; the release they write scores to the same rewards."""
    dataset = consult_data if task == "consultation" else data
    out = tmp_path / "openenv"
    got = openenv_episodes(task, dataset, out)
    assert len(got) == 2 and [r for _, _, r, _ in got] == [1.0, 0.0]
    assert read_release(out / "release").manifest.task == task
    back = scored(out / "release", dataset, "offline")
    for case, _, reward, _ in got:
        assert not math.isnan(reward) and back[case].hex() == float(reward).hex()


def test_environments_never_import_the_command_layer():
    from test_imports import module_graph

    edges = {m: e for m, e in module_graph().items() if m.startswith("craftmd.envs")}
    assert {"craftmd.envs", "craftmd.envs.core", "craftmd.envs.openenv"} <= set(edges)
    assert not [(m, e) for m, es in edges.items() for e in es if e.startswith("craftmd.commands")]


def test_a_failed_patient_ends_the_episode_and_says_so(data, tmp_path, monkeypatch):
    """A patient call that fails (a content-filter refusal) ends the conversation by the task's rule before the doctor
    speaks; the blocked answer is graded as `craftmd score` grades it, and the episode says it failed."""
    with LoopbackServer(lambda request: None) as server:
        monkeypatch.setenv("SIM_BASE_URL", server.base_url)
        env = episodes("craftmd", "test", dataset=data, patient=PATIENT, cache=tmp_path / "c.sqlite")
        import asyncio

        async def play():
            s = await env.reset(0)
            await env.aclose()
            return s

        s = asyncio.run(play())
    assert s.done and s.messages is None and s.info["failed"][0].startswith("refusal: the conversation failed")
    rel = env.write_release(tmp_path / "rollouts")
    assert [c["ended"] for c in read_release(rel).table("conversations").to_pylist()] == ["refusal"]
    assert scored(rel, data, "offline")[env.jobs[0][0].case_id].hex() == s.reward.hex()


def test_a_case_played_again_is_its_next_trial_and_the_release_holds_both(data, tmp_path, monkeypatch):
    """GRPO plays a case several times: each episode of it is the next trial (the patient's seed is seed + trial, as
    in a run), so the release holds every episode and `craftmd score` gives each its reward."""
    import asyncio

    truth = answers(data)
    with LoopbackServer(patient_says) as server:
        monkeypatch.setenv("SIM_BASE_URL", server.base_url)
        env = episodes("craftmd", "test", dataset=data, patient=PATIENT, cache=tmp_path / "c.sqlite")
        case = env.jobs[0][0].case_id

        async def play() -> list:
            out = []
            for reply in (truth[case], "sunburn", truth[case]):
                await env.reset(0)
                await env.step("Final Diagnosis: ?")
                out.append((await env.step(reply)).reward)
            await env.aclose()
            return out

        got = asyncio.run(play())
    assert got == [1.0, 0.0, 1.0]
    rel = env.write_release(tmp_path / "rollouts")
    assert cli_main(["score", str(rel), "--dataset", str(data), "--scorer", "offline", "--quiet"]) == 0
    back = {r["trial"]: r["value"] for r in read_release(rel).table("scores").to_pylist() if r["scorer"] == "offline"}
    assert back == {0: 1.0, 1: 0.0, 2: 1.0}


def test_environments_on_one_ledger_number_a_cases_trials_in_one_sequence(data, tmp_path, monkeypatch):
    """The environment server's sessions (craftmd.envs.serve) share a ledger: a case played in two of them is trial 0 in
    the first and trial 1 in the second, and one release holds both, each scored as its episode was (issue #45)."""
    import asyncio

    from craftmd.envs.core import Ledger

    truth = answers(data)
    with LoopbackServer(patient_says) as server:
        monkeypatch.setenv("SIM_BASE_URL", server.base_url)
        ledger = Ledger()
        one, two = (
            episodes("craftmd", "test", ledger=ledger, dataset=data, patient=PATIENT, cache=tmp_path / f"{n}.sqlite")
            for n in ("one", "two")
        )
        case = one.case_id(0)

        async def play(env, reply: str):
            await env.reset(0)
            await env.step("Final Diagnosis: ?")
            done = await env.step(reply)
            await env.aclose()
            return done

        got = [asyncio.run(play(one, truth[case])), asyncio.run(play(two, "sunburn"))]
    assert [(s.info["job"], s.reward) for s in got] == [(f"{case}/0", 1.0), (f"{case}/1", 0.0)]
    rel = one.write_release(tmp_path / "rollouts")
    assert cli_main(["score", str(rel), "--dataset", str(data), "--scorer", "offline", "--quiet"]) == 0
    back = {r["trial"]: r["value"] for r in read_release(rel).table("scores").to_pylist() if r["scorer"] == "offline"}
    assert back == {0: 1.0, 1: 0.0}


# -- issue #48: what a remote client reads ------------------------------------------------------------------------


def test_a_servers_errors_are_one_line_4xx_for_the_clients_mistakes_and_never_name_a_local_path(data, tmp_path):
    """OpenEnv's server (create_app) in the side venv: a stateless HTTP /step (no reset before it) is a 409 with one
    line, not a 500; a step before a reset in a session is that line; a failure naming the dataset's path reaches the
    client without the path."""
    import json
    import os

    rl_python = Path(__file__).resolve().parent.parent / ".venv-rl" / "bin" / "python"
    if not rl_python.exists():
        pytest.fail("the RL side venv is missing: run `make rl` (.venv-rl)", pytrace=False)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_BASE_URL")}
    script = Path(__file__).parent / "openenv_errors.py"
    res = subprocess.run(
        [str(rl_python), str(script), str(data), str(tmp_path)], capture_output=True, text=True, env=env, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads((tmp_path / "answers.json").read_text())
    step = got["http_step"]
    assert step["status"] == 409, step
    detail = json.loads(step["body"])["detail"]
    assert detail.startswith("no episode in progress: call reset first") and "\n" not in detail and "Traceback" not in detail
    assert got["ws_step"]["type"] == "error" and "no episode in progress" in got["ws_step"]["data"]["message"]
    said = json.dumps([got["ws_reset"], got["http_reset"]])
    assert "is damaged; rebuild it" in said and "<path>" in said
    for path in {str(data), str(data.resolve()), str(tmp_path), str(Path.home())}:
        assert path not in said and path not in json.dumps(got)
    assert got["http_reset"]["status"] == 409
