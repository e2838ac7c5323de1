"""Two episodes of a task's environment through OpenEnv's own server and client (run by .venv-rl's Python).

``python tests/openenv_episodes.py TASK DATASET OUT``: serves ``load_environment(TASK, "test", ...)`` with
OpenEnv's ``create_app`` (uvicorn, in a thread), drives two episodes with OpenEnv's ``GenericEnvClient``, the
doctor a model on a loopback server (answering the first case right, the second wrong; for the consultation the
solver answers; in an encounter the right doctor asks about the patient's medicines, the judge scores by that) and the
patient the task's own patient on the same server; writes ``OUT/rewards.json`` ([[case_id, reward], ...]) and the
episodes' release ``OUT/release``.
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


def main(task: str, dataset: str, out: str) -> None:
    import openai
    import uvicorn
    from openenv.core.env_server.http_server import create_app
    from openenv.core.generic_client import GenericEnvClient

    from craftmd.envs import load_environment
    from craftmd.envs.openenv import DoctorAction, DoctorObservation

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
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

    with LoopbackServer(respond, models=("patient", "doctor", "solver", "judge")) as server:
        os.environ["SIM_BASE_URL"] = server.base_url
        made = []

        def factory():
            roles = {"consultation": {"solver": "openai-api/sim/solver"},
                     "encounters": {"judge": "openai-api/sim/judge", "judge_mode": "category", **ENCOUNTERS}}.get(task, {})
            env = load_environment(task, "test", dataset=dataset, patient="openai-api/sim/patient", cache=out / "cache.sqlite", **roles)
            made.append(env)
            return env

        app = create_app(factory, DoctorAction, DoctorObservation, env_name=task)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        threading.Thread(target=uv.run, daemon=True).start()
        while not uv.started:
            time.sleep(0.05)
        doctor = openai.OpenAI(base_url=server.base_url, api_key="none")
        rewards = []
        try:
            with GenericEnvClient(base_url=f"http://127.0.0.1:{port}", message_timeout_s=300).sync() as client:
                for i, right in ((0, True), (1, False)):
                    result = client.reset(seed=i)
                    case = made[-1].episodes.case_id(i)
                    state["answer"], state["right"] = (truth.get(case) if right else "sunburn"), right
                    while not result.done:
                        view = result.observation["messages"]
                        reply = doctor.chat.completions.create(model="doctor", messages=view).choices[0].message.content
                        result = client.step({"message": reply})
                    rewards.append([case, result.reward])
            made[-1].write_release(out / "release")
        finally:
            uv.should_exit = True
    (out / "rewards.json").write_text(json.dumps(rewards))


if __name__ == "__main__":
    main(*sys.argv[1:4])
