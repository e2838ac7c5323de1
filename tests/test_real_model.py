"""A real model in the loop: SmolLM2-135M-Instruct (llama.cpp's OpenAI-compatible server, tests/realmodel.py).

What a user relies on when they point ``craftmd`` at a real server, end to end through the
command line: ``generate`` (every setting and format) killed with ``kill -9`` and resumed,
then re-run over its cache; the LLM grader (refused on its own model unless forced, then marked)
and the offline grader; the history-taking metrics; MELD; the page. Nothing
here asserts what the 135M model answers: only that releases are complete, every failed call
keeps its reason, the many-choice MCQ (~8.6k tokens, over the 6k context) fails with the
server's context-length reason, a re-run over a full cache sends nothing and writes the same
bytes, and the API key is nowhere on disk.

Sized for ~2 min on 2 cores: the shortest case (~25 requests: killed after 12), two doctor turns, 32 tokens per reply.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from craftmd.release import read_release
from craftmd.tasks import get_task

from helpers import analyse_argv, craftmd, generate_argv

MODEL = "openai/smollm2"
N_CASES = 1
KEY = "sk-craftmd-real-model-test-0123456789abcdef"  # must never reach a file
COMMON = ["--max-turns", "2", "--max-tokens", "32", "--temperature", "1.0", "--seed", "7"]


def release_bytes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def cached_rows(cache: Path) -> int:
    try:
        with sqlite3.connect(cache, timeout=5) as db:
            return db.execute("SELECT count(*) FROM requests").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def check_scores(release: Path, graders: list[str]) -> None:
    """After grading: every FRQ answer has a verdict or a failure with its reason, for each grader.

    Kept in this one helper: the scores table is being reshaped (long form) while this test is written.
    """
    answers = pq.read_table(release / "answers.parquet").to_pylist()
    frq = {(a["case_id"], a["setting"], a["with_image"]) for a in answers if a["format"] == "frq"}
    scores = pl.read_parquet(release / "scores.parquet")
    for grader in graders:
        mine = scores.filter((pl.col("scorer") == grader) & (pl.col("metric") == "correct")).to_dicts()
        assert {(s["case_id"], s["setting"], s["with_image"]) for s in mine} == frq, grader
        for s in mine:
            if s["status"] == "ok":
                assert s["value"] in (0.0, 1.0)
            else:
                assert s["value"] is None and s["detail"], f"{grader}: a failed score must keep its reason"


@pytest.fixture(scope="module")
def short_cases(dataset_dir) -> list[str]:
    """The shortest cases that take part in every setting and format (an exam to split off, four choices)."""
    df = pl.read_parquet(dataset_dir / "all" / "test-00000-of-00001.parquet")
    full = df.filter(
        (pl.col("history").str.len_chars() > 0)
        & (pl.col("physical_exam").str.len_chars() > 0)
        & (pl.col("choices").list.len() == 4)
    )
    return full.sort(pl.col("vignette").str.len_chars(), "case_id")["case_id"].head(N_CASES).to_list()


def test_a_real_model_end_to_end(real_model, dataset_dir, short_cases, tmp_path):
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    cache, releases = tmp_path / "cache.sqlite", tmp_path / "releases"
    rel = releases / "smollm2"
    start = real_model.chat_requests()  # the server is shared by the session: count this test's requests only
    where = {"base_url": real_model.base_url, "cache": cache}
    gen = generate_argv(dataset_dir, "--cases", ",".join(short_cases), *COMMON, doctor=MODEL, **where)

    # 1. Killed with kill -9 mid-run: nothing is written, what finished is in the cache.
    killed = subprocess.Popen(
        [sys.executable, "-m", "craftmd.commands.cli", *map(str, gen), "--concurrency", "1", "--out", tmp_path / "killed"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 240
    while cached_rows(cache) < 12 and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    before = cached_rows(cache)
    assert before >= 12, "the run should have been killed mid-way"
    assert not (tmp_path / "killed").exists()

    # 2. Resumed: the release is complete, and no call that finished before the kill is made again.
    run = craftmd(*gen, "--concurrency", "4", "--out", rel, env=env)
    sent = real_model.chat_requests()
    after = cached_rows(cache)
    assert sent - start - after <= 1, "only the one request in flight at the kill may be sent twice"
    release = read_release(rel)
    answers = release.table("answers").to_pylist()
    assert {(a["case_id"], a["setting"], a["format"]) for a in answers} == set(
        itertools.product(short_cases, get_task("craftmd").settings, get_task("craftmd").formats)
    )
    conversations = release.table("conversations").to_pylist()
    assert {(c["case_id"], c["conversation"]) for c in conversations} == set(
        itertools.product(short_cases, ("standard", "no_exam"))
    )

    # Every failure keeps its reason; the many-choice MCQ overflows the 6k context and says so.
    for row in answers + conversations:
        failed = row.get("status", row.get("ended")) in ("error", "refusal")
        assert bool(row["error"]) == failed or row.get("status") == "refusal", row
    many = [a for a in answers if a["format"] == "mcq_many"]
    assert many and all(a["status"] == "error" and "context_length_exceeded" in a["error"] for a in many)
    assert "context_length_exceeded" in run.stderr and "deterministic" in run.stderr
    counts = release.manifest.counts
    assert counts["failures"] >= len(many) and any("context_length_exceeded" in r for r in counts["failures_by_reason"])
    assert release.manifest.roles["doctor"]["base_url"] == real_model.base_url

    # 3. A re-run over the full cache: no request reaches the server, the same bytes.
    again = craftmd(*gen, "--out", tmp_path / "again" / "smollm2", env=env)
    assert real_model.chat_requests() == sent
    assert release_bytes(rel) == release_bytes(tmp_path / "again" / "smollm2")
    assert f"{sum(counts['requests'].values())}: 0 sent" in again.stderr

    # 4. The model may not grade itself unless forced; graded by the LLM grader (the same small model:
    #    self-grading forced here, so it is recorded) and the offline grader.
    score = ["score", rel, "--dataset", dataset_dir, "--scorer", f"llm:{MODEL}"]
    score += ["--base-url", real_model.base_url, "--cache", cache]
    refused = craftmd(*score, "--quiet", env=env, ok=None)
    assert refused.returncode == 2 and "would grade its own model" in refused.stderr and not (rel / "scores.parquet").exists()
    craftmd(*score, "--scorer", "offline", "--scorer", "paper", "--allow-self", "--quiet", env=env)
    check_scores(rel, [f"llm:{MODEL}", "offline"])
    assert read_release(rel).scorer_records()[f"llm:{MODEL}"]["self_graded"] is True

    # The history-taking metrics of its conversations (no model): scores beside the release, nothing else touched.
    from conftest import frozen

    before = frozen(rel)
    craftmd("score", rel, "--dataset", dataset_dir, "--scorer", "history", "--quiet", env=env)
    history = pl.read_parquet(rel / "scores.parquet").filter(pl.col("scorer") == "history")
    assert {(r["case_id"], r["conversation"]) for r in history.iter_rows(named=True)} == set(
        itertools.product(short_cases, ("standard", "no_exam"))
    )
    assert {"patient_info_recall", "patient_info_f1", "doctor_turns", "patient_words_per_turn"} <= set(history["metric"])
    assert frozen(rel) == before  # the release as written, but for the scores' own checksum

    # 5. MELD on the same cases, and the page over the release.
    meld = craftmd(
        "meld",
        "--dataset",
        dataset_dir,
        "--model",
        MODEL,
        "--base-url",
        real_model.base_url,
        "--config",
        "medqa_usmle",
        "--cases",
        *short_cases,
        "--max-tokens",
        "32",
        "--cache",
        cache,
        "--out",
        tmp_path / "meld",
        "--quiet",
        env=env,
    )
    assert f"cases {N_CASES:5d}" in meld.stdout
    craftmd(*analyse_argv(releases, dataset_dir, tmp_path / "board", resamples=200), env=env)
    page = (tmp_path / "board" / "index.html").read_text()
    assert "smollm2" in page
    # the board's FRQ figure comes from the offline grader (measured), never the model grading itself, which is marked
    board = page[page.index('id="leaderboard"') :]
    board = board[: board.index("</table>")]
    assert "<code>offline</code>" in board and f"self-graded: llm:{MODEL}" in board
    assert 'id="history"' in page and "patient_info_recall" in page  # the history section

    # The API key is nowhere: not in the cache, the releases, MELD's output or the page.
    for path in [cache, *tmp_path.rglob("*")]:
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_a_missing_model_says_to_run_make_llm(monkeypatch, tmp_path):
    from realmodel import MissingModel, RealModelServer

    monkeypatch.setenv("CRAFTMD_LLM_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(MissingModel, match="run `make llm`"):
        RealModelServer()
