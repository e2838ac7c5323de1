"""The README's local-model path, every task, with a real model: SmolLM2-135M on llama.cpp's server. Each generation
run starts its own (``--doctor llama.cpp/FILE.gguf``, ``--serve-args`` as the page gives them: the context the tasks
need); the steps that call a model outside a run use the server the page's own command starts (its options parsed
from the page), an ``openai-api/local/...`` model at ``LOCAL_BASE_URL`` with no key. One case (one packet) and one
trial each, low caps:

CRAFT-MD's interview and questions (the many-choice MCQ: its prompt, counted by the server, fits the README's window), its graders (the rules,
the offline grader, the LLM grader); key-value extraction and the consultation; an encounter and its judge; the page; the
inspect logs. Every step must produce results (failures counted, never all failing): each command exits 0, or, for a
step the 135M model cannot do (the JSON of the extraction), exits 2 with one line. Nothing asserts what the model says.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import polars as pl
import pytest

from helpers import analyse_argv, craftmd, generate_argv

ROOT = Path(__file__).resolve().parent.parent
M = "openai-api/local/local-model"


def readme_server_options() -> list[str]:
    """The options of the documented llama.cpp server command (every such command of the local-model page,
    ``docs/local.md``, is the same one)."""
    lines = [ln.split("&")[0] for ln in (ROOT / "docs" / "local.md").read_text().splitlines() if "-m llama_cpp.server" in ln]
    assert lines, "docs/local.md has no llama.cpp server command"
    options = [shlex.split(ln.split("-m llama_cpp.server", 1)[1]) for ln in lines]
    assert all(o == options[0] for o in options), f"docs/local.md's server commands differ: {options}"
    return options[0]


def readme_serve_args() -> list[str]:
    """The ``--serve-args`` of the page's ``craftmd generate`` commands (every one gives the same)."""
    given = []
    for ln in (ROOT / "docs" / "local.md").read_text().splitlines():
        if ln.startswith("craftmd generate") and "--serve-args" in ln:
            argv = shlex.split(ln.split("#")[0].replace("<packet id>", "x"))
            given.append(shlex.split(argv[argv.index("--serve-args") + 1]))
    assert given and all(g == given[0] for g in given), f"docs/local.md's --serve-args differ: {given}"
    return given[0]


@pytest.fixture(scope="module")
def server():
    from realmodel import served

    options = readme_server_options()
    assert int(options[options.index("--n_ctx") + 1]) >= 12_288  # the many-choice MCQ's ~11.7k tokens and a reply
    yield from served(options=options)


def post_json(url: str, body: dict) -> dict:
    import json
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def statuses(rows, key="status") -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0) + 1
    return out


