"""Inside the inspect_ai ecosystem (issue #23): the package's tasks run by ``inspect eval``, inspect logs into
releases, releases into logs.

``inspect eval craftmd/craftmd`` runs as a user runs it (the ``inspect`` command, found by the package's entry
point), against a loopback server replaying recorded upstream conversations; its log ingested is the release the
package's own ``craftmd generate`` + ``grade`` + ``history`` write against the same server, row for row, and the
release is on the page. An upstream release exported as logs and ingested back gives the same answers and scores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main
from craftmd.release import read_release, write_release

sys.path.insert(0, str(Path(__file__).parent))
from helpers import generate_argv  # noqa: E402
from loopback import LoopbackServer, Replay, pick_upstream, write_replay_dataset  # noqa: E402
from encounter_script import medpi  # noqa: E402,F401  (the fixture: a few MedPI packets)

INSPECT = str(Path(sys.executable).with_name("inspect"))
EXPERIMENTS = "multiturn,summarized,mcq4,frq"


def grader_responder(request: dict) -> str:
    """The LLM grader's two steps, deterministic: the extraction names the diagnosis after "Final Diagnosis"; the judge says correct."""
    text = request["messages"][-1]["content"]
    if "Diagnosis Diagnosis" in text or "is the same" in text.lower() or "correct answer" in text.lower():
        return "correct"
    return "Psoriasis"


