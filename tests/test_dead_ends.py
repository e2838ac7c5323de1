"""No dead ends on the way from a run to a result (issue 30), offline against the loopback server.

- A command that produces nothing usable exits non-zero with one line naming the reason that failed most
  (``keyinfo extract`` with every case failed, ``score`` with every judge or grader call failed); one that
  produced part exits 0 and says how much failed.
- ``score --estimate`` is a table like ``generate --estimate``'s, with the calls a run sends at most (every
  reply asked again); a self-judge is estimated (estimating sends nothing) with the refusal a run would meet.
- The page never points at what is not there: releases whose steps failed (every case's key-value extraction,
  every emotion step) give a page whose every ``src`` exists and no empty figure, and a sentence with the count.
- The one-line errors name their way out: a failed source download names ``--source`` and ``$CRAFTMD_SOURCE``;
  ``generate --help`` says which tasks need ``--patient``.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest

from craftmd.commands.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from helpers import analyse_argv, generate_argv  # noqa: E402
from loopback import LoopbackServer, pick_upstream, write_replay_dataset  # noqa: E402
from test_consultation import Models, consult, extract, vignettes  # noqa: E402


@pytest.fixture(scope="module")
def picked(source) -> dict:
    return pick_upstream(source, 2, seed=11, max_messages=14)


@pytest.fixture(scope="module")
def two_cases(picked, tmp_path_factory) -> Path:
    """Two recorded cases as a dataset with a paper key (for grading)."""
    data = write_replay_dataset(picked, tmp_path_factory.mktemp("dead") / "data")
    f = data / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer").str.to_lowercase()).write_parquet(f)
    return data


def one_line_error(err: str, command: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith(f"craftmd {command}: error:")]
    assert len(lines) == 1, err
    return lines[0]


def srcs_exist(page: Path) -> list[str]:
    """Every ``src`` of the page, each checked to be a file beside it."""
    html = (page / "index.html").read_text()
    found = re.findall(r'\bsrc="([^"]+)"', html)
    for s in found:
        assert (page / s).is_file(), f"the page points at {s}, which is not there"
    return found


def test_keyinfo_extract_with_every_case_failed_exits_non_zero_and_names_why(two_cases, tmp_path, capsys):
    v = vignettes(two_cases)
    with LoopbackServer(Models({x: "prose" for x in v.values()})) as server:
        assert extract(two_cases, server.base_url, tmp_path / "c.sqlite") == 2
    line = one_line_error(capsys.readouterr().err, "keyinfo")
    assert "nothing extracted: all 2 cases failed" in line and "2 × invalid" in line and "no JSON object" in line
    # written all the same, every failure with its reason
    rows = pl.read_parquet(two_cases / "keyinfo" / "test-00000-of-00001.parquet")
    assert rows["status"].to_list() == ["invalid", "invalid"] and rows["error"].null_count() == 0
    # part extracted: exit 0, the failure counted
    first = sorted(v)[0]
    with LoopbackServer(Models({v[first]: "prose"})) as server:
        assert extract(two_cases, server.base_url, tmp_path / "d.sqlite") == 0
    assert "1 extracted, 1 failed" in capsys.readouterr().err


def test_the_page_of_releases_whose_steps_failed_points_at_nothing_missing(two_cases, tmp_path, capsys):
    """A consultation release without rounds (every extraction failed) and encounters without one valid emotion state."""
    from encounter_script import CELLS, Script, run

    from craftmd.dataset_builder.packets import build_packets

    v = vignettes(two_cases)
    with LoopbackServer(Models({x: "prose" for x in v.values()})) as server:
        assert extract(two_cases, server.base_url, tmp_path / "c.sqlite") == 2
        assert consult(two_cases, tmp_path / "consult" / "c1", server.base_url, tmp_path / "c.sqlite") == 0
    assert main(["score", str(tmp_path / "consult" / "c1"), "--dataset", str(two_cases), "--quiet"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty figure (matplotlib's "No artists with labels") fails the test
        assert main(analyse_argv(tmp_path / "consult", two_cases, tmp_path / "p1", resamples=50)) == 0
    assert not srcs_exist(tmp_path / "p1") and not (tmp_path / "p1" / "figures" / "consult_rounds.png").exists()
    page = (tmp_path / "p1" / "index.html").read_text()
    assert "the key-value extraction failed for 2 of 2 cases" in page and 'id="consultation"' in page
    assert "figures/consult_rounds.png" not in (tmp_path / "p1" / "leaderboard.md").read_text()

    class NoFeelings(Script):  # every emotion step unreadable
        def __call__(self, req):
            return "not json at all" if req["messages"][0]["content"].startswith("You read a patient") else super().__call__(req)

    medpi = tmp_path / "medpi"
    build_packets(medpi, seed=1, scale=0.05, cells=CELLS, progress=False)
    with LoopbackServer(NoFeelings(doctor_turns=2)) as server:
        run(server, medpi, tmp_path / "enc" / "e1", tmp_path / "e.sqlite")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(analyse_argv(tmp_path / "enc", medpi, tmp_path / "p2", resamples=50, packets=medpi)) == 0
    assert not srcs_exist(tmp_path / "p2") and not (tmp_path / "p2" / "figures" / "encounter_affect.png").exists()
    assert "the emotion step failed at all 4 patient turns" in (tmp_path / "p2" / "index.html").read_text()

    # ... and where the steps worked, the figures are there and the page shows them
    with LoopbackServer(Script(doctor_turns=2)) as server:
        run(server, medpi, tmp_path / "enc2" / "e2", tmp_path / "e2.sqlite")
    assert main(analyse_argv(tmp_path / "enc2", medpi, tmp_path / "p3", resamples=50, packets=medpi)) == 0
    assert "figures/encounter_affect.png" in srcs_exist(tmp_path / "p3")


def down(request: dict) -> str:
    raise ValueError("this server refuses every request")  # the loopback answers HTTP 400 (not retried)


def test_a_judge_whose_every_call_fails_exits_non_zero_and_partial_failure_is_counted(tmp_path, capsys):
    from test_judge import make_release, responder

    rel = make_release(tmp_path)
    argv = ["score", str(rel), "--scorer", "judge:openai/judge-a", "--dimensions", "final diagnosis", "--mode", "category",
            "--cache", str(tmp_path / "c.sqlite"), "--max-retries", "0", "--quiet"]  # fmt: skip
    with LoopbackServer(down, models=("judge-a",)) as server:
        assert main([*argv, "--base-url", server.base_url]) == 2
    err = capsys.readouterr().err
    line = one_line_error(err, "score")
    assert "nothing scored: judge:openai/judge-a" in line and "this server refuses every request" in line
    failed = pl.read_parquet(rel / "scores.parquet").filter(pl.col("scorer") == "judge:openai/judge-a")
    assert failed.height and set(failed["status"]) == {"error"}  # the failures are written, never a score

    # a judge that works, on a release with a failed conversation: exit 0, the failures counted
    with LoopbackServer(responder, models=("judge-a",)) as server:
        assert main([*argv, "--base-url", server.base_url]) == 0
    err = capsys.readouterr().err
    scores = pl.read_parquet(rel / "scores.parquet").filter(pl.col("scorer") == "judge:openai/judge-a")
    ok, bad = (scores["status"] == "ok").sum(), (scores["status"] == "error").sum()
    assert ok and bad and f"judge:openai/judge-a: {ok} scored, {bad} failed (mostly" in err and "error:" not in err


def test_a_grader_whose_every_call_fails_exits_non_zero(two_cases, tmp_path, capsys):
    with LoopbackServer(Models()) as server:
        assert extract(two_cases, server.base_url, tmp_path / "c.sqlite") == 0
        assert (
            consult(two_cases, tmp_path / "r" / "c1", server.base_url, tmp_path / "c.sqlite", "--experiments", "upper,frq") == 0
        )
    capsys.readouterr()
    with LoopbackServer(down, models=("grader",)) as server:
        rc = main(
            [
                "score",
                str(tmp_path / "r" / "c1"),
                "--dataset",
                str(two_cases),
                "--scorer",
                "offline",
                "--scorer",
                "llm:openai/grader",
                "--base-url",
                server.base_url,
                "--cache",
                str(tmp_path / "g.sqlite"),
                "--max-retries",
                "0",
                "--quiet",
            ]
        )
    assert rc == 2
    assert "nothing scored: llm:openai/grader" in one_line_error(capsys.readouterr().err, "score")
    scores = pl.read_parquet(tmp_path / "r" / "c1" / "scores.parquet")
    assert set(scores.filter(pl.col("scorer") == "offline")["status"]) == {"ok"}  # what worked is kept


def test_score_estimate_is_a_table_with_the_worst_case_and_a_self_judge_is_estimated(tmp_path, capsys):
    from test_judge import make_release

    rel = make_release(tmp_path, model="openai/judge-a")  # the judge's own model: a run is refused without --allow-self
    argv = [
        "score",
        str(rel),
        "--scorer",
        "judge:openai/judge-a",
        "--dimensions",
        "final diagnosis",
        "--mode",
        "category",
        "--quiet",
    ]
    with LoopbackServer(down, models=("judge-a",)) as server:
        assert main([*argv, "--base-url", server.base_url, "--max-invalid", "2", "--estimate"]) == 0
        assert server.calls == 0  # nothing sent
        out = capsys.readouterr().out
        assert main([*argv, "--base-url", server.base_url]) == 2  # the run itself is refused
        assert "own model family" in one_line_error(capsys.readouterr().err, "score") and server.calls == 0
    row = next(ln for ln in out.splitlines() if ln.startswith("judge:openai/judge-a"))
    calls, at_most = map(int, re.search(r"([\d,]+) \(\s*([\d,]+)\)", row).groups())
    # two judged conversations, one category each: a discussion and a scoring call, the scoring asked at most 2 more times
    assert (calls, at_most) == (4, 8)
    assert "a run would be refused" in out and "--allow-self" in out and not out.lstrip().startswith("{")


def test_the_judges_bar_keeps_its_total_when_replies_are_asked_again(tmp_path, capsys):
    from test_judge import make_release, responder

    asked: dict[str, int] = {}

    def invalid_first(request: dict) -> str:  # every scoring reply invalid the first time it is asked
        prompt = request["messages"][0]["content"]
        if not prompt.startswith("You chair a review committee") and len(request["messages"]) == 1:
            asked[prompt] = asked.get(prompt, 0) + 1
            return "no JSON here"
        return responder(request)

    rel = make_release(tmp_path)
    with LoopbackServer(invalid_first, models=("judge-a",)) as server:
        judge = ["score", str(rel), "--scorer", "judge:openai/judge-a", "--dimensions", "final diagnosis", "--mode", "category"]
        judge += ["--base-url", server.base_url]
        assert main([*judge, "--estimate"]) == 0
        row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("judge:openai/judge-a"))
        calls, at_most = map(int, re.search(r"([\d,]+) \(\s*([\d,]+)\)", row).groups())
        assert main([*judge, "--cache", str(tmp_path / "c.sqlite")]) == 0
        sent = server.calls
    assert calls < sent <= at_most  # asked again: more than expected, never more than the worst case
    bars = re.findall(r"judge:.*?(\d+)/(\d+) \[", capsys.readouterr().err)
    assert bars and bars[-1] == (str(sent), str(sent))  # the bar ends at its total: every re-ask counted in it


def test_estimate_lists_the_prompts_a_small_context_window_cannot_hold(dataset_dir, tmp_path, capsys):
    """A server that says its window (vLLM's max_model_len; 2,048 tokens, the README's old laptop server): --estimate
    names every many-choice MCQ (~8.6k tokens: its 1,136 diagnoses as options) as too long, by role and setting, and sends nothing; a run's
    start says the same before its first call."""
    from aiohttp import web

    class Windowed(LoopbackServer):
        async def _models(self, request):
            return web.json_response(
                {"object": "list", "data": [{"id": m, "object": "model", "max_model_len": 2048} for m in self.models]}
            )

    case = pl.read_parquet(dataset_dir / "all" / "test-00000-of-00001.parquet", columns=["case_id"])["case_id"][0]
    argv = generate_argv(dataset_dir, "--cases", case, "--max-turns", "1")
    with Windowed(lambda r: "Final diagnosis: flu", max_context=2048) as server:
        assert main([*argv, "--base-url", server.base_url, "--estimate", "--out", str(tmp_path / "r")]) == 0
        assert server.calls == 0
        out = capsys.readouterr().out
        too_long = re.findall(r"^too long\s+doctor (\w+):mcq_many: ~([\d,]+) prompt .*> the 2,048-token window", out, re.M)
        from craftmd.tasks.diagnosis import TASK

        assert (
            {s for s, _ in too_long}
            == {e.setting for e in TASK.experiments if e.format == "mcq_many"}
            >= {"vignette", "multiturn"}
        )
        assert all(int(n.replace(",", "")) > 6_000 for _, n in too_long)
        assert not re.search(r"^too long.*:mcq4:", out, re.M)  # the four-choice questions fit
        main([*argv, "--base-url", server.base_url, "--experiments", "vignette", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert "warning: doctor vignette:mcq_many" in err and "will fail" in err
    assert err.index("warning: doctor vignette:mcq_many") < err.index("release ")  # said before the run's summary


def test_a_servers_context_window_is_read_where_servers_report_it():
    """vLLM's /v1/models max_model_len and llama.cpp's /props n_ctx; a server that says neither: unknown, never a guess."""
    from aiohttp import web

    from craftmd.generation.context import context_window

    import asyncio
    import threading

    async def serve(app, port_box, ready, stop):
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_box.append(site._server.sockets[0].getsockname()[1])
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await runner.cleanup()

    async def models(request):
        return web.json_response({"data": [{"id": "m"}]})

    async def props(request):
        return web.json_response({"default_generation_settings": {"n_ctx": 4096}})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/props", props)
    port, ready, stop = [], threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: asyncio.run(serve(app, port, ready, stop)), daemon=True)
    t.start()
    ready.wait(10)
    try:
        assert context_window(f"http://127.0.0.1:{port[0]}/v1", "m") == 4096
    finally:
        stop.set()
        t.join(10)
    with LoopbackServer(lambda r: "x") as plain:  # says nothing of its window
        assert context_window(plain.base_url, "loopback") is None


def test_inspect_eval_of_a_local_service_needs_no_key(two_cases, picked, tmp_path):
    """``inspect eval`` with ``openai-api/local/...`` and ``LOCAL_BASE_URL`` but no ``LOCAL_API_KEY``, as under craftmd."""
    import os
    import shutil
    import subprocess

    from loopback import Replay

    inspect = shutil.which("inspect", path=str(Path(sys.executable).parent))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    case = sorted(picked["text"])[0]
    with LoopbackServer(Replay(picked["text"]), models=("doc",)) as server:
        env.update(LOCAL_BASE_URL=server.base_url, INSPECT_LOG_DIR=str(tmp_path / "logs"))
        proc = subprocess.run([inspect, "eval", "craftmd/craftmd", "--model", "openai-api/local/doc", "-T", f"dataset={two_cases}",
                               "-T", f"cases={case}", "-T", "experiments=vignette,frq", "--display", "plain", "--log-format", "eval"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert server.calls > 0 and set(server.keys) == {"EMPTY"}  # the placeholder craftmd's own clients send, never a key
    from craftmd.inspect_bridge.keys import local_key

    assert local_key("LOCAL_API_KEY", "sk-set") is None  # a key that is set is the key
    assert local_key("NOWHERE_API_KEY", "") is None  # no server named: inspect's own error stands


def test_exported_logs_carry_their_setting_and_format_as_task_arguments(tmp_path):
    import pyarrow as pa
    from inspect_ai.log import read_eval_log

    from craftmd.release import RunRecord, write_release

    answers = [{"case_id": "case_1", "trial": 0, "setting": s, "format": f, "with_image": False, "response": "x", "status": "ok",
                "error": None} for s in ("vignette", "multiturn") for f in ("mcq4", "frq")]  # fmt: skip
    from craftmd.release import ANSWERS_SCHEMA, CONVERSATIONS_SCHEMA

    rec = RunRecord(task="craftmd", release="tiny", kind="generated", model="openai/m", roles={"doctor": {"model": "openai/m"}})
    rel = write_release(
        tmp_path / "tiny",
        rec,
        {
            "answers": pa.Table.from_pylist(answers, ANSWERS_SCHEMA),
            "conversations": pa.Table.from_pylist([], CONVERSATIONS_SCHEMA),
        },
    )
    assert main(["export", str(rel), "--inspect", str(tmp_path / "logs"), "--quiet"]) == 0
    seen = {}
    for log in sorted((tmp_path / "logs").glob("*.eval")):
        spec = read_eval_log(str(log), header_only=True).eval
        seen[log.name] = spec.task_args
        setting, fmt = spec.task_args["experiments"].split(",")
        assert spec.task_args_passed == spec.task_args and log.name == f"tiny_{setting}_{fmt}.eval"
    assert sorted(a["experiments"] for a in seen.values()) == sorted(
        f"{s},{f}" for s in ("vignette", "multiturn") for f in ("mcq4", "frq")
    )


def test_the_one_line_errors_and_helps_name_the_way_out(tmp_path, capsys, monkeypatch):
    from craftmd import CraftMDError
    from craftmd.source import Source

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "the patient-AI: holds the case's vignette (or its history only) and answers the doctor (required)" in helptext
    # a download that cannot happen (an unreachable host) names the two ways to give the archive
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path))
    with pytest.raises(CraftMDError) as err:
        Source("http://127.0.0.1:9/craft-md.tar.gz")
    assert "--source" in str(err.value) and "$CRAFTMD_SOURCE" in str(err.value) and "\n" not in str(err.value)
