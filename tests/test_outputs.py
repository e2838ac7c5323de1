"""Outputs that survive failures and concurrency (issue #25, the output side).

Every output folder is swapped in whole (a failure leaves the previous one exactly as it
was; two runs into one --out never replace each other); one writer of a release at a time
(concurrent scorers all keep their scores); every file of a release is in its checksums and
a damaged one is named with how to rebuild it; disk and file errors are one line; killed runs
leave no temporary folders and tests leave no servers running.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError
from craftmd.atomic import atomic_dir, check_writable, lock_path
from craftmd.commands.cli import main
from craftmd.release import RunRecord, read_release, write_release, write_scores
from craftmd.scoring.scorers import scores_from_grades
from craftmd.scoring.submission import submission_id

sys.path.insert(0, str(Path(__file__).parent))
from helpers import analyse_argv, generate_argv, submit_argv  # noqa: E402
from loopback import LoopbackServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KEY = {"setting": "vignette", "format": "frq", "with_image": False}


# -- helpers -------------------------------------------------------------------------------------
def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(*folders: Path) -> list[str]:
    """Hidden entries (temporary folders, lock files) anywhere under ``folders``; an analysis folder's own memo
    (``.cache``, read back by the next analysis into it) is no leftover."""
    from craftmd.analysis.tables import CACHE

    return sorted(str(p) for f in folders if f.exists() for p in f.rglob(".*") if CACHE not in p.relative_to(f).parts)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def toy_release(path: Path, graders=("offline",)) -> Path:
    cols = ["case_id", "trial", "setting", "format", "with_image", "response", "status"]
    rows = [(f"case_{i}", 0, "vignette", "frq", False, "Psoriasis", "ok") for i in (1, 2, 3)]
    answers = pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})
    manifest = RunRecord(task="craftmd", release=path.name, kind="generated", model="openai/toy", source={})
    return write_release(path, manifest, {"answers": answers}, scores=(grades(*graders), {g: {"v": 1} for g in graders}))


def grades(*graders: str, correct: bool = True) -> pa.Table:
    return scores_from_grades([{"case_id": f"case_{i}", "trial": 0, **KEY, "grader": g, "resolved": None, "resolved_kind": "single",
                                "correct": correct, "detail": None} for i in (1, 2, 3) for g in graders])  # fmt: skip


def flip_a_bit_in_the_value_column(path: Path) -> None:
    meta = pq.ParquetFile(path).metadata
    col = meta.schema.names.index("value")
    chunk = meta.row_group(0).column(col)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    pos = start + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


def dead(pid: int) -> bool:
    """Whether process ``pid`` is gone (or a zombie nobody reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, IndexError):
        return True
    return state in "ZX"


