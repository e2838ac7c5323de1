"""Every craftmd task under ``inspect eval`` through one factory (issue #31): a task file runs as inspect users run
theirs (``inspect eval path/to/task.py``), its log ingests into a release, and ``craftmd score`` of that release gives
the scores the log holds. The runner takes its roles as given calls (``Runner(spec, calls=...)``), opening nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASK_FILE = Path("tests") / "fixtures" / "oneword" / "oneword.py"  # relative: as a user types it, from the checkout
INSPECT = str(Path(sys.executable).with_name("inspect"))


@pytest.fixture(scope="module")
def tiny_dataset(source, tmp_path_factory):
    """Three recorded cases as a built dataset (with the graders' answer key, as a built dataset has)."""
    import polars as pl
    from loopback import pick_upstream, write_replay_dataset

    out = tmp_path_factory.mktemp("inspect-tasks") / "data"
    write_replay_dataset(pick_upstream(source, 3, seed=2, max_messages=12), out)
    f = out / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer")).write_parquet(f)
    return out


def answer(request: dict) -> str:
    """One, two or three words, by the length of the last message."""
    return " ".join(["dermatitis"] * (1 + len(request["messages"][-1]["content"]) % 3))


def run(args: list, env: dict, tool: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*tool, *map(str, args)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


def toy_eval(dataset, log_dir, *args, env: dict) -> subprocess.CompletedProcess:
    """``inspect eval`` of the toy task file on ``dataset``, the model ``toy/m`` its doctor and patient, logs in ``log_dir``."""
    argv = ["eval", TASK_FILE, "--model", "openai-api/toy/m", "-T", f"dataset={dataset}", *args, "--log-dir", log_dir]
    return run([*argv, "--display", "plain", "--log-format", "eval"], env, [INSPECT])


def craftmd(args: list, env: dict) -> subprocess.CompletedProcess:
    return run(args, env, [sys.executable, "-m", "craftmd.commands.cli"])


@pytest.fixture(scope="module")
def toy_log(tiny_dataset, tmp_path_factory):
    """``inspect eval`` of the toy task file, two epochs, against a loopback server; the log and the env that ran it."""
    root = tmp_path_factory.mktemp("inspect-toy")
    with LoopbackServer(answer, models=("m",)) as server:
        env = dict(os.environ, TOY_BASE_URL=server.base_url, CRAFTMD_TASKS=str(ROOT / TASK_FILE))
        env.pop("TOY_API_KEY", None)  # a local server: no key (the package's inspect hook)
        proc = toy_eval(tiny_dataset, root / "logs", "--epochs", "2", env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert server.calls >= 6  # three cases, two epochs: at least the doctor's call each
    logs = sorted((root / "logs").glob("*.eval"))
    assert len(logs) == 1
    return logs[0], env, root


def test_a_task_file_runs_under_inspect_eval_and_craftmd_score_gives_its_scores(toy_log, tiny_dataset):
    from inspect_ai.log import read_eval_log

    log, env, root = toy_log
    got = read_eval_log(str(log))
    assert got.status == "success" and len(got.samples) == 6
    # the log's own scores: scorer -> (case, trial, "setting/format") -> value
    logged = {}
    for s in got.samples:
        for g, sc in s.scores.items():
            values = sc.value if isinstance(sc.value, dict) else {"": sc.value}
            for key, v in values.items():
                logged[(g, s.metadata["case_id"], s.epoch - 1, key)] = v
    assert logged
    # the log as a release, scored by craftmd score (the task known through $CRAFTMD_TASKS)
    rel = root / "releases" / "via-inspect"
    out = craftmd(["ingest", "--inspect", log, "--out", rel], env)
    assert out.returncode == 0, out.stderr
    out = craftmd(["score", rel, "--dataset", tiny_dataset, "--quiet"], env)
    assert out.returncode == 0, out.stderr
    answers = pq.read_table(rel / "answers.parquet").to_pylist()
    assert len(answers) == 6 and all(a["status"] == "ok" for a in answers)
    rows = [r for r in pq.read_table(rel / "scores.parquet").to_pylist() if not r["scorer"].startswith("claimed:")]
    assert rows
    scored = {(r["scorer"], r["case_id"], r["trial"], f"{r['setting']}/{r['format']}"): r["value"] for r in rows}
    assert scored == logged  # every score craftmd computes is the log's, and the log holds no other
    claims = {r["scorer"] for r in pq.read_table(rel / "scores.parquet").to_pylist() if r["scorer"].startswith("claimed:")}
    assert claims == {f"claimed:{g}" for g, *_ in scored}


def test_a_task_option_it_does_not_have_is_refused_naming_the_known_ones(tiny_dataset, tmp_path):
    env = dict(os.environ, TOY_BASE_URL="http://127.0.0.1:9/v1")
    proc = toy_eval(tiny_dataset, tmp_path / "logs", "-T", "no_such_option=3", env=env)
    assert proc.returncode != 0
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("craftmd.CraftMDError: ")]
    assert len(said) == 1 and "no_such_option" in said[0], (proc.stdout + proc.stderr)[
        -2000:
    ]  # inspect shows where, then the line


def test_a_runner_on_given_calls_opens_no_connection_and_writes_nothing(tiny_dataset, tmp_path, monkeypatch):
    """The protocol's jobs through calls a harness gives: no server asked, no key needed, no cache, no release."""
    from craftmd.generation.runner import GenerateSpec, runner_for
    from craftmd.models.base import Completion
    from craftmd.scoring.llm_grader import LLMGrader
    from craftmd.tasks import get_task

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    sent = []

    async def call(messages, sampling):
        sent.append(messages)
        return Completion("Psoriasis", "ok", "stop", 10, 1)

    cache, out = tmp_path / "cache.sqlite", tmp_path / "release"
    run = {"options": {"max_turns": 2}, "experiments": ["multiturn", "mcq4"]}
    spec = GenerateSpec(dataset=tiny_dataset, out=out, doctor="openai/nobody", task="craftmd", cache=cache, **run)
    with pytest.raises(CraftMDError):  # without calls: the model's server and key are checked, as craftmd generate does
        runner_for(get_task("craftmd"))(spec)
    runner = runner_for(get_task("craftmd"))(spec, calls={"doctor": call, "patient": call, "summarizer": call})
    rows = asyncio.run(runner.run_job(runner.jobs()[0]))
    assert rows["answers"] and rows["conversations"] and all(a["status"] == "ok" for a in rows["answers"])
    assert runner.tallies["doctor"].requests + runner.tallies["patient"].requests == len(sent) > 0
    with pytest.raises(CraftMDError, match="no call"):
        runner_for(get_task("craftmd"))(spec, calls={"doctor": call})
    asked = []

    async def grade(messages, sampling):  # upstream's grader-AI: the extraction, then the yes/no equivalence
        asked.append(messages)
        return Completion("Psoriasis" if len(asked) == 1 else "Yes", "ok", "stop", 10, 1)

    grader = LLMGrader("openai/nobody", call=grade)
    graded = grader.grade_many([("It is psoriasis.", "Psoriasis")], progress=False)
    assert [(g.resolved, g.correct) for g in graded] == [("psoriasis", True)] and len(asked) == 2  # lower-cased
    assert not cache.exists() and not out.exists()
