"""The tasks as verifiers environments (environments/craftmd_verifiers, in its side venv .venv-verifiers: `make verifiers`):
verifiers' own evaluation entry point (`vf-eval`) plays two episodes of each task on the package's environment server
(`python -m craftmd.envs.serve`, run by .venv-rl's Python), the doctor a model on a loopback server reached through
verifiers' chat harness; the rewards verifiers records are what `craftmd score` gives the release the server writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from encounter_script import Script, judge_says, medpi  # noqa: E402,F401  (medpi: the fixture)
from loopback import LoopbackServer, text_of  # noqa: E402
from test_environment_encounters import judged, rubric_reward  # noqa: E402
from test_environments import answers, consult_data, data, scored  # noqa: E402,F401  (data, consult_data: fixtures)

from craftmd.release import read_release  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VF_BIN = ROOT / ".venv-verifiers" / "bin"
RL_PYTHON = ROOT / ".venv-rl" / "bin" / "python"
COMPLAINT = "I have had a cough and a fever for three days."
#: The environments' options besides the dataset and the request cache, by task.
OPTIONS = {
    "craftmd": {"patient": "openai-api/sim/patient"},
    "consultation": {"patient": "openai-api/sim/patient", "solver": "openai-api/sim/solver"},
    "encounters": {
        "patient": "openai-api/sim/patient",
        "judge": "openai-api/sim/judge",
        "judge_mode": "category",
        "reward_weights": {"judge/communication": 1.0},
        "max_messages": 6,
    },
}


def side_venvs() -> None:
    """Fail, never skip, where a side venv is missing."""
    for path, make in ((VF_BIN / "vf-eval", "make verifiers (.venv-verifiers)"), (RL_PYTHON, "make rl (.venv-rl)")):
        if not path.exists():
            pytest.fail(f"{path.parent.parent.name} is missing: run `{make}`", pytrace=False)


def doctor_and_roles(task: str, dataset: Path | None = None):
    """The loopback's responder. The patient names its case (by the vignette in its prompt) in every reply; the doctor (verifiers' agent: each turn a JSON
    object of the server's observation and the action's schema) reads the case from its view, and answers the first case
    right and the second wrong (the consultation: its solver does); in an encounter the doctor asks about medicines."""
    import polars as pl

    cases = pl.read_parquet(dataset / "all" / "test-00000-of-00001.parquet") if dataset else pl.DataFrame()
    truth = dict(zip(cases["case_id"], cases["answer"])) if dataset else {}
    vignettes = dict(zip(cases["case_id"], cases["vignette"])) if dataset else {}
    first = sorted(truth)[0] if truth else None
    script = Script()

    def case_in(messages: list[dict]) -> str:
        text = " ".join(text_of(m["content"]) for m in messages)
        return next(c for c in truth if f"({c})" in text)

    def respond(request: dict) -> str:
        msgs = request["messages"]
        if task == "encounters" and request["model"] != "doctor":
            return judge_says(request) if request["model"] == "judge" else script(request)
        if request["model"] == "patient":
            system = text_of(msgs[0]["content"])
            return f"{COMPLAINT} ({next(c for c, v in vignettes.items() if v in system)})"
        if request["model"] == "solver":
            case = case_in(msgs)
            return truth[case] if case == first else "sunburn"
        turn = json.loads(text_of(msgs[-1]["content"]))  # verifiers' OpenEnv turn: the observation and the schema
        assert turn["action_schema"]["required"] == ["message"]
        view = turn["observation"]["messages"]
        asked = sum(m["role"] == "assistant" for m in view)
        if task == "encounters":
            return "What medicines do you take?" if asked == 0 else "Goodbye. [END]"
        if task == "consultation":
            return "Do you have a fever?" if not asked else "Thank you, that is all."
        case = case_in(view)
        answer = truth[case] if case == first else "sunburn"
        if not text_of(view[-1]["content"]).startswith(COMPLAINT):  # the question after the conversation
            return answer
        return "How long have you had it?" if asked == 1 else f"Final Diagnosis: {answer}"

    return respond


def vf_eval(task: str, dataset: Path, out: Path, base_url: str, *, limit: int = 2) -> list[dict]:
    """``vf-eval @ eval.toml`` in .venv-verifiers: ``limit`` cases of ``task`` on split test, one episode each, the doctor
    ``doctor`` on ``base_url``; the server started by the taskset with .venv-rl's Python, its
    release written to ``out/release``. Returns the episodes verifiers wrote (traces.jsonl)."""
    options = {"dataset": str(dataset), "cache": str(out / "cache.sqlite"), **OPTIONS[task]}
    config = {
        "model": "doctor",
        "num_rollouts": 1,
        "push": False,
        "output_dir": str(out / "vf"),
        "client": {"base_url": base_url, "api_key_var": "LOOPBACK_KEY"},
        "select": {"limit": limit},
        "env": {
            "taskset": {
                "id": "craftmd-verifiers",
                "craftmd_task": task,
                "python": str(RL_PYTHON),
                "release": str(out / "release"),
                "options": options,
            }
        },
    }
    (out / "eval.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_BASE_URL")}
    env.update(SIM_BASE_URL=base_url, PATH=f"{VF_BIN}{os.pathsep}{env.get('PATH', '')}")  # uv: the chat harness's
    cmd = [str(VF_BIN / "vf-eval"), "@", str(out / "eval.json"), "--no-rich"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200, cwd=out)
    assert res.returncode == 0, res.stderr[-3000:]
    (runs,) = (out / "vf").iterdir()
    return [json.loads(line) for line in (runs / "traces.jsonl").read_text().splitlines()]


def rewards_of(episodes: list[dict]) -> dict[str, float]:
    """case -> the reward verifiers recorded (every episode ok, one trace each)."""
    out = {}
    for e in episodes:
        assert e["ok"], e["errors"]
        (trace,) = e["traces"]
        out[e["task"]["data"]["id"]] = trace["rewards"]["craftmd_reward"]["score"]
    return out


@pytest.mark.parametrize("task", ["craftmd", "consultation"])
def test_vf_eval_plays_two_episodes_and_craftmd_score_agrees(task, data, consult_data, tmp_path):
    side_venvs()
    dataset = consult_data if task == "consultation" else data
    truth = answers(dataset)
    with LoopbackServer(doctor_and_roles(task, dataset), models=("patient", "doctor", "solver")) as server:
        got = rewards_of(vf_eval(task, dataset, tmp_path, server.base_url))
        doctor_turns = [r for r in server.log if r["model"] == "doctor"]
    first, second = sorted(truth)
    assert got == {first: 1.0, second: 0.0}
    assert doctor_turns and all("action_schema" in text_of(r["messages"][-1]["content"]) for r in doctor_turns)
    release = tmp_path / "release"
    assert read_release(release).manifest.task == task
    back = scored(release, dataset, "offline")
    for case, reward in got.items():
        assert back[case].hex() == float(reward).hex()


def test_vf_eval_plays_two_encounters_and_craftmd_score_agrees(medpi, tmp_path, monkeypatch):  # noqa: F811
    side_venvs()
    with LoopbackServer(doctor_and_roles("encounters"), models=("patient", "doctor", "judge")) as server:
        got = rewards_of(vf_eval("encounters", medpi, tmp_path, server.base_url))
    assert len(got) == 2 and all(r > 0 for r in got.values())
    release = tmp_path / "release"
    with LoopbackServer(judge_says, models=("judge",)) as server:
        monkeypatch.setenv("SIM_BASE_URL", server.base_url)
        rows = judged(release, medpi, ["communication"])
    for case, reward in got.items():
        assert rubric_reward(rows, case, 0, OPTIONS["encounters"]["reward_weights"]).hex() == float(reward).hex()


def test_load_environment_trains_on_the_train_split_and_bad_inputs_are_one_line(data, tmp_path):
    """`load_environment` (what a trainer loads, also named by the package's `verifiers.environments` entry point) poses
    the train split by default: on a dataset without the training cases, the server it starts refuses in one line, which
    the environment passes on; so does an unknown task."""
    side_venvs()
    code = (
        "import sys, json\n"
        "from importlib.metadata import entry_points\n"
        "from craftmd_verifiers import load_environment\n"
        "from craftmd_verifiers.server import ServerError\n"
        "assert entry_points(group='verifiers.environments')['craftmd-verifiers'].load() is load_environment\n"
        "for task in ('craftmd', 'chess'):\n"
        "    env = load_environment(task, python=sys.argv[1], dataset=sys.argv[2], patient='openai-api/sim/p')\n"
        "    try:\n"
        "        list(env.taskset)\n"
        "    except ServerError as e:\n"
        "        print(json.dumps([env.taskset.config.split, str(e)]))\n"
    )
    env = dict(os.environ, SIM_BASE_URL="http://127.0.0.1:9/v1")
    res = subprocess.run(
        [str(VF_BIN / "python"), "-c", code, str(RL_PYTHON), str(data)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (split, train), (_, chess) = [json.loads(line) for line in res.stdout.splitlines()]
    assert split == "train"
    assert "before serving: error: split 'train' of craftmd" in train and "is not built" in train and "\n" not in train
    assert "unknown task 'chess'" in chess and "\n" not in chess
