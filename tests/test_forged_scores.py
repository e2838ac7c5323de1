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

from helpers import analyse_argv, assert_tables_documented


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


# -- scores only a model could compute again: the sender's claims (issue 48, "Done when") --------------------------------


def _graded_right_by(rel: Path, grader: str) -> None:
    """Add ``grader``'s rows to a release as an LLM grader would write them, every FRQ answer called right (on the
    machine the release comes from: its scores file noted as made there)."""
    import polars as pl

    from craftmd.release import read_release, write_scores
    from craftmd.scoring.llm_grader import grader_record, parse_grader_name
    from craftmd.scoring.scorers import scores_from_grades

    r = read_release(rel)
    frq = pl.from_arrow(r.table("answers")).filter(pl.col("format") == "frq")
    grades = [{"case_id": a["case_id"], "trial": a["trial"], "setting": a["setting"], "format": "frq", "with_image": False,
               "grader": grader, "resolved": "psoriasis", "resolved_kind": "single", "correct": True, "detail": None}
              for a in frq.iter_rows(named=True)]  # fmt: skip
    n = len(grades)
    record = dict(grader_record(parse_grader_name(grader), "grader-v1"), graded=n, asked=n, failures=0)
    write_scores(r, scores_from_grades(pa.Table.from_pylist(grades)), {grader: record})


def test_an_llm_graders_scores_from_elsewhere_are_their_senders_claims_shown_apart_never_ranked(
    dataset_dir, tmp_path, monkeypatch, capsys
):
    """A release arrives with an LLM grader's scores (every answer right): ``craftmd analyse`` alone refuses it in one
    line until ``craftmd score`` has settled it; ``craftmd score`` keeps those scores as the sender's claims
    (``claimed:<grader>``), which the analysis never ranks and shows apart (tables/claims.csv, the page's own table)
    naming who reported them and the run record; the grader run here computes its own, and says how many claims
    disagree."""
    import polars as pl

    from craftmd.scoring.score import FROM_SENDER

    from loopback import LoopbackServer
    from test_llm_grader import GraderResponder

    grader = "llm:openai/loopback"
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "there"))
    releases = tmp_path / "releases"
    rel = _release(releases / "tiny", dataset_dir)
    assert _score(rel, dataset_dir, "paper", "strict", "offline") == 0
    _graded_right_by(rel, grader)
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "here"))  # the release arrives on a machine that did not score it
    capsys.readouterr()
    site = tmp_path / "site"
    analyse = analyse_argv(releases, dataset_dir, site, resamples=20)
    assert main(analyse) == 2
    err = _one_line(capsys)
    assert "release tiny" in err and grader in err and "craftmd score" in err and "not computed or checked" in err
    assert not site.exists()

    assert (
        _score(rel, dataset_dir) == 0
    )  # the task's scorers: the rule scorers recomputed and found equal, the grader's kept apart
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["claimed"] == [grader] and report["verified"] == ["offline", "paper", "strict"]
    assert f"its {grader} scores came with the release" in captured.err and f"claimed:{grader}" in captured.err
    held = set(pq.read_table(rel / "scores.parquet").column("scorer").to_pylist())
    assert grader not in held and f"claimed:{grader}" in held

    assert main(analyse) == 0
    accuracy = pl.read_csv(site / "tables" / "accuracy.csv")
    assert grader not in accuracy["grader"].to_list() and "offline" in accuracy["grader"].to_list()  # never ranked
    claims = pl.read_csv(site / "tables" / "claims.csv").to_dicts()
    assert [(c["release"], c["scorer"], c["metric"], c["n_ok"], c["mean"]) for c in claims] == [
        ("tiny", grader, "correct", 4, 1.0)
    ]
    assert claims[0]["reported_by"] == FROM_SENDER and claims[0]["scored_by"] == "openai/loopback"
    assert claims[0]["run_record"].startswith("tiny/manifest.json")
    assert_tables_documented(site / "tables")  # claims.csv with its columns on the analysis page
    page = (site / "index.html").read_text()
    assert "Claimed by their senders, not recomputed here" in page and 'id="claims-table"' in page
    assert "## Claimed by their senders, not recomputed here" in (site / "leaderboard.md").read_text()

    with LoopbackServer(GraderResponder()) as server:  # the grader run here: its own scores, the claims compared
        argv = ["score", str(rel), "--dataset", str(dataset_dir), "--scorer", grader, "--base-url", server.base_url]
        assert main([*argv, "--grader-prompts", "grader-v1", "--cache", str(tmp_path / "c.sqlite"), "--quiet"]) == 0
    assert f"4 of its 4 claimed {grader} scores (claimed:{grader}) disagree" in capsys.readouterr().err
    assert main(analyse) == 0
    accuracy = pl.read_csv(site / "tables" / "accuracy.csv").filter(pl.col("grader") == grader)
    assert accuracy.height and set(accuracy["accuracy"].to_list()) == {0.0}  # what it computed here: "no idea" is wrong


