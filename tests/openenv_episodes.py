"""Two episodes of a task's environment through OpenEnv's own server and client (run by .venv-rl's Python).

``python tests/openenv_episodes.py TASK DATASET OUT``: serves ``load_environment(TASK, "test", ...)`` with
OpenEnv's ``create_app`` (uvicorn, in a thread), drives two episodes with OpenEnv's ``GenericEnvClient``, the
doctor a model on a loopback server (answering the first case right, the second wrong; for the consultation the
solver answers) and the patient the task's own patient on the same server; writes ``OUT/rewards.json`` ([[case_id, reward], ...]) and the
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

from loopback import LoopbackServer, text_of  # noqa: E402

COMPLAINT = "I have had a cough and a fever for three days."


def main(task: str, dataset: str, out: str) -> None:
    import openai
    import uvicorn
    from openenv.core.env_server.http_server import create_app
    from openenv.core.generic_client import GenericEnvClient

    from craftmd.envs import load_environment
    from craftmd.envs.openenv import DoctorAction, DoctorObservation

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    df = pl.read_parquet(Path(dataset) / "all" / "test-00000-of-00001.parquet")
    truth = dict(zip(df["case_id"], df["answer"]))
    state = {"answer": ""}

    def respond(request: dict) -> str:
        if request["model"] == "patient":
            return COMPLAINT
        if request["model"] == "solver":
            return state["answer"]
        msgs = request["messages"]
        if task == "consultation":  # one question, then a closing turn without one
            return "Do you have a fever?" if not any(m["role"] == "assistant" for m in msgs) else "Thank you, that is all."
        last = text_of(msgs[-1]["content"])
        if last != COMPLAINT:  # the question after the conversation
            return state["answer"]
        asked = sum(m["role"] == "assistant" for m in msgs)
        return "How long have you had it?" if asked == 1 else f"Final Diagnosis: {state['answer']}"

    with LoopbackServer(respond, models=("patient", "doctor", "solver")) as server:
        os.environ["SIM_BASE_URL"] = server.base_url
        made = []

        def factory():
            roles = {"solver": "openai-api/sim/solver"} if task == "consultation" else {}
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
                    case = made[-1].episodes.jobs[i][0].case_id
                    state["answer"] = truth[case] if right else "sunburn"
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
