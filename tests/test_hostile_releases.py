"""A release others can trust (issue 29): what a release, a submission or an inspect log says never runs code, never
merges two models, never replaces a folder its command did not write, never reaches outside its folder.

Each test plays a hostile (or careless) user against the commands, with the issue's payloads and others of the same
kind: task files named by a manifest or a log, pickles in parquet metadata, a task file that exits, colliding model
names, copies of one release, ``--overwrite`` into a folder of releases, links and ``..`` in what a release names.
The last one runs ``craftmd leaderboard`` over a releases folder seeded with a hostile release.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError
from craftmd.atomic import sha256_file
from craftmd.commands.cli import main
from craftmd.release import RunRecord, find_releases, read_release, write_release

from helpers import analyse_argv, run_leaderboard, submit_argv

EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


def _release(path: Path, dataset_dir: Path, *, model: str = "acme/tiny", n: int = 3, extra_ids: tuple[str, ...] = ()) -> Path:
    """A small CRAFT-MD release: vignette FRQ answers for ``n`` derm cases (and ``extra_ids``), written by the package."""
    from craftmd.dataset import load_config

    ids = load_config(dataset_dir, "derm_public")["case_id"].to_list()[:n] + list(extra_ids)
    rows = [
        {
            "case_id": c,
            "trial": 0,
            "setting": "vignette",
            "format": "frq",
            "with_image": False,
            "response": "Psoriasis",
            "status": "ok",
        }
        for c in ids
    ]
    m = RunRecord(task="craftmd", release=path.name, kind="generated", model=model)
    return write_release(path, m, {"answers": pa.Table.from_pylist(rows)})


def _tamper(rel: Path, **changes) -> None:
    """Change the run record as a hand with a text editor would (the manifest is not among the hashed files)."""
    mf = rel / "manifest.json"
    raw = json.loads(mf.read_text())
    raw.update(changes)
    mf.write_text(json.dumps(raw))


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and err.count("\n") == 0, err
    return err


def _evil(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "ran"
    evil = tmp_path / f"evil_{re.sub(r'[^A-Za-z0-9]', '_', tmp_path.name)}.py"  # its own name: a module run before is not cached
    evil.write_text(EVIL.format(marker=str(marker)))
    return evil, marker


def _rewrite_log(log: Path, change) -> None:
    """Change an ``.eval`` log's header (its eval metadata) with ``change(header)``, every other member as it was."""
    with zipfile.ZipFile(log) as z:
        members = {n: z.read(n) for n in z.namelist()}
    header = json.loads(members["header.json"])
    change(header)
    members["header.json"] = json.dumps(header).encode()
    with zipfile.ZipFile(log, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)


# -- 1. nothing read from a release, a log or a dataset runs code ---------------------------------------------------
def test_a_release_naming_a_task_file_runs_nothing_in_score_or_export(dataset_dir, tmp_path, monkeypatch, capsys):
    evil, marker = _evil(tmp_path)
    rel = _release(tmp_path / "releases" / "tiny", dataset_dir)
    monkeypatch.chdir(tmp_path)  # the payload: a relative path, resolved against the working directory
    for task in (str(evil), evil.name, f"../{evil.name}", f"tasks/../{evil.name}"):
        _tamper(rel, task=task)
        for argv in (
            ["score", str(rel), "--dataset", str(dataset_dir), "--quiet"],
            ["export", str(rel), "--inspect", str(tmp_path / "logs"), "--quiet"],
        ):
            assert main(argv) == 2, (task, argv[0])
            err = _one_line(capsys)
            assert str(rel) in err and "task" in err, err
            assert not marker.exists(), f"{argv[0]} ran the task file {task}"
    # a registered name the release cannot be read by: its task file not named by the user
    _tamper(rel, task="evil")
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    assert "unknown task 'evil'" in _one_line(capsys) and not marker.exists()


