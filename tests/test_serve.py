"""``craftmd generate --serve``: the run starts its local models itself, K replicas on free ports, pooled, checked ready,
recorded like any server, their logs beside the release, and stopped when the run ends or is killed (no orphan).

llama.cpp is the real one (SmolLM2-135M in ``.venv-llm``, as tests/realmodel.py finds it). vLLM is not installed here:
its launcher is tested against a stand-in ``vllm`` executable (``$CRAFTMD_VLLM``) that takes ``vllm serve``'s documented
command line, answers as its OpenAI-compatible server does, and writes down how it was started.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from craftmd.release import read_release
from helpers import craftmd, generate_argv

STAND_IN = r"""#!{python}
# vLLM's `vllm serve MODEL [options]`, as its documentation gives it, on the port asked; answers /v1/models and chat
import http.server, json, os, sys
args = sys.argv[1:]
assert args[0] == "serve", args
model = args[1]
opt = lambda name, default=None: args[args.index(name) + 1] if name in args else default
name, port = opt("--served-model-name", model), int(opt("--port"))
record = {{"argv": args, "pid": os.getpid(), "pgid": os.getpgid(0), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}}
with open(os.path.join({folder!r}, f"vllm-{{port}}.json"), "w") as f:
    json.dump(record, f)
max_len = int(opt("--max-model-len", 32768))


