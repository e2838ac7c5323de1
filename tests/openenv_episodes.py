"""Two episodes of a task's environment through OpenEnv's own server and client (run by .venv-rl's Python).

``python tests/openenv_episodes.py TASK DATASET OUT [BASE_URL]``: serves ``load_environment(TASK, "test", ...)`` with
OpenEnv's ``create_app`` (uvicorn, in a thread), drives two episodes with OpenEnv's ``GenericEnvClient``, the
doctor a model on a loopback server (answering the first case right, the second wrong; for the consultation the
solver answers; in an encounter the right doctor asks about the patient's medicines, the judge scores by that) and the
patient the task's own patient on the same server; writes ``OUT/rewards.json`` ([[case_id, trial, reward, scores], ...]) and the
episodes' release ``OUT/release``. With ``BASE_URL`` (llama.cpp's server of SmolLM2, tests/realmodel.py), the real small
model plays every role instead, the doctor included (:data:`REAL`: short episodes).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parent.parent


def this_checkout() -> None:
    """Import craftmd from the checkout this script is in: a side venv's editable install (``make rl``) points at the
    checkout it was made from, which another worktree's tests must not run instead of their own."""
    for name, finder in list(sys.modules.items()):
        if name.startswith("__editable___craftmd") and hasattr(finder, "MAPPING"):
            made = Path(finder.MAPPING["craftmd"]).parent
            if made != ROOT:
                swap = lambda p: str(ROOT / Path(p).relative_to(made))  # noqa: E731
                finder.MAPPING.update({k: swap(v) for k, v in finder.MAPPING.items()})
                finder.NAMESPACES.update({k: [swap(p) for p in v] for k, v in finder.NAMESPACES.items()})


this_checkout()

from encounter_script import Script, judge_says  # noqa: E402
from loopback import LoopbackServer, text_of  # noqa: E402

COMPLAINT = "I have had a cough and a fever for three days."
#: The encounters environment's options here: the judge's communication category is the reward.
ENCOUNTERS = {"reward_weights": {"judge/communication": 1.0}, "max_messages": 6}


def play(task: str, make, doctor, out: Path, prepare=lambda case, right: None) -> list:
    """OpenEnv's server (``create_app`` over the factory ``make``, uvicorn in a thread) and client (``GenericEnvClient``):
    two episodes (``reset(seed=0)``, ``reset(seed=1)``), ``doctor(view)`` replying to each view; the episodes' release is
    written to ``out/release``. Returns ``[[case_id, trial, reward, the scores the reward was made of], ...]``."""
    import uvicorn
    from openenv.core.env_server.http_server import create_app
    from openenv.core.generic_client import GenericEnvClient

    from craftmd.envs.openenv import DoctorAction, DoctorObservation

    made = []

    def factory():
        made.append(make())
        return made[-1]

    app = create_app(factory, DoctorAction, DoctorObservation, env_name=task)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=uv.run, daemon=True).start()
    while not uv.started:
        time.sleep(0.05)
    rewards = []
    try:
        with GenericEnvClient(base_url=f"http://127.0.0.1:{port}", message_timeout_s=600).sync() as client:
            for i, right in ((0, True), (1, False)):
                result = client.reset(seed=i)
                prepare(made[-1].episodes.case_id(i), right)
                while not result.done:
                    result = client.step({"message": doctor(result.observation["messages"])})
                last = made[-1].episodes.rewards[-1]  # the episode's job, as the environment recorded it
                case, trial = last["job"].rsplit("/", 1)
                assert last["reward"] == result.reward, (last, result.reward)
                rewards.append([case, int(trial), result.reward, last["scores"]])
        made[-1].write_release(out / "release")
    finally:
        uv.should_exit = True
    return rewards


def main(task: str, dataset: str, out: str, base_url: str | None = None) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rewards = (real if base_url else loopback)(task, dataset, out, base_url)
    (out / "rewards.json").write_text(json.dumps(rewards))


def loopback(task: str, dataset: str, out: Path, _=None) -> list:
    import openai

    from craftmd.envs import load_environment

    truth = {}
    if task != "encounters":
        df = pl.read_parquet(Path(dataset) / "all" / "test-00000-of-00001.parquet")
        truth = dict(zip(df["case_id"], df["answer"]))
    state = {"answer": "", "right": True}
    script = Script()

    def respond(request: dict) -> str:
        if task == "encounters" and request["model"] != "doctor":
            return judge_says(request) if request["model"] == "judge" else script(request)
        if request["model"] == "patient":
            return COMPLAINT
        if request["model"] == "solver":
            return state["answer"]
        msgs = request["messages"]
        asked = sum(m["role"] == "assistant" for m in msgs)
        if task == "encounters":  # the doctor opens: a question (about medicines, or not), then it closes
            return ("What medicines do you take?" if state["right"] else "How are you?") if not asked else "Goodbye. [END]"
        if task == "consultation":  # one question, then a closing turn without one
            return "Do you have a fever?" if not asked else "Thank you, that is all."
        last = text_of(msgs[-1]["content"])
        if last != COMPLAINT:  # the question after the conversation
            return state["answer"]
        return "How long have you had it?" if asked == 1 else f"Final Diagnosis: {state['answer']}"

    def prepare(case: str, right: bool) -> None:
        state["answer"], state["right"] = (truth.get(case) if right else "sunburn"), right

    with LoopbackServer(respond, models=("patient", "doctor", "solver", "judge")) as server:
        os.environ["SIM_BASE_URL"] = server.base_url
        roles = {
            "consultation": {"solver": "openai-api/sim/solver"},
            "encounters": {"judge": "openai-api/sim/judge", "judge_mode": "category", **ENCOUNTERS},
        }.get(task, {})
        client = openai.OpenAI(base_url=server.base_url, api_key="none")

        def make():
            return load_environment(
                task, "test", dataset=dataset, patient="openai-api/sim/patient", cache=out / "cache.sqlite", **roles
            )

        def doctor(view: list[dict]) -> str:
            return client.chat.completions.create(model="doctor", messages=view).choices[0].message.content

        return play(task, make, doctor, out, prepare)


#: The real small model's episodes (``BASE_URL`` given: SmolLM2 on llama.cpp in every role): short, 32 tokens a reply.
REAL_MODEL = "openai/smollm2"
REAL = {"craftmd": {"max_turns": 2},
        "consultation": {"max_turns": 2, "solver": REAL_MODEL},
        "encounters": {"judge": REAL_MODEL, "judge_mode": "category", "reward_weights": {"judge/communication": 1.0},
                       "judge_options": {"discussion_tokens": 32, "score_tokens": 256, "max_invalid": 0},
                       "max_messages": 2, "memory_tags": False}}  # fmt: skip


def real(task: str, dataset: str, out: Path, base_url: str) -> list:
    import openai

    from craftmd.envs import load_environment

    client = openai.OpenAI(base_url=base_url, api_key="sk-not-used")

    def make():
        return load_environment(
            task,
            "test",
            dataset=dataset,
            patient=REAL_MODEL,
            base_url=base_url,
            max_tokens=32,
            temperature=0.0,
            cache=out / "cache.sqlite",
            **REAL[task],
        )

    def doctor(view: list[dict]) -> str:
        reply = client.chat.completions.create(
            model=REAL_MODEL.split("/")[1], messages=view, max_tokens=32, temperature=0.0, seed=0
        )
        return reply.choices[0].message.content or ""

    return play(task, make, doctor, out)


if __name__ == "__main__":
    main(*sys.argv[1:5])
