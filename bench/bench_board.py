"""A board that grows: analysis time and peak memory for boards of 5, 10, 20, 40 and 80 releases.

    .venv/bin/python bench/bench_board.py [--releases DIR --dataset DIR] [--sizes 5,10,20,40,80] [--all-pairs] [--figures]

Each board is made of copies of the given releases (default: out/releases and out/data, as `make leaderboard` leaves
them) under new ids, cycling through them: a copy is a folder whose parquet files are hard links to the original's
(a real copy where the file system refuses) and whose manifest names the new id, so the copies cost no disk. Each size
is analysed in a fresh process (``craftmd.analysis.tables.analyse``, tables only unless --figures, 10,000
resamples), which reports its wall time, its peak resident memory (``ru_maxrss``: "peak MB") and the peak of its
memory and its worker processes' together ("all MB": their proportional set sizes summed, sampled every 0.2 s); then
one more release (a copy with files of its own, as a new release has) is added to the board and the board analysed again, in another fresh
process, reading back what the first analysis kept (``previous=``: its ``.cache``), as `craftmd analyse` into the same
folder does ("+1"). The board is analysed two seconds after it is made (``craftmd.release.SETTLED_NS``): a file
younger than that is hashed each time it is read, and a board's releases are older. Printed: one row per size and
the growth exponent of the time between consecutive sizes and between the first size of at least 10 and the last
(1.0: linear). By default models are paired as ``craftmd analyse`` pairs them (every pair up to
``runner.ALL_PAIRS_UP_TO`` models per family, else neighbours in the ranking and the leader); --all-pairs tests every
pair, as the analysis did before.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def make_board(sources: list[Path], n: int, root: Path) -> Path:
    """``root/releases`` with ``n`` copies of ``sources`` under new ids (hard-linked parquet, new manifests)."""
    out = root / "releases"
    out.mkdir(parents=True)
    for i in range(n):
        add_copy(sources[i % len(sources)], i, out)
    return out


def add_copy(src: Path, i: int, out: Path, link: bool = True) -> Path:
    """Copy ``i`` of release ``src`` in the releases folder ``out``, under the id ``<id>-<i>``: its parquet files
    hard-linked (or copied, ``link=False``: a release added to a board has files of its own, and a new link to a file
    is a change of it, which the releases already checked on this machine would be hashed again for), a new
    manifest."""
    manifest = json.loads((src / "manifest.json").read_text())
    new = f"{manifest['release']}-{i:03d}"
    manifest["release"] = new
    if manifest.get("display_name"):
        manifest["display_name"] = f"{manifest['display_name']} #{i:03d}"
    dst = out / new
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "manifest.json" or not f.is_file():
            continue
        if link:
            try:
                os.link(f, dst / f.name)
                continue
            except OSError:
                pass  # (a file system that refuses links: a copy)
        shutil.copy2(f, dst / f.name)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return dst


def _tree(root: int) -> list[int]:
    """``root`` and the processes below it (its workers, their fork server), from ``/proc``."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # "pid (name) state ppid ..."
        except (OSError, IndexError, ValueError):
            continue  # (a process that ended meanwhile)
        kids.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        found.append(todo.pop())
        todo.extend(kids.get(found[-1], []))
    return found


def _pss_kb(pid: int) -> int:
    """A process's proportional set size: its pages, those shared with others divided among them (0 once it ended)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class TreePeak(threading.Thread):
    """The most memory this process and its descendants held together (their summed proportional set sizes: pages
    they share counted once), sampled every ``every`` seconds while it runs (a shorter peak between samples is missed)."""

    def __init__(self, every: float = 0.2):
        super().__init__(daemon=True)
        self.every, self.peak_kb, self._done = every, 0, threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every):
            self.peak_kb = max(self.peak_kb, sum(map(_pss_kb, _tree(os.getpid()))))

    def __enter__(self) -> TreePeak:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self.join()


def one(releases: Path, dataset: Path, out: Path, all_pairs: bool, figures: bool, previous: Path | None = None) -> dict:
    """Analyse one board in this process (into ``out``, reading back what ``previous`` kept): wall seconds, peak RSS
    (MB) of this process, peak memory (MB) of this process and its workers together (:class:`TreePeak`), rows of
    pvalues.csv, the stages' timings."""
    from craftmd.analysis.tables import analyse

    t = time.perf_counter()
    with TreePeak() as tree:
        a = analyse(releases, dataset, out, figures=figures, all_pairs=all_pairs, previous=previous)
    wall = time.perf_counter() - t
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"wall_s": wall, "peak_mb": peak_mb, "all_mb": tree.peak_kb / 1024, "pvalues": a.pvalues.height, "timings": a.timings}