class H(http.server.BaseHTTPRequestHandler):
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({{"object": "list", "data": [{{"id": name, "object": "model", "root": model, "max_model_len": max_len}}]}})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        print("POST /v1/chat/completions", flush=True)
        self._send({{"id": "x", "object": "chat.completion", "created": 0, "model": name,
                    "choices": [{{"index": 0, "finish_reason": "stop",
                                 "message": {{"role": "assistant", "content": "Final Diagnosis: " + str(len(req["messages"]))}}}}],
                    "usage": {{"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}}})


http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def stand_in(tmp_path: Path) -> Path:
    folder = tmp_path / "started"
    folder.mkdir()
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(STAND_IN.format(python=sys.executable, folder=str(folder)))
    exe.chmod(0o755)
    return exe


def started(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "started").glob("*.json"))]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")  # a zombie is gone


def processes_naming(text: str) -> list[int]:
    """Every live process whose command line holds ``text``."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if text in (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace") and alive(int(p.name)):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def gone_within(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not check():
            return True
        time.sleep(0.25)
    return not check()


@pytest.fixture(scope="module")
def dataset(tiny_dataset):
    return tiny_dataset


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """The real test model's GGUF file, under a name of this module's own (so its servers are this module's to find)."""
    from realmodel import MissingModel, find_gguf, llm_python

    try:
        real = find_gguf(llm_python())
    except MissingModel as exc:
        pytest.fail(str(exc), pytrace=False)
    link = tmp_path_factory.mktemp("model") / "tiny-doctor.gguf"
    link.symlink_to(real)
    return link


def env_for_llm() -> dict:
    from realmodel import llm_python

    return {**os.environ, "CRAFTMD_LLM_PYTHON": str(llm_python())}


def test_a_gguf_model_is_served_as_two_pooled_replicas_recorded_and_stopped(dataset, gguf, tmp_path):
    out = tmp_path / "releases" / "local"
    argv = generate_argv(dataset, "--experiments", "vignette,mcq4", "--max-tokens", "8", "--serve", "doctor=2",
                         "--serve-args", "--n_ctx 2048", doctor=f"llama.cpp/{gguf}", cache=tmp_path / "c.sqlite", out=out)  # fmt: skip
    run = craftmd(*argv, env=env_for_llm())
    assert not processes_naming(str(gguf)), "a server outlived the run"
    release = read_release(out)
    answers = release.table("answers").to_pylist()
    assert answers and all(a["status"] == "ok" for a in answers)  # every case answered by the served model
    m = release.manifest
    name = "openai-api/llamacpp/tiny-doctor"  # the file's name is the model's: the same on any machine
    assert m.model == name and m.models["patient"] == name and m.protocol.roles["patient"] == name
    doctor = m.roles["doctor"]
    assert doctor["service"] == "llamacpp" and len(doctor["base_url"].split(",")) == 2  # the pool of two replicas
    served = doctor["served"]
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert served == {"engine": "llama.cpp", "model": "tiny-doctor.gguf", "sha256": sha, "replicas": 2, "options": ["--n_ctx", "2048"],
                      "logs": ["local.servers/llamacpp-0.log", "local.servers/llamacpp-1.log"]}  # fmt: skip
    logs = [out.parent / p for p in served["logs"]]
    posts = [p.read_text(errors="replace").count('"POST /v1/chat/completions') for p in logs]
    assert sum(posts) == len(answers) and all(posts), posts  # both replicas served, every request in their logs
    assert f"serving {name} (2 x llama.cpp)" in run.stderr


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "kill"])
def test_a_killed_run_leaves_no_server(dataset, gguf, tmp_path, sig):
    """``kill -9`` runs no handler: the servers' guard sees its run gone and stops them; ``kill`` stops them at once."""
    argv = generate_argv(dataset, "--experiments", "multiturn,frq", "--trials", "5", "--serve", "doctor=2",
                         doctor=f"llama.cpp/{gguf}", cache=tmp_path / "c.sqlite", out=tmp_path / "rel", quiet=False)  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "craftmd.commands.cli", *argv], env=env_for_llm(), stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # until the servers answer and the run is under way
            line = proc.stderr.readline()
            if line.startswith("serving ") or not line:
                break
        assert line.startswith("serving "), line
        servers = processes_naming(str(gguf))
        assert len(servers) >= 2  # two replicas (each under its guard)
        proc.send_signal(sig)
        proc.wait(60)
        assert gone_within(lambda: [p for p in servers if alive(p)], 30), "a server outlived its killed run"
        assert not (tmp_path / "rel").exists()  # no half-written release
    finally:
        proc.kill()
        proc.wait(10)
        for p in processes_naming(str(gguf)):  # whatever the defect left, stopped here
            os.kill(p, signal.SIGKILL)


def test_vllm_serve_replicas_each_get_a_gpu_and_the_documented_command(dataset, tmp_path, monkeypatch):
    exe = stand_in(tmp_path)
    env = {**os.environ, "CRAFTMD_VLLM": str(exe), "CUDA_VISIBLE_DEVICES": "0,1"}
    out = tmp_path / "rel"
    options = ("--experiments", "vignette,frq", "--serve", "doctor=2", "--serve-args", "--max-model-len 4096 --dtype bfloat16")
    argv = generate_argv(dataset, *options, doctor="vllm/Qwen/Qwen2.5-0.5B-Instruct", cache=tmp_path / "c.sqlite", out=out)
    craftmd(*argv, env=env)
    runs = started(tmp_path)
    assert len(runs) == 2 and sorted(r["cuda"] for r in runs) == ["0", "1"]  # a GPU each
    for r in runs:
        a = r["argv"]
        assert (
            a[:2] == ["serve", "Qwen/Qwen2.5-0.5B-Instruct"]
            and a[a.index("--served-model-name") + 1] == "Qwen/Qwen2.5-0.5B-Instruct"
        )
        assert a[a.index("--max-model-len") + 1] == "4096" and a[a.index("--host") + 1] == "127.0.0.1"
        assert "--gpu-memory-utilization" not in a  # a GPU of its own: vLLM's default
        assert gone_within(lambda r=r: alive(r["pid"]), 30)
    m = read_release(out).manifest
    assert m.model == "openai-api/vllm/Qwen/Qwen2.5-0.5B-Instruct"
    served = m.roles["doctor"]["served"]
    assert (served["engine"], served["model"], served["replicas"]) == ("vllm", "Qwen/Qwen2.5-0.5B-Instruct", 2)
    assert sorted(m.roles["doctor"]["base_url"].split(",")) == sorted(f"http://127.0.0.1:{json.loads(p.read_text())['argv'][-1]}/v1" for p in (tmp_path / "started").glob("*.json"))  # fmt: skip
    # one GPU for two replicas: they share it, each with half of vLLM's 0.9
    for p in (tmp_path / "started").iterdir():
        p.unlink()
    argv = generate_argv(
        dataset, *options, doctor="vllm/Qwen/Qwen2.5-0.5B-Instruct", cache=tmp_path / "c2.sqlite", out=tmp_path / "rel2"
    )
    craftmd(*argv, env={**env, "CUDA_VISIBLE_DEVICES": "0"})
    runs = started(tmp_path)
    assert len(runs) == 2 and all(r["cuda"] == "0" for r in runs)
    assert all(r["argv"][r["argv"].index("--gpu-memory-utilization") + 1] == "0.45" for r in runs)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--doctor", "openai/loopback", "--serve", "doctor"], "--serve doctor: its model openai/loopback is not a local model"),
        (["--doctor", "llama.cpp/{tmp}/missing.gguf"], "no such GGUF file"),
        (["--doctor", "llama.cpp/{tmp}/notes.txt"], "not a GGUF file"),
        (["--doctor", "llama.cpp/{gguf}", "--serve-args", "--port 5"], "--serve-args --port: the run sets it"),
        (["--doctor", "llama.cpp/{gguf}", "--serve", "nobody=2"], "--serve nobody: the run's roles are"),
        (["--doctor", "llama.cpp/{gguf}", "--serve", "doctor=99"], "replicas must be 1 to 16"),
        (["--doctor", "llama.cpp/{gguf}", "--serve", "doctor=two"], "expected ROLE or ROLE=K"),
        (["--doctor", "vllm/some/model", "--serve", "doctor"], "need vLLM's `vllm` command"),
        (["--doctor", "openai/loopback", "--serve-args", "--n_ctx 9"], "no role of the run is served"),
        (["--doctor", "llama.cpp/{gguf}", "--serve-args", "patient=--n_ctx 9"], "its model openai/loopback is not one the run"),
    ],
)
def test_what_cannot_be_served_is_one_line_and_starts_nothing(dataset, gguf, tmp_path, args, says):
    (tmp_path / "notes.txt").write_text("not a model")
    args = [a.format(tmp=tmp_path, gguf=gguf) for a in args]
    env = {k: v for k, v in env_for_llm().items() if k != "CRAFTMD_VLLM"}
    env["PATH"] = "/usr/bin:/bin"  # no vllm on it
    out = craftmd("generate", "--dataset", dataset, "--patient", "openai/loopback", "--base-url", "http://127.0.0.1:9/v1",
                  *args, "--out", tmp_path / "rel", env=env, ok=(2,))  # fmt: skip
    assert out.stderr.count("\n") == 1 and says in out.stderr, out.stderr
    assert not (tmp_path / "rel").exists() and not (tmp_path / "rel.servers").exists() and not processes_naming(str(gguf))