def test_a_pickle_in_parquet_metadata_is_never_unpickled(dataset_dir, tmp_path, capsys):
    """Another carrier of code: arrow's old pickled extension type, in a release's answers file (its hash made to match)."""
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):
            return (exec, (f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')",))

    rel = _release(tmp_path / "pickled", dataset_dir)
    t = pq.read_table(rel / "answers.parquet")
    field = t.schema.field("response").with_metadata(
        {b"ARROW:extension:name": b"arrow.py_extension_type", b"ARROW:extension:metadata": pickle.dumps(Payload())}
    )
    pq.write_table(t.cast(t.schema.set(t.schema.get_field_index("response"), field)), rel / "answers.parquet")
    raw = json.loads((rel / "manifest.json").read_text())
    raw["files"]["answers.parquet"]["sha256"] = sha256_file(rel / "answers.parquet")
    (rel / "manifest.json").write_text(json.dumps(raw))
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 0  # read as plain text: scored, not run
    assert not marker.exists()
    assert read_release(rel).verdicts(grader="offline").height == 3


def test_an_inspect_log_naming_a_task_file_runs_nothing(dataset_dir, tmp_path, capsys):
    evil, marker = _evil(tmp_path)
    rel = _release(tmp_path / "tiny", dataset_dir)
    assert main(["export", str(rel), "--inspect", str(tmp_path / "logs"), "--quiet"]) == 0
    capsys.readouterr()
    log = next((tmp_path / "logs").glob("*.eval"))

    def embedded(h):  # the payload: the task of the log's embedded run record
        h["eval"]["metadata"]["craftmd.manifest"]["task"] = str(evil)

    def native(h):  # another: a log with no run record, whose task description names the file
        meta = h["eval"]["metadata"]
        del meta["craftmd.manifest"]
        meta["craftmd"] = {"task": str(evil)}

    for change in (embedded, native):
        bad = tmp_path / f"{change.__name__}.eval"
        shutil.copy(log, bad)
        _rewrite_log(bad, change)
        assert main(["ingest", "--inspect", str(bad), "--out", str(tmp_path / f"r-{change.__name__}")]) == 2, change.__name__
        err = _one_line(capsys)
        assert "task" in err and not marker.exists(), err
        assert not (tmp_path / f"r-{change.__name__}").exists()


def test_a_task_file_of_ones_own_is_bound_to_its_release_by_hash(dataset_dir, tmp_path, capsys, monkeypatch):
    """A task file runs when the user names it; a release of it records its sha256 and is read only with that file."""
    src = Path(__file__).parent / "fixtures" / "oneword"
    shutil.copytree(src, tmp_path / "oneword")
    task_file = tmp_path / "oneword" / "oneword.py"
    env = dict(os.environ, CRAFTMD_TASKS=str(task_file))
    code = (
        "import pyarrow as pa, sys; from craftmd.release import RunRecord, write_release\n"
        "rows = [{'case_id': c, 'trial': 0, 'setting': 'oneword', 'format': 'text', 'with_image': False, 'response': 'a b',"
        " 'status': 'ok'} for c in sys.argv[2:]]\n"
        "write_release(sys.argv[1], RunRecord(release='toy', kind='generated', model='m', task='oneword'),"
        " {'answers': pa.Table.from_pylist(rows)})\n"
    )
    from craftmd.dataset import load_config

    ids = load_config(dataset_dir, "derm_public")["case_id"].to_list()[:3]
    rel = tmp_path / "toy"
    made = subprocess.run([sys.executable, "-c", code, str(rel), *ids], env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    recorded = json.loads((rel / "manifest.json").read_text())["task_sha256"]
    assert recorded == sha256_file(task_file)
    score = [sys.executable, "-m", "craftmd.commands.cli", "score", str(rel), "--dataset", str(dataset_dir), "--quiet"]
    ok = subprocess.run(score, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    # the same name, another file: refused in one line, before anything of the release is read
    task_file.write_text(task_file.read_text() + "\n# changed\n")
    changed = subprocess.run(score, env=env, capture_output=True, text=True, timeout=300)
    assert changed.returncode == 2 and "is not the one that made this release" in changed.stderr
    assert changed.stderr.strip().count("\n") == 0
    # a built-in task claiming a task file's hash is refused too
    _tamper(rel, task="craftmd", task_sha256=recorded)
    with pytest.raises(CraftMDError, match="built in"):
        read_release(rel)


@pytest.mark.parametrize(
    "n, body", list(enumerate(["import sys\nsys.exit(0)\n", "raise SystemExit\n", "import sys\nsys.exit(3)\n"]))
)
def test_a_task_file_that_exits_is_an_error_not_a_success(n, body, dataset_dir, tmp_path, monkeypatch, capsys):
    exits = tmp_path / f"exits{n}.py"
    exits.write_text(body)
    monkeypatch.setenv("CRAFTMD_TASKS", str(exits))
    sub = tmp_path / "sub.jsonl"
    sub.write_text("")
    assert main(["validate", str(sub), "--dataset", str(dataset_dir)]) == 2
    err = _one_line(capsys)
    assert str(exits) in err and "exits (SystemExit" in err


# -- 2. release ids are unique and stable ---------------------------------------------------------------------------
def test_two_model_names_with_one_slug_make_two_releases(dataset_dir, tmp_path):
    from craftmd.dataset import load_config
    from craftmd.registry import slug
    from craftmd.scoring.submission import submit

    ids = load_config(dataset_dir, "derm_public")["case_id"].to_list()[:4]
    releases = tmp_path / "releases"
    names = ["acme/med-7b", "acme med 7b", "acme_med_7b", "Acme/Med-7B"]
    for i, name in enumerate(names):  # four models, four sets of answers (one set under two ids is one run: refused)
        sub = tmp_path / f"sub{i}.jsonl"
        sub.write_text(
            "".join(
                json.dumps({"case_id": c, "trial": 0, "setting": "vignette", "format": "frq", "response": f"Psoriasis {i}"})
                + "\n"
                for c in ids
            )
        )
        submit(sub, dataset_dir, name, releases, graders=["offline"], config="derm_public", progress=False)
    sub = tmp_path / "sub0.jsonl"
    found = find_releases(releases)
    assert sorted(r.manifest.model for r in found) == sorted(names)
    assert len({r.id for r in found}) == len(names)
    for r in found:  # still readable: the slug, then a short hash of the exact name
        assert (
            r.id.startswith(f"submission-{slug(r.manifest.model, '-')}-")
            and len(r.id) == len(f"submission-{slug(r.manifest.model, '-')}-") + 8
        )
    again = submit(
        sub, dataset_dir, "acme/med-7b", tmp_path / "again", graders=["offline"], config="derm_public", progress=False
    )[0]
    assert again.name in {r.id for r in found}  # stable: the same name, the same id


def test_two_releases_of_one_id_are_refused_naming_both_folders(dataset_dir, tmp_path, capsys):
    releases = tmp_path / "releases"
    rel = _release(releases / "tiny", dataset_dir)
    # the README's own round trip: export, then ingest into a new folder beside the original (the same run)
    assert main(["export", str(rel), "--inspect", str(tmp_path / "logs"), "--quiet"]) == 0
    logs = sorted(map(str, (tmp_path / "logs").glob("*.eval")))
    assert main(["ingest", "--inspect", *logs, "--out", str(releases / "tiny-again")]) == 0
    capsys.readouterr()
    argv = analyse_argv(releases, dataset_dir, tmp_path / "site", resamples=20, page=False)
    assert main(argv) == 2
    err = _one_line(capsys)
    assert str(releases / "tiny") in err and str(releases / "tiny-again") in err and "'tiny'" in err
    assert not (tmp_path / "site").exists()
    # another: a copy of a release folder under another name
    shutil.rmtree(releases / "tiny-again")
    shutil.copytree(rel, releases / "copy")
    assert main(argv) == 2
    err = _one_line(capsys)
    assert str(releases / "copy") in err and str(releases / "tiny") in err


# -- 3. --overwrite replaces only what that command wrote ------------------------------------------------------------
NOT_ITS_OWN = "not an output of this command|did not write"


def _folder_of_releases(tmp_path: Path, dataset_dir: Path) -> tuple[Path, dict]:
    releases = tmp_path / "releases"
    _release(releases / "theirs", dataset_dir)
    (releases / "NOTES.txt").write_text("my notes")
    return releases, {p.name: p.stat().st_mtime_ns for p in releases.rglob("*")}


def test_overwrite_never_replaces_a_folder_of_releases(dataset_dir, tmp_path, capsys):
    releases, before = _folder_of_releases(tmp_path, dataset_dir)
    m = RunRecord(task="craftmd", release="releases", kind="generated", model="acme/x")
    answers = read_release(releases / "theirs").table("answers")
    with pytest.raises(CraftMDError, match=NOT_ITS_OWN):  # generate, merge and ingest all write through it
        write_release(releases, m, {"answers": answers}, overwrite=True)
    # the same through the commands: ingest --inspect and submit into the releases folder with --overwrite
    rel = _release(tmp_path / "tiny", dataset_dir)
    assert main(["export", str(rel), "--inspect", str(tmp_path / "logs"), "--quiet"]) == 0
    log = str(next((tmp_path / "logs").glob("*.eval")))
    assert main(["ingest", "--inspect", log, "--out", str(releases), "--overwrite"]) == 2
    assert re.search(NOT_ITS_OWN, _one_line(capsys))
    sub = tmp_path / "sub.jsonl"
    sub.write_text(
        json.dumps(
            {"case_id": answers["case_id"][0].as_py(), "trial": 0, "setting": "vignette", "format": "frq", "response": "x"}
        )
        + "\n"
    )
    (releases / "scores.json").write_text("{}")  # even with what a score folder has, the folder holds others' files
    assert main(submit_argv(sub, dataset_dir, "acme/x", releases, "--overwrite", config="derm_public")) == 2
    assert re.search(NOT_ITS_OWN, _one_line(capsys))
    (releases / "scores.json").unlink()
    assert {p.name: p.stat().st_mtime_ns for p in releases.rglob("*")} == before
    assert (releases / "NOTES.txt").read_text() == "my notes"
    # a release is still replaced by its command with --overwrite
    assert main(["ingest", "--inspect", log, "--out", str(releases / "theirs"), "--overwrite"]) == 0


def test_output_folders_get_the_umasks_permissions(dataset_dir, tmp_path):
    old = os.umask(0o022)
    try:
        rel = _release(tmp_path / "shared", dataset_dir)
        assert (rel.stat().st_mode & 0o777) == 0o755
        os.umask(0o027)
        rel = _release(tmp_path / "group", dataset_dir)
        assert (rel.stat().st_mode & 0o777) == 0o750
    finally:
        os.umask(old)


# -- 4. links and paths a release names stay inside ------------------------------------------------------------------
def test_score_never_copies_through_a_link_inside_a_release(dataset_dir, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "big.bin").write_bytes(b"x" * 1000)
    for name, target in (("extra", elsewhere), ("notes.txt", elsewhere / "big.bin")):
        rel = _release(tmp_path / f"linked-{name}", dataset_dir)
        (rel / name).symlink_to(target)
        assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
        err = _one_line(capsys)
        assert "symbolic link" in err and str(rel / name) in err
        assert (rel / name).is_symlink() and not (rel / "scores.parquet").exists()


def test_export_and_read_stay_inside_their_folders(dataset_dir, tmp_path, capsys):
    rel = _release(tmp_path / "a" / "b" / "c" / "tiny", dataset_dir)
    out = tmp_path / "a" / "b" / "c" / "logs"
    for rid in ("../../../X", "..", "a/b", "/abs"):
        _tamper(rel, release=rid)
        assert main(["export", str(rel), "--inspect", str(out), "--quiet"]) == 2, rid
        assert "release" in _one_line(capsys)
        assert not list(tmp_path.rglob("*.eval"))
    _tamper(rel, release="tiny")
    raw = json.loads((rel / "manifest.json").read_text())
    for name in ("../../../../../etc/hostname", "/etc/hostname"):
        _tamper(rel, files={**raw["files"], name: {"sha256": "0" * 64, "rows": 1}})
        with pytest.raises(CraftMDError, match="not a plain name"):
            read_release(rel)


# -- 5. ingest --inspect checks what a log claims --------------------------------------------------------------------
def test_ingest_checks_a_logs_model_name_kind_and_cases(dataset_dir, tmp_path, capsys):
    rel = _release(tmp_path / "tiny", dataset_dir, extra_ids=("case_not_in_the_dataset",))
    assert main(["export", str(rel), "--inspect", str(tmp_path / "logs"), "--quiet"]) == 0
    capsys.readouterr()
    log = next((tmp_path / "logs").glob("*.eval"))
    for i, name in enumerate(("acme\nmed", "acme\x1b[31mred", "acme\u202emed", "")):
        bad = tmp_path / f"name{i}.eval"
        shutil.copy(log, bad)
        _rewrite_log(bad, lambda h, name=name: h["eval"]["metadata"]["craftmd.manifest"].update(model=name))
        assert main(["ingest", "--inspect", str(bad), "--out", str(tmp_path / f"n{i}")]) == 2, ascii(name)
        assert "model" in _one_line(capsys) and not (tmp_path / f"n{i}").exists()
    # a case the dataset does not hold: refused, listing it (nothing dropped without a word)
    assert main(["ingest", "--inspect", str(log), "--out", str(tmp_path / "cases"), "--dataset", str(dataset_dir)]) == 2
    assert "case_not_in_the_dataset" in _one_line(capsys) and not (tmp_path / "cases").exists()
    # a log claiming to be an upstream release makes a generated one
    claimed = tmp_path / "claimed.eval"
    shutil.copy(log, claimed)
    _rewrite_log(claimed, lambda h: h["eval"]["metadata"]["craftmd.manifest"].update(kind="upstream"))
    assert main(["ingest", "--inspect", str(claimed), "--out", str(tmp_path / "claimed")]) == 0
    back = read_release(tmp_path / "claimed")
    assert back.manifest.kind == "generated" and "upstream" in back.manifest.notes["ingested_from"]


# -- end to end: the leaderboard over a releases folder seeded with a hostile release --------------------------------
@pytest.mark.parametrize("payload", ["task-file", "same-id", "outside"])
def test_the_leaderboard_names_a_hostile_release_and_publishes_nothing(payload, source, dataset_dir, releases_dir, tmp_path):
    evil, marker = _evil(tmp_path)
    releases = tmp_path / "releases"
    shutil.copytree(releases_dir, releases)
    hostile = releases / "zz-hostile"
    if payload == "task-file":
        _release(hostile, dataset_dir)
        _tamper(hostile, task=str(evil))
    elif payload == "same-id":  # a copy of GPT-4's release under another folder: its answers would count twice
        shutil.copytree(releases / "gpt4_1106", hostile)
    else:
        _release(hostile, dataset_dir)
        _tamper(hostile, release="../../../escaped")
    out = tmp_path / "site"
    proc = run_leaderboard(source, dataset_dir, releases, out)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("[leaderboard]")]
    assert len(lines) == 1 and str(hostile) in lines[0], proc.stderr[-2000:]
    assert not out.exists() and not marker.exists()
    assert not list(tmp_path.rglob("*escaped*"))
