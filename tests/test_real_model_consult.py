"""The consultation protocol with a real model in every role: SmolLM2-135M (tests/realmodel.py, the ``real_model`` fixture).

Extraction, the consultation with a fixed solver, the order oracle, grading and the keyinfo scores run
end to end through the command line against llama.cpp's server. Nothing here asserts what the 135M
model says: only that every case and every answer gets a row, that what failed keeps its reason,
and that a re-run over the cache sends nothing. The small model rarely writes the JSON the extraction
asks for; a case whose extraction failed (recorded as such) gets hand-written key-value information
(model ``test/hand-written``) so the protocol and the oracle still run on it with the real model.

Sized for about a minute on 2 cores: one short case, two doctor turns, 32 tokens per reply.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from helpers import analyse_argv, craftmd, generate_argv, hand_written_keyinfo, shortest_case  # noqa: E402

MODEL = "openai/smollm2"
SETTINGS = ["upper", "lower", "consult_20", "consult_100", "oracle_direct_100", "oracle_random_100", "oracle_reverse_100"]


@pytest.fixture(scope="module")
def one_case(source, tmp_path_factory) -> tuple[Path, str]:
    """A dataset of the shortest of a few recorded cases (with a paper key, for grading)."""
    data = tmp_path_factory.mktemp("consult-real") / "data"
    return data, shortest_case(source, data, paper_key=True)["case_id"][0]


def test_the_consultation_protocol_with_a_real_model(real_model, one_case, tmp_path):
    from craftmd.generation.keyinfo import write_keyinfo
    from craftmd.keyinfo import SCHEMA
    from craftmd.release import read_release

    data, cid = one_case
    env = {**os.environ, "OPENAI_API_KEY": "sk-not-used"}
    cache = tmp_path / "cache.sqlite"
    url = ["--base-url", real_model.base_url]

    # 1. Extraction: the case gets a row, ok or a failure with its reason.
    # (exit 2 when the one case failed: nothing extracted)
    out = craftmd(
        "keyinfo", "extract", "--dataset", data, "--model", MODEL, *url, "--cache", cache, "--quiet", env=env, ok=(0, 2)
    )
    rows = pq.read_table(data / "keyinfo" / "test-00000-of-00001.parquet").to_pylist()
    assert [r["case_id"] for r in rows] == [cid]
    row = rows[0]
    assert row["model"] == MODEL and len(row["prompt_sha256"]) == 64
    assert (row["status"] == "ok") == (row["error"] is None) and (row["status"] == "ok") == bool(row["items"])
    assert (row["status"] == "ok") == (out.returncode == 0)
    if row["status"] != "ok":
        vignette = pl.read_parquet(data / "all" / "test-00000-of-00001.parquet")["vignette"][0]
        row = hand_written_keyinfo(cid, vignette, row["prompt_sha256"])
        write_keyinfo(data, [row], {"model": "test/hand-written"})
    assert set(SCHEMA.names) == set(row)

    # 2. The protocol: consultation, oracle in three orders, bounds; the small model in every role.
    rel = tmp_path / "releases" / "smollm2"
    options = ("--experiments", ",".join(SETTINGS), "--max-turns", "2", "--max-tokens", "32", "--seed", "7")
    gen = generate_argv(data, *url, *options, task="consultation", doctor=MODEL, solver=MODEL, cache=cache)
    craftmd(*gen, "--out", rel, env=env)
    sent = real_model.chat_requests()
    release = read_release(rel)
    answers = release.table("answers").to_pylist()
    assert {(a["setting"], a["format"]) for a in answers} == {(s, f) for s in SETTINGS for f in ("mcq4", "frq")}
    for a in answers:
        assert (a["status"] == "ok") == (a["response"] is not None) and (a["status"] == "ok" or a["error"]), a
    convs = {c["conversation"]: c for c in release.table("conversations").to_pylist()}
    assert set(convs) == {"consult", "oracle_direct", "oracle_random", "oracle_reverse"}
    for kind, c in convs.items():
        assert c["messages"][1] == {"role": "user", "content": row["initial_request"]}
        assert c["ended"] in ("final_diagnosis", "no_question", "max_turns") or c["error"], c
        if kind != "consult" and not c["error"]:
            assert c["messages"][2]["content"].startswith("Can you tell me about ")
    assert release.manifest.roles["solver"]["model"] == MODEL and release.manifest.task == "consultation"

    # 3. A re-run over the cache sends nothing.
    craftmd(*gen, "--out", tmp_path / "again" / "smollm2", env=env)
    assert real_model.chat_requests() == sent
    assert (rel / "answers.parquet").read_bytes() == (tmp_path / "again" / "smollm2" / "answers.parquet").read_bytes()

    # 4. Graded by the existing graders, scored against the key-value information.
    craftmd("score", rel, "--dataset", data, "--scorer", "paper", "--scorer", "offline", "--quiet", env=env)
    out = craftmd("score", rel, "--dataset", data, "--scorer", "keyinfo", "--quiet", env=env)
    assert json.loads(out.stdout)["scored"] == ["keyinfo"]
    rec = json.loads(pq.read_schema(rel / "scores.parquet").metadata[b"craftmd.scorers"])["keyinfo"]
    assert rec["scored"] + rec["failed"] == 4
    scores = pl.read_parquet(rel / "scores.parquet")
    graded = scores.filter(pl.col("metric") == "correct")
    assert set(graded["setting"]) == set(SETTINGS)
    assert set(scores.filter(pl.col("scorer") == "keyinfo")["conversation"]) == set(convs)

    # 5. The release reaches the page: its consultation section, its accuracy per setting against the bounds, the figure.
    craftmd(*analyse_argv(rel.parent, data, tmp_path / "page", resamples=200), env=env)
    acc = pl.read_csv(tmp_path / "page" / "tables" / "consult_accuracy.csv")
    assert set(acc["setting"]) == set(SETTINGS) and set(acc["model"]) == {"smollm2"}
    page = (tmp_path / "page" / "index.html").read_text()
    assert 'id="consultation"' in page and 'id="tasks"' in page and 'id="board"' not in page
    assert (tmp_path / "page" / "figures" / "consult_rounds.png").exists()
