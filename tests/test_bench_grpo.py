"""The GRPO bench's own arithmetic and arguments (bench/bench_grpo.py; the run itself needs the side venvs and minutes of
CPU, and is measured in docs/training.md): what it reports of a GRPO record, and how it refuses a bad argument."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_grpo  # noqa: E402


def episode(phase: str, case: int, reward, step: int = 0) -> dict:
    return {"phase": phase, "step": step, "case": case, "job": f"train_x_{case}/0", "reward": reward}


def test_the_held_out_reward_is_paired_by_case_and_an_unscored_episode_is_left_out_not_zero():
    record = {
        "episodes": [
            episode("before", 8, 0.0),
            episode("before", 8, 1.0),  # two trials: the case scores their mean
            episode("before", 9, 1.0),
            episode("before", 10, None),  # the environment could not score it: counted, never a 0
            episode("train", 0, 1.0, step=1),  # training episodes are not held out
            episode("after", 8, 1.0),
            episode("after", 8, 1.0),
            episode("after", 9, 0.0),
            episode("after", 10, 1.0),
        ]
    }
    before, after, unscored = bench_grpo.held_out(record)
    assert before == {"8": {"reward": 0.5}, "9": {"reward": 1.0}}
    assert after == {"8": {"reward": 1.0}, "9": {"reward": 0.0}, "10": {"reward": 1.0}}
    assert unscored == 1
    (row,) = bench_grpo.summarise(before, after, metrics=("reward",))
    assert row["n"] == 2  # case 10 has no score before: it is not paired
    assert row["base"][0] == 0.75 and row["tuned"][0] == 0.5 and row["diff"][0] == -0.25
    for arm in ("base", "tuned", "diff"):
        assert row[arm][1] <= row[arm][0] <= row[arm][2]


def test_a_group_teaches_grpo_only_when_its_rewards_differ():
    record = {
        "episodes": [
            episode("train", 3, 0.0, step=1),
            episode("train", 3, 0.0, step=1),  # all equal: no advantage, no gradient
            episode("train", 5, 0.0, step=2),
            episode("train", 5, 1.0, step=2),
            episode("before", 3, 1.0),
            episode("after", 3, 0.0),
        ]
    }
    assert bench_grpo.groups_with_spread(record) == (1, 2)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--steps", "0"], "--steps must be at least 1"),
        (["--held-out", "0"], "--held-out must be at least 1"),
        (["--num-generations", "1"], "--num-generations must be at least 2"),
        (["--reward-weights", "{x"], "--reward-weights is not JSON"),
        (["--reward-weights", "[1]"], "--reward-weights must be a JSON object"),
    ],
)
def test_a_bad_argument_is_one_line_before_anything_starts(tmp_path, args, why):
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_grpo.py"), *args, "--json", str(out), "--work", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("bench_grpo.py: error: ") and why in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no work folder, no record
