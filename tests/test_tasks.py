"""A new protocol is a task file plus its scorers: the toy task of ``tests/fixtures/oneword/`` goes from release to scores to the page.

The toy task poses CRAFT-MD cases in one made-up setting and format; its own scorer writes a continuous metric (the
number of words of the answer). Nothing else is registered or changed: the release contract checks the release
against the toy task, ``craftmd score`` runs the task's default scorer from the registry (``craftmd score --list``
shows it) and only when stale, analysis puts the metric in ``tables/metrics.csv`` with a bootstrap CI, and the page
shows it. (tests/test_toy_protocol.py generates the task's releases through the runner; here they are written by hand.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from craftmd import CraftMDError
from craftmd.metrics import METRICS
from craftmd.release import RunRecord, read_release, write_release
from craftmd.scoring.scorers import SCORERS
from craftmd.tasks import TASKS, get_task, load_task_file

TASK_FILE = Path(__file__).parent / "fixtures" / "oneword" / "oneword.py"


@pytest.fixture(scope="module")
def toy():
    """The toy task, loaded from its file (its scorer and metric with it), and unregistered afterwards."""
    task = load_task_file(TASK_FILE)
    yield task
    sys.modules.pop("craftmd_task_oneword", None)  # loaded again, it registers again
    TASKS.pop("oneword", None)
    METRICS.pop("oneword_words", None)
    SCORERS.pop("oneword-words", None)


def _toy_release(out, dataset_dir, n_cases=12):
    from craftmd.dataset import load_config

    ids = load_config(dataset_dir, "derm_public")["case_id"].to_list()[:n_cases]
    rows = []
    for i, c in enumerate(ids):
        for t in range(2):
            missing = i == 0 and t == 1
            rows.append(
                {
                    "case_id": c,
                    "trial": t,
                    "setting": "oneword",
                    "format": "text",
                    "with_image": False,
                    "response": None if missing else " ".join(["word"] * (i + t + 1)),
                    "status": "missing" if missing else "ok",
                }
            )
    m = RunRecord(release="toy-model", kind="generated", model="test/toy-model", task="oneword")
    return write_release(out / "toy-model", m, {"answers": pa.Table.from_pylist(rows)})


def test_a_release_is_checked_against_its_task(toy, tmp_path, dataset_dir):
    rel = _toy_release(tmp_path, dataset_dir)
    assert read_release(rel).manifest.task == "oneword"
    bad = pa.Table.from_pylist(
        [
            {
                "case_id": "case_1",
                "trial": 0,
                "setting": "multiturn",
                "format": "text",
                "with_image": False,
                "response": "x",
                "status": "ok",
            }
        ]
    )
    with pytest.raises(CraftMDError, match="unknown value.*multiturn"):
        write_release(tmp_path / "bad", RunRecord(release="bad", kind="generated", model="m", task="oneword"), {"answers": bad})
    with pytest.raises(CraftMDError, match="unknown task 'nope'"):
        get_task("nope")


def _score(rel, dataset_dir, *more) -> dict:
    """``craftmd score RELEASE --dataset DIR ...``: its JSON line."""
    import contextlib
    import io
    import json

    from craftmd.commands.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet", *more]) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_craftmd_score_lists_and_runs_the_toy_scorer_only_when_stale(toy, tmp_path, dataset_dir, capsys):
    from craftmd.commands.cli import main

    assert main(["score", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "oneword-words" in listed and "any task; formats text" in listed
    assert "writes oneword_words: words in the doctor's answer" in listed
    for name in ("paper", "strict", "offline", "history", "keyinfo", "meld", "llm:PROVIDER/MODEL", "judge:PROVIDER/MODEL"):
        assert f"\n{name} " in "\n" + listed, name

    rel = _toy_release(tmp_path / "releases", dataset_dir)
    assert _score(rel, dataset_dir) == {
        "release": str(rel),
        "scored": ["oneword-words"],
        "current": [],
        "skipped": {},
        "writes": {"oneword-words": ["oneword-words"]},
    }  # the task's default
    once = (rel / "scores.parquet").read_bytes()
    assert _score(rel, dataset_dir)["current"] == ["oneword-words"]  # nothing changed: nothing done
    assert (rel / "scores.parquet").read_bytes() == once
    assert _score(rel, dataset_dir, "--scorer", "oneword-words", "--force")["scored"] == ["oneword-words"]
    assert (rel / "scores.parquet").read_bytes() == once  # scored again: the same bytes
    # CRAFT-MD's scorers do not apply to the toy task's releases: named, they are refused with the reason
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--scorer", "offline", "--quiet"]) == 2
    assert "scorer offline applies to none of the releases given: no frq/top3 answers in task oneword" in capsys.readouterr().err
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--scorer", "nope"]) == 2
    assert "unknown scorer 'nope'" in capsys.readouterr().err


def test_toy_task_goes_through_to_the_metrics_table(toy, tmp_path, dataset_dir):
    from craftmd.analysis.tables import compute

    rel = _toy_release(tmp_path / "releases", dataset_dir)
    from conftest import frozen

    before = frozen(rel)
    _score(rel, dataset_dir, "--scorer", "oneword-words")
    assert frozen(rel) == before  # scoring never rewrites the release (but the scores' checksum)
    r = read_release(rel)
    scores = pl.from_arrow(r.scores_with_records()[0])
    assert set(scores["metric"]) == {"oneword_words"} and scores.height == 24
    failed = scores.filter(pl.col("status") == "error")
    assert failed.height == 1 and failed["value"].null_count() == 1
    assert r.scorer_records()["oneword-words"]["rule"] == "whitespace-separated words"

    a = compute(tmp_path / "releases", dataset_dir, B=500)
    row = a.metrics.filter(pl.col("metric") == "oneword_words").to_dicts()
    assert len(row) == 1
    row = row[0]
    # case i has trials of i+1 and i+2 words (case 0: only its first trial, one word): case means, then their mean
    case_means = [1.0] + [i + 1.5 for i in range(1, 12)]
    assert row["n_cases"] == 12 and row["n_failed"] == 1
    assert row["mean"] == pytest.approx(sum(case_means) / 12)
    assert row["ci_low"] < row["mean"] < row["ci_high"]
    assert row["kind"] == "continuous" and row["variant"] == "setting=oneword, format=text, with_image=false"


def test_toy_task_reaches_the_page(toy, tmp_path, dataset_dir):
    """The toy metric gets its own table on the page, with its description, CI and the failed score counted."""
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import compute

    rel = _toy_release(tmp_path / "releases", dataset_dir)
    _score(rel, dataset_dir)
    a = compute(tmp_path / "releases", dataset_dir, B=500)
    page = write_page(a, tmp_path / "page").read_text()
    section = page[page.index('id="measures"') : page.index('id="trust"')]
    row = a.metrics.row(0, named=True)
    assert "<code>oneword_words</code>" in section
    assert "words in the doctor&#39;s one-word diagnosis (continuous; lower is better)" in section
    assert f"{row['mean']:.3f}" in section and f"{row['ci_low']:.3f}–{row['ci_high']:.3f}" in section
    assert '<td data-v="12">12</td><td data-v="1">1</td>' in section  # 12 cases, 1 failed score
