"""Hostile inputs (issue #29): forged scores, impossible values, damaged files and limits that disagree.

* An inspect log's scores are the log's word: ingest keeps them as claims (scorer ``claimed:<name>``), ``craftmd score``
  computes the scorers again and reports each claim that disagrees, and the analysis never reads a claim.
* A log with an impossible score writes nothing.
* A damaged manifest, files entry, data file, log sample or shard record is one line (no traceback), and nothing is
  written; a release without conversations simply has no history scores.
* One limit everywhere: the trial limit (``MAX_TRIALS``) at generate, validate, submit, ingest, every release read and
  analyse; prices, ``--max-tokens``, ``--timeout``, ``--temperature``, ``--budget`` and shard numbers, checked once each.

Two recorded cases replayed by a loopback server stand in for a model, so these run in seconds.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
import zipfile
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main
from craftmd.release import CLAIM_PREFIX, MAX_TRIALS, read_release

sys.path.insert(0, str(Path(__file__).parent))
from helpers import generate_argv, submit_argv  # noqa: E402
from loopback import LoopbackServer, Replay, write_replay_dataset  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/loopback"


@pytest.fixture(scope="module")
def world(upstream, tmp_path_factory):
    """A dataset of two cases and three releases of them: multi-turn (scored, and exported as inspect logs), vignette
    only (no conversations), and the two shards of the multi-turn run."""
    root = tmp_path_factory.mktemp("hostile")
    data = write_replay_dataset(upstream, root / "data")
    f = data / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer")).write_parquet(f)  # the paper rule's key
    ids = ",".join(sorted(upstream["text"]))
    with LoopbackServer(Replay(upstream["text"])) as server:
        common = ("--cases", ids, "--trials", "2")
        where = {"doctor": MODEL, "base_url": server.base_url, "cache": root / "cache.sqlite"}
        assert main(generate_argv(data, *common, "--experiments", "multiturn,frq,mcq4", **where, out=root / "mt")) == 0
        assert main(generate_argv(data, *common, "--experiments", "vignette,frq,mcq4", **where, out=root / "vf")) == 0
        for k in (1, 2):
            options = (*common, "--experiments", "multiturn,frq,mcq4", "--shard", f"{k}/2")
            assert main(generate_argv(data, *options, **where, out=root / f"shard{k}")) == 0
    assert main(["score", str(root / "mt"), "--dataset", str(data), "--quiet"]) == 0
    assert main(["export", str(root / "mt"), "--inspect", str(root / "logs"), "--quiet"]) == 0
    return {
        "root": root,
        "data": data,
        "mt": root / "mt",
        "vf": root / "vf",
        "logs": sorted((root / "logs").glob("*.eval")),
        "shards": [root / "shard1", root / "shard2"],
    }


def one_line(capsys, *, says: str = "") -> str:
    """The command's stderr, which must be one line with no traceback (and say ``says``)."""
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and says in err, err
    return err


def rewrite_log(src: Path, dst: Path, change) -> Path:
    """``src`` with ``change(log)`` applied, written to ``dst`` by inspect itself."""
    from inspect_ai.log import read_eval_log, write_eval_log

    log = read_eval_log(str(src))
    change(log)
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_eval_log(log, str(dst))
    return dst


def set_scores(value, metric: str = "correct"):
    """A change of a log: every score row of ``metric`` set to ``value`` (status ok)."""

    def change(log):
        for s in log.samples:
            for sc in s.scores.values():
                for r in sc.metadata["craftmd"]["rows"]:
                    if r["metric"] == metric:
                        r["value"], r["status"] = value, "ok"

    return change


def rehash(release: Path, name: str) -> None:
    """Record ``name``'s present sha256 in the release's manifest: a tampered file that passes the checksum."""
    mf = release / "manifest.json"
    m = json.loads(mf.read_text())
    m["files"][name]["sha256"] = hashlib.sha256((release / name).read_bytes()).hexdigest()
    mf.write_text(json.dumps(m))


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- forged scores are claims ------------------------------------------------------------------------------------