def test_a_judges_scores_from_elsewhere_are_claims_the_rubric_never_reads(tmp_path, monkeypatch, capsys):
    """A judged release from elsewhere: its rubric scores are the sender's claims, out of the rubric's tables and in the
    claims table."""
    from craftmd.analysis.rubric import rubric
    from craftmd.analysis.tables import claims_table
    from craftmd.release import read_release, write_scores
    from craftmd.scoring.judge import SCHEMA
    from craftmd.scoring.score import check_standing, score_release

    from test_judge import make_release

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "there"))
    path = make_release(tmp_path / "releases", model="openai/doc", release="judged")
    rows = [{"case_id": "case_1", "trial": 0, "conversation": "standard", "with_image": False,
             "dimension": "communication.empathy", "scorer": "judge-committee", "metric": "rubric_score", "value": 4.0,
             "label": None, "detail": "{}", "status": "ok"}]  # fmt: skip
    write_scores(read_release(path), pa.Table.from_pylist(rows, schema=SCHEMA), {"judge-committee": {"members": ["judge:x/y"]}})
    assert rubric([read_release(path)], B=20, seed=1).table.height  # there, made there: ranked
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "here"))
    with pytest.raises(Exception, match="judge-committee scores were not computed or checked on this machine"):
        check_standing([read_release(path)])
    report = score_release(path, None, using=[], progress=False)  # no scorer to run: the file settled alone
    assert report["claimed"] == ["judge-committee"]
    rel = read_release(path)
    check_standing([rel])  # settled: a claim now
    assert rubric([rel], B=20, seed=1).table.height == 0
    [claim] = claims_table([rel]).to_dicts()
    assert (claim["release"], claim["scorer"], claim["metric"], claim["mean"]) == (
        "judged",
        "judge-committee",
        "rubric_score",
        4.0,
    )


@pytest.mark.parametrize(
    "name, standing_here",
    [
        ("llm:openai/gpt-4o", "to claim"),
        ("judge:openai/gpt-4o", "to claim"),
        ("judge-committee", "to claim"),
        ("judge-calibrated", "to claim"),
        ("experts", "to claim"),
        ("meld", "to claim"),
        ("upstream-gpt4", "to claim"),
        ("a-scorer-no-one-registered", "to claim"),
        ("paper", "to check"),
        ("strict", "to check"),
        ("offline", "to check"),
        ("history", "to check"),
        ("keyinfo", "to check"),
        ("claimed:paper", "claim"),
    ],
)
def test_one_place_says_whose_word_a_score_is(name, standing_here, tmp_path, monkeypatch):
    """:func:`craftmd.scoring.score.standing`: of a scores file this machine has no note of, the scorers without a model are
    recomputed and checked; every other scorer's rows (a model's, the recorded labels, the experts', one unknown here)
    can only be the sender's claims; a note of the file makes them all made here."""
    from types import SimpleNamespace

    from craftmd.release import note_made_here
    from craftmd.scoring.score import standing

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    sha = "ab" * 32
    rel = SimpleNamespace(manifest=SimpleNamespace(files={"scores.parquet": {"sha256": sha}}), scorer_names=lambda: {name})
    assert standing(rel) == {name: standing_here}
    note_made_here(sha, [name])
    assert standing(rel) == {name: "claim" if name.startswith("claimed:") else "made here"}


