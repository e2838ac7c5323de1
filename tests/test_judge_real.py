"""The rubric judge with a real model in the loop: SmolLM2-135M (llama.cpp's server, tests/realmodel.py) judges two
conversations end to end through ``craftmd score --scorer judge:...``, per category. Its scores will be poor; what is asserted is that the
whole path runs, every applicable dimension has a score or a recorded failure, and a re-run over the cache sends nothing
and writes the same bytes. A handful of calls: two conversations x (one discussion + one reply, asked again at most once)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from test_judge import make_release

from craftmd.release import read_release
from craftmd.scoring.rubric import applicable, load_catalog


def test_smollm2_judges_two_conversations(real_model, tmp_path):
    rel = make_release(tmp_path)
    cache = tmp_path / "cache.sqlite"
    cmd = [sys.executable, "-m", "craftmd.commands.cli", "score", str(rel), "--scorer", "judge:openai/smollm2", "--base-url", real_model.base_url,
           "--mode", "category", "--dimensions", "final diagnosis", "--cases", "case_1,case_2", "--response-format", "json_object",
           "--max-tokens", "48", "--score-tokens", "80", "--max-invalid", "1", "--concurrency", "1", "--cache", str(cache), "--quiet"]  # fmt: skip
    before = real_model.chat_requests()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)["summaries"]["judge:openai/smollm2"]
    sent = real_model.chat_requests() - before
    assert 2 * 2 <= sent <= 2 * 3 and summary["sent"] == sent  # per conversation: a discussion, a reply, at most one more asking
    rows = [r for r in read_release(rel).scores_with_records()[0].to_pylist() if r["scorer"] == "judge:openai/smollm2"]
    dims = {d.id for d in applicable(load_catalog().select(["final diagnosis"]), "diagnosis")}
    assert {(r["case_id"], r["dimension"]) for r in rows} == {(c, d) for c in ("case_1", "case_2") for d in dims}
    for r in rows:
        detail = json.loads(r["detail"])
        if r["status"] == "ok":
            assert r["value"] in (1.0, 2.0, 3.0, 4.0) and isinstance(detail["rationale"], str)
        else:
            assert r["value"] is None and detail["error"]  # a failure keeps its reason, never a number
    rec = read_release(rel).scorer_records()["judge:openai/smollm2"]
    assert rec["mode"] == "category" and rec["response_format"]["requested"] == "json_object"
    assert rec["scored"] + rec["failed"] == len(rows)
    first = hashlib.sha256((rel / "scores.parquet").read_bytes()).hexdigest()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert real_model.chat_requests() - before == sent  # the cache answered everything
    assert hashlib.sha256((rel / "scores.parquet").read_bytes()).hexdigest() == first