def test_a_log_with_forged_scores_gives_claims_that_scoring_computes_again_and_reports(world, tmp_path, capsys):
    forged = [rewrite_log(p, tmp_path / "forged" / p.name, set_scores(1.0)) for p in world["logs"]]
    out = tmp_path / "forged-release"
    assert main(["ingest", "--inspect", *map(str, forged), "--out", str(out)]) == 0
    scores, records = read_release(out).scores_with_records()
    scorers = set(scores.column("scorer").to_pylist())
    assert scorers == {"claimed:paper", "claimed:strict", "claimed:offline", "claimed:history"}  # the log's word, nothing more
    assert all(r["claimed"] is True and r["reported_by"] for r in records.values()) and set(records) == scorers
    capsys.readouterr()
    # scoring computes every default scorer again (no claim makes one current) and says which claims disagree
    assert main(["score", str(out), "--dataset", str(world["data"]), "--quiet"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert sorted(report["scored"]) == ["history", "offline", "paper", "strict"] and not report["current"]
    for g in ("paper", "strict", "offline"):
        line = next(x for x in captured.err.splitlines() if f"claimed {g} scores" in x)
        assert "4 of its 4" in line and "disagree" in line and "never ranked" in line
        assert report["claims"][g] == {"as": f"claimed:{g}", "checked": 4, "disagree": 4}
    assert report["claims"]["history"]["disagree"] == 0 and "claimed history" not in captured.err  # not forged: agrees
    rel = read_release(out)
    assert rel.scorer_records()["paper"]["claims"]["disagree"] == 4  # the count stays in the scorer's record
    # the scores are the package's: the answers are wrong, as in the release the log was exported from
    ours = pl.from_arrow(rel.scores_with_records()[0])
    theirs = pl.from_arrow(read_release(world["mt"]).scores_with_records()[0])
    for g in ("paper", "strict", "offline"):
        mine = (
            ours.filter(pl.col("scorer") == g, pl.col("metric") == "correct")
            .sort("case_id", "trial", "format")["value"]
            .to_list()
        )
        assert (
            mine
            == theirs.filter(pl.col("scorer") == g, pl.col("metric") == "correct")
            .sort("case_id", "trial", "format")["value"]
            .to_list()
        )
        assert set(mine) == {0.0}
        assert set(ours.filter(pl.col("scorer") == f"claimed:{g}")["value"].to_list()) == {1.0}
    # no claim is ever read as a score: the analysis' scores and grades, and the release's verdicts
    from craftmd.analysis.runner import connect

    con = connect([rel], world["data"])
    assert not {r[0] for r in con.sql("select distinct scorer from scores").fetchall()} & scorers
    assert {r[0] for r in con.sql("select distinct grader from grades").fetchall()} == {"paper", "strict", "offline"}
    assert not any(g.startswith(CLAIM_PREFIX) for g in rel.verdicts()["grader"].to_list())
    # scored once, the release is current: nothing to do
    assert main(["score", str(out), "--dataset", str(world["data"]), "--quiet"]) == 0
    assert "current, nothing to do" in capsys.readouterr().err


def test_claims_that_agree_are_not_reported_and_a_claim_is_no_scorer_to_run(world, tmp_path, capsys):
    out = tmp_path / "honest"
    assert main(["ingest", "--inspect", *map(str, world["logs"]), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["score", str(out), "--dataset", str(world["data"]), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert all(c["disagree"] == 0 for c in json.loads(captured.out)["claims"].values()) and "disagree" not in captured.err
    assert main(["score", str(out), "--dataset", str(world["data"]), "--scorer", "claimed:paper"]) == 2
    one_line(capsys, says="holds the scores an ingested log claimed")
    from craftmd.scoring.scorers import register_scorer

    with pytest.raises(CraftMDError, match="reserved"):
        register_scorer("claimed:mine", object)


@pytest.mark.parametrize(
    "value",
    [7, math.inf, -math.inf, 1e309, -0.5, "1.0", "abc", True, [1.0], {"v": 1}],
    ids=["7", "inf", "-inf", "1e309", "-0.5", "text-1.0", "text", "true", "list", "object"],
)
def test_a_log_with_an_impossible_score_writes_nothing(world, tmp_path, capsys, value):
    log = rewrite_log(world["logs"][0], tmp_path / "bad.eval", set_scores(value))
    out = tmp_path / "r"
    assert main(["ingest", "--inspect", str(log), "--out", str(out)]) == 2
    one_line(capsys, says="nothing was written")
    assert not out.exists()


# -- what crashed is one line ------------------------------------------------------------------------------------


def test_a_release_without_conversations_has_no_history_scores(world, tmp_path, capsys):
    rel = tmp_path / "vf"
    shutil.copytree(world["vf"], rel)
    assert main(["score", str(rel), "--dataset", str(world["data"]), "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report["scored"]) == ["offline", "paper", "strict"] and "no conversations" in report["skipped"]["history"]
    assert "history" not in read_release(rel).scorer_records()
    assert main(["score", str(rel), "--dataset", str(world["data"]), "--scorer", "history"]) == 2
    one_line(capsys, says="scorer history applies to none of the releases given")


def _manifest(edit):
    def change(rel: Path) -> None:
        m = json.loads((rel / "manifest.json").read_text())
        edit(m)
        (rel / "manifest.json").write_text(json.dumps(m))

    return change


def _raw_manifest(data: bytes):
    def change(rel: Path) -> None:
        (rel / "manifest.json").write_bytes(data)

    return change


def _data_file(name: str, make):
    def change(rel: Path) -> None:
        make(rel / name)
        rehash(rel, name)

    return change


def _trial_column(values, type_=None):
    def make(path: Path) -> None:
        t = pq.read_table(path)
        t = t.set_column(t.schema.get_field_index("trial"), "trial", pa.array(values(t.column("trial").to_pylist()), type_))
        pq.write_table(t, path)

    return make


TAMPERED = {  # what a hostile release holds -> what the one line says
    "deep-manifest": (_raw_manifest(b'{"a":' * 200_000 + b"1" + b"}" * 200_000), "nested too deeply"),
    "manifest-not-utf8": (
        lambda rel: (rel / "manifest.json").write_bytes(
            (rel / "manifest.json").read_bytes().replace(b'"craftmd"', '"cr\u00e4ftmd"'.encode("latin-1"))
        ),
        "unreadable manifest",
    ),
    "files-entry-no-sha256": (_manifest(lambda m: m["files"]["answers.parquet"].pop("sha256")), "invalid run record: files"),
    "files-sha256-a-number": (_manifest(lambda m: m["files"]["answers.parquet"].update(sha256=5)), "invalid run record: files"),
    "files-entry-a-string": (_manifest(lambda m: m["files"].update({"answers.parquet": "abc"})), "invalid run record: files"),
    "files-entry-a-list": (_manifest(lambda m: m["files"].update({"answers.parquet": [1]})), "invalid run record: files"),
    "files-rows-negative": (_manifest(lambda m: m["files"]["answers.parquet"].update(rows=-1)), "invalid run record: files"),
    "data-not-parquet": (_data_file("answers.parquet", lambda p: p.write_bytes(b"hello")), "is damaged"),
    "data-a-csv": (_data_file("answers.parquet", lambda p: pl.read_parquet(p).drop("with_image").write_csv(p)), "is damaged"),
    "trial-as-text": (_data_file("answers.parquet", _trial_column(lambda v: [str(x) for x in v])), "column trial holds string"),
    "trial-as-float": (_data_file("answers.parquet", _trial_column(lambda v: [x + 0.5 for x in v])), "column trial holds double"),
    "trial-63": (
        _data_file("answers.parquet", _trial_column(lambda v: [MAX_TRIALS] * len(v), pa.int16())),
        "trial 63 is out of range",
    ),
    "trial-negative": (
        _data_file("answers.parquet", _trial_column(lambda v: [-1] * len(v), pa.int16())),
        "trial -1 is out of range",
    ),
}


@pytest.mark.parametrize("how", list(TAMPERED))
def test_a_damaged_release_is_one_line_and_nothing_is_written(world, tmp_path, capsys, how):
    change, says = TAMPERED[how]
    rel = tmp_path / "rel"
    shutil.copytree(world["vf"], rel)
    change(rel)
    before = snapshot(tmp_path)
    assert main(["score", str(rel), "--dataset", str(world["data"]), "--quiet"]) == 2
    one_line(capsys, says=says)
    assert snapshot(tmp_path) == before


def test_damaged_scores_file_records_are_one_line(world, tmp_path, capsys):
    rel = tmp_path / "rel"
    shutil.copytree(world["mt"], rel)
    t = pq.read_table(rel / "scores.parquet")
    for junk in (b"{not json", b"[1, 2]", b"[" * 100_000, b'{"paper": 5}'):
        pq.write_table(t.replace_schema_metadata({b"craftmd.scorers": junk}), rel / "scores.parquet")
        rehash(rel, "scores.parquet")
        assert main(["score", str(rel), "--dataset", str(world["data"]), "--quiet"]) == 2
        one_line(capsys, says="scorer records")


def _sample_member(data: bytes):
    """A change of an ``.eval`` file (a zip): its first sample's member replaced by ``data``."""

    def change(path: Path) -> None:
        with zipfile.ZipFile(path) as z:
            members = {n: z.read(n) for n in z.namelist()}
        first = next(n for n in members if n.startswith("samples/"))
        members[first] = data
        with zipfile.ZipFile(path, "w") as z:
            for n, b in members.items():
                z.writestr(n, b)

    return change


def _embedded(edit):
    def change(log) -> None:
        edit(log.eval.metadata["craftmd.manifest"])

    return change


def _store_rows(table: str, edit):
    def change(log) -> None:
        for s in log.samples:
            for r in s.store["craftmd"][table]:
                edit(r)

    return change


HOSTILE_LOGS = {  # a log's content -> what the one line says
    "sample-not-an-EvalSample": (_sample_member(b'{"id": 1}'), "a sample is unreadable"),
    "sample-a-list": (_sample_member(b"[1, 2, 3]"), "a sample is unreadable"),
    "sample-not-json": (_sample_member(b"\xff\xfe"), "a sample is unreadable"),
    "embedded-manifest-extra-key": (_embedded(lambda m: m.update(evil=1)), "the run record it carries: invalid run record: evil"),
    "embedded-manifest-bad-kind": (_embedded(lambda m: m.update(kind="nonsense")), "invalid run record: kind"),
    "embedded-manifest-a-list": (lambda log: log.eval.metadata.update({"craftmd.manifest": [1]}), "invalid run record"),
    "answer-trial-as-text": (_store_rows("answers", lambda r: r.update(trial=f"{r['trial']}")), "rows that do not fit a release"),
    "answer-trial-63": (_store_rows("answers", lambda r: r.update(trial=MAX_TRIALS)), "trial 63 is out of range"),
    "answer-trial-2**70": (_store_rows("answers", lambda r: r.update(trial=2**70)), "rows that do not fit a release"),
    "conversation-trial-2**70": (_store_rows("conversations", lambda r: r.update(trial=2**70)), "rows that do not fit"),
    "score-row-a-string": (
        lambda log: [sc.metadata["craftmd"].update(rows=["x"]) for s in log.samples for sc in s.scores.values()],
        "nothing was written",
    ),
    "score-trial-as-list": (
        lambda log: [
            r.update(trial=[0]) for s in log.samples for sc in s.scores.values() for r in sc.metadata["craftmd"]["rows"]
        ],
        "nothing was written",
    ),
}


@pytest.mark.parametrize("how", list(HOSTILE_LOGS))
def test_a_hostile_log_is_one_line_and_nothing_is_written(world, tmp_path, capsys, how):
    change, says = HOSTILE_LOGS[how]
    log = tmp_path / "in" / world["logs"][0].name
    if how.startswith("sample-"):
        log.parent.mkdir()
        shutil.copy(world["logs"][0], log)
        change(log)
    else:
        rewrite_log(world["logs"][0], log, change)
    out = tmp_path / "out" / "r"
    assert main(["ingest", "--inspect", str(log), "--out", str(out)]) == 2
    one_line(capsys, says=says)
    assert not out.exists()


SHARD_RECORDS = {  # producer.shard of the second shard -> what the one line says
    "of-0": {"k": 2, "of": 0},
    "k-text": {"k": "abc", "of": 2},
    "k-a-list": {"k": [2], "of": 2},
    "of-negative": {"k": 1, "of": -1},
    "k-0": {"k": 0, "of": 2},
    "k-above-of": {"k": 3, "of": 2},
    "of-a-float": {"k": 2, "of": 2.0},
    "of-true": {"k": 1, "of": True},
    "of-huge-text": {"k": 2, "of": "9" * 5000},
    "a-list": [2, 2],
    "a-string": "2/2",
    "no-of": {"k": 2},
}


@pytest.mark.parametrize("how", list(SHARD_RECORDS))
def test_a_bad_shard_record_is_one_line_and_nothing_is_merged(world, tmp_path, capsys, how):
    shards = []
    for src in world["shards"]:
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        shards.append(dst)
    if how == "of-negative":  # a whole run that calls itself shard 1 of -1
        shards = shards[:1]
    good = json.loads((shards[-1] / "manifest.json").read_text())["producer"]["shard"]
    _manifest(lambda m: m["producer"].update(shard=SHARD_RECORDS[how]))(shards[-1])
    out = tmp_path / "merged"
    assert main(["merge", *map(str, shards), "--out", str(out)]) == 2
    one_line(capsys, says="is no shard")
    assert not out.exists()
    if how != "of-negative":  # the record put right, the same shards merge into the whole run
        _manifest(lambda m: m["producer"].update(shard=good))(shards[-1])
        assert main(["merge", *map(str, shards), "--out", str(out)]) == 0
        assert read_release(out).table("answers").equals(read_release(world["mt"]).table("answers"))


# -- one limit everywhere ----------------------------------------------------------------------------------------


def generate_nowhere(data, out, *option) -> list[str]:
    """``craftmd generate`` of ``data`` into ``out`` against a server nothing answers on, with ``option`` (not quiet)."""
    return generate_argv(data, *option, doctor=MODEL, base_url="http://127.0.0.1:9/v1", out=out, quiet=False)


def cli_refuses(capsys, argv: list[str], says: str) -> None:
    """The command line refuses ``argv`` before anything runs: argparse's usage and one error line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and says in err.strip().splitlines()[-1], err


@pytest.mark.parametrize(
    "option",
    [
        ["--trials", "64"],
        ["--trials", "0"],
        ["--trials", "-1"],
        ["--price", "nan,nan"],
        ["--price", "inf,inf"],
        ["--price=-1,2"],
        ["--price", "1,-inf"],
        ["--price", "patient=nan,1"],
        ["--price", "1e309,1"],
        ["--max-tokens", "0"],
        ["--max-tokens", "-5"],
        ["--timeout", "-1"],
        ["--timeout", "0"],
        ["--timeout", "nan"],
        ["--timeout", "inf"],
        ["--temperature", "nan"],
        ["--temperature", "inf"],
        ["--temperature", "-1"],
        ["--budget", "nan"],
        ["--budget", "inf"],
        ["--budget", "0"],
        ["--max-retries", "-1"],
    ],
    ids=lambda o: "=".join(o),
)
def test_generate_refuses_an_out_of_range_option_before_it_runs(world, tmp_path, capsys, option):
    out = tmp_path / "never"
    cli_refuses(capsys, generate_nowhere(world["data"], out, *option), option[0].split("=")[0])
    assert not out.exists()


@pytest.mark.parametrize("option", [["-T", "max_turns=0"], ["--max-turns", "0"]], ids=lambda o: "=".join(o))
def test_generate_refuses_an_out_of_range_task_option_before_it_runs(world, tmp_path, capsys, option):
    """A task's option (``-T``, or its old flag) is checked by the task's options class: one line, nothing written."""
    out = tmp_path / "never"
    assert main(generate_nowhere(world["data"], out, *option)) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "option max_turns='0'" in err and err.count("\n") == 0, err
    assert not out.exists()


@pytest.mark.parametrize(
    "option",
    [["--temperature", "nan"], ["--max-tokens", "0"], ["--timeout", "-1"], ["--price", "nan,1"]],
    ids=lambda o: "=".join(o),
)
def test_every_command_that_calls_models_has_the_same_limits(world, capsys, option):
    cli_refuses(
        capsys, ["score", str(world["mt"]), "--dataset", str(world["data"]), "--scorer", "judge:openai/j", *option], option[0]
    )


def test_a_run_spec_out_of_range_is_refused_before_any_call(world, tmp_path):
    from craftmd.generation.runner import GenerateSpec, generate

    base = dict(
        dataset=world["data"],
        out=tmp_path / "never",
        doctor=MODEL,
        task="craftmd",
        patient=MODEL,
        base_url="http://127.0.0.1:9/v1",
        progress=False,
    )
    for bad, says in (
        (dict(price=(math.nan, math.nan), budget=1.0), "--price"),
        (dict(price=(-1.0, 2.0)), "--price"),
        (dict(price={"patient": (math.inf, 1.0)}), "--price"),
        (dict(trials=MAX_TRIALS + 1), "--trials"),
        (dict(max_tokens=0), "--max-tokens"),
        (dict(timeout=-1.0), "--timeout"),
        (dict(temperature=math.nan), "--temperature"),
        (dict(shard=(1, -1)), "--shard"),
        (dict(price=(1.0, 1.0), budget=math.nan), "--budget"),
    ):
        with pytest.raises(CraftMDError, match=says):
            generate(GenerateSpec(**base, **bad))
        assert not (tmp_path / "never").exists()


def test_the_trial_limit_is_the_same_for_validate_submit_and_ingest(world, tmp_path, capsys):
    from craftmd.scoring.submission import schema

    assert schema()["properties"]["trial"]["maximum"] == MAX_TRIALS - 1
    shipped = json.loads((ROOT / "scoring" / "submission.schema.json").read_text())
    assert shipped["properties"]["trial"]["maximum"] == MAX_TRIALS - 1  # the published file says the same
    case = sorted(pl.read_parquet(world["data"] / "all" / "test-00000-of-00001.parquet")["case_id"].to_list())[0]
    ok = {"case_id": case, "trial": MAX_TRIALS - 1, "setting": "vignette", "format": "frq", "response": "x"}
    for trial, rc in ((MAX_TRIALS - 1, 0), (MAX_TRIALS, 2), (99, 2)):
        sub = tmp_path / f"sub{trial}.jsonl"
        sub.write_text(json.dumps(dict(ok, trial=trial)) + "\n")
        assert main(["validate", str(sub), "--dataset", str(world["data"])]) == rc, trial
        assert main(submit_argv(sub, world["data"], "acme/m", tmp_path / f"s{trial}", "--grader", "offline")) == rc, trial
        assert (tmp_path / f"s{trial}").exists() == (rc == 0)
    capsys.readouterr()
    # a log of 64 epochs: refused at ingest, in one line
    log = rewrite_log(world["logs"][0], tmp_path / "epochs.eval", _store_rows("answers", lambda r: r.update(trial=MAX_TRIALS)))
    assert main(["ingest", "--inspect", str(log), "--out", str(tmp_path / "r64")]) == 2
    one_line(capsys, says=f"trial {MAX_TRIALS} is out of range")


def test_analyse_names_a_release_with_a_trial_beyond_the_limit(world, tmp_path, capsys):
    from craftmd.analysis.tables import prepared_connection

    rel = tmp_path / "releases" / "hand-made"
    shutil.copytree(world["mt"], rel)
    _data_file("answers.parquet", _trial_column(lambda v: [t + MAX_TRIALS - 1 for t in v], pa.int16()))(rel)  # trials 62 and 63
    # the analysis takes the release's tables as read (craftmd.release.Release.table), whose reader names the file
    with pytest.raises(CraftMDError, match=rf"hand-made/answers\.parquet: trial {MAX_TRIALS} is out of range"):
        prepared_connection([read_release(rel, verify=True)], world["data"])


# -- make bench runs every bench ---------------------------------------------------------------------------------


def test_the_tasks_analysis_bench_runs_without_packets(tmp_path, capsys):
    """``make bench`` runs every bench with no arguments: this one no longer requires --packets (it uses out/medpi when
    it is there, else leaves the encounters release out with a note)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_tasks_analysis", ROOT / "bench" / "bench_tasks_analysis.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.ROOT = tmp_path  # no out/ here: it stops before any work, saying what to run first
    assert bench.main([]) == 2
    err = capsys.readouterr().err
    assert "no packets" in err and "make leaderboard" in err
