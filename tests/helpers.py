"""Helpers several test modules share, so that each is written once: the argv lists of the commands (generate, submit,
analyse), the command line in a process of its own, the leaderboard and the OpenEnv episodes run by their side processes,
and small fixtures' building blocks (the shortest recorded case, a hand-written key-value row, episodes on a loopback
server, the accuracy table's published columns)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def craftmd(*args, env: dict | None = None, ok: tuple[int, ...] | None = (0,), timeout: int = 900) -> subprocess.CompletedProcess:
    """``craftmd ARGS`` (each item as a string) in a process of its own with ``env``, its output captured as text; its exit
    status must be one of ``ok`` (None: any)."""
    proc = subprocess.run(
        [sys.executable, "-m", "craftmd.commands.cli", *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert ok is None or proc.returncode in ok, proc.stderr[-2000:]
    return proc


def generate_argv(
    dataset,
    *options,
    doctor: str = "openai/loopback",
    patient: str | None = None,
    solver: str | None = None,
    task: str | None = None,
    base_url=None,
    cache=None,
    out=None,
    quiet: bool = True,
) -> list[str]:
    """The argv of ``craftmd generate`` (no program name): the task where given, the dataset, the doctor and the patient (the
    doctor's model unless named; none where ``patient=""``), the solver, server, cache and output folder where given, then
    ``options`` as they are, and ``--quiet`` unless ``quiet=False``. Every item is a string (paths included)."""
    argv = ["generate", *(["--task", str(task)] if task else []), "--dataset", str(dataset), "--doctor", doctor]
    if patient != "":
        argv += ["--patient", patient or doctor]
    for flag, value in (("--solver", solver), ("--base-url", base_url), ("--cache", cache), ("--out", out)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + [str(o) for o in options] + (["--quiet"] if quiet else [])


def submit_argv(submission, dataset, model: str, out, *options, config: str | None = None, quiet: bool = True) -> list[str]:
    """The argv of ``craftmd submit`` (no program name): the submission file, the dataset (its ``config`` where given), the
    model and the output folder, then ``options`` as they are, and ``--quiet`` unless ``quiet=False``."""
    argv = ["submit", str(submission), "--dataset", str(dataset), *(["--config", config] if config else [])]
    return argv + ["--model", model, "--out", str(out)] + [str(o) for o in options] + (["--quiet"] if quiet else [])


def analyse_argv(releases, dataset, out, *options, resamples: int, packets=None, page: bool = True) -> list[str]:
    """The argv of ``craftmd analyse`` (no program name): the releases folder, the dataset (and the MedPI ``packets`` where
    given), the output folder and ``--resamples``, then ``options`` as they are, and ``--page`` unless ``page=False``."""
    argv = ["analyse", "--releases", str(releases), "--dataset", str(dataset), *(["--packets", str(packets)] if packets else [])]
    return argv + ["--out", str(out), "--resamples", str(resamples)] + [str(o) for o in options] + (["--page"] if page else [])


def run_leaderboard(source, dataset, releases, out, *options) -> subprocess.CompletedProcess:
    """``craftmd leaderboard --quiet`` of the ``releases`` folder into ``out`` (``options`` added), in a process of its own
    that finds the pinned ``source`` through $CRAFTMD_SOURCE; its output captured as text."""
    argv = ["leaderboard", "--dataset", str(dataset), "--releases", str(releases), "--out", str(out), *map(str, options)]
    env = dict(os.environ, CRAFTMD_SOURCE=str(source.path))
    cmd = [sys.executable, "-m", "craftmd.commands.cli", *argv, "--quiet"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


def openenv_episodes(task: str, dataset, out, *base_url: str, timeout: int = 600) -> list:
    """tests/openenv_episodes.py in the RL side venv (.venv-rl; fails, never skips, where it is missing): two episodes of
    ``task``'s environment served by OpenEnv on ``dataset`` (the real model at ``base_url`` where given), written to
    ``out``; the rewards it wrote (``out/rewards.json``)."""
    import pytest

    rl_python = ROOT / ".venv-rl" / "bin" / "python"
    if not rl_python.exists():
        pytest.fail("the RL side venv is missing: run `make rl` (.venv-rl)", pytrace=False)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_BASE_URL")}
    cmd = [str(rl_python), str(ROOT / "tests" / "openenv_episodes.py"), task, str(dataset), str(out), *base_url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((Path(out) / "rewards.json").read_text())


#: The first columns of the published accuracy table (tables/accuracy.csv), in their order.
ACCURACY_HEAD = ["model", "setting", "format", "grader", "group_by", "group", "n_cases", "accuracy", "ci_low", "ci_high"]


def analysed_twice(release, dataset, tmp_path, names, *, B: int, more_than: int) -> None:
    """``analyse`` of ``release`` twice (no figures), into tmp_path/one and tmp_path/two: each of the tables ``names`` comes
    out the same bytes both times, with more than ``more_than`` lines."""
    from craftmd.analysis.tables import analyse

    analyse(release, dataset, tmp_path / "one", B=B, figures=False)
    analyse(release, dataset, tmp_path / "two", B=B, figures=False)
    for name in names:
        one = (tmp_path / "one" / "tables" / f"{name}.csv").read_bytes()
        assert one == (tmp_path / "two" / "tables" / f"{name}.csv").read_bytes(), name
        assert len(one.splitlines()) > more_than, name


def shortest_case(source, out, *, paper_key: bool = False):
    """A replay dataset at ``out`` of the shortest four-choice case of six recorded ones (seed 2, at most 10 messages); its
    one row (a polars frame). With ``paper_key``, the paper rule's key is the case's answer in lower case."""
    import polars as pl

    from loopback import pick_upstream, write_replay_dataset

    write_replay_dataset(pick_upstream(source, 6, seed=2, max_messages=10), out)
    f = out / "all" / "test-00000-of-00001.parquet"
    df = pl.read_parquet(f).filter(pl.col("choices").list.len() == 4).sort(pl.col("vignette").str.len_chars(), "case_id").head(1)
    if paper_key:
        df = df.with_columns(paper_answer=pl.col("answer").str.to_lowercase())
    df.write_parquet(f)
    return df


def hand_written_keyinfo(case_id: str, vignette: str, prompt_sha256: str = "0" * 64) -> dict:
    """A key-value information row for ``case_id`` written by hand (model ``test/hand-written``): the first three sentences
    of its ``vignette``, each keyed by its first three words."""
    parts = [s for s in vignette.split(". ") if s][:3]
    return {
        "case_id": case_id,
        "items": [{"key": " ".join(s.split()[:3]), "value": s} for s in parts],
        "initial_request": "I don't feel well. Can you help me?",
        "status": "ok",
        "error": None,
        "model": "test/hand-written",
        "prompt_sha256": prompt_sha256,
    }


def sim_episodes(monkeypatch, server, task: str, split: str, dataset, tmp_path, **options):
    """``episodes(task, split)`` of ``dataset``, its models served by ``server`` as the ``sim`` service ($SIM_BASE_URL, set
    for the test), its request cache tmp_path/c.sqlite; ``options``: the environment's other options."""
    from craftmd.envs.core import episodes

    monkeypatch.setenv("SIM_BASE_URL", server.base_url)
    return episodes(task, split, dataset=dataset, cache=tmp_path / "c.sqlite", **options)


def assert_tables_documented(tables: Path) -> None:
    """Every CSV in ``tables`` is on the documentation's analysis page (``docs/analysis.md``), with exactly its columns."""
    import csv
    import re

    page = (Path(__file__).resolve().parent.parent / "docs" / "analysis.md").read_text()
    documented = {
        name: re.findall(r"`([^`]+)`", cols)
        for name, cols in re.findall(r"^### `tables/([\w.]+)`\n\n.*?\n\nColumns: ([^\n]*)\.$", page, re.M | re.S)
    }
    for table in sorted(tables.glob("*.csv")):
        with open(table, newline="") as f:
            columns = next(csv.reader(f))
        assert table.name in documented, f"tables/{table.name} is not on docs/analysis.md"
        assert documented[table.name] == columns, table.name


def listings(monkeypatch, folder) -> list[str]:
    """Every listing of ``folder`` (``os.listdir``, ``os.scandir``: what ``Path.iterdir`` and ``glob`` call) from now on,
    by the function that asked."""
    import os
    import sys
    from pathlib import Path

    seen, where = [], str(Path(folder).resolve())
    listdir, scandir = os.listdir, os.scandir

    def counted(real):
        def listing(path=".", *args, **kwargs):
            if not isinstance(path, int) and str(Path(os.fsdecode(path)).resolve()) == where:  # an int: a folder's fd
                seen.append(sys._getframe(2).f_code.co_name)
            return real(path, *args, **kwargs)

        return listing

    monkeypatch.setattr(os, "listdir", counted(listdir))
    monkeypatch.setattr(os, "scandir", counted(scandir))
    return seen
