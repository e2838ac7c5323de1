"""``craftmd finetune serve`` stopped by its process id (``kill PID``, as a user stops a server started with ``&``): the
server it started goes with it, and nothing answers on the port afterwards.

The training environment is not needed: ``--python`` names a stand-in for it, an executable that answers the health
check on the port ``transformers serve`` would have been given (and writes its process id, so the test can always stop it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import pytest

STAND_IN = """#!{python}
import http.server, json, os, sys
Path = __import__("pathlib").Path
Path({pidfile!r}).write_text(str(os.getpid()))
port = int(sys.argv[sys.argv.index("--port") + 1])


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"status": "ok"}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stopping_the_serve_command_by_its_pid_stops_the_server_it_started(tmp_path, sig):
    from craftmd.models.local_server import free_port

    ckpt = tmp_path / "my-doctor"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    (ckpt / "model.safetensors").write_bytes(b"x")
    (ckpt / "tokenizer.json").write_text("{}")
    pidfile = tmp_path / "server.pid"
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN.format(python=sys.executable, pidfile=str(pidfile)))
    stand_in.chmod(0o755)
    port = free_port()
    argv = [sys.executable, "-m", "craftmd.commands.cli", "finetune", "serve", str(ckpt), "--port", str(port)]
    proc = subprocess.Popen([*argv, "--python", str(stand_in)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # printed once the server answers its health check
        assert first.startswith(f"serving my-doctor at http://127.0.0.1:{port}/v1"), (first, proc.stderr.read())
        assert listening(port)
        proc.send_signal(sig)  # the user's `kill PID` (or the terminal closing: SIGHUP)
        assert proc.wait(60) != 0
        assert not listening(port), "the server still answers after its command was stopped"
    finally:
        proc.kill()
        proc.wait(10)
        if pidfile.exists():  # the stand-in left running by the defect: stopped here, whatever the result
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
