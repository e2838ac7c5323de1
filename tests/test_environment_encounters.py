"""The encounters environment (issue #35): the doctor under training meets the task's own AI patient (memory tags,
emotion steps, the closer), the episode ends by the task's rules (a side closes, the message cap), and the reward is
the rubric judge's dimensions for the packet's objective, weighted; `craftmd score --scorer judge:...` of the written
release gives the rewards back to the bit. The training packets (`--split train`) are the split `train`."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from encounter_script import CELLS, Script, judge_says, medpi  # noqa: E402,F401  (medpi: the fixture)
from helpers import openenv_episodes, sim_episodes  # noqa: E402
from loopback import LoopbackServer  # noqa: E402

from craftmd import CraftMDError  # noqa: E402
from craftmd.commands.cli import main as cli_main  # noqa: E402
from craftmd.dataset_builder.packets import load_packets  # noqa: E402
from craftmd.release import read_release  # noqa: E402
from craftmd.scoring.rubric import applicable, load_catalog  # noqa: E402

ROLES = {"patient": "openai-api/sim/patient", "judge": "openai-api/sim/judge"}
JUDGE = f"judge:{ROLES['judge']}"
#: Two categories of the rubric: one that applies to every objective, one to diagnosis encounters only.
WEIGHTS = {"judge/communication": 1.0, "judge/final diagnosis": 0.5}


def responder(script: Script):
    def respond(request: dict) -> str | None:
        return judge_says(request) if request["model"] == "judge" else script(request)

    return respond


def rubric_reward(rows: list[dict], case: str, trial: int, weights: dict[str, float], judge: str = JUDGE) -> float | None:
    """The documented reward from `craftmd score`'s rows: sum over the keys of w * mean((score - 1) / 3) over the key's
    dimensions that the judge scored (math.fsum: the order of the rows does not matter); None when a score failed."""
    cat = {d.id: d for d in load_catalog().dimensions}
    mine = {r["dimension"]: r["value"] for r in rows if r["case_id"] == case and r["trial"] == trial and r["scorer"] == judge}
    total = 0.0
    for key, w in weights.items():
        what = key.split("/", 1)[1]
        values = [v for d, v in mine.items() if what == "rubric_score" or what in (d, cat[d].category, cat[d].meta_category)]
        if any(v is None for v in values):
            return None
        if values:
            total += w * (math.fsum((v - 1.0) / 3.0 for v in values) / len(values))
    return total


def judged(release: Path, dataset: Path, dimensions: list[str]) -> list[dict]:
    assert cli_main(["score", str(release), "--dataset", str(dataset), "--scorer", JUDGE, "--mode", "category",
                     "--dimensions", ",".join(dimensions), "--quiet"]) == 0  # fmt: skip
    return read_release(release).table("scores").to_pylist()


def test_encounter_episodes_reward_the_judges_dimensions_and_craftmd_score_agrees(medpi, tmp_path, monkeypatch):  # noqa: F811
    """Episode 0: the doctor opens, asks about medicines, the patient (memories, an emotion step) answers, the doctor
    closes with [END]. Episode 1 (the other packet): the doctor never asks about medicines and never closes; the cap of
    4 messages ends it. The reward is the weighted judge's scores on the dimensions that apply to each packet's
    objective; `craftmd score` of the release the episodes write gives them back exactly."""
    packets = {p["case_id"]: p for p in load_packets(medpi)}
    with LoopbackServer(responder(Script()), models=("patient", "judge")) as server:
        options = {**ROLES, "judge_mode": "category", "reward_weights": WEIGHTS, "max_messages": 4}
        env = sim_episodes(monkeypatch, server, "encounters", "test", medpi, tmp_path, **options)

        async def play() -> list:
            out = []
            s = await env.reset(0)
            packet = packets[env.case_id(0)]
            assert [m["role"] for m in s.messages] == ["system"]  # the doctor opens
            assert packet["name"] in s.messages[0]["content"]
            s = await env.step("Hello. What medicines do you take?")
            assert not s.done and s.messages[-1]["role"] == "user" and s.messages[-1]["content"].startswith("I have")
            s = await env.step("Thank you, goodbye. [END]")
            assert s.done and s.info["ended"] == "doctor_closed"
            out.append((env.case_id(0), s))
            s = await env.reset(1)
            s = await env.step("How are you today?")
            assert not s.done
            s = await env.step("Tell me more.")
            assert s.done and s.info["ended"] == "max_messages"  # doctor, patient, doctor, patient: the cap
            out.append((env.case_id(1), s))
            await env.aclose()
            return out

        got = asyncio.run(play())
        objectives = {c: packets[c]["objective"] for c, _ in got}
        assert sorted(objectives.values()) == ["diagnosis", "medication_advice"]
        cat = load_catalog()
        for case, s in got:  # the judge scored exactly the weighted categories' dimensions that apply to the objective
            weighed = ("communication", "final diagnosis")
            want = {d.id for d in applicable(cat.dimensions, objectives[case]) if d.category in weighed}
            assert set(s.info["scores"]) == want and s.info["objective"] == objectives[case]
        diagnosis = next(s for c, s in got if objectives[c] == "diagnosis")
        advice = next(s for c, s in got if objectives[c] != "diagnosis")
        assert advice.info["not_applicable"] == ["judge/final diagnosis"] and "not_applicable" not in diagnosis.info
        asked = got[0][1]
        assert asked.reward > 0 and got[1][1].reward == 0.0  # the judge's scores reached the reward
        assert diagnosis.reward is not None and advice.reward is not None
        rel = env.write_release(tmp_path / "rollouts")
        m = read_release(rel).manifest
        assert m.task == "encounters" and m.models["doctor"] == "openai-api/policy/policy"
        assert {t for t in ("conversations", "patient_states", "closures", "memory_tags") if read_release(rel).has(t)} == {
            "conversations",
            "patient_states",
            "closures",
            "memory_tags",
        }
        rows = judged(rel, medpi, ["communication", "final diagnosis"])
    for case, s in got:
        assert rubric_reward(rows, case, 0, WEIGHTS).hex() == s.reward.hex()


def test_the_judge_is_a_role_and_bad_inputs_are_one_line(medpi, tmp_path, monkeypatch):  # noqa: F811
    from craftmd.envs import load_environment

    monkeypatch.setenv("SIM_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("NOWHERE_BASE_URL", raising=False)
    base = {"dataset": medpi, **ROLES, "cache": tmp_path / "c"}
    for kwargs, line in [
        ({"judge": None}, "needs its judge bound: judge="),
        ({"judge": "openai-api/nowhere/judge"}, "NOWHERE_BASE_URL"),
        ({"patient": None}, "needs its patient bound"),
        ({"reward_weights": {"judge/bedside": 1.0}}, "'bedside' is no dimension id, category or meta-category"),
        ({"reward_weights": {"offline/correct": 1.0}}, "the encounters reward is the judge's"),
        ({"reward_weights": {"judge/rubric_score": "high"}}, "not a finite number"),
        ({"judge_mode": "vibes"}, "judge_mode 'vibes'"),
        ({"judge_options": {"discussion_tokens": 64, "colour": 1}}, "unknown judge option 'colour'"),
        ({"judge_options": {"response_format": "xml"}}, "--response-format 'xml'"),
        ({"split": "train"}, "split 'train' of encounters (config packets) is not built"),
    ]:
        args = {"task": "encounters", "split": "test", **base, **kwargs}
        with pytest.raises(CraftMDError) as e:
            load_environment(**args)
        assert line in str(e.value) and "\n" not in str(e.value), (kwargs, str(e.value))


def test_training_packets_are_the_train_split(medpi, tmp_path, monkeypatch):  # noqa: F811
    """Split `train` poses the training packets (another seed and population, checked against the benchmark's by the
    build); the release the episode writes names them, and the judge reads their objectives."""
    from craftmd.dataset_builder.packets import build_packets

    train = tmp_path / "train"
    build_packets(train, split="train", cells=CELLS[:1], count=1, against=medpi, progress=False)
    (case,) = [p["case_id"] for p in load_packets(train, split="train")]
    with LoopbackServer(responder(Script()), models=("patient", "judge")) as server:
        options = {**ROLES, "judge_mode": "category", "reward_weights": {"judge/communication": 1.0}}
        env = sim_episodes(monkeypatch, server, "encounters", "train", train, tmp_path, **options)
        assert len(env) == 1 and env.case_id(0) == case and case.startswith("medpi_train_")

        async def play():
            await env.reset(0)
            s = await env.step("What medicines do you take? Goodbye. [END]")
            await env.aclose()
            return s

        s = asyncio.run(play())
    assert s.done and s.reward > 0 and s.info["job"] == f"{case}/0"
    rel = env.write_release(tmp_path / "rollouts")
    assert [c["case_id"] for c in read_release(rel).table("conversations").to_pylist()] == [case]


def test_openenv_serves_two_encounter_episodes_and_craftmd_score_agrees(medpi, tmp_path, monkeypatch):  # noqa: F811
    """OpenEnv's own server (create_app) and client (GenericEnvClient) run two encounter episodes, the doctor a model on a
    loopback server (the first asks about medicines, the second does not); `craftmd score` of their release agrees."""
    from openenv_episodes import ENCOUNTERS

    out = tmp_path / "openenv"
    got = openenv_episodes("encounters", medpi, out)
    assert len(got) == 2 and got[0][2] > 0 and got[1][2] == 0.0
    rel = out / "release"
    assert read_release(rel).manifest.task == "encounters"
    with LoopbackServer(judge_says, models=("judge",)) as server:
        monkeypatch.setenv("SIM_BASE_URL", server.base_url)
        rows = judged(rel, medpi, ["communication"])
    for case, trial, reward, scores in got:
        assert rubric_reward(rows, case, trial, ENCOUNTERS["reward_weights"]).hex() == float(reward).hex()
        mine = [r for r in rows if (r["case_id"], r["trial"], r["scorer"]) == (case, trial, JUDGE)]
        assert scores == {r["dimension"]: r["value"] for r in mine}
