"""Issue 48, part C: nothing read without a bound, nothing written half, one line for every bad input.

* A release's files and an inspect log are regular files of bounded size (and a log's JSON of bounded depth), checked
  before anything parses them: a FIFO, ``/dev/zero`` or a log of nested brackets is one line, never a hang or a
  memory blow-up.
* Bad values where data enters (a manifest's 5000-digit number, nonsense command-line numbers, a lock timeout that is
  no number) are one line and a non-zero exit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from craftmd.commands.cli import main
from craftmd.release import RunRecord, write_release


def _release(path: Path, dataset_dir: Path, n: int = 3) -> Path:
    """A small CRAFT-MD release: vignette FRQ answers for ``n`` derm cases, written by the package."""
    from craftmd.dataset import load_config

    ids = load_config(dataset_dir, "derm_public")["case_id"].to_list()[:n]
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
    return write_release(
        path,
        RunRecord(task="craftmd", release=path.name, kind="generated", model="acme/tiny"),
        {"answers": pa.Table.from_pylist(rows)},
    )


def one_line(capsys, says: str = "") -> str:
    err = capsys.readouterr().err.strip()
    assert err and err.count("\n") == 0 and "Traceback" not in err and says in err, err
    return err


# -- bounded reads ----------------------------------------------------------------------------------------------------


def _fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


def _zero(p: Path) -> None:
    p.unlink()
    p.symlink_to("/dev/zero")


def _folder(p: Path) -> None:
    p.unlink()
    p.mkdir()


@pytest.mark.parametrize(("how", "says"), [(_fifo, "a FIFO"), (_zero, "a device"), (_folder, "a folder")])
def test_a_release_file_that_is_no_regular_file_is_one_line_never_read(dataset_dir, tmp_path, capsys, how, says):
    rel = _release(tmp_path / "r", dataset_dir)
    how(rel / "answers.parquet")
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, f"not a regular file ({says})")
    assert not (rel / "scores.parquet").exists()


def test_a_manifest_that_is_a_fifo_or_too_large_is_one_line(dataset_dir, tmp_path, capsys):
    rel = _release(tmp_path / "r", dataset_dir)
    _fifo(rel / "manifest.json")
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, "not a regular file (a FIFO)")
    rel = _release(tmp_path / "s", dataset_dir)
    with open(rel / "manifest.json", "ab") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of nothing after the record
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, "too large")


def test_a_manifest_with_a_5000_digit_number_is_one_line(dataset_dir, tmp_path, capsys):
    rel = _release(tmp_path / "r", dataset_dir)
    text = (rel / "manifest.json").read_text()
    (rel / "manifest.json").write_text(text.replace('"schema_version": 2', '"schema_version": ' + "9" * 5000))
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, "unreadable manifest")


def test_a_log_of_nested_brackets_is_refused_before_inspect_reads_it(tmp_path, capsys):
    pytest.importorskip("inspect_ai")
    log = tmp_path / "nested.json"
    log.write_text("[" * 200_000 + "]" * 200_000)  # 400 KB: inspect's reader took 20 GB over it
    out = tmp_path / "out"
    assert main(["ingest", "--inspect", str(log), "--out", str(out)]) == 2
    one_line(capsys, "nested more than")
    assert not out.exists()


def test_an_eval_log_whose_member_is_nested_brackets_is_refused(tmp_path, capsys):
    pytest.importorskip("inspect_ai")
    import zipfile

    log = tmp_path / "nested.eval"
    with zipfile.ZipFile(log, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("header.json", "[" * 200_000 + "]" * 200_000)
    assert main(["ingest", "--inspect", str(log), "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "nested more than")


def test_a_log_that_is_a_fifo_is_one_line(tmp_path, capsys):
    pytest.importorskip("inspect_ai")
    log = tmp_path / "run.eval"
    os.mkfifo(log)
    assert main(["ingest", "--inspect", str(log), "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "not a regular file (a FIFO)")


# -- nothing written half -----------------------------------------------------------------------------------------------


class _Boom:
    """A scorer of FRQ answers that fails as it scores (a grader whose dataset config is missing, a crash)."""

    def __new__(cls):
        from craftmd.scoring.scorers import Offline

        class Boom(Offline):
            name = "boom"

            def score(self, rows, ctx, out):
                from craftmd import CraftMDError

                raise CraftMDError("boom: the second scorer failed")

        return Boom()


def test_score_writes_every_scorers_rows_or_none(dataset_dir, tmp_path, capsys, monkeypatch):
    from craftmd.scoring import scorers

    monkeypatch.setitem(scorers.SCORERS, "boom", _Boom)
    rel = _release(tmp_path / "r", dataset_dir)
    before = {p.name: p.read_bytes() for p in rel.iterdir()}
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--scorer", "offline", "--scorer", "boom", "--quiet"]) == 2
    one_line(capsys, "the second scorer failed")
    assert {p.name: p.read_bytes() for p in rel.iterdir()} == before  # offline's rows not written without boom's
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--scorer", "offline", "--quiet"]) == 0
    assert (rel / "scores.parquet").exists()


def test_a_lock_is_let_go_on_a_full_disk(dataset_dir, tmp_path, capsys, monkeypatch):
    import errno

    from craftmd import atomic

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    rel = _release(tmp_path / "r", dataset_dir)
    monkeypatch.setattr(atomic.os, "pwrite", full)  # the lock's holder line cannot be written
    main(["score", str(rel), "--dataset", str(dataset_dir), "--scorer", "offline", "--quiet"])
    capsys.readouterr()
    assert not atomic.lock_path(rel).exists()


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_a_lock_timeout_that_is_no_number_is_one_line(dataset_dir, tmp_path, capsys, monkeypatch, value):
    rel = _release(tmp_path / "r", dataset_dir)
    monkeypatch.setenv("CRAFTMD_LOCK_TIMEOUT", value)
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--scorer", "offline", "--quiet"]) == 2
    one_line(capsys, "CRAFTMD_LOCK_TIMEOUT")
    assert not (rel / "scores.parquet").exists()


def test_review_results_and_their_scores_are_written_together_or_not_at_all(tmp_path, monkeypatch):
    import errno

    import pyarrow as pa

    from craftmd import atomic
    from analysis.agreement.review import write_with_scores

    table = pa.table(
        {
            "case_id": ["c1"],
            "trial": pa.array([0], pa.int16()),
            "scorer": ["experts"],
            "metric": ["correct"],
            "value": [1.0],
            "label": [None],
            "detail": [None],
            "status": ["ok"],
        }
    )
    real, calls = atomic.os.fdopen, []

    def second_write_fails(fd, *a, **k):  # the disk fills after the first file
        calls.append(fd)
        if len(calls) == 2:
            os.close(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, *a, **k)

    monkeypatch.setattr(atomic.os, "fdopen", second_write_fails)
    with pytest.raises(OSError):
        write_with_scores(tmp_path / "review.json", {"id": "review"}, table, {"experts": {}})
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- one line for every bad input ------------------------------------------------------------------------------------

_ANALYSE = ["analyse", "--releases", "R", "--dataset", "D", "--out", "O"]
_REVIEW = ["judge-review", "import", "S.xlsx", "--out", "O.json"]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        ([*_ANALYSE, "--resamples", "0"], "--resamples"),
        ([*_ANALYSE, "--resamples", "-1"], "--resamples"),
        ([*_ANALYSE, "--resamples", "10000000000"], "--resamples"),
        ([*_ANALYSE, "--seed", "-5"], "--seed"),
        (["leaderboard", "--dataset", "D", "--releases", "R", "--out", "O", "--seed", "-5"], "--seed"),
        ([*_REVIEW, "--B", "0"], "--B"),
        ([*_REVIEW, "--seed", "-1"], "--seed"),
        (["judge-review", "export", "R", "--out", "S.xlsx", "--n", "0"], "--n"),
        (["judge-calibrate", "fit", "S.xlsx", "--out", "C.json", "--folds", "0"], "--folds"),
        (["judge-sensitivity", "R", "--other-judge", "openai/x", "--B", "-3"], "--B"),
        (["review", "export", "--release", "R", "--dataset", "D", "--n", "-2", "--seed", "1", "--out", "O"], "--n"),
        (["meld", "--dataset", "D", "--model", "openai/x", "--out", "O", "--threshold", "2"], "--threshold"),
        (["generate", "R", "--seed", "-5"], "--seed"),
    ],
    ids=lambda x: x if isinstance(x, str) else "_".join(x[:1] + x[-2:]),
)
def test_a_nonsense_number_on_the_command_line_is_one_line(capsys, tmp_path, monkeypatch, argv, option):
    monkeypatch.chdir(tmp_path)  # the folders named are relative: nothing is written beside the tests if a command ran
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and option in err.strip().splitlines()[-1], err


def _rewrite_answers(rel: Path, change) -> None:
    """``change(table)`` written over the release's answers, its sha256 recorded: a file that passes the checksum."""
    import hashlib
    import json

    import pyarrow.parquet as pq

    pq.write_table(change(pq.read_table(rel / "answers.parquet")), rel / "answers.parquet")
    m = json.loads((rel / "manifest.json").read_text())
    m["files"]["answers.parquet"]["sha256"] = hashlib.sha256((rel / "answers.parquet").read_bytes()).hexdigest()
    (rel / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    ("change", "column"),
    [
        (lambda t: t.drop(["status"]), "status"),
        (lambda t: t.rename_columns(["reply" if c == "response" else c for c in t.column_names]), "response"),
        (lambda t: t.drop(["setting"]), "setting"),
    ],
    ids=["no-status", "response-renamed", "no-setting"],
)
def test_a_release_missing_a_column_is_one_line_at_score(dataset_dir, tmp_path, capsys, change, column):
    rel = _release(tmp_path / "r", dataset_dir)
    _rewrite_answers(rel, change)
    assert main(["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]) == 2
    one_line(capsys, f"no column {column}")
    assert not (rel / "scores.parquet").exists()


@pytest.mark.parametrize(
    "usage", [{"prompt_tokens": 1e400}, {"completion_tokens": float("inf")}, {"prompt_tokens": 1e400, "completion_tokens": 1}]
)
def test_a_reply_whose_usage_is_no_count_is_malformed_not_a_traceback(usage):
    from craftmd.models.base import MALFORMED, TransientError
    from craftmd.models.openai import parse_completion

    body = json.loads(json.dumps({"usage": usage, "choices": [{"message": {"content": "Psoriasis"}, "finish_reason": "stop"}]}))
    with pytest.raises(TransientError) as e:
        parse_completion(body)
    assert e.value.reason == MALFORMED


# -- output replaced only when it is the command's own ---------------------------------------------------------------


def test_judge_sensitivity_never_replaces_a_folder_holding_a_users_file(tmp_path):
    from craftmd import CraftMDError
    from craftmd.analysis.agreement.judge_sensitivity import FOLDER, sensitivity

    folder = tmp_path / FOLDER
    folder.mkdir()
    (folder / "sensitivity.json").write_text("{}")  # an earlier run's
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(CraftMDError, match="notes.txt"):
        sensitivity(tmp_path, "openai/judge-b", n=2, B=10)
    assert (folder / "notes.txt").read_text() == "mine"


def test_two_meld_audits_whose_names_make_one_file_name_are_kept_apart(tmp_path, monkeypatch):
    from craftmd import CraftMDError
    from craftmd.analysis import meld

    def audit(meld_dir):  # openai/x and openai:x: one slug
        model = Path(meld_dir).name.replace("_", "/" if "slash" in str(meld_dir) else ":")
        return {"id": "meld-openai_x", "title": f"Contamination (MELD): {model}", "figures": []}

    monkeypatch.setattr(meld, "meld_audit", audit)
    audits = tmp_path / "audits"
    first = meld.write_meld_audit(tmp_path / "slash" / "openai_x", audits)
    kept = first.read_bytes()
    with pytest.raises(CraftMDError, match="same file name"):
        meld.write_meld_audit(tmp_path / "colon" / "openai_x", audits)
    assert first.read_bytes() == kept
    assert meld.write_meld_audit(tmp_path / "slash" / "openai_x", audits) == first  # the same model's: replaced


def test_an_export_into_a_file_another_run_made_meanwhile_is_refused(tmp_path, monkeypatch):
    from craftmd import CraftMDError
    from craftmd.analysis.agreement import rubric_review

    out = tmp_path / "review.xlsx"

    def meanwhile(*a, **k):  # another export into the same new file finishes first
        out.write_bytes(b"the other run's sheet")
        return b"this run's sheet"

    monkeypatch.setattr(rubric_review, "build_workbook", meanwhile)
    monkeypatch.setattr(rubric_review, "sample_rows", lambda *a, **k: ([], [], []))
    with pytest.raises(CraftMDError, match="exists"):
        rubric_review.export_rubric_review([], out, n=1, seed=0)
    assert out.read_bytes() == b"the other run's sheet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["review.xlsx"]


@pytest.mark.parametrize(
    "stored",
    [
        "not json",
        "[1, 2]",
        '"text"',
        '{"status": "ok"}',
        '{"text": 7, "status": "ok"}',
        '{"text": "Psoriasis", "status": "OK"}',
        '{"text": "Psoriasis", "status": "ok", "tokens_in": "5"}',
        '{"text": "Psoriasis", "status": "ok", "tokens_in": 1e400}',
        42,
    ],
)
def test_a_cache_row_that_is_no_stored_reply_is_one_line(tmp_path, stored):
    import sqlite3

    from craftmd import CraftMDError
    from craftmd.models.base import Completion
    from craftmd.models.cache import RequestCache

    path = tmp_path / "requests.sqlite"
    with RequestCache(path) as cache:
        cache.put("k", "openai", "m", "{}", Completion("Psoriasis", "ok", tokens_in=3))
        assert cache.get("k") == Completion("Psoriasis", "ok", tokens_in=3)
    db = sqlite3.connect(path)
    db.execute("UPDATE requests SET response = ? WHERE key = 'k'", (stored,))
    db.commit()
    db.close()
    with RequestCache(path) as cache, pytest.raises(CraftMDError, match="a stored reply is not one"):
        cache.get("k")