def test_an_upstream_release_copied_from_elsewhere_is_ingested_again_from_the_pinned_source(
    source, dataset_dir, tmp_path, monkeypatch
):
    """``make leaderboard`` keeps an upstream release only when this machine ingested it: one in a releases folder copied
    from elsewhere (its recorded labels rewritten, every answer right) is ingested again from the pinned, checked source."""
    from craftmd.generation.ingest import ingest
    from craftmd.release import made_here, read_release

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "there"))
    out = tmp_path / "releases"
    ingest(source, dataset_dir, out, models=["gpt4v"], progress=False)
    honest = (out / "gpt4v" / "scores.parquet").read_bytes()
    _rewrite_scores(out / "gpt4v", _all_right)
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "here"))
    ingest(source, dataset_dir, out, models=["gpt4v"], progress=False, skip_existing=True)
    assert (out / "gpt4v" / "scores.parquet").read_bytes() == honest
    assert "upstream-gpt4" in made_here(read_release(out / "gpt4v"))


def test_the_grader_audits_read_no_scores_no_one_checked(dataset_dir, tmp_path, monkeypatch, capsys):
    """``craftmd grader-agreement`` and the release a review's sheets are compared with (``craftmd review import
    --release``) read a grader's labels only once they are made here or settled as claims: a release whose scores
    came from elsewhere is one line naming it and ``craftmd score``, and nothing is written."""
    from craftmd.analysis.agreement.review.write import release_case_labels

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "there"))
    releases = tmp_path / "releases"
    rel = _release(releases / "tiny", dataset_dir)
    assert _score(rel, dataset_dir, "paper", "offline") == 0
    _rewrite_scores(rel, _all_right)  # forged there, then sent
    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "here"))
    capsys.readouterr()
    out = tmp_path / "audits"
    argv = ["grader-agreement", "--releases", str(releases), "--dataset", str(dataset_dir), "--out", str(out), "--no-source"]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert "release tiny" in err and "offline" in err and "craftmd score" in err
    assert not out.exists()
    with pytest.raises(Exception, match="release tiny: its offline, paper scores were not computed or checked"):
        release_case_labels(rel, grader="offline")
    assert _score(rel, dataset_dir, "paper", "offline") == 2  # the forgery found where the release is settled


def test_a_release_checked_once_is_not_hashed_again_until_one_of_its_files_changes(dataset_dir, tmp_path, monkeypatch):
    """A board of a thousand is read by every analysis: this machine notes each release whose files it hashed and whose
    scores' rows it checked, and reads those files as they are without hashing them again (their scorer names from the
    note), until a file is written, replaced or linked; a file changed since is refused as before, and a note made
    against other metric terms is not taken."""
    import craftmd.release as R
    from craftmd import CraftMDError

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(R, "SETTLED_NS", 0)  # (the files were written a moment ago)
    rel = _release(tmp_path / "r1", dataset_dir)
    assert _score(rel, dataset_dir, "paper", "strict") == 0
    hashed = []
    verify = R._verify
    monkeypatch.setattr(R, "_verify", lambda release: hashed.append(release.id) or verify(release))

    def fresh():  # as a new command would (the releases open in this process forgotten)
        R._OPEN.clear()
        return R.read_release(rel)

    names = fresh().scorer_names()
    assert hashed == ["r1"] and names >= {"paper", "strict"}
    again = fresh()
    assert hashed == ["r1"] and again._data == {} and again.scorer_names() == names  # not read, not hashed
    assert again.table("scores").num_rows > 0  # (a file read later is still checked against the run record)
    note = R._checked_path(again, R._signature(rel, again.manifest.files))
    terms = json.loads(note.read_text())
    note.write_text(json.dumps(terms | {"metrics": {m: [k, lo, hi + 1] for m, (k, lo, hi) in terms["metrics"].items()}}))
    fresh()
    assert hashed == ["r1", "r1"]  # a metric's range changed: hashed and checked again
    fresh()
    assert hashed == ["r1", "r1"]
    data = (rel / "answers.parquet").read_bytes()
    (rel / "answers.parquet").write_bytes(data[:-9] + bytes([data[-9] ^ 1]) + data[-8:])  # one bit, the size unchanged
    with pytest.raises(CraftMDError, match="answers.parquet is damaged"):
        fresh()
