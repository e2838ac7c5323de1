"""The analysis's figures drawn in worker processes, beside the statistics and each other.

An analysis draws a dozen matplotlib figures, each from its finished tables, each on its own (a figure reads the
analysis, never another figure). :class:`Workers` starts up to :data:`JOBS` processes when the analysis starts: they
import matplotlib and work out the overlap between the tasks' cases (:mod:`.overlap`: the dataset alone) while the
main process runs the SQL and the bootstrap; they run the per-release queries (:func:`.runner.keep`), and are then
renewed (:meth:`Workers.renew`), so that what those queries' allocators kept goes with their processes; once the
tables are written, each figure (:func:`jobs`) is drawn by whichever worker is free. A figure is the same bytes
whoever draws it: the same function, the same data (the analysis, pickled), the same style
(:func:`craftmd.analysis.figures.style`) and matplotlib's Agg, whose PNGs carry no date.

The workers come from a fork server (a fresh interpreter that imported the figure modules once, forked for each
worker), never from a fork of the analysing process, whose DuckDB and polars threads a fork would copy mid-flight.
With one CPU, or ``JOBS = 1``, everything is drawn in the analysing process, in order.
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import Future
from pathlib import Path

from craftmd import cpus

#: Worker processes at most (never more than the CPUs this process may run on); 1: all in the analysing process.
JOBS = 2
#: What the fork server imports once, before any worker is forked from it.
PRELOAD = ["craftmd.analysis.figures", "craftmd.analysis.paper_figures", "craftmd.analysis.overlap", "craftmd.analysis.runner"]


class Workers:
    """Up to :data:`JOBS` worker processes (none with one CPU): :meth:`submit` runs a function in one of them, or here,
    at once, without any."""

    def __init__(self, jobs: int | None = None):
        self.jobs = max(1, min(JOBS if jobs is None else jobs, cpus()))
        self._pool = None
        if self.jobs > 1:
            import multiprocessing as mp

            if "forkserver" in mp.get_all_start_methods():
                self._ctx = mp.get_context("forkserver")
                self._ctx.set_forkserver_preload(PRELOAD)
                self._start()
            else:
                self.jobs = 1

    def _start(self) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self._pool = ProcessPoolExecutor(self.jobs, mp_context=self._ctx)

    @property
    def apart(self) -> bool:
        """Whether :meth:`submit` runs its function in a worker process (else here, at once)."""
        return self._pool is not None

    def submit(self, fn, *args) -> Future:
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        done: Future = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # raised by result(), as a worker's would be
            done.set_exception(exc)
        return done

    def warm(self) -> None:
        """Start every worker now (each imports nothing more: the fork server did), so none starts while figures wait."""
        if self._pool is not None:
            for f in [self._pool.submit(os.getpid) for _ in range(self.jobs)]:
                f.add_done_callback(lambda _: None)

    def renew(self) -> None:
        """End the workers once what was submitted to them is done, and start new ones (forked from the fork server,
        warm at once): what a step's work left in their memory goes with them (DuckDB's allocator and polars' keep
        what a query freed: 0.35-0.5 GB stayed with the analysing process after a board of 1,000's per-release queries
        ran in its threads)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._start()
            self.warm()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def jobs(a, v) -> list[tuple[str, str]]:
    """Every figure of analysis ``a`` (view ``v``) as a job of :func:`draw`: ``("main", file)``
    (:data:`craftmd.analysis.figures.FIGURES`, with any model), ``("paper", file)``
    (:data:`craftmd.analysis.paper_figures.DRAWN`), ``("rubric", "")`` with a rubric, ``("task", name)`` for each task
    that draws its own, in the order :func:`draw_all` draws them in one process."""
    from craftmd.tasks import in_order

    from .figures import FIGURES
    from .paper_figures import DRAWN

    paper = [("paper", name) for name, _, _ in DRAWN]
    main = [("main", name) for name, _ in FIGURES] if v.models else []
    rubric = [("rubric", "")] if a.rubric is not None else []
    tasks = [("task", t.name) for t in in_order(a.tasks) if t.analysis.figures is not None]
    return main + paper + rubric + tasks


def draw(a, v, job: tuple[str, str], folder: Path) -> None:
    """Draw one job of :func:`jobs` into ``folder`` (under the figures' style)."""
    from .figures import style, write_figures
    from .paper_figures import write_paper_figures

    kind, name = job
    style()
    if kind == "main":
        write_figures(v, folder, only={name})
    elif kind == "paper":
        write_paper_figures(v, folder, only={name})
    elif kind == "rubric":
        from .rubric import write_figures as write_rubric_figures

        write_rubric_figures(a.rubric, folder)
    else:
        from craftmd.tasks import in_order

        (task,) = in_order([name])
        task.analysis.figures(a, v, folder)


_HELD: dict[str, tuple] = {}  # in a worker: the analysis it draws (its token -> analysis and view), read once


def _draw_in_worker(token: str, blob: bytes, job: tuple[str, str], folder: str) -> None:
    from .view import View

    if token not in _HELD:
        _HELD.clear()
        a = pickle.loads(blob)
        _HELD[token] = (a, View.of(a))
    a, v = _HELD[token]
    draw(a, v, job, Path(folder))


def draw_all(a, folder: Path, workers: Workers | None = None) -> None:
    """Every figure of analysis ``a`` into ``folder``: by ``workers`` when they are processes, else here, in order."""
    from .view import View

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    v = View.of(a)
    todo = jobs(a, v)
    if workers is None or workers.jobs == 1:
        for job in todo:
            draw(a, v, job, folder)
        return
    import dataclasses
    import hashlib

    light = dataclasses.replace(a, board=None)  # what the figures read (the releases read stay here)
    light.__dict__.pop("_view", None)
    blob = pickle.dumps(light, protocol=pickle.HIGHEST_PROTOCOL)
    token = hashlib.blake2b(blob, digest_size=16).hexdigest()
    slowest = [j for j in todo if j[0] == "paper"][:2]  # the paper's bracketed panels: started first
    todo = slowest + [j for j in todo if j not in slowest]
    pending = [workers.submit(_draw_in_worker, token, blob, job, str(folder)) for job in todo]
    for f in pending:
        f.result()  # a figure that failed raises here, as it would drawn in order


__all__ = ["Workers", "jobs", "draw", "draw_all", "cpus", "JOBS"]
