"""A client's mistakes and the server's errors as OpenEnv's server answers them (run by .venv-rl's Python; issue #48).

``python tests/openenv_errors.py DATASET OUT``: serves ``load_environment("craftmd", "test", ...)`` with OpenEnv's
``create_app`` through FastAPI's test client, the patient a loopback server, and writes ``OUT/answers.json``: what a
client got for a stateless HTTP ``/step`` (no reset before it), for a step before a reset in a WebSocket session, and for
a reset that fails with an error naming the dataset's path (a damaged dataset file, as the release reader words it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from openenv_episodes import this_checkout  # noqa: E402

this_checkout()

from loopback import LoopbackServer  # noqa: E402


def main(dataset: str, out: str) -> None:
    from fastapi.testclient import TestClient
    from openenv.core.env_server.http_server import create_app

    from craftmd import CraftMDError
    from craftmd.envs import load_environment
    from craftmd.envs.openenv import DoctorAction, DoctorObservation

    out_dir = Path(out)
    damaged = {"on": False}

    def make():
        env = load_environment("craftmd", "test", dataset=dataset, patient="openai-api/sim/patient", cache=out_dir / "c.sqlite")
        reset = env._core.reset

        def failing(index):  # the dataset's file damaged after the server started: its reader's one line names the path
            if damaged["on"]:
                raise CraftMDError(f"{Path(dataset).resolve()}/all/test-00000-of-00001.parquet is damaged; rebuild it")
            return reset(index)

        env._core.reset = failing
        return env

    got = {}
    with LoopbackServer(lambda r: "I have a cough.", models=("patient",)) as server:
        os.environ["SIM_BASE_URL"] = server.base_url
        app = create_app(make, DoctorAction, DoctorObservation, env_name="craftmd")
        with TestClient(app, raise_server_exceptions=False) as client:
            r = client.post("/step", json={"action": {"message": "What brings you in?"}})
            got["http_step"] = {"status": r.status_code, "body": r.text}
            with client.websocket_connect("/ws") as ws:
                ws.send_text(json.dumps({"type": "step", "data": {"message": "hello"}}))
                got["ws_step"] = json.loads(ws.receive_text())
            damaged["on"] = True
            with client.websocket_connect("/ws") as ws:
                ws.send_text(json.dumps({"type": "reset", "data": {"seed": 0}}))
                got["ws_reset"] = json.loads(ws.receive_text())
            r = client.post("/reset", json={"seed": 0})
            got["http_reset"] = {"status": r.status_code, "body": r.text}
    (out_dir / "answers.json").write_text(json.dumps(got, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
