"""The consultation framework's and MedPI's results analysed and on the page (issue #24).

Small releases of each task are made against loopback servers: two consultation releases (a doctor that asks three
questions and one that asks one; a solver whose answers depend on what it was shown) and a judged encounters release.
The tables' values are checked against a hand computation from the releases' own files; the sections and figures
render (the page opened in headless Chromium when it is installed); a section never appears without its releases.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from encounter_script import medpi, patient_down, run  # noqa: E402,F401  (medpi: the fixture)
from loopback import LoopbackServer, pick_upstream, text_of, write_replay_dataset  # noqa: E402
from test_consultation import consult, extract, sentences  # noqa: E402
from test_judge_encounters import judge_reply  # noqa: E402

from craftmd.commands.cli import main as cli_main  # noqa: E402

B = 400
N_CASES = 6


class Consultation:
    """Every agent of the consultation protocol. The extractor gives each case a request naming it; the doctor
    ``openai/loopback`` asks three questions, ``openai/doc-b`` one; the solver answers right or wrong by a hash of
    the case, the format and how much it was shown (more rounds, more often right; the whole vignette most often)."""

    def __init__(self, answers: dict[str, tuple[str, str]]):
        self.answers = answers  # vignette -> (case_id, answer)
        self.by_request = {}

    def __call__(self, req: dict) -> str:
        msgs = req["messages"]
        system, last = text_of(msgs[0]["content"]), text_of(msgs[-1]["content"])
        if system.startswith("You turn a clinical case"):
            vignette = last.split("Case description:\n", 1)[1].rsplit("\n\nJSON:", 1)[0]
            cid = self.answers[vignette][0]
            items = [{"key": " ".join(s.split()[:3]), "value": s} for s in sentences(vignette)]
            return json.dumps({"initial_request": f"I feel unwell ({cid}), can you help me?", "items": items})
        if system.startswith("You are a doctor"):
            asked = sum(m["role"] == "assistant" for m in msgs)
            limit = 3 if req["model"] == "loopback" else 1
            return f"Any fever or cough, question {asked + 1}?" if asked < limit else "**Final Diagnosis:** Pneumonia"
        if system.startswith("You play a patient"):
            vignette = system.split("What you know about your condition: ", 1)[1]
            n = sum(m["role"] == "user" for m in msgs)
            parts = sentences(vignette)
            return " ".join(parts[min(n - 1, len(parts) - 1)].split()[:8])
        if system.startswith("You are a medical expert"):
            options = [ln[2:] for ln in last.splitlines() if ln.startswith("- ")]
            if last.startswith("Patient information: "):
                vignette = last.removeprefix("Patient information: ").split("\n\n", 1)[0]
                cid, answer = self.answers[vignette]
                chance = 8
            else:
                cid = re.search(r"I feel unwell \((\S+)\)", last).group(1)
                answer = next(a for c, a in self.answers.values() if c == cid)
                chance = 2 + 2 * last.count("\nDoctor: ")
            right = zlib.crc32(f"{cid}|{bool(options)}|{last.count(chr(10) + 'Doctor: ')}|{chance}".encode()) % 10 < chance
            if options:
                return answer if right else next(o for o in options if o != answer)
            return answer if right else "Completely unrelated condition"
        raise ValueError(f"unexpected request: {system[:60]!r}")


@pytest.fixture(scope="module")
def consult_releases(source, tmp_path_factory):
    """A tiny dataset with keyinfo, and two graded consultation releases (doctors loopback and doc-b)."""
    root = tmp_path_factory.mktemp("consult-analysis")
    data = root / "data"
    write_replay_dataset(pick_upstream(source, N_CASES, seed=5, max_messages=14), data)
    f = data / "all" / "test-00000-of-00001.parquet"
    df = pl.read_parquet(f).with_columns(paper_answer=pl.col("answer").str.to_lowercase())
    df.write_parquet(f)
    models = Consultation({v: (c, a) for c, v, a in zip(df["case_id"], df["vignette"], df["answer"])})
    rels = root / "releases"
    with LoopbackServer(models, models=("loopback", "doc-b")) as server:
        assert extract(data, server.base_url, root / "c.sqlite") == 0
        for name, doctor in (("consult-a", "openai/loopback"), ("consult-b", "openai/doc-b")):
            assert consult(data, rels / name, server.base_url, root / "c.sqlite", "--doctor", doctor) == 0
            assert (
                cli_main(
                    ["score", str(rels / name), "--dataset", str(data), "--scorer", "paper", "--scorer", "offline", "--quiet"]
                )
                == 0
            )
    return data, rels


@pytest.fixture(scope="module")
def encounter_release(medpi, tmp_path_factory):  # noqa: F811
    """An encounters release (two packets, two trials; one encounter fails), judged in category mode."""
    play = patient_down(medpi)  # the diagnosis packet's second trial fails
    out = tmp_path_factory.mktemp("enc-analysis") / "releases" / "enc"
    with LoopbackServer(play) as server:
        run(server, medpi, out, out.parent.parent / "cache.sqlite", trials=2)
    plain = out.parent.parent / "plain" / "enc"
    shutil.copytree(out, plain)  # the same release, never judged
    with LoopbackServer(judge_reply, models=("judge-a",)) as server:
        assert cli_main(["score", str(out), "--scorer", "judge:openai/judge-a", "--base-url", server.base_url, "--dataset", str(medpi),
                         "--mode", "category", "--max-invalid", "1", "--quiet"]) == 0  # fmt: skip
    return out, plain


@pytest.fixture(scope="module")
def together(consult_releases, encounter_release, medpi, tmp_path_factory):  # noqa: F811
    """Both consultation releases and the judged encounters release, analysed and written as a page."""
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import analyse

    data, rels = consult_releases
    root = tmp_path_factory.mktemp("together")
    shutil.copytree(rels, root / "releases")
    shutil.copytree(encounter_release[0], root / "releases" / "enc")
    out = root / "out"
    a = analyse(root / "releases", data, out, B=B, packets=medpi)
    write_page(a, out)
    return a, root / "releases", data, out


def case_scores(rel: Path) -> pl.DataFrame:
    """Per grader, format, setting and case: the share of correct trials (a missing grade counts wrong), by hand."""
    answers = pl.read_parquet(rel / "answers.parquet")
    scores = pl.read_parquet(rel / "scores.parquet").filter(pl.col("metric") == "correct")
    rows = []
    for grader in sorted(set(scores["scorer"])):
        g = scores.filter(pl.col("scorer") == grader)
        graded = set(zip(g["setting"], g["format"]))
        right = {
            (r["case_id"], r["trial"], r["setting"], r["format"]) for r in g.filter(pl.col("value") == 1).iter_rows(named=True)
        }
        for r in answers.iter_rows(named=True):
            if (r["setting"], r["format"]) in graded:
                ok = r["status"] == "ok" and (r["case_id"], r["trial"], r["setting"], r["format"]) in right
                rows.append(
                    {
                        "grader": grader,
                        "format": r["format"],
                        "setting": r["setting"],
                        "case_id": r["case_id"],
                        "correct": float(ok),
                    }
                )
    return pl.DataFrame(rows).group_by("grader", "format", "setting", "case_id").agg(pl.col("correct").mean())


def test_consultation_tables_equal_a_hand_computation(together):
    a, rels, data, out = together
    t = a.tasks["consultation"]
    for name in ("consult_accuracy", "consult_rounds", "consult_oracle", "consult_gap", "consult_complexity", "consult_tests"):
        assert (out / "tables" / f"{name}.csv").exists() and t[name].height > 0, name
    for rel in ("consult-a", "consult-b"):
        hand = case_scores(rels / rel)
        # accuracy per setting: the mean over cases of each case's share of correct trials
        acc = hand.group_by("grader", "format", "setting").agg(pl.col("correct").mean().alias("want"), pl.len().alias("n"))
        got = t["consult_accuracy"].filter(pl.col("model") == rel).join(acc, on=["grader", "format", "setting"])
        assert got.height == acc.height == 2 * 22 and got.height == t["consult_accuracy"].filter(pl.col("model") == rel).height
        for r in got.iter_rows(named=True):
            assert r["accuracy"] == pytest.approx(r["want"], abs=1e-6) and r["n_cases"] == r["n"]
            assert r["ci_low"] <= r["accuracy"] + 1e-9 and r["accuracy"] <= r["ci_high"] + 1e-9
            assert (r["conversation"], r["share"]) == ((r["setting"], None) if r["setting"] in ("upper", "lower") else
                                                       (r["setting"].rsplit("_", 1)[0], int(r["setting"].rsplit("_", 1)[1])))  # fmt: skip
        # the bound gap closed: on the cases posed in all three settings
        wide = hand.pivot(on="setting", index=["grader", "format", "case_id"], values="correct")
        gaps = t["consult_gap"].filter(pl.col("model") == rel)
        assert gaps.height == 2 * 4 * 5
        for r in gaps.iter_rows(named=True):
            w = wide.filter(pl.col("grader") == r["grader"], pl.col("format") == r["format"]).drop_nulls(
                [f"{r['conversation']}_{r['share']}", "upper", "lower"]
            )
            c, u, lo = (w[s].to_numpy() for s in (f"{r['conversation']}_{r['share']}", "upper", "lower"))
            assert r["n_cases"] == w.height and r["accuracy"] == pytest.approx(c.mean(), abs=1e-6)
            assert r["upper"] == pytest.approx(u.mean(), abs=1e-6) and r["lower"] == pytest.approx(lo.mean(), abs=1e-6)
            if u.sum() == lo.sum():
                assert r["gap_closed"] is None
            else:
                assert r["gap_closed"] == pytest.approx((c.sum() - lo.sum()) / (u.sum() - lo.sum()), abs=1e-6)
        # rounds: the same accuracy, with the bounds beside
        rounds = t["consult_rounds"].filter(pl.col("model") == rel)
        assert rounds.height == 2 * 4 * 5
        for r in rounds.filter(pl.col("share") == 60).iter_rows(named=True):
            want = acc.filter(pl.col("grader") == r["grader"], pl.col("format") == r["format"])
            at = dict(zip(want["setting"], want["want"]))
            assert r["accuracy"] == pytest.approx(at[f"{r['conversation']}_60"], abs=1e-6)
            assert r["upper"] == pytest.approx(at["upper"], abs=1e-6) and r["lower"] == pytest.approx(at["lower"], abs=1e-6)
        oracle = t["consult_oracle"].filter(pl.col("model") == rel)
        assert oracle.height == 2 * 5 * 3 and set(oracle["order"]) == {"direct", "random", "reverse"}
        for r in oracle.iter_rows(named=True):
            direct = oracle.filter(pl.col("grader") == r["grader"], pl.col("format") == r["format"], pl.col("share") == r["share"],
                                   pl.col("order") == "direct")["accuracy"][0]  # fmt: skip
            assert r["vs_direct"] == pytest.approx(r["accuracy"] - direct, abs=1e-9)

    # complexity: three equal parts of the cases by their number of key-value items
    ki = pl.read_parquet(data / "keyinfo" / "test-00000-of-00001.parquet").filter(pl.col("status") == "ok")
    counts = dict(zip(ki["case_id"], ki["items"].list.len()))
    edges = np.quantile(list(counts.values()), [1 / 3, 2 / 3])
    part = {c: int(np.searchsorted(edges, k, side="right")) + 1 for c, k in counts.items()}
    hand = case_scores(rels / "consult-a").filter(pl.col("setting") == "consult_100", pl.col("grader") == "offline")
    cx = t["consult_complexity"].filter(
        pl.col("model") == "consult-a", pl.col("setting") == "consult_100", pl.col("grader") == "offline"
    )
    assert set(cx["tertile"]) == set(part.values())
    for r in cx.iter_rows(named=True):
        mine = hand.filter(pl.col("case_id").is_in([c for c, p in part.items() if p == r["tertile"]]))
        assert r["n_cases"] == mine.height and r["accuracy"] == pytest.approx(mine["correct"].mean(), abs=1e-6)
        assert r["items_low"] == min(counts[c] for c in mine["case_id"]) and r["items_high"] == max(
            counts[c] for c in mine["case_id"]
        )

    # paired tests: both families, both tests, Holm within each family (never below the raw p-value)
    tests = t["consult_tests"]
    assert set(tests["family"]) == {"setting", "model"} and set(tests["test"]) == {"paired-bootstrap", "mcnemar"}
    assert (tests["p_adjusted"] >= tests["p_value"] - 1e-12).all()
    models = tests.filter(pl.col("family") == "model")
    assert set(zip(models["a"], models["b"])) == {("consult-a", "consult-b")}
    hand_a, hand_b = case_scores(rels / "consult-a"), case_scores(rels / "consult-b")
    r = models.filter(pl.col("setting") == "consult_100", pl.col("format") == "frq", pl.col("grader") == "offline",
                      pl.col("test") == "paired-bootstrap").row(0, named=True)  # fmt: skip
    pick = lambda h: h.filter(pl.col("setting") == "consult_100", pl.col("format") == "frq", pl.col("grader") == "offline")  # noqa: E731
    both = pick(hand_a).join(pick(hand_b), on="case_id")
    assert r["diff"] == pytest.approx((both["correct"] - both["correct_right"]).mean(), abs=1e-6) and r["n_cases"] == both.height
    pairs = set(zip(*tests.filter(pl.col("family") == "setting").select("a", "b").to_dict(as_series=False).values()))
    assert {("upper", "lower"), ("consult_100", "upper"), ("oracle_direct_100", "oracle_reverse_100")} <= pairs


def test_encounter_tables_equal_a_hand_computation(together, encounter_release, medpi):  # noqa: F811
    from craftmd.dataset_builder.packets import load_packets
    from craftmd.scoring.rubric import load_catalog

    a, _, _, out = together
    rel = encounter_release[0]
    e = a.tasks["encounters"]
    for name in ("encounter_endings", "encounter_length", "encounter_affect", "rubric_by_encounter"):
        assert (out / "tables" / f"{name}.csv").exists() and e[name].height > 0, name
    conv = pl.read_parquet(rel / "conversations.parquet")
    closures = pl.read_parquet(rel / "closures.parquet")
    # endings: ended x closure label (failed when the classifier gave none), counts and shares
    j = conv.join(closures, on=["case_id", "trial"], how="left").with_columns(
        pl.when(pl.col("status") != "ok").then(pl.lit("failed")).otherwise(pl.col("label")).alias("closure")
    )
    want = {(r["ended"], r["closure"]): r["len"] for r in j.group_by("ended", "closure").len().iter_rows(named=True)}
    got = {(r["ended"], r["closure"]): r["n"] for r in e["encounter_endings"].iter_rows(named=True)}
    assert (
        got == want and sum(got.values()) == conv.height == 4 and ("error", "failed") in got or ("error", "not_reasonable") in got
    )
    assert e["encounter_endings"]["share"].sum() == pytest.approx(1.0)
    # length: messages per encounter, the failed one counted and not measured
    ok = conv.filter(~pl.col("ended").is_in(["error", "refusal"]))
    n_msgs = ok["messages"].list.len().to_numpy()
    row = e["encounter_length"].filter(pl.col("ended") == "all").row(0, named=True)
    assert row["n"] == ok.height == 3 and row["n_failed"] == 1 and row["n_encounters"] == 4
    assert row["median_messages"] == pytest.approx(np.median(n_msgs)) and row["mean_messages"] == pytest.approx(n_msgs.mean())
    assert row["p20_messages"] == pytest.approx(np.quantile(n_msgs, 0.2)) and row["max_messages"] == n_msgs.max()
    # affect: valid states only, failed steps counted per turn
    states = pl.read_parquet(rel / "patient_states.parquet")
    for r in e["encounter_affect"].iter_rows(named=True):
        s = states.filter(pl.col("turn") == r["turn"])
        good = s.filter(pl.col("status") == "ok")
        assert r["n_states"] == good.height and r["n_failed"] == s.height - good.height
        if good.height:
            assert r["mean_valence"] == pytest.approx(good["valence"].mean()) and r["mean_arousal"] == pytest.approx(
                good["arousal"].mean()
            )
            assert r["top_emotions"].startswith("anxiety 6.0")  # the script's feeling: anxiety 6, interest 4, fear 3
    assert e["encounter_affect"]["n_failed"].sum() > 0
    # the rubric by reason and objective: per conversation the mean of its meta-category means of categories' means
    cat = load_catalog().by_id()
    scores = pl.read_parquet(rel / "scores.parquet").filter(pl.col("metric") == "rubric_score")
    packets = {p["case_id"]: p for p in load_packets(medpi)}
    per_conv: dict = {}
    for r in scores.filter(pl.col("status") == "ok").iter_rows(named=True):
        d = cat[r["dimension"]]
        per_conv.setdefault((r["case_id"], r["trial"]), {}).setdefault(d.meta_category, {}).setdefault(d.category, []).append(
            100 * (r["value"] - 1) / 3
        )
    overall = {
        k: np.mean([np.mean([np.mean(v) for v in cats.values()]) for cats in metas.values()]) for k, metas in per_conv.items()
    }
    rub = e["rubric_by_encounter"]
    for r in rub.filter(pl.col("level") == "reason_objective").iter_rows(named=True):
        cases = {c for c, p in packets.items() if p["reason"] == r["reason"] and p["objective"] == r["objective"]}
        by_case = [
            np.mean([v for (c, _), v in overall.items() if c == cid])
            for cid in sorted(cases)
            if any(c == cid for c, _ in overall)
        ]
        assert r["mean"] == pytest.approx(np.mean(by_case), abs=1e-3) and r["n_cases"] == len(by_case)
        failed = scores.filter(pl.col("status") != "ok", pl.col("case_id").is_in(list(cases))).height
        assert r["n_failed"] == failed and r["ci_low"] <= r["mean"] <= r["ci_high"]
    allrow = rub.filter(pl.col("level") == "all").row(0, named=True)
    assert allrow["n_failed"] == scores.filter(pl.col("status") != "ok").height
    assert allrow["mean"] == pytest.approx(np.mean([np.mean([v for (c, _), v in overall.items() if c == cid])
                                                    for cid in sorted({c for c, _ in overall})]), abs=1e-3)  # fmt: skip
    assert set(rub["level"]) == {"all", "reason", "objective", "reason_objective"}


def test_one_board_per_task_under_one_name(together):
    a, _, _, out = together
    b = a.boards
    assert (out / "tables" / "boards.csv").exists()
    assert set(b["task"]) == {"consultation", "encounters"}
    # the doctor openai/loopback ran both tasks: one name, a row in each
    assert set(b.filter(pl.col("model") == "openai/loopback")["task"]) == {"consultation", "encounters"}
    assert set(b.filter(pl.col("model") == "openai/doc-b")["task"]) == {"consultation"}
    lead = b.filter(pl.col("release") == "consult-a", pl.col("measure") == "frq_accuracy_consult_100").row(0, named=True)
    acc = a.tasks["consultation"]["consult_accuracy"].filter(pl.col("model") == "consult-a", pl.col("setting") == "consult_100",
                                                    pl.col("format") == "frq", pl.col("grader") == "offline").row(0, named=True)  # fmt: skip
    assert (lead["value"], lead["ci_low"], lead["ci_high"]) == (acc["accuracy"], acc["ci_low"], acc["ci_high"])
    closure = b.filter(pl.col("measure") == "reasonable_closure").row(0, named=True)
    ends = a.tasks["encounters"]["encounter_endings"]
    labelled = ends.filter(pl.col("closure").is_in(["reasonable", "not_reasonable"]))
    assert closure["value"] == pytest.approx(labelled.filter(pl.col("closure") == "reasonable")["n"].sum() / labelled["n"].sum())


def test_the_sections_render_and_appear_only_with_their_releases(together, consult_releases, encounter_release, medpi, tmp_path):  # noqa: F811
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import analyse

    a, _, _, out = together
    page = (out / "index.html").read_text()
    for anchor in ('id="tasks"', 'id="consultation"', 'id="encounters"', 'id="rubric"'):
        assert anchor in page, anchor
    assert 'id="board"' not in page and 'id="specialty"' not in page  # no CRAFT-MD release: none of its sections
    for fig in ("consult_rounds.png", "encounter_affect.png", "rubric_reason_objective.png", "rubric_meta.png"):
        assert (out / "figures" / fig).stat().st_size > 10_000 and f"figures/{fig}" in page, fig
    best = a.tasks["consultation"]["consult_accuracy"]
    assert "closes" in page and "of the gap between the bounds" in page
    md = (out / "leaderboard.md").read_text()
    assert "## Boards by task" in md and "## The consultation framework" in md and "## MedPI's patient-led encounters" in md
    assert best.height

    # the consultation releases alone: no encounters section, no encounter table
    data, rels = consult_releases
    only = analyse(rels, data, tmp_path / "c", B=B)
    p = write_page(only, tmp_path / "c").read_text()
    assert 'id="consultation"' in p and 'id="encounters"' not in p and 'id="rubric"' not in p
    assert not (tmp_path / "c" / "tables" / "encounter_endings.csv").exists()
    # an unjudged encounters release alone (no dataset of CRAFT-MD's needed): its section, no consultation, no rubric
    enc = analyse(encounter_release[1].parent, medpi, tmp_path / "e", B=B, packets=medpi)
    p = write_page(enc, tmp_path / "e").read_text()
    assert 'id="encounters"' in p and 'id="consultation"' not in p and 'id="rubric"' not in p and 'id="board"' not in p
    assert not (tmp_path / "e" / "tables" / "consult_accuracy.csv").exists()
    assert (
        enc.tasks["encounters"]["rubric_by_encounter"].height == 0
        and enc.tasks["encounters"]["encounter_endings"]["n"].sum() == 4
    )

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (make browser)")
    shot = out / "screenshot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1280,5200",
                    (out / "index.html").as_uri()], check=True, capture_output=True, timeout=120)  # fmt: skip
    assert shot.stat().st_size > 50_000
    keep = Path("/tmp/craftmd-tasks-page")
    if keep.parent.is_dir():  # for a person to look at
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(out, keep)
    assert math.isfinite(float(a.tasks["consultation"]["consult_gap"]["gap_closed"].drop_nulls().mean()))


def test_hostile_release_names_are_escaped_in_the_other_tasks_tables(consult_releases, encounter_release, medpi, tmp_path):  # noqa: F811
    """A release named like a spreadsheet formula, with a pipe: the consultation and board tables neutralise it
    (as CRAFT-MD's do), and the markdown twin escapes it."""
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import analyse

    data, rels = consult_releases
    hostile = "=cmd|x"
    shutil.copytree(rels / "consult-a", tmp_path / "releases" / "hostile")
    manifest = tmp_path / "releases" / "hostile" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"release": "consult-a"', f'"release": "{hostile}"'))
    shutil.copytree(encounter_release[0], tmp_path / "releases" / "enc")
    out = tmp_path / "out"
    write_page(analyse(tmp_path / "releases", data, out, B=B, packets=medpi, figures=False), out)
    checked = 0
    for name in ("consult_accuracy", "consult_tests", "boards"):
        table = pl.read_csv(out / "tables" / f"{name}.csv", infer_schema_length=0)
        for col in set(table.columns) & {"model", "release", "display", "a", "b"}:
            cells = [c for c in table[col].to_list() if c and "cmd" in c]
            assert all(c[0] == "'" for c in cells), (name, col, cells)
            checked += len(cells)
    assert checked > 0
    md = (out / "leaderboard.md").read_text()
    assert "=cmd\\|x" in md and "=cmd|x" not in md


def test_reasonable_closure_is_one_number_of_the_labelled_encounters():
    """``reasonable_closure`` by hand: A 3 reasonable, 1 not, none failed (3/4); B 2 reasonable, 0 not, 2 labels failed
    or missing (2/2 = 100 %: failed labels are counted apart, not 2/4). The board and the encounters section show that
    one figure: the section is led by B, its lead sentence and table state B's share of its labelled encounters."""
    import dataclasses

    from craftmd.tasks.encounters import analysis as encounters
    from craftmd.analysis.page import environment
    from craftmd.analysis.tables import Analysis, _empty, _with_boards
    from craftmd.metrics import metric

    assert metric("reasonable_closure").kind == "binary" and metric("reasonable_closure").higher_is_better
    rows = [
        ("rel-a", "doctor_closed", "reasonable", 3),
        ("rel-a", "max_messages", "not_reasonable", 1),
        ("rel-b", "patient_closed", "reasonable", 2),
        ("rel-b", "error", "failed", 1),
        ("rel-b", "doctor_closed", "missing", 1),
    ]
    ends = pl.DataFrame(rows, schema=["model", "ended", "closure", "n"], orient="row")
    assert encounters.reasonable_closure(ends) == {
        "rel-a": {"n": 4, "labelled": 4, "reasonable": 3, "n_failed": 0, "share": 0.75},
        "rel-b": {"n": 4, "labelled": 2, "reasonable": 2, "n_failed": 2, "share": 1.0}}  # fmt: skip

    tables = {"encounter_endings": ends,
              "encounter_length": pl.DataFrame(schema={"model": pl.String, "ended": pl.String, "median_messages": pl.Float64}),
              "encounter_affect": pl.DataFrame(schema={"model": pl.String, "turn": pl.Int64, "n_states": pl.Int64, "n_failed": pl.Int64}),
              "rubric_by_encounter": pl.DataFrame(schema={"model": pl.String, "level": pl.String, "objective": pl.String,
                                                          "reason": pl.String, "mean": pl.Float64})}  # fmt: skip
    releases = pl.DataFrame({"release": ["rel-a", "rel-b"], "kind": ["run", "run"], "model": ["openai/a", "openai/b"],
                             "display": ["A", "B"], "notes": ["{}", "{}"], "task": ["encounters", "encounters"],
                             "scorers": ["{}", "{}"], "protocol": [None, None]})  # fmt: skip
    e = _empty()
    fields = [f.name for f in dataclasses.fields(Analysis)][:10]
    a = _with_boards(Analysis(**{f: (releases if f == "releases" else e[f]) for f in fields}, tasks={"encounters": tables}))
    board = a.boards.filter(pl.col("measure") == "reasonable_closure")
    assert board.select("release", "value", "n_cases", "n_failed").rows() == [("rel-a", 0.75, 4, 0), ("rel-b", 1.0, 4, 2)]

    from craftmd.analysis.boards import page_section as boards_section
    from craftmd.analysis.view import View

    section = encounters.page_section(a, View(a))
    assert section["lead"]["display"] == "B" and [r["closed"]["share"] for r in section["rows"]] == [0.75, 1.0]
    page = environment(True).from_string(
        '{% import "leaderboard_tasks.html.j2" as t with context %}{{ t.boards() }}{{ t.sections() }}'
    )
    where = "task:encounters/section"
    from craftmd.analysis.page import TOP_ROWS

    html = page.render(
        task_boards=boards_section(a), task_sections=[{"data": section, "html": f"{where}.html.j2"}], top_rows=TOP_ROWS
    )
    assert (
        "B: 2 of the 2 encounters the closure classifier labelled reached a reasonable end (<b>100.0%</b>; 2 of 4 labels" in html
    )
    # each model's share in the board's cell and in the section's column (B's in the lead sentence too), nowhere 2 of 4
    assert html.count(">100.0%<") == 3 and html.count(">75.0%<") == 2 and "50.0%" not in html


def test_every_table_is_documented_with_its_columns(together):
    """The analysis page of the documentation lists every table an analysis of the other tasks writes, with exactly
    its columns (the CRAFT-MD board's are checked in test_leaderboard.py)."""
    from helpers import assert_tables_documented

    out = together[3]
    assert_tables_documented(out / "tables")
