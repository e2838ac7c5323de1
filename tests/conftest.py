"""Shared fixtures: the pinned source, a dataset built from it, and upstream releases.

Each is made once per test session from ../shared/sources (or $CRAFTMD_SOURCE).
Rooms add their own fixtures in their test modules; fixtures used by several rooms
live here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from craftmd.source import Source, default_location


#: The test files that start a real model: each spends minutes in one or two tests. ``make test`` runs a file per worker
#: (``--dist loadfile``), and xdist hands out the files with the most tests first, which left these for the end, run
#: side by side after everything else. The scheduler below hands them out first, slowest first, so the many short files
#: fill the other worker meanwhile. A name not collected is passed over.
SLOW_FIRST = (
    "tests/test_local_path.py",
    "tests/test_real_model.py",
    "tests/test_environments_real_model.py",
    "tests/test_encounters_real_model.py",
    "tests/test_finetune.py",
    "tests/test_grpo.py",
    "tests/test_judge_real.py",
)


def pytest_configure(config):
    """Under xdist with a worker for every CPU or more (``make test``: ``-n auto``), each worker and everything it starts
    (commands, llama.cpp servers) runs on a CPU of its own. The package's llama.cpp servers take the CPUs their process
    may run on (:func:`craftmd.cpus`); on a machine shared by every worker, each server's prompt threads would take
    every core and spin waiting for each other, several times slower than a server on its own share."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if not worker or not hasattr(os, "sched_setaffinity"):
        return
    mine = sorted(os.sched_getaffinity(0))
    if 1 < len(mine) <= count:
        os.sched_setaffinity(0, {mine[int(worker.removeprefix("gw")) % len(mine)]})


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile``: xdist's file scheduler, handing out :data:`SLOW_FIRST`'s files before any other."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlowFirst(LoadFileScheduling):
        def _assign_work_unit(self, node) -> None:
            first = next((f for f in SLOW_FIRST if f in self.workqueue), None)
            if first is not None:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return SlowFirst(config, log)


def shared(tmp_path_factory, name: str, make: Callable[[Path], object]) -> Path:
    """A folder ``make(folder)`` fills once per test run. Under pytest-xdist (``make test`` runs the suite on every core)
    the workers share one: the first to come makes it under a file lock, the others wait and read it. Tests never
    write into a session fixture's folder, so sharing it is safe."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.mktemp(name)
        make(out)
        return out
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's own
    out, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            make(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def source() -> Source:
    loc = default_location()
    if loc.startswith("http"):
        pytest.fail("the pinned source is not beside the checkout (../shared/sources); set CRAFTMD_SOURCE")
    return Source(loc)


@pytest.fixture(scope="session")
def dataset_dir(source, tmp_path_factory):
    """The full dataset built from the pinned source (all configs)."""
    from craftmd.dataset_builder.build import build_dataset

    return shared(tmp_path_factory, "dataset", lambda root: build_dataset(source, root / "data")) / "data"


@pytest.fixture(scope="session")
def releases_dir(source, dataset_dir, tmp_path_factory):
    """Every upstream model ingested into a frozen, graded release."""
    from craftmd.generation.ingest import ingest

    return shared(tmp_path_factory, "releases", lambda root: ingest(source, dataset_dir, root))


@pytest.fixture(scope="module")
def upstream(source, request):
    """Recorded upstream GPT-4 cases (trial 0) for a module's replay tests: ``pick_upstream(source, **REPLAY)`` with the
    module's ``REPLAY`` (default: 2 cases, seed 3, at most 12 messages)."""
    from loopback import pick_upstream

    return pick_upstream(source, **getattr(request.module, "REPLAY", {"n": 2, "seed": 3, "max_messages": 12}))


@pytest.fixture(scope="module")
def tiny_dataset(upstream, tmp_path_factory):
    """A dataset folder of just the module's :func:`upstream` cases (configs all, diagnoses, nejm_image)."""
    from loopback import write_replay_dataset

    return write_replay_dataset(upstream, tmp_path_factory.mktemp("replay") / "data")


@pytest.fixture(scope="session")
def real_model():
    """SmolLM2-135M-Instruct behind llama.cpp's OpenAI-compatible server (tests/realmodel.py), for the session.

    Fails (never skips) with a one-line message when the side venv is missing: run `make llm`.
    """
    from realmodel import served

    yield from served()


def frozen(release, names=("answers.parquet", "conversations.parquet")) -> dict:
    """What generation (or ingest) wrote, which scoring must never rewrite: the files ``names`` (those
    present) byte for byte, and the run record but for the scores file's own checksum (the one
    entry of manifest.json that scoring updates)."""
    import json
    from pathlib import Path

    release = Path(release)
    out = {n: (release / n).read_bytes() for n in names if (release / n).exists()}
    record = json.loads((release / "manifest.json").read_text())
    record["files"].pop("scores.parquet", None)
    out["manifest.json"] = record
    return out