def test_score_serves_an_llm_graders_local_model_as_generate_serves_a_role(dataset, tmp_path):
    """``--serve`` is one option of every command that calls a model (:mod:`craftmd.commands.serving`): ``craftmd score``
    starts an ``llm:`` grader's vLLM model itself (the stand-in), grades under the name its server answers to, keeps the
    server's log beside the release (never in the release's own servers' folder) and stops it when the command ends."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import shutil

    import polars as pl

    from craftmd.dataset import load_config
    from craftmd.release import RunRecord, write_release

    dataset = shutil.copytree(dataset, tmp_path / "data")  # with the answer key the grader reads (as a build writes it)
    cases = dataset / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(cases).with_columns(paper_answer=pl.col("answer")).write_parquet(cases)
    ids = load_config(dataset, "all")["case_id"].to_list()[:2]
    rows = [{"case_id": c, "trial": 0, "setting": "vignette", "format": "frq", "with_image": False,
             "response": "Final Diagnosis: eczema", "status": "ok"} for c in ids]  # fmt: skip
    rel = tmp_path / "releases" / "tiny"
    write_release(rel, RunRecord(task="craftmd", release="tiny", kind="generated", model="acme/tiny"),
                  {"answers": pa.Table.from_pylist(rows)})  # fmt: skip
    env = {**os.environ, "CRAFTMD_VLLM": str(stand_in(tmp_path)), "CUDA_VISIBLE_DEVICES": "0"}
    run = craftmd("score", rel, "--dataset", dataset, "--scorer", "llm:vllm/other/grader-7b", "--serve", "grader",
                  "--serve-args", "--max-model-len 4096", "--cache", tmp_path / "c.sqlite", "--quiet", env=env)  # fmt: skip

    [start] = started(tmp_path)
    a = start["argv"]
    assert a[:2] == ["serve", "other/grader-7b"] and a[a.index("--max-model-len") + 1] == "4096"
    assert gone_within(lambda: alive(start["pid"]), 30), "the grader's server outlived the command"
    name = "llm:openai-api/vllm/other/grader-7b"  # the name its server answers to, as generate names a served role
    assert "serving openai-api/vllm/other/grader-7b (1 x vllm)" in run.stderr
    scores = pq.read_table(rel / "scores.parquet").to_pylist()
    graded = [r for r in scores if r["scorer"] == name and r["metric"] == "correct"]
    assert len(graded) == len(ids) and all(r["status"] == "ok" for r in graded), scores
    log = tmp_path / "releases" / "tiny.score-servers" / "vllm-0.log"
    assert log.read_text().count("POST /v1/chat/completions") >= len(ids)

    bad = craftmd("score", rel, "--dataset", dataset, "--scorer", "llm:vllm/other/grader-7b", "--serve", "judge",
                  env=env, ok=(2,))  # fmt: skip
    assert bad.stderr.count("\n") == 1 and "--serve judge: the run's roles are grader" in bad.stderr, bad.stderr
    assert len(started(tmp_path)) == 1  # nothing started for a refused command


def test_every_command_that_takes_a_model_takes_serve():
    """Every command with an option naming a model (or a scorer or grader that calls one) offers ``--serve`` and
    ``--serve-args``, the one pair of :func:`craftmd.commands.serving.add_serve_arguments`."""
    import argparse

    from craftmd.commands.cli import build_parser

    models = {"--doctor", "--model", "--judge", "--other-judge", "--scorer", "--grader", "--golden-writer"}
    #: options of those names that call no model: a grader whose recorded verdicts are read, an upstream model's results
    names_only = {"review export", "review import", "ingest"}

    def commands(parser, path=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, (*path, name))
        yield path, {o for a in parser._actions for o in a.option_strings}

    found = {" ".join(p): opts for p, opts in commands(build_parser()) if opts & models and " ".join(p) not in names_only}
    assert {
        "generate",
        "score",
        "judge",
        "judge-sensitivity",
        "meld",
        "submit",
        "build",
        "keyinfo extract",
        "leaderboard",
    } <= set(found)
    without = {c: sorted(opts & models) for c, opts in found.items() if not {"--serve", "--serve-args"} <= opts}
    assert not without, without


def test_llama_cpp_servers_share_the_cpus_the_run_may_use(gguf, tmp_path, monkeypatch):
    """llama.cpp's prompt threads default to every core of the machine and spin while they wait for each other: two
    servers that each take all of them (replicas, or a run pinned with ``taskset`` beside other work) run several times
    slower than each on its share. Each server the package starts takes its part of the CPUs its process may use."""
    from craftmd.models import serve

    monkeypatch.setattr(serve, "cpus", lambda: 8)
    monkeypatch.setenv("CRAFTMD_LLM_PYTHON", str(env_for_llm()["CRAFTMD_LLM_PYTHON"]))
    threads = lambda cmd: (cmd[cmd.index("--n_threads") + 1], cmd[cmd.index("--n_threads_batch") + 1])  # noqa: E731
    alone = serve.LlamaCppServer(gguf, alias="a", log=tmp_path / "a.log")
    assert threads(alone.command()) == ("4", "8")  # one server: half the CPUs for its replies, all for its prompts
    given = serve.LlamaCppServer(gguf, alias="a", options=["--n_threads_batch", "3"], log=tmp_path / "a.log").command()
    assert threads(given) == ("4", "3") and given.count("--n_threads_batch") == 1  # the user's word stands
    other = tmp_path / "patient.gguf"
    other.symlink_to(gguf)
    plan = serve.ServePlan({"doctor": f"llama.cpp/{gguf}", "patient": f"llama.cpp/{other}"}, {"doctor": 2}, {}, tmp_path)
    servers = [x for s in plan.models for x in plan._servers(s)]
    assert len(servers) == 3 and all(threads(x.command()) == ("1", "2") for x in servers)  # 8 CPUs over three servers