@pytest.fixture(scope="module")
def tiny_dataset(upstream, tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect") / "data"
    write_replay_dataset(upstream, out)
    f = out / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer")).write_parquet(f)  # the paper rule's key
    return out


def claimed(scores: pa.Table) -> pl.DataFrame:
    """An ingested log's scores with the ``claimed:`` of each scorer taken off: ingest keeps a log's scores as claims."""
    df = pl.from_arrow(scores)
    assert df["scorer"].str.starts_with("claimed:").all()
    return df.with_columns(pl.col("scorer").str.strip_prefix("claimed:"))


def inspect_eval(task: str, model: str, *args, env: dict, cwd: Path, roles: dict, options: dict) -> None:
    """``inspect eval TASK --model MODEL`` with each of ``roles`` (``--model-role ROLE=MODEL``) and of the task's ``options``
    (``-T NAME=VALUE``), then ``args``, in ``cwd`` with ``env``; it must succeed."""
    argv = [INSPECT, "eval", task, "--model", model, *(x for r, m in roles.items() for x in ("--model-role", f"{r}={m}"))]
    argv += [*(x for k, v in options.items() for x in ("-T", f"{k}={v}")), *map(str, args)]
    proc = subprocess.run(
        [*argv, "--display", "plain", "--log-format", "eval"], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(upstream, tiny_dataset, tmp_path_factory):
    """The same two cases, two trials, through ``inspect eval`` and through ``craftmd generate``, one deterministic server."""
    root = tmp_path_factory.mktemp("runs")
    ids = ",".join(sorted(upstream["text"]))
    replay = Replay(upstream["text"])
    with LoopbackServer(replay, models=("doc", "pat")) as loop, LoopbackServer(grader_responder, models=("g",)) as grade:
        env = dict(
            os.environ,
            LOOP_BASE_URL=loop.base_url,
            LOOP_API_KEY="sk-loop-1111",
            GRADE_BASE_URL=grade.base_url,
            GRADE_API_KEY="sk-grade-2222",
            INSPECT_LOG_DIR=str(root / "logs"),
        )
        roles = {"patient": "openai-api/loop/pat", "grader": "openai-api/grade/g"}
        options = {"dataset": tiny_dataset, "cases": ids, "experiments": EXPERIMENTS}
        inspect_eval("craftmd/craftmd", "openai-api/loop/doc", "--epochs", "2", env=env, cwd=root, roles=roles, options=options)
        inspect_calls = loop.calls
        old = {k: os.environ.get(k) for k in ("LOOP_BASE_URL", "LOOP_API_KEY", "GRADE_BASE_URL", "GRADE_API_KEY")}
        os.environ.update({k: env[k] for k in old})
        try:
            gen = root / "gen"
            options = ("--cases", ids, "--experiments", EXPERIMENTS, "--trials", "2")
            roles = {"doctor": "openai-api/loop/doc", "patient": "openai-api/loop/pat"}
            assert main(generate_argv(tiny_dataset, *options, **roles, cache=root / "cache.sqlite", out=gen)) == 0
            for g in ("paper", "strict", "offline", "llm:openai-api/grade/g", "history"):
                assert main(["score", str(gen), "--dataset", str(tiny_dataset), "--scorer", g, "--quiet"]) == 0
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert not replay.mismatches
    logs = sorted((root / "logs").glob("*.eval"))
    assert len(logs) == 1
    return {"root": root, "log": logs[0], "generated": gen, "inspect_calls": inspect_calls, "ids": ids.split(",")}


def test_inspect_eval_runs_the_protocol_and_its_log_ingests_into_the_release_generate_writes(runs, tiny_dataset):
    root = runs["root"]
    assert runs["inspect_calls"] > 0  # inspect's own openai-api provider called the loopback server
    out = root / "releases" / "via-inspect"
    assert main(["ingest", "--inspect", str(runs["log"]), "--out", str(out)]) == 0
    ours, theirs = read_release(out), read_release(runs["generated"])
    for table in ("conversations", "answers"):
        assert ours.table(table).equals(theirs.table(table)), table
    a, b = ours.scores_with_records()[0], theirs.scores_with_records()[0]
    assert claimed(a).equals(pl.from_arrow(b))  # the log's scores, kept as its claims (scorer claimed:<name>)
    assert set(pc.unique(b.column("scorer")).to_pylist()) == {"paper", "strict", "offline", "llm:openai-api/grade/g", "history"}
    answers = ours.table("answers").to_pylist()
    assert {a["trial"] for a in answers} == {0, 1} and {a["setting"] for a in answers} == {"multiturn", "summarized"}
    # the run record: each role, the dataset, the prompt set, inspect's version; never a key
    m = ours.manifest
    assert m.kind == "generated" and m.task == "craftmd" and m.model == "openai-api/loop/doc"
    assert m.roles["patient"]["model"] == "openai-api/loop/pat" and m.roles["grader"]["model"] == "openai-api/grade/g"
    assert m.roles["summarizer"]["model"] == "openai-api/loop/pat"
    assert m.roles["doctor"]["sampling"] == theirs.manifest.roles["doctor"]["sampling"]
    assert m.prompt_set == theirs.manifest.prompt_set and m.source["dataset_sha256"] == theirs.manifest.source["dataset_sha256"]
    assert m.protocol == theirs.manifest.protocol and m.protocol.version == 2  # the protocol it ran, as generate records it
    from importlib.metadata import version

    assert m.dependencies["inspect_ai"] == version("inspect-ai") == m.producer["inspect"]["inspect_ai"]
    text = (out / "manifest.json").read_text()
    assert "sk-loop-1111" not in text and "sk-grade-2222" not in text
    # claims make no score current: the leaderboard's scoring computes the scorers again, and they agree with the log
    from craftmd.scoring.score import stale

    assert stale(out, tiny_dataset, ["paper", "strict", "offline", "history"]) == ["paper", "strict", "offline", "history"]
    assert main(["score", str(out), "--dataset", str(tiny_dataset), "--quiet"]) == 0
    assert stale(out, tiny_dataset, ["paper", "strict", "offline", "history"]) == []
    ours = read_release(out)
    scored = pl.from_arrow(ours.scores_with_records()[0]).filter(~pl.col("scorer").str.starts_with("claimed:"))
    assert scored.equals(pl.from_arrow(b).filter(pl.col("scorer") != "llm:openai-api/grade/g"))
    assert all(ours.scorer_records()[g]["claims"]["disagree"] == 0 for g in ("paper", "strict", "offline", "history"))
    # and on the page, as any release is
    site = root / "site"
    assert (
        main(
            [
                "analyse",
                "--releases",
                str(root / "releases"),
                "--dataset",
                str(tiny_dataset),
                "--out",
                str(site),
                "--page",
                "--resamples",
                "50",
            ]
        )
        == 0
    )
    page = (site / "index.html").read_text()
    assert "via-inspect" in page
    assert "inspect view --log-dir logs/via-inspect" in page  # the page says how to read its conversations in inspect view
    rec = ours.scorer_records()
    assert rec["history"]["conversations"] == 4 and rec["paper"]["graded"] == theirs.scorer_records()["paper"]["graded"]
    assert "via-inspect" in pl.read_csv(site / "tables" / "accuracy.csv")["model"].to_list()


def test_a_log_of_another_task_or_an_unfinished_one_is_refused_in_one_line(runs, tmp_path, capsys):
    from inspect_ai.log import read_eval_log, write_eval_log

    log = read_eval_log(str(runs["log"]))
    other = log.model_copy(deep=True)
    other.eval.task = "inspect_evals/healthbench"
    write_eval_log(other, str(tmp_path / "other.eval"))
    unfinished = log.model_copy(deep=True)
    unfinished.status = "started"
    write_eval_log(unfinished, str(tmp_path / "unfinished.eval"))
    (tmp_path / "junk.eval").write_bytes(b"not a zip")
    for name, says in (
        ("other", "a log of task 'inspect_evals/healthbench'"),
        ("unfinished", "an unfinished log (status started)"),
        ("junk", "not an inspect log"),
    ):
        rc = main(["ingest", "--inspect", str(tmp_path / f"{name}.eval"), "--out", str(tmp_path / f"r-{name}")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and err.count("\n") == 0 and says in err, err
        assert not (tmp_path / f"r-{name}").exists()


@pytest.fixture(scope="module")
def exported(releases_dir, tmp_path_factory):
    """An upstream release over a sample of its cases, and its export: one inspect log per setting and format."""
    tmp_path = tmp_path_factory.mktemp("export")
    src = read_release(releases_dir / "gpt4_1106")
    ids = sorted(set(src.table("answers").column("case_id").to_pylist()))[::150]
    arr = pa.array(ids, pa.string())
    keep = lambda t: t.filter(pc.is_in(t.column("case_id"), arr))  # noqa: E731
    scores, records = src.scores_with_records()
    m = src.manifest.model_copy(update={"release": "gpt4-sample", "files": {}})
    sample = write_release(
        tmp_path / "gpt4-sample", m, {t: keep(src.table(t)) for t in ("conversations", "answers")}, scores=(keep(scores), records)
    )
    assert main(["export", str(sample), "--inspect", str(tmp_path / "logs"), "--quiet"]) == 0
    return read_release(sample), tmp_path / "logs"


def test_export_then_ingest_gives_back_an_upstream_release(exported, tmp_path):
    """An upstream release over a sample of its cases → inspect logs (one per setting and format) → the same release."""
    rel, folder = exported
    logs = sorted(folder.glob("*.eval"))
    pairs = {(a["setting"], a["format"]) for a in rel.table("answers").select(["setting", "format"]).to_pylist()}
    assert len(logs) == len(pairs)
    assert all(zipfile.is_zipfile(p) for p in logs)
    assert main(["ingest", "--inspect", *map(str, logs), "--out", str(tmp_path / "back")]) == 0
    back = read_release(tmp_path / "back")
    for table in ("conversations", "answers"):
        assert back.table(table).equals(rel.table(table)), table
    a, ra = back.scores_with_records()
    b, rb = rel.scores_with_records()
    assert claimed(a).equals(pl.from_arrow(b))  # the log's scores come back as its claims, marked as such
    assert ra == {f"claimed:{g}": dict(r, claimed=True, reported_by="an inspect log") for g, r in rb.items()}
    same = {
        "release",
        "files",
        "git_revision",
        "kind",
        "notes",
    }  # a log makes no upstream release: it comes back generated, saying so
    assert back.manifest.model_dump(exclude=same) == rel.manifest.model_dump(exclude=same)
    assert back.manifest.kind == "generated" and back.manifest.notes == {
        **rel.manifest.notes,
        "ingested_from": back.manifest.notes["ingested_from"],
    }
    # a sample is an answer: its conversation as messages, the answer as the last one, its scores
    from inspect_ai.log import read_eval_log

    log = read_eval_log(str(next(p for p in logs if p.name.endswith("_multiturn_frq.eval"))))
    s = log.samples[0]
    assert log.eval.task == "craftmd/craftmd" and log.status == "success"
    assert s.metadata["setting"] == "multiturn" and s.epoch == s.metadata["trial"] + 1
    assert s.messages[0].role == "system" and s.messages[-1].role == "assistant" and "upstream-gpt4" in s.scores


def test_an_export_refuses_what_is_not_a_release(tmp_path, capsys):
    rc = main(["export", str(tmp_path), "--inspect", str(tmp_path / "logs")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "not a release" in err and err.count("\n") == 0
    with pytest.raises(CraftMDError, match="no such log"):
        from craftmd.inspect_bridge.logs import ingest_logs

        ingest_logs([tmp_path / "none.eval"], tmp_path / "r")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _screenshot(url: str, out: Path, wait_for: str, profile: Path, timeout: float = 90) -> str:
    """Open ``url`` in headless Chromium (DevTools over its debugging port), wait until the page's text holds
    ``wait_for`` (the viewer loads a sample after the page), screenshot it; the page's text."""
    import asyncio
    import base64
    import json
    import time
    from urllib.parse import quote

    import aiohttp

    port = _free_port()
    proc = subprocess.Popen(
        [
            shutil.which("chromium") or "/usr/bin/chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--remote-debugging-port={port}",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession() as http:
            target = None
            for _ in range(150):
                try:
                    async with http.put(f"http://127.0.0.1:{port}/json/new?{quote(url, safe=':/')}") as r:
                        target = await r.json()
                        break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.2)
            assert target, "chromium did not start"
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                n = 0

                async def call(method: str, params: dict | None = None) -> dict:
                    nonlocal n
                    n += 1
                    await ws.send_json({"id": n, "method": method, "params": params or {}})
                    while True:
                        msg = json.loads((await ws.receive()).data)
                        if msg.get("id") == n:
                            return msg.get("result", {})

                await call(
                    "Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 2000, "deviceScaleFactor": 1, "mobile": False}
                )
                text, deadline = "", time.monotonic() + timeout
                while wait_for not in text and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    r = await call(
                        "Runtime.evaluate", {"expression": "document.body ? document.body.innerText : ''", "returnByValue": True}
                    )
                    text = r["result"].get("value") or ""
                await asyncio.sleep(1)  # let the last frame paint
                out.write_bytes(base64.b64decode((await call("Page.captureScreenshot", {"format": "png"}))["data"]))
                return text
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_inspect_view_shows_an_exported_conversation(exported, tmp_path):
    """``inspect view`` over the exported logs, in headless Chromium: a sample's messages are the release's conversation."""
    import asyncio

    rel, folder = exported
    conv = next(c for c in rel.table("conversations").to_pylist() if c["conversation"] == "standard" and c["trial"] == 0)
    patient_first = conv["messages"][2]["content"]
    port = _free_port()
    view = subprocess.Popen(
        [INSPECT, "view", "--log-dir", str(folder), "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        log = next(p.name for p in folder.glob("*_multiturn_frq.eval"))
        url = f"http://127.0.0.1:{port}/#/logs/{log}/samples/sample/{conv['case_id']}/1/messages"
        shot = tmp_path / "inspect-view.png"
        text = asyncio.run(_screenshot(url, shot, patient_first[:60], tmp_path / "profile"))
    finally:
        os.killpg(view.pid, 15)
        view.wait(timeout=10)
    assert patient_first[:60] in text, text[:500]
    assert conv["messages"][1]["content"] in text  # the doctor's opening line
    assert "\nSCORE" in text.upper(), text[:1500]  # the sample's score (SCORE, or SCORES when several)
    assert shot.stat().st_size > 50_000  # a rendered conversation, not a blank page
    if os.environ.get("CRAFTMD_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["CRAFTMD_KEEP_SCREENSHOT"])


def test_a_real_model_through_inspect_eval(real_model, dataset_dir, tmp_path):
    """SmolLM2 behind llama.cpp's server as doctor and patient of one case, run by ``inspect eval``; the log ingests."""
    case = pl.read_parquet(dataset_dir / "all" / "test-00000-of-00001.parquet").filter(pl.col("source") == "medqa_usmle")[
        "case_id"
    ][0]
    start = real_model.chat_requests()
    env = dict(os.environ, SMOL_BASE_URL=real_model.base_url, SMOL_API_KEY="none")
    m = "openai-api/smol/smollm2"
    options = {"dataset": dataset_dir, "cases": case, "experiments": "multiturn,mcq4", "max_turns": 3, "max_tokens": 48}
    args = ("--log-dir", tmp_path / "logs", "--max-connections", "1")
    inspect_eval("craftmd/craftmd", m, *args, env=env, cwd=tmp_path, roles={"patient": m}, options=options)
    assert real_model.chat_requests() - start >= 3  # the real server answered the doctor's and the patient's turns
    out = tmp_path / "release"
    assert main(["ingest", "--inspect", str(next((tmp_path / "logs").glob("*.eval"))), "--out", str(out)]) == 0
    rel = read_release(out)
    [conv] = rel.table("conversations").to_pylist()
    assert conv["case_id"] == case and conv["n_turns"] >= 1 and conv["ended"] in ("final_diagnosis", "no_question", "max_turns")
    [answer] = rel.table("answers").to_pylist()
    assert (answer["setting"], answer["format"], answer["status"]) == ("multiturn", "mcq4", "ok") and answer["response"]
    scores = rel.scores_with_records()[0].to_pylist()
    assert {r["scorer"] for r in scores} >= {"claimed:paper", "claimed:strict", "claimed:history"}
    assert rel.manifest.roles["doctor"]["model"] == "openai-api/smol/smollm2"


def test_the_consultation_task_under_inspect_eval_is_the_release_generate_writes(source, tmp_path, monkeypatch):
    """``inspect eval craftmd/consultation`` (doctor, lazy patient, the ``solver`` role) ingested = ``craftmd generate --task
    consultation`` + the MCQ rules and the offline grader against the same server."""
    from test_consultation import Models, extract

    data = tmp_path / "data"
    write_replay_dataset(pick_upstream(source, 2, seed=11, max_messages=14), data)
    f = data / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer")).write_parquet(f)
    with LoopbackServer(Models(), models=("loopback",)) as server:
        assert extract(data, server.base_url, tmp_path / "k.sqlite") == 0
        env = dict(os.environ, LOOP_BASE_URL=server.base_url, LOOP_API_KEY="k")
        m = "openai-api/loop/loopback"
        options = {"dataset": data, "experiments": "upper,consult_40,oracle_random_100,mcq4,frq", "seed": 3, "temperature": 0}
        roles = {"patient": m, "solver": m}
        inspect_eval(
            "craftmd/consultation", m, "--log-dir", tmp_path / "logs", env=env, cwd=tmp_path, roles=roles, options=options
        )
        monkeypatch.setenv("LOOP_BASE_URL", server.base_url)
        gen = tmp_path / "gen"
        options = ("--experiments", "upper,consult_40,oracle_random_100,mcq4,frq", "--seed", "3", "--temperature", "0")
        argv = generate_argv(data, *options, task="consultation", doctor=m, solver=m, cache=tmp_path / "c.sqlite", out=gen)
        assert main(argv) == 0
    for g in ("paper", "strict", "offline"):  # (the history metrics are CRAFT-MD's; the keyinfo scorer is not run under inspect)
        assert main(["score", str(gen), "--dataset", str(data), "--scorer", g, "--quiet"]) == 0
    out = tmp_path / "via-inspect"
    assert main(["ingest", "--inspect", str(next((tmp_path / "logs").glob("*.eval"))), "--out", str(out)]) == 0
    ours, theirs = read_release(out), read_release(gen)
    assert ours.manifest.task == "consultation" and ours.manifest.roles["solver"]["model"] == m
    for table in ("conversations", "answers"):
        assert ours.table(table).equals(theirs.table(table)), table
    assert {c["conversation"] for c in ours.table("conversations").to_pylist()} == {"consult", "oracle_random"}
    assert claimed(ours.scores_with_records()[0]).equals(pl.from_arrow(theirs.scores_with_records()[0]))


def test_the_encounters_task_under_inspect_eval_is_the_release_encounters_generate_writes(medpi, tmp_path, monkeypatch):
    """``inspect eval craftmd/encounters`` (scripted doctor and AI patient on a loopback server) ingested = ``craftmd
    generate --task encounters``: the conversations, every patient state, the closures and the memory tags."""
    from encounter_script import Script

    from craftmd.generation.runner import GenerateSpec, generate

    m = "openai-api/loop/loopback"
    with LoopbackServer(Script(doctor_turns=2), models=("loopback",)) as server:
        env = dict(os.environ, LOOP_BASE_URL=server.base_url, LOOP_API_KEY="k")
        args = ("--epochs", "2", "--log-dir", tmp_path / "logs")
        inspect_eval("craftmd/encounters", m, *args, env=env, cwd=tmp_path, roles={"patient": m}, options={"dataset": medpi})
        monkeypatch.setenv("LOOP_BASE_URL", server.base_url)
        generate(
            GenerateSpec(
                task="encounters",
                dataset=medpi,
                out=tmp_path / "gen",
                doctor=m,
                patient=m,
                trials=2,
                cache=tmp_path / "c.sqlite",
                progress=False,
                max_retries=1,
                backoff=0.01,
            )
        )
    out = tmp_path / "via-inspect"
    assert main(["ingest", "--inspect", str(next((tmp_path / "logs").glob("*.eval"))), "--out", str(out)]) == 0
    ours, theirs = read_release(out), read_release(tmp_path / "gen")
    assert ours.manifest.task == "encounters" and ours.manifest.counts["trials"] == 2
    for table in ("conversations", "patient_states", "closures", "memory_tags"):
        assert ours.table(table).num_rows > 0 and ours.table(table).equals(theirs.table(table)), table
    assert ours.table("conversations").num_rows == 2 * theirs.manifest.counts["cases"]
