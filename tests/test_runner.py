"""The one runner (issue #21): every task through ``craftmd generate --task``; ``--estimate`` sends nothing and
prints each role's calls, tokens and cost; ``--budget`` stops starting conversations and records what was not
run as not run; a task names its protocol."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main
from craftmd.generation.runner import GenerateSpec, Runner, runner, runner_for
from craftmd.release import read_release
from craftmd.tasks import get_task

sys.path.insert(0, str(Path(__file__).parent))
from helpers import generate_argv  # noqa: E402
from loopback import LoopbackServer, Replay  # noqa: E402


#: The recorded upstream cases of the conftest fixtures upstream and tiny_dataset.
REPLAY = {"n": 4, "seed": 7, "max_messages": 12}


def estimate_rows(text: str) -> dict[str, list[str]]:
    """role -> the columns of its row in the estimate table."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in ("doctor", "patient", "summarizer", "solver", "closer", "tagger", "total"):
            rows[parts[0]] = parts
    return rows


def loopback_spec(dataset, tmp_path, server, **kw) -> GenerateSpec:
    """A run of ``dataset`` into tmp_path/rel, the loopback model of ``server`` the doctor and the patient, cached in
    tmp_path/c.sqlite, with no progress bar; ``kw``: the rest of the spec."""
    where = {"out": tmp_path / "rel", "base_url": server.base_url, "cache": tmp_path / "c.sqlite"}
    kw = {"task": "craftmd", **kw}
    return GenerateSpec(dataset=dataset, doctor="openai/loopback", patient="openai/loopback", **where, progress=False, **kw)


def test_every_builtin_task_names_its_protocol():
    for name in ("craftmd", "consultation", "encounters"):
        assert issubclass(runner_for(get_task(name)), Runner)


def test_estimate_sends_nothing_and_prices_each_role(tiny_dataset, tmp_path, capsys, monkeypatch):
    with LoopbackServer(lambda r: "unused", models=("doc", "pat")) as server:
        monkeypatch.setenv("LOCAL_BASE_URL", server.base_url)
        monkeypatch.setenv("API_BASE_URL", server.base_url)
        options = "--trials 2 --experiments multiturn,summarized,vignette,frq,mcq4 --estimate".split()
        prices = ("--price", "patient=2.5,10", "--price", "summarizer=2.5,10")
        roles = {"doctor": "openai-api/local/doc", "patient": "openai-api/api/pat"}
        rc = main(generate_argv(tiny_dataset, *options, *prices, task="craftmd", **roles, out=tmp_path / "r"))
        out = capsys.readouterr().out
        assert rc == 0 and server.calls == 0
    assert not (tmp_path / "r").exists()
    rows = estimate_rows(out)
    assert set(rows) == {"doctor", "patient", "summarizer", "total"}
    assert rows["doctor"][1] == "openai-api/local/doc" and rows["patient"][1] == "openai-api/api/pat"
    assert rows["doctor"][-1] == "-"  # the local doctor has no price
    assert rows["patient"][-1].startswith("$") and rows["total"][-1].startswith("$")
    # 4 cases x 2 trials: one summary each; 6 questions each (3 settings x 2 formats)
    assert float(rows["summarizer"][2].replace(",", "")) == 8
    doctor_calls = float(rows["doctor"][2].replace(",", ""))
    assert doctor_calls == 8 * (10 + 6)  # ten expected turns and six questions per job


def test_budget_stops_new_conversations_and_records_them_as_not_run(tiny_dataset, upstream, tmp_path):
    replay = Replay(upstream["text"])
    with LoopbackServer(replay) as server:
        # a dollar a token: the first job spends it all
        spec = loopback_spec(
            tiny_dataset, tmp_path, server, experiments=["multiturn", "frq"], concurrency=1, price=(1e6, 1e6), budget=1.0
        )
        report = runner(spec).run()
    rec = read_release(report.path)
    not_run = rec.manifest.counts["not_run"]
    run_ids = {f"{a['case_id']}/{a['trial']}" for a in rec.table("answers").to_pylist()}
    assert report.not_run == not_run["jobs"] >= 1 and "budget" in not_run["why"]
    assert not set(not_run["ids"]) & run_ids and len(set(not_run["ids"]) | run_ids) == 4
    assert all(a["status"] == "ok" for a in rec.table("answers").to_pylist())  # not run is not a failure
    assert "not run" in report.summary()


def test_budget_needs_a_price(tiny_dataset, tmp_path):
    with pytest.raises(CraftMDError, match="--budget needs --price"):
        runner(
            GenerateSpec(
                dataset=tiny_dataset,
                out=tmp_path / "r",
                doctor="openai/x",
                task="craftmd",
                patient="openai/x",
                base_url="http://127.0.0.1:9/v1",
                budget=5.0,
            )
        )


def test_an_unknown_task_is_one_line(tiny_dataset, tmp_path, capsys):
    rc = main(
        generate_argv(tiny_dataset, task="surgery", doctor="openai/x", base_url="http://127.0.0.1:9/v1", out=tmp_path / "r")
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "surgery" in err and err.count("\n") == 0


def test_the_progress_record_names_the_task(tiny_dataset, upstream, tmp_path):
    with LoopbackServer(Replay(upstream["text"])) as server:
        report = runner(
            loopback_spec(tiny_dataset, tmp_path, server, experiments=["vignette", "frq"], price={"doctor": (1.0, 2.0)})
        ).run()
    m = json.loads((report.path / "manifest.json").read_text())
    assert m["task"] == "craftmd" and report.cost is not None and report.cost > 0
