"""Numbers no one can forge (issue 48, part B): no score is ranked that this machine did not compute or check, a scores
file is validated where it is read, and a copy of a release under another id is one release, not two.

Each test plays the hostile user of the issue: a scores file rewritten (every answer right) with its checksum updated in
the manifest, values no metric takes, a release copied under a new id, an inspect run renamed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from craftmd.commands.cli import main
from craftmd.release import RunRecord, encode_scores, write_release

from helpers import analyse_argv


def _release(path: Path, dataset_dir: Path, *, model: str = "acme/tiny", n: int = 4, response: str = "no idea") -> Path:
    """A small CRAFT-MD release of vignette MCQ and FRQ answers for ``n`` derm cases, every answer wrong."""
    from craftmd.dataset import load_config

    ids = load_config(dataset_dir, "derm_public")["case_id"].to_list()[:n]
    rows = [
        {"case_id": c, "trial": 0, "setting": "vignette", "format": f, "with_image": False, "response": response, "status": "ok"}
        for c in ids
        for f in ("mcq4", "frq")
    ]
    return write_release(
        path, RunRecord(task="craftmd", release=path.name, kind="generated", model=model), {"answers": pa.Table.from_pylist(rows)}
    )


def _rewrite_scores(rel: Path, change) -> None:
    """Rewrite a release's scores file as a hostile hand would (``change(table) -> table``, its records kept) and put
    its new sha256 in the manifest."""
    t = pq.read_table(rel / "scores.parquet")
    records = json.loads(t.schema.metadata[b"craftmd.scorers"])
    data = encode_scores(change(t.replace_schema_metadata(None)), records)
    (rel / "scores.parquet").write_bytes(data)
    raw = json.loads((rel / "manifest.json").read_text())
    raw["files"]["scores.parquet"]["sha256"] = hashlib.sha256(data).hexdigest()
    (rel / "manifest.json").write_text(json.dumps(raw))


def _all_right(t: pa.Table) -> pa.Table:
    ok = pc.equal(t.column("status"), "ok")
    return t.set_column(t.schema.get_field_index("value"), "value", pc.if_else(ok, 1.0, t.column("value")))


def _score(rel: Path, dataset_dir: Path, *scorers: str) -> int:
    argv = ["score", str(rel), "--dataset", str(dataset_dir), "--quiet"]
    for s in scorers:
        argv += ["--scorer", s]
    return main(argv)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and err.count("\n") == 0, err
    return err


@pytest.mark.parametrize("scorer", ["paper", "strict", "offline"])
def test_forged_scores_of_a_deterministic_scorer_are_refused_naming_release_and_scorer(
    scorer, dataset_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    rel = _release(tmp_path / "releases" / "tiny", dataset_dir)
    assert _score(rel, dataset_dir, scorer) == 0
    _rewrite_scores(rel, _all_right)  # every answer right, the manifest's checksum updated
    capsys.readouterr()
    assert _score(rel, dataset_dir, scorer) == 2
    err = _one_line(capsys)
    assert "tiny" in err and scorer in err and "not what" in err


def test_scores_from_another_machine_are_recomputed_once_then_kept(dataset_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "there"))
    rel = _release(tmp_path / "releases" / "tiny", dataset_dir)
    assert _score(rel, dataset_dir, "paper", "offline") == 0
    before = (rel / "scores.parquet").read_bytes()
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "here"))  # the release arrives on a machine that did not score it
    capsys.readouterr()
    assert _score(rel, dataset_dir, "paper", "offline") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verified"] == ["offline", "paper"] and report["scored"] == []
    assert (rel / "scores.parquet").read_bytes() == before  # checked, not rewritten
    assert _score(rel, dataset_dir, "paper", "offline") == 0
    assert "verified" not in json.loads(capsys.readouterr().out)  # noted: not recomputed again


def _write_raw_scores(rel: Path, change) -> None:
    """Write a release's scores file with pyarrow alone (no check of the package in the way), its records kept, its
    sha256 put in the manifest: what a hand outside the package can write."""
    t = pq.read_table(rel / "scores.parquet")
    out = change(t)
    pq.write_table(out.replace_schema_metadata(t.schema.metadata), rel / "scores.parquet")
    raw = json.loads((rel / "manifest.json").read_text())
    raw["files"]["scores.parquet"]["sha256"] = hashlib.sha256((rel / "scores.parquet").read_bytes()).hexdigest()
    (rel / "manifest.json").write_text(json.dumps(raw))


def _set_row(column: str, value):
    def change(t: pa.Table) -> pa.Table:
        col = t.column(column).to_pylist()
        col[1] = value
        i = t.schema.get_field_index(column)
        return t.set_column(i, t.schema.field(i), pa.array(col, t.schema.field(i).type))

    return change


@pytest.mark.parametrize(
    "column, value, said",
    [
        ("value", float("nan"), "nan is not a valid value of metric 'correct'"),
        ("value", float("inf"), "inf is not a valid value of metric 'correct'"),
        ("value", 7.0, "7.0 is not a valid value of metric 'correct'"),
        ("value", None, "status 'ok' with value None"),
        ("status", "OK", "status 'OK' is not one of"),
    ],
)
def test_a_scores_row_no_scorer_writes_is_one_line_where_the_release_is_read(
    column, value, said, dataset_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    rel = _release(tmp_path / "releases" / "tiny", dataset_dir)
    assert _score(rel, dataset_dir, "offline") == 0
    _write_raw_scores(rel, _set_row(column, value))
    capsys.readouterr()
    analyse = analyse_argv(rel.parent, dataset_dir, tmp_path / "site", resamples=20, page=False)
    for args in (["score", str(rel), "--dataset", str(dataset_dir), "--quiet"], analyse):
        assert main(args) == 2
        err = _one_line(capsys)
        assert "release tiny" in err and str(rel / "scores.parquet") in err and "row 1" in err and said in err
    assert not (tmp_path / "site").exists()


def test_two_releases_sharing_a_display_name_are_two_rows_of_the_rubric_tables(tmp_path, monkeypatch):
    """Issue 48, 3: the rubric's tables are keyed by release id; the shared display name appears only where text is
    written (the page's rows, the figures' labels)."""
    import polars as pl

    from craftmd.analysis.rubric import page_section, rubric
    from craftmd.release import read_release, write_scores
    from craftmd.scoring.judge import SCHEMA

    from test_judge import make_release

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    releases = []
    for model, score in (("m1", 4.0), ("m2", 1.0)):
        path = make_release(tmp_path, model=f"openai/{model}", release=model)
        raw = json.loads((path / "manifest.json").read_text())
        (path / "manifest.json").write_text(json.dumps(dict(raw, display_name="Same Name")))
        rel = read_release(path)
        rows = [{"case_id": "case_1", "trial": 0, "conversation": "standard", "with_image": False,
                 "dimension": "communication.empathy", "scorer": "judge-committee", "metric": "rubric_score", "value": score,
                 "label": None, "detail": "{}", "status": "ok"}]  # fmt: skip
        write_scores(rel, pa.Table.from_pylist(rows, schema=SCHEMA), {"judge-committee": {}})
        releases.append(read_release(path))
    r = rubric(releases, B=50, seed=1)
    meta = r.table.filter(pl.col("level") == "meta_category", pl.col("group") == "Communication Skills")
    assert dict(meta.select("model", "mean").iter_rows()) == {"m1": 100.0, "m2": 0.0}
    assert sorted(r.raw["model"].unique().to_list()) == ["m1", "m2"]
    sec = page_section(r)
    assert [(row["model"], row["release"]) for row in sec["rows"]] == [("Same Name", "m1"), ("Same Name", "m2")]


def test_a_copy_of_a_release_under_a_new_id_is_refused_naming_both(dataset_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    releases = tmp_path / "releases"
    rel = _release(releases / "tiny", dataset_dir)
    other = _release(releases / "other", dataset_dir, model="acme/other", response="Psoriasis")  # other answers: fine
    shutil.copytree(rel, releases / "tiny-copy")
    raw = json.loads((releases / "tiny-copy" / "manifest.json").read_text())
    (releases / "tiny-copy" / "manifest.json").write_text(json.dumps(dict(raw, release="tiny-copy", model="acme/copy")))
    capsys.readouterr()
    assert main(analyse_argv(releases, dataset_dir, tmp_path / "site", resamples=20, page=False)) == 2
    err = _one_line(capsys)
    assert str(rel) in err and str(releases / "tiny-copy") in err and "same answers" in err
    assert not (tmp_path / "site").exists() and other.exists()
    # a benchmark of hard-linked copies says so, for its own process alone: then each copy is read as its own release
    from craftmd.release import find_releases

    monkeypatch.setenv("CRAFTMD_ALLOW_COPIES", "1")
    assert [r.id for r in find_releases(releases)] == ["other", "tiny", "tiny-copy"]


def test_a_renamed_copy_of_an_inspect_run_is_refused_naming_both(dataset_dir, tmp_path, monkeypatch, capsys):
    """Issue 48, 14: an exported run's log with a zero-width space added to its release id and its ``eval_id`` edited
    ingests, but the board refuses it beside the original: the same answers."""
    import zipfile

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    releases = tmp_path / "releases"
    rel = _release(releases / "tiny", dataset_dir)
    assert main(["export", str(rel), "--inspect", str(tmp_path / "logs"), "--quiet"]) == 0
    for log in (tmp_path / "logs").glob("*.eval"):
        with zipfile.ZipFile(log) as z:
            members = {n: z.read(n) for n in z.namelist()}
        for name in [n for n in members if n.endswith(".json")]:
            text = members[name].decode()
            text = text.replace('"eval_id":"', '"eval_id":"x').replace('"release":"tiny"', '"release":"tiny\\u200b"')
            members[name] = text.encode()
        with zipfile.ZipFile(log, "w") as z:
            for n, data in members.items():
                z.writestr(n, data)
    logs = sorted(map(str, (tmp_path / "logs").glob("*.eval")))
    assert main(["ingest", "--inspect", *logs, "--out", str(releases / "tiny\u200b")]) == 0
    assert json.loads((releases / "tiny\u200b" / "manifest.json").read_text())["release"] == "tiny\u200b"
    capsys.readouterr()
    assert main(analyse_argv(releases, dataset_dir, tmp_path / "site", resamples=20, page=False)) == 2
    err = _one_line(capsys)
    assert str(rel) in err and "same answers" in err


def test_a_judged_conversation_release_beside_craftmd_ones_is_no_crash_of_the_audits(dataset_dir, source, tmp_path, monkeypatch):
    """The README's local encounters release in ``out/releases`` crashed ``make leaderboard`` (ColumnNotFoundError:
    ``setting``): its scores have no answer variant keys. Its scores are no verdicts; the grader-agreement and
    history audits, which read every release, read the CRAFT-MD ones."""
    from craftmd.analysis.agreement.graders import paired_labels
    from craftmd.analysis.agreement.history_validity import history_validity_audit
    from craftmd.release import read_release, write_scores
    from craftmd.scoring.judge import SCHEMA

    from test_judge import make_release

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    releases = tmp_path / "releases"
    rel = _release(releases / "tiny", dataset_dir)
    assert _score(rel, dataset_dir, "offline") == 0
    judged = read_release(make_release(releases, model="openai/doc", release="judged"))
    rows = [{"case_id": "case_1", "trial": 0, "conversation": "standard", "with_image": False,
             "dimension": "communication.empathy", "scorer": "judge-committee", "metric": "rubric_score", "value": 3.0,
             "label": None, "detail": "{}", "status": "ok"}]  # fmt: skip
    write_scores(judged, pa.Table.from_pylist(rows, schema=SCHEMA), {"judge-committee": {}})
    assert read_release(judged.path).verdicts().is_empty()
    assert paired_labels(releases).is_empty()  # no upstream-gpt4 labels here: nothing paired, and no crash
    history_validity_audit(releases, dataset_dir, source)