def wait_dead(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if dead(pid):
            return True
        time.sleep(0.05)
    return dead(pid)


# -- (1) output folders are swapped in whole -------------------------------------------------------
def test_atomic_dir_refuses_an_output_that_appeared_meanwhile_and_cleans_killed_runs(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(CraftMDError, match="exists .pass --overwrite"):
        with atomic_dir(out, overwrite=False) as tmp:
            (tmp / "mine").write_text("a")
            out.mkdir()
            (out / "theirs").write_text("b")  # another run put its output in place first
    assert snapshot(out) == {"theirs": b"b"} and leftovers(tmp_path) == []
    # A killed run's temporary folder (its process gone) is removed by the next run; a live one's is kept.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f".out.tmp-{gone.pid}-x1"
    live = tmp_path / f".out.tmp-{os.getppid()}-x2"
    for d in (stale, live):
        d.mkdir()
        (d / "half.csv").write_text("a,b\n1,")
    with atomic_dir(out, owns=("theirs",)) as tmp:  # an earlier output of this writer (it holds its "theirs")
        (tmp / "new").write_text("c")
    assert snapshot(out) == {"new": b"c"} and not stale.exists() and live.exists()
    # An unrelated folder is never replaced.
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"x")
    with pytest.raises(CraftMDError, match="not an output of this command"):
        with atomic_dir(other, owns=("tables", "index.html")):
            pass
    assert snapshot(other) == {"cat.jpg": b"x"}


def test_analyse_failures_leave_the_previous_output_exactly_and_say_one_line(
    releases_dir, dataset_dir, tmp_path, monkeypatch, capsys
):
    from craftmd.analysis import draw, figures

    releases = tmp_path / "releases"
    for name in ("gpt4_1106", "gpt3_1106"):
        shutil.copytree(releases_dir / name, releases / name)
    out = tmp_path / "board"
    argv = analyse_argv(releases, dataset_dir, out, resamples=20)
    assert main(argv) == 0
    before = snapshot(out)
    assert {"index.html", "leaderboard.md", "tables/pvalues.csv"} <= set(before) and any(k.startswith("figures/") for k in before)
    capsys.readouterr()

    # Figures raising: nothing of the new run shows, tables included (they were written before the figures).
    def broken(*a, **kw):
        raise RuntimeError("figures broke")

    with monkeypatch.context() as m:
        m.setattr(figures, "write_figures", broken)
        m.setattr(draw, "JOBS", 1)  # drawn here, where the patch is (a worker's figures raise the same way)
        with pytest.raises(RuntimeError, match="figures broke"):
            main([*argv[:-2], "7", "--page"])  # other resamples: other tables, were they written
    assert snapshot(out) == before and leftovers(tmp_path / "board", tmp_path) == []

    # A full disk while writing pvalues.csv: one line naming the file, no table cut mid-row.
    real = pl.DataFrame.write_csv

    def full_disk(self, file=None, *a, **kw):
        if file is not None and Path(file).name == "pvalues.csv":
            text = self.write_csv()
            Path(file).write_text(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real(self, file, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(pl.DataFrame, "write_csv", full_disk)
        assert main([*argv[:-2], "7", "--page"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("craftmd analyse: error: No space left on device: ") and "pvalues.csv" in line
    assert snapshot(out) == before and leftovers(tmp_path / "board", tmp_path) == []

    # An --out that is no analysis folder is refused before any work, and left alone.
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me")
    assert main([*argv[:-4], str(mine)]) == 2
    assert "not an output of this command" in one_line(capsys.readouterr().err)
    assert snapshot(mine) == {"todo.txt": b"keep me"}


# -- submissions' --out ----------------------------------------------------------------------------
def _submission(tmp_path: Path, dataset_dir: Path, name: str, n: int = 3, response: str | None = "Psoriasis") -> Path:
    from craftmd.dataset import load_config

    cases = load_config(dataset_dir, "derm_public")["case_id"].to_list()[:n]
    p = tmp_path / name
    p.write_text("".join(json.dumps({"case_id": c, "trial": 0, "setting": "vignette", "format": "frq", "response": response}) + "\n"
                         for c in cases))  # fmt: skip
    return p


def test_two_scores_into_one_out_never_replace_each_other(tmp_path, dataset_dir, monkeypatch):
    import craftmd.analysis.report as report
    from craftmd.commands.submit import score_submission

    a, b = _submission(tmp_path, dataset_dir, "a.jsonl"), _submission(tmp_path, dataset_dir, "b.jsonl", n=5)
    out = tmp_path / "out"
    real, raced = report.submission_report, []

    def racing(*args, **kw):
        if not raced:  # while run A scores, run B (same --out, no --overwrite) finishes first
            raced.append(1)
            score_submission(b, dataset_dir, "acme/b", out, config="derm_public", B=50, progress=False)
        return real(*args, **kw)

    monkeypatch.setattr(report, "submission_report", racing)
    with pytest.raises(CraftMDError, match="exists .pass --overwrite to replace it"):
        score_submission(a, dataset_dir, "acme/a", out, config="derm_public", B=50, progress=False)
    assert json.loads((out / "scores.json").read_text())["release"] == submission_id("acme/b")
    assert sorted(p.name for p in out.iterdir()) == ["scores.csv", "scores.json", submission_id("acme/b")]
    assert leftovers(tmp_path) == []


def test_a_killed_score_leaves_no_temporary_folder_after_the_next_run(tmp_path, dataset_dir):
    sub = _submission(tmp_path, dataset_dir, "s.jsonl")
    out = tmp_path / "out"
    argv = submit_argv(sub, dataset_dir, "acme/k", out, config="derm_public")
    proc = subprocess.Popen(
        [sys.executable, "-m", "craftmd.commands.cli", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not leftovers(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert leftovers(tmp_path)  # what the killed run left
    assert main(argv) == 0
    assert leftovers(tmp_path) == []
    assert (out / "scores.json").exists()


def test_the_score_summary_says_how_many_answers_were_missing_and_why(tmp_path, dataset_dir, capsys):
    from craftmd.dataset import load_config

    n = load_config(dataset_dir, "derm_public").height
    sub = _submission(tmp_path, dataset_dir, "nulls.jsonl", n=3, response=None)  # three rows, every response null
    argv = submit_argv(sub, dataset_dir, "acme/n", tmp_path / "o", config="derm_public")
    assert main(argv) == 0
    said = capsys.readouterr().out.splitlines()[0]
    assert said.startswith(
        f"scored {n} answers: 0 answered, {n} missing and scored wrong ({n - 3} not in the submission, 3 with an empty response)"
    )


def test_a_300_character_model_name_fails_before_grading(tmp_path, dataset_dir, monkeypatch, capsys):
    import craftmd.scoring.grade as grade

    def never(*a, **kw):
        raise AssertionError("graded")

    monkeypatch.setattr(grade, "grade_answers", never)
    sub = _submission(tmp_path, dataset_dir, "s.jsonl")
    out = tmp_path / "o"
    assert (
        main(["submit", str(sub), "--dataset", str(dataset_dir), "--model", "acme/" + "m" * 300, "--out", str(out), "--quiet"])
        == 2
    )
    assert "305 characters long" in one_line(capsys.readouterr().err)
    assert not out.exists() and leftovers(tmp_path) == []


# -- (2) one writer of a release at a time ---------------------------------------------------------
def test_concurrent_scorers_of_one_release_both_keep_their_scores(tmp_path, monkeypatch):
    import craftmd.release as release

    out = toy_release(tmp_path / "r")
    # Each writer read the release (and its scores) before either wrote, as two `craftmd score` runs do.
    rels = [read_release(out), read_release(out)]
    for r in rels:
        r.scores_with_records()
    real = release.encode_scores

    def slow(*a, **kw):
        time.sleep(0.3)  # both writers between reading and writing at once
        return real(*a, **kw)

    monkeypatch.setattr(release, "encode_scores", slow)
    errors = []

    def write(rel, grader):
        try:
            write_scores(rel, grades(grader), {grader: {"v": 2}})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(r, g)) for r, g in zip(rels, ("paper", "strict"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    after = read_release(out)
    assert set(after.scorer_records()) == {"offline", "paper", "strict"}
    assert set(after.verdicts()["grader"]) == {"offline", "paper", "strict"}
    assert not lock_path(out).exists() and leftovers(tmp_path) == []


def test_a_second_writer_waits_and_says_who_holds_the_release(tmp_path, monkeypatch, capsys):
    out = toy_release(tmp_path / "r")
    holder = "from craftmd.atomic import locked\nimport sys, time\nwith locked(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", holder, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        monkeypatch.setenv("CRAFTMD_LOCK_TIMEOUT", "0.5")
        with pytest.raises(CraftMDError) as err:
            write_scores(read_release(out), grades("paper"), {"paper": {}})
        assert f"{out} is being written by pid {proc.pid} on " in str(err.value) and "\n" not in str(err.value)
        assert f"craftmd: waiting for {out}: being written by pid {proc.pid}" in capsys.readouterr().err
        assert set(read_release(out).scorer_records()) == {"offline"}
    finally:
        proc.kill()  # a killed holder lets go: the lock is the operating system's
        proc.wait()
    write_scores(read_release(out), grades("paper"), {"paper": {}})
    assert set(read_release(out).scorer_records()) == {"offline", "paper"}
    assert not lock_path(out).exists()


# -- (3) every file of a release is in its checksums -----------------------------------------------
def test_every_file_of_a_release_is_checked_and_a_damaged_one_named_with_how_to_rebuild(tmp_path):
    out = toy_release(tmp_path / "r")
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["files"]) == {p.name for p in out.iterdir()} - {"manifest.json"} == {"answers.parquet", "scores.parquet"}
    # Re-running the same writes gives the same bytes, the checksums included.
    again = toy_release(tmp_path / "again" / "r")
    assert snapshot(again) == snapshot(out)
    write_scores(read_release(out), grades("paper"), {"paper": {}})
    write_scores(read_release(again), grades("paper"), {"paper": {}})
    assert snapshot(again) == snapshot(out)
    good = (out / "scores.parquet").read_bytes()

    flip_a_bit_in_the_value_column(out / "scores.parquet")
    with pytest.raises(CraftMDError) as err:
        read_release(out)
    msg = str(err.value)
    assert msg.startswith(f"{out / 'scores.parquet'} is damaged") and "\n" not in msg
    assert f"rebuild it: remove {out / 'scores.parquet'} and score the release again (craftmd score {out}" in msg

    (out / "scores.parquet").write_bytes(good[: len(good) // 2])  # cut short
    with pytest.raises(CraftMDError, match="scores.parquet is damaged"):
        read_release(out)
    # Rebuilt as the message says: removed, the release reads as unscored; scored again, it is whole.
    (out / "scores.parquet").unlink()
    assert read_release(out).scorer_records() == {}
    write_scores(read_release(out), grades("offline"), {"offline": {"v": 1}})
    assert set(read_release(out).scorer_records()) == {"offline"}
    # A scores file the checksums do not list is refused too.
    m = json.loads((out / "manifest.json").read_text())
    del m["files"]["scores.parquet"]
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CraftMDError, match="scores.parquet is not in manifest.json's checksums"):
        read_release(out)


def test_a_damaged_upstream_release_is_one_line_and_rebuilt_by_ingest(releases_dir, dataset_dir, source, tmp_path, capsys):
    from craftmd.generation.ingest import ingest

    rel = tmp_path / "releases" / "gpt3_1106"
    shutil.copytree(releases_dir / "gpt3_1106", rel)
    good = (rel / "scores.parquet").read_bytes()
    (rel / "scores.parquet").write_bytes(good[: len(good) // 3])
    for argv in (
        ["score", str(rel), "--dataset", str(dataset_dir), "--scorer", "offline", "--quiet"],
        ["analyse", "--releases", str(rel.parent), "--dataset", str(dataset_dir), "--out", str(tmp_path / "a")],
    ):
        assert main(argv) == 2
        line = one_line(capsys.readouterr().err)
        assert (
            f"{rel / 'scores.parquet'} is damaged" in line
            and "rebuild it: craftmd ingest --overwrite (or make leaderboard)" in line
        )
    ingest(
        source, dataset_dir, rel.parent, models=["gpt3_1106"], progress=False, skip_existing=True
    )  # what make leaderboard runs
    assert (rel / "scores.parquet").read_bytes() == good
    assert snapshot(rel) == snapshot(releases_dir / "gpt3_1106")


# -- (4) disk and file errors are one line ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dataset(source, tmp_path_factory):
    from loopback import pick_upstream, write_replay_dataset

    out = tmp_path_factory.mktemp("gen") / "data"
    write_replay_dataset(pick_upstream(source, 2, seed=5, max_messages=8), out)
    return out


def _generate(dataset: Path, url: str, cache: Path, out: Path) -> list[str]:
    return generate_argv(dataset, "--experiments", "vignette,frq", base_url=url, cache=cache, out=out)


def test_generate_finds_an_unwritable_output_before_its_first_call(tiny_dataset, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with LoopbackServer(lambda req: "**Final Diagnosis:** Psoriasis") as server:
        assert main(_generate(tiny_dataset, server.base_url, tmp_path / "c.sqlite", blocker / "rel")) == 2
        assert server.calls == 0
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"craftmd generate: error: cannot write {blocker / 'rel'}: Not a directory")
    with pytest.raises(CraftMDError, match="is a file, not a folder|exists"):
        check_writable(blocker, overwrite=False)


def test_a_damaged_request_cache_is_one_line_naming_it(tiny_dataset, tmp_path, capsys):
    import sqlite3

    from craftmd.models.base import Completion, Sampling
    from craftmd.models.cache import RequestCache, request_key

    cache = tmp_path / "c.sqlite"
    with RequestCache(cache) as c:
        for i in range(300):
            key, req = request_key("openai", "m", [{"role": "user", "content": f"hi {i} " * 20}], Sampling())
            c.put(key, "openai", "m", req, Completion(text="x" * 200, status="ok"))
    db = sqlite3.connect(cache)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    data = bytearray(cache.read_bytes())
    for off in range(2 * 4096, len(data), 4096):  # every page but the header and the schema: it opens, its queries fail
        data[off : off + 64] = b"\xff" * 64
    cache.write_bytes(bytes(data))
    with LoopbackServer(lambda req: "**Final Diagnosis:** Psoriasis") as server:
        assert main(_generate(tiny_dataset, server.base_url, cache, tmp_path / "rel")) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"craftmd generate: error: {cache}: request cache: database disk image is malformed; it is damaged")
    assert not (tmp_path / "rel").exists()


@pytest.mark.parametrize(
    "code, words",
    [(errno.EACCES, "Permission denied"), (errno.EROFS, "Read-only file system"), (errno.ENOSPC, "No space left on device")],
)
def test_os_errors_reach_the_user_as_one_line(tmp_path, monkeypatch, capsys, code, words):
    import craftmd.analysis.tables as tables

    def fail(*a, **kw):
        raise OSError(code, os.strerror(code), str(tmp_path / "x.csv"))

    monkeypatch.setattr(tables, "analyse", fail)
    assert main(["analyse", "--releases", str(tmp_path), "--dataset", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"craftmd analyse: error: {words}: {tmp_path / 'x.csv'}")
    with pytest.raises(OSError):
        main(["--debug", "analyse", "--releases", str(tmp_path), "--dataset", str(tmp_path), "--out", str(tmp_path / "o")])


# -- (6) every model server a test or a benchmark starts is stopped ---------------------------------
STAND_IN = r"""
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "smollm2"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def stand_in(tmp_path: Path, command=None, **kw):
    """A RealModelServer whose process is a tiny stand-in that answers /v1/models (no llama.cpp needed)."""
    from realmodel import RealModelServer

    class StandIn(RealModelServer):
        def command(self):
            return command or [sys.executable, "-c", STAND_IN, str(self.port)]

    return StandIn(python=Path(sys.executable), model_file=tmp_path / "unused.gguf", log=tmp_path / "server.log", **kw)


def test_every_model_server_started_is_stopped(tmp_path, monkeypatch):
    import realmodel

    started = []
    popen = realmodel.subprocess.Popen

    def spy(*a, **kw):
        started.append(popen(*a, **kw))
        return started[-1]

    monkeypatch.setattr(realmodel.subprocess, "Popen", spy)
    with stand_in(tmp_path).start() as server:  # the benchmark's way: start(), then the with block enters it
        assert server.running and len(started) == 1
    with pytest.raises(KeyError):
        with stand_in(tmp_path):  # an error inside the block
            raise KeyError("x")
    with pytest.raises(RuntimeError, match="did not answer"):  # a server that never comes up
        stand_in(tmp_path, command=[sys.executable, "-c", "import time; time.sleep(60)"], start_timeout=1).start()
    assert len(started) == 3
    assert all(wait_dead(p.pid) for p in started)


def test_a_server_left_running_is_stopped_when_the_interpreter_exits(tmp_path):
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pathlib import Path
from test_outputs import stand_in
s = stand_in(Path({str(tmp_path)!r})).start()
print(s.proc.pid, flush=True)
"""  # no stop(): the caller forgot, or crashed
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert wait_dead(int(done.stdout.split()[0]))


# -- (7) the wheel installs and runs ----------------------------------------------------------------
@pytest.mark.packaging
def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path, source):
    """Build the wheel from the checkout's files, install it into a fresh venv (its dependencies from
    this one's site-packages, by a .pth file), and from a folder outside the checkout build the
    dataset and generate a release against a loopback server. ~1-2 min."""
    import sysconfig

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the wheel is built from the tracked files")
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True, check=True
    )
    src = tmp_path / "src"
    for rel in files.stdout.splitlines():
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)], check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    (wheel,) = wheels.glob("craftmd-*.whl")
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    rooms = {"craftmd": "craftmd", "dataset_builder": "craftmd/dataset_builder", "generation": "craftmd/generation",
             "scoring": "craftmd/scoring", "analysis": "craftmd/analysis", "cards": "craftmd/cards"}  # fmt: skip
    shipped = [
        f"{rooms[top]}/{rest}" for top, _, rest in (r.partition("/") for r in files.stdout.splitlines()) if top in rooms and rest
    ]
    assert (
        shipped and [f for f in shipped if f not in names] == []
    )  # every tracked file of every room: code, prompts, SQL, data, templates

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # the dependencies, not craftmd
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    from craftmd.dataset_builder.mediq import default_location as mediq_location

    # The pinned archives are named (outside a checkout there is no ../shared beside the package to find them in).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "OPENAI_API_KEY": "sk-unused",
        "CRAFTMD_MEDIQ": str(mediq_location()),
        "CRAFTMD_SOURCE": str(source.location),  # and upstream's code beside it (the default prompt set reads it)
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(args, capture_output=True, text=True, cwd=elsewhere, env=env, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    where = run(str(py), "-c", "import craftmd, craftmd.tasks, craftmd.dataset_builder; print(craftmd.__file__)").stdout.strip()
    assert Path(where).is_relative_to(venv), where
    craftmd = str(venv / "bin" / "craftmd")
    run(craftmd, "build", "--source", str(source.location), "--out", "data", "--quiet")
    with LoopbackServer(lambda req: "**Final Diagnosis:** Psoriasis") as server:
        options = ("--cases", "case_1", "--experiments", "vignette,frq")
        run(craftmd, *generate_argv("data", *options, base_url=server.base_url, cache="c.sqlite", out="rel"))
        assert server.calls >= 1
    answers = read_release(elsewhere / "rel").table("answers")
    assert answers.num_rows == 1 and answers.column("response").to_pylist() == ["**Final Diagnosis:** Psoriasis"]