def test_every_task_on_the_readmes_local_server(server, dataset_dir, tmp_path):
    import shutil

    from craftmd.release import read_release

    dataset_dir = Path(shutil.copytree(dataset_dir, tmp_path / "data"))  # its keyinfo config is written: a copy of the session's

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LOCAL_"))}
    env["LOCAL_BASE_URL"] = server.base_url  # no LOCAL_API_KEY: a local server needs none
    env["CRAFTMD_LLM_PYTHON"] = str(server.python)  # the interpreter of .venv-llm, which a generation run starts
    serve = readme_serve_args()
    assert int(serve[serve.index("--n_ctx") + 1]) >= 12_288  # the many-choice MCQ in the window of a run's own server
    L = f"llama.cpp/{server.model_file}"  # a generation run's model: it starts its own server (docs/local.md)
    served = ("--serve-args", " ".join(serve))
    df = pl.read_parquet(dataset_dir / "all" / "test-00000-of-00001.parquet")
    # a text case (an image case has none)
    text = df.filter(pl.col("choices").list.len() == 4, pl.col("vignette").str.strip_chars() != "")
    case = text.sort(pl.col("vignette").str.len_chars(), "case_id")["case_id"][0]
    caps = ["--concurrency", "local=1", "--max-tokens", "32", "--seed", "7", "--quiet", "--cache", tmp_path / "cache.sqlite"]
    rels = tmp_path / "releases"

    # CRAFT-MD: the estimate (nothing sent); the many-choice MCQ within the README's window; the interview and its
    # questions, graded
    gen = generate_argv(dataset_dir, "--cases", case, "--max-turns", "2", *served, *caps, task="craftmd", doctor=L, quiet=False)
    est = craftmd(*gen, "--estimate", "--out", rels / "local", env=env).stdout
    logs = sorted((rels / "local.servers").glob("*.log"))  # the run's own server: started, sent nothing
    assert logs and not any('"POST /v1/chat/completions' in p.read_text(errors="replace") for p in logs)
    assert "too long" not in est and re.search(r"largest\s+doctor\s+\w+:mcq_many: ~[\d,]+", est)
    # the many-choice MCQ fits the README's window as llama.cpp counts it: its request (the longest prompt of any task,
    # caught by a loopback stand-in) in the model's own chat template, tokenized by the server (`/extras/tokenize`:
    # llama-cpp-python refuses a prompt whose tokens and max_tokens pass --n_ctx), with room for the reply. Sent, it
    # takes minutes of a busy CPU; the rest of the task's formats are sent below.
    from loopback import LoopbackServer

    with LoopbackServer(lambda req: "Final Diagnosis: (A)", models=("local-model",)) as lb:
        many = generate_argv(dataset_dir, "--cases", case, "--experiments", "vignette,mcq_many", "--max-tokens", "32",
                             task="craftmd", doctor=M, cache=tmp_path / "many.sqlite", out=tmp_path / "many")  # fmt: skip
        craftmd(*many, env={**env, "LOCAL_BASE_URL": lb.base_url})
    (request,) = lb.log  # one question: the vignette's, among every diagnosis
    chatml = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in request["messages"])
    tokens = post_json(
        server.base_url.removesuffix("/v1") + "/extras/tokenize/count", {"input": chatml + "<|im_start|>assistant\n"}
    )
    assert 6_000 < tokens["count"] and tokens["count"] + (request.get("max_tokens") or request["max_completion_tokens"]) <= int(
        serve[serve.index("--n_ctx") + 1]
    )
    craftmd(*gen, "--experiments", "multiturn,mcq4,frq", "--out", rels / "local", env=env)
    answers = read_release(rels / "local").table("answers").to_pylist()
    doctor = read_release(rels / "local").manifest.roles["doctor"]  # the run's own server, recorded as any server is
    assert doctor["service"] == "llamacpp" and doctor["served"]["engine"] == "llama.cpp" and doctor["served"]["options"] == serve
    assert {(a["setting"], a["format"]) for a in answers} == {("multiturn", "mcq4"), ("multiturn", "frq")}
    craftmd("score", rels / "local", "--dataset", dataset_dir, "--quiet", env=env)
    craftmd("score", rels / "local", "--dataset", dataset_dir, "--scorer", f"llm:{M}", "--allow-self", *caps, env=env)
    scores = pl.read_parquet(rels / "local" / "scores.parquet")
    for scorer in ("paper", "strict", "offline", "history", f"llm:{M}"):
        mine = statuses(scores.filter(pl.col("scorer") == scorer).to_dicts())
        assert mine.get("ok"), (scorer, mine)  # some scores, whatever failed is counted as failed

    # the consultation: the extraction (the small model rarely writes its JSON: then one line and exit 2, and the
    # case gets hand-written key-value items so the protocol still runs on the real model), the protocol, its scores
    out = craftmd("keyinfo", "extract", "--dataset", dataset_dir, "--model", M, "--cases", case, "--concurrency", "1", "--quiet",
                  "--cache", tmp_path / "cache.sqlite", env=env, ok=(0, 2))  # fmt: skip
    if out.returncode == 2:
        assert out.stderr.strip().splitlines()[-1].startswith("craftmd keyinfo: error: nothing extracted: all 1 cases failed")
        from craftmd.generation.keyinfo import write_keyinfo
        from craftmd.keyinfo import SCHEMA

        row = pl.read_parquet(dataset_dir / "keyinfo" / "test-00000-of-00001.parquet").to_dicts()[0]
        parts = [x for x in df.filter(pl.col("case_id") == case)["vignette"][0].split(". ") if x][:3]
        row.update(items=[{"key": " ".join(x.split()[:3]), "value": x} for x in parts], initial_request="I don't feel well.",
                   status="ok", error=None, model="test/hand-written")  # fmt: skip
        write_keyinfo(dataset_dir, [{k: row[k] for k in SCHEMA.names}], {"model": "test/hand-written"})
    options = ("--cases", case, "--experiments", "upper,lower,consult_100,oracle_direct_100", "--max-turns", "2", *caps)
    craftmd(
        *generate_argv(
            dataset_dir, *options, *served, task="consultation", doctor=L, solver=L, out=rels / "local-consult", quiet=False
        ),
        env=env,
    )
    craftmd("score", rels / "local-consult", "--dataset", dataset_dir, "--quiet", env=env)
    scores = pl.read_parquet(rels / "local-consult" / "scores.parquet")
    assert statuses(scores.filter(pl.col("scorer") == "offline").to_dicts()).get("ok")

    # an encounter (one packet) and its judge
    from craftmd.dataset_builder.packets import build_packets, load_packets

    medpi = tmp_path / "medpi"
    build_packets(medpi, seed=2, scale=0.05, cells=["seizure_disorder:treatment_advice"], progress=False)
    packet = load_packets(medpi)[0]["case_id"]
    options = ("--cases", packet, "--max-messages", "4", "--memory-tag-tokens", "96", *caps)
    craftmd(*generate_argv(medpi, *options, *served, task="encounters", doctor=L, out=rels / "local-medpi", quiet=False), env=env)
    craftmd(
        "score",
        rels / "local-medpi",
        "--dataset",
        medpi,
        "--scorer",
        f"judge:{M}",
        "--allow-self",
        "--mode",
        "dimension",
        "--dimensions",
        "communication.empathy,communication.clarity",
        "--response-format",
        "json_object",
        "--score-tokens",
        "200",
        "--max-invalid",
        "1",
        *caps,
        env=env,
    )  # one dimension a call: a reply the small model finishes within its cap
    judged = read_release(rels / "local-medpi").scorer_records()[f"judge:{M}"]
    assert judged["scored"] > 0, judged  # some scores (failures counted as failed, never all)

    # the page over all three releases, every image it shows there; the inspect logs of the CRAFT-MD release
    craftmd(*analyse_argv(rels, dataset_dir, tmp_path / "page", resamples=50, packets=medpi), env=env)
    html = (tmp_path / "page" / "index.html").read_text()
    assert all(f'id="{s}"' in html for s in ("consultation", "encounters"))
    for src in re.findall(r'\bsrc="([^"]+)"', html):
        assert (tmp_path / "page" / src).is_file(), src
    craftmd("export", rels / "local", "--inspect", tmp_path / "logs", env=env)
    assert sorted(p.suffix for p in (tmp_path / "logs").iterdir()) == [".eval"] * 2  # one log per setting and format