def main(argv=None) -> int:
    from craftmd.release import SETTLED_NS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=Path)
    p.add_argument("--dataset", type=Path)
    p.add_argument("--sizes", default="5,10,20,40,80", help="board sizes (comma-separated; default 5,10,20,40,80)")
    p.add_argument("--all-pairs", action="store_true", help="test every pair of models (the analysis before boards grew)")
    p.add_argument("--figures", action="store_true", help="also draw the figures (default: tables only)")
    p.add_argument("--one", nargs="+", type=Path, metavar="PATH", help=argparse.SUPPRESS)  # the child: BOARD OUT [PREVIOUS]
    args = p.parse_args(argv)
    here = Path(__file__).resolve().parent.parent / "out"
    releases = args.releases or here / "releases"
    dataset = args.dataset or here / "data"
    if args.one:
        prev = args.one[2] if len(args.one) > 2 else None
        print(json.dumps(one(args.one[0], dataset, args.one[1], args.all_pairs, args.figures, prev)))
        return 0
    sources = sorted(d for d in releases.iterdir() if (d / "manifest.json").exists()) if releases.is_dir() else []
    if not sources:
        print(f"no releases under {releases} (run `make leaderboard`, or give --releases and --dataset)", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    print(
        f"{'releases':>8} {'seconds':>8} {'peak MB':>8} {'all MB':>7} {'p-values':>9} {'+1 s':>7} {'+1 MB':>7} {'+1 all':>7}"
        "  (sql / bootstrap+tests s)"
    )
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-board-") as tmp:
            board = make_board(sources, n, Path(tmp) / "a")
            time.sleep(SETTLED_NS / 1e9)  # a board's releases are older than this (younger files are hashed every time)
            full = _child(board, dataset, Path(tmp) / "out", args)
            # one more release added to the board just analysed: analysed into a new folder, reading back the first's .cache
            add_copy(sources[n % len(sources)], n, board, link=False)
            grown = _child(board, dataset, Path(tmp) / "out2", args, Path(tmp) / "out")
        if full is None or grown is None:
            return 1
        rows.append((n, full))
        t = full["timings"]
        print(
            f"{n:>8} {full['wall_s']:>8.2f} {full['peak_mb']:>8.0f} {full['all_mb']:>7.0f} {full['pvalues']:>9} "
            f"{grown['wall_s']:>7.2f} {grown['peak_mb']:>7.0f} {grown['all_mb']:>7.0f}  "
            f"({t.get('sql_s', 0):.2f} / {t.get('bootstrap_s', 0):.2f})",
            flush=True,
        )
    for (n0, r0), (n1, r1) in zip(rows, rows[1:]):
        print(f"growth exponent {n0}->{n1}: {math.log(r1['wall_s'] / r0['wall_s']) / math.log(n1 / n0):.2f}")
    big = [(n, r) for n, r in rows if n >= 10]
    if len(big) >= 2:
        (n0, r0), (n1, r1) = big[0], big[-1]
        print(f"growth exponent {n0}->{n1} (time): {math.log(r1['wall_s'] / r0['wall_s']) / math.log(n1 / n0):.2f}")
    return 0


def _child(board: Path, dataset: Path, out: Path, args, previous: Path | None = None) -> dict | None:
    """:func:`one` in a fresh process (its own peak memory); None, with its error printed, when it failed."""
    cmd = [sys.executable, __file__, "--dataset", str(dataset), "--one", str(board), str(out)] + (
        [str(previous)] if previous else []
    )
    cmd += ["--all-pairs"] * args.all_pairs + ["--figures"] * args.figures
    # the copies hold the same tables under new ids, which a board refuses (one run is one release): allowed here alone
    env = {**os.environ, "CRAFTMD_ALLOW_COPIES": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if res.returncode != 0:
        print(res.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
