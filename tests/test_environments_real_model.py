"""Issue #35 with the real small model: OpenEnv's own server and client run two episodes of each task's environment
with SmolLM2-135M on llama.cpp (tests/realmodel.py, the ``real_model`` fixture) in every role: the doctor under
training, the patient, the consultation's solver, the encounters' closer and judge. Then `craftmd score` of the release
the episodes wrote gives back the rewards the environment gave (the judge's scores from the same request cache: nothing
is sent again). Nothing here asserts what the 135M model says.

Sized small: one short case, two doctor turns (encounters: the doctor's opening and the patient's reply, no memory tags,
the judge on one category with a short discussion), 32 tokens a reply (tests/openenv_episodes.py, :data:`REAL`). On a
2-core machine loaded by other work (load average 7–10): CRAFT-MD 92 s, the consultation 49 s, encounters 254 s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from encounter_script import medpi  # noqa: E402,F401  (the fixture)
from helpers import openenv_episodes, shortest_case  # noqa: E402
from openenv_episodes import REAL, REAL_MODEL  # noqa: E402
from test_environment_encounters import rubric_reward  # noqa: E402

from craftmd.commands.cli import main as cli_main  # noqa: E402
from craftmd.release import read_release  # noqa: E402


@pytest.fixture(scope="module")
def one_case(source, tmp_path_factory) -> Path:
    """The shortest of a few recorded cases (with its paper key), and hand-written key-value information for it."""
    from craftmd.dataset import config_file
    from craftmd.keyinfo import SCHEMA

    data = tmp_path_factory.mktemp("env-real") / "data"
    df = shortest_case(source, data, paper_key=True)
    row = {"case_id": df["case_id"][0], "items": [{"key": "complaint", "value": df["vignette"][0][:200]}],
           "initial_request": "Doctor, I do not feel well.", "status": "ok", "error": None, "model": "test/hand-written",
           "prompt_sha256": "0" * 64}  # fmt: skip
    path = config_file(data, "keyinfo")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([row], SCHEMA), path)
    return data


@pytest.mark.parametrize("task", ["craftmd", "consultation", "encounters"])
def test_two_episodes_with_the_real_model_and_craftmd_score_agrees(task, real_model, one_case, medpi, tmp_path):  # noqa: F811
    dataset = medpi if task == "encounters" else one_case
    out = tmp_path / "openenv"
    got = openenv_episodes(task, dataset, out, real_model.base_url, timeout=1500)
    rel = out / "release"
    m = read_release(rel).manifest
    assert len(got) == 2 and m.task == task and m.roles["patient"]["model"] == REAL_MODEL
    convs = read_release(rel).table("conversations").to_pylist()
    assert sorted((c["case_id"], c["trial"]) for c in convs) == sorted((c, t) for c, t, _, _ in got)  # a conversation an episode
    if task == "encounters":  # the judge again, through craftmd score, from the episodes' request cache
        sent = real_model.chat_requests()
        judge = REAL["encounters"]["judge_options"]
        assert cli_main(["score", str(rel), "--dataset", str(dataset), "--scorer", f"judge:{REAL_MODEL}", "--mode", "category",
                         "--dimensions", "communication", "--max-tokens", str(judge["discussion_tokens"]),
                         "--score-tokens", str(judge["score_tokens"]), "--max-invalid", str(judge["max_invalid"]),
                         "--base-url", real_model.base_url, "--cache", str(out / "cache.sqlite"), "--quiet"]) == 0  # fmt: skip
        assert real_model.chat_requests() == sent
        rows = read_release(rel).table("scores").to_pylist()
        for case, trial, reward, scores in got:  # the judge's scores, each dimension's (a failed one null), and the reward
            mine = [r for r in rows if (r["case_id"], r["trial"], r["scorer"]) == (case, trial, f"judge:{REAL_MODEL}")]
            assert scores == {r["dimension"]: r["value"] for r in mine} and len(mine) == 5  # the communication category
            back = rubric_reward(rows, case, trial, REAL["encounters"]["reward_weights"], judge=f"judge:{REAL_MODEL}")
            assert (None if back is None else back.hex()) == (None if reward is None else float(reward).hex())
        return
    assert cli_main(["score", str(rel), "--dataset", str(dataset), "--scorer", "offline", "--quiet"]) == 0
    rows = read_release(rel).table("scores").to_pylist()
    back = {(r["case_id"], r["trial"]): r["value"] for r in rows if r["scorer"] == "offline"}
    for case, trial, reward, scores in got:
        assert reward is not None and back[(case, trial)].hex() == float(reward).hex()
        assert scores == {"offline/correct": [back[(case, trial)]]}
