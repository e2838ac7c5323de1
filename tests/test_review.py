"""The expert-review loop: export -> clinicians fill in -> import, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import openpyxl
import polars as pl
import pyarrow as pa
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.release import RunRecord, conform_scores, write_release
from craftmd.analysis.agreement import expert, review
from craftmd.scoring.scorers import scores_from_grades

SOURCES = {"derm_public": range(0, 6), "medqa_usmle": range(200, 206)}
SINGLE = {0, 2, 4, 5, 201}  # single-diagnosis cases: 4 of derm_public, 1 of medqa_usmle
QIDS = review.question_ids()


def verdict(n: int, trial: int, model: str) -> bool:
    return (n + trial + len(model)) % 3 != 0


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small dataset (all config) and two graded releases of 2 trials per case."""
    root = tmp_path_factory.mktemp("review_world")
    data = root / "data" / "all"
    data.mkdir(parents=True)
    rows = [
        {"case_id": f"case_{n}", "source": src, "vignette": f"Vignette of case {n}.", "answer": f"Disease {n}",
         "single_dx": (n in SINGLE) if n != 3 else None}
        for src, ns in SOURCES.items() for n in ns
    ]  # fmt: skip
    pl.DataFrame(rows).write_parquet(data / "test-00000-of-00001.parquet")
    rels = root / "releases"
    for model in ("model-a", "model-b"):
        conv, ans, grades = [], [], []
        for src, ns in SOURCES.items():
            for n in ns:
                for t in (0, 1):
                    key = {"case_id": f"case_{n}", "trial": t, "with_image": False}
                    msgs = [{"role": "system", "content": f"You are a doctor ({model})."},  # each release's own run
                            {"role": "assistant", "content": "What brings you in?"},
                            {"role": "user", "content": f"I have symptoms of case {n}."},
                            {"role": "assistant", "content": f"Final diagnosis: Disease {n}?"}]  # fmt: skip
                    conv.append(
                        {
                            **key,
                            "conversation": "standard",
                            "messages": msgs,
                            "summary": None,
                            "n_turns": 2,
                            "ended": "final_diagnosis",
                        }
                    )
                    ans.append(
                        {**key, "setting": "multiturn", "format": "frq", "response": f"{model} says disease {n}", "status": "ok"}
                    )
                    grades.append({**key, "setting": "multiturn", "format": "frq", "grader": "upstream-gpt4",
                                   "resolved": f"disease {n}", "resolved_kind": "single", "correct": verdict(n, t, model), "detail": None})  # fmt: skip
        tables = {"conversations": pa.Table.from_pylist(conv), "answers": pa.Table.from_pylist(ans)}
        manifest = RunRecord(task="craftmd", release=model, kind="generated", model=f"openai/{model}", source={})
        write_release(rels / model, manifest, tables, scores=(scores_from_grades(grades), {"upstream-gpt4": {}}))
    return {"dataset": root / "data", "releases": rels}


def export(world, out: Path, n=3, seed=7) -> Path:
    return review.export_review([world["releases"]], world["dataset"], out, n=n, seed=seed)


def header_index(ws) -> dict[str, int]:
    return {c.value: c.column for c in ws[1] if c.value}


def read_rows(path: Path) -> list[dict]:
    wb = openpyxl.load_workbook(path)
    ws = wb[review.REVIEW_SHEET]
    hdr = [c.value for c in ws[1]]
    return [dict(zip(hdr, [c.value for c in row])) for row in ws.iter_rows(min_row=2)]


def fill(src: Path, dst: Path, answers: dict[tuple[str, str, str], str | None]) -> Path:
    """Copy the sheet ``src`` to ``dst`` with (review_id, rater set, question) -> answer written in."""
    wb = openpyxl.load_workbook(src)
    ws = wb[review.REVIEW_SHEET]
    col = header_index(ws)
    rid_col = col["review_id"]
    for r in range(2, ws.max_row + 1):
        rid = ws.cell(r, rid_col).value
        for (k_rid, rset, q), v in answers.items():
            if k_rid == rid:
                ws.cell(r, col[f"{rset}:{q}"]).value = v
    wb.save(dst)
    return dst


def r1_label(i: int, j: int) -> bool:
    return (i * 7 + j * 3) % 5 < 3


def r2_label(i: int, j: int) -> bool:
    return r1_label(i, j) if (i + j) % 4 else not r1_label(i, j)


def kappa_by_hand(a: list[bool], b: list[bool]) -> float:
    n = len(a)
    po = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    pe = pa * pb + (1 - pa) * (1 - pb)
    return (po - pe) / (1 - pe)


# -- export -------------------------------------------------------------------------------
def test_export_samples_n_per_model_and_dataset_single_diagnosis_first(world, tmp_path):
    out = export(world, tmp_path / "sheet.xlsx")
    rows = read_rows(out)
    assert len(rows) == 2 * 2 * 3  # models x sources x n
    for model in ("openai/model-a", "openai/model-b"):
        derm = [r for r in rows if r["model"] == model and r["dataset"] == "derm_public"]
        medqa = [r for r in rows if r["model"] == model and r["dataset"] == "medqa_usmle"]
        assert len(derm) == len(medqa) == 3
        # derm_public has 4 single-diagnosis cases, so all 3 picks are single-diagnosis
        assert {int(r["case_id"].split("_")[1]) for r in derm} <= SINGLE
        # medqa_usmle has 1: it is always picked
        assert "case_201" in {r["case_id"] for r in medqa}
    r = rows[0]
    assert r["review_id"] == f"{r['release']}|{r['case_id']}|t{r['trial']}"
    assert r["conversation"].startswith("Doctor-AI: What brings you in?\nPatient-AI: I have symptoms")
    assert "You are a doctor" not in r["conversation"]
    assert r["correct_answer"] == f"Disease {r['case_id'].split('_')[1]}"
    assert r["final_diagnosis"].endswith(f"says disease {r['case_id'].split('_')[1]}")
    assert all(f"{s}:{q}" in r for s in ("r1", "r2") for q in QIDS)
    wb = openpyxl.load_workbook(out)
    assert wb[review.KEY_SHEET].sheet_state == "hidden"
    assert "grader_correct" not in r  # raters answer blind


def test_export_is_deterministic_and_the_seed_matters(world, tmp_path):
    a = export(world, tmp_path / "a.xlsx").read_bytes()
    b = export(world, tmp_path / "b.xlsx").read_bytes()
    assert a == b
    c = {r["review_id"] for r in read_rows(export(world, tmp_path / "c.xlsx", seed=8))}
    assert c != {r["review_id"] for r in read_rows(tmp_path / "a.xlsx")}
    with pytest.raises(CraftMDError, match="exists"):
        export(world, tmp_path / "a.xlsx")


def test_cli_export_and_its_refusals(world, tmp_path, capsys):
    out = tmp_path / "s.xlsx"
    rel_a = str(world["releases"] / "model-a")
    export_a = ["review", "export", "--release", rel_a, "--dataset", str(world["dataset"]), "--seed", "0"]
    assert cli_main([*export_a, "--n", "2", "--out", str(out)]) == 0
    assert {r["release"] for r in read_rows(out)} == {"model-a"} and len(read_rows(out)) == 4
    with pytest.raises(SystemExit) as e:  # refused by the command line before anything is read
        cli_main([*export_a, "--n", "0", "--out", str(tmp_path / "t.xlsx")])
    assert e.value.code == 2 and "--n: '0': expected a whole number of at least 1" in capsys.readouterr().err
    rc = cli_main([*export_a, "--n", "2", "--grader", "llm:nobody", "--out", str(tmp_path / "t.xlsx")])
    assert rc == 2 and "no multiturn FRQ grades by grader 'llm:nobody'" in capsys.readouterr().err
    assert not (tmp_path / "t.xlsx").exists()


# -- round trip ----------------------------------------------------------------------------
def test_round_trip_two_raters_and_a_tiebreak_give_the_expected_kappa_shares_and_grader_agreement(world, tmp_path):
    sheet = export(world, tmp_path / "sheet.xlsx")
    rows = read_rows(sheet)
    rids = [r["review_id"] for r in rows]
    yn = {True: "yes", False: "no"}
    # rater 1 and rater 2 fill r1 and r2 of one copy; rater 3 breaks ties in r1 of another.
    dual, tie = {}, {}
    tie_label = {}
    for i, rid in enumerate(rids):
        for j, q in enumerate(QIDS):
            dual[(rid, "r1", q)] = yn[r1_label(i, j)]
            dual[(rid, "r2", q)] = ["Yes", "NO"][not r2_label(i, j)]  # any case is fine
            if r1_label(i, j) != r2_label(i, j):
                tie_label[(i, j)] = (i + j) % 2 == 0
                tie[(rid, "r1", q)] = yn[tie_label[(i, j)]]
    a = fill(sheet, tmp_path / "dual.xlsx", dual)
    t = fill(sheet, tmp_path / "tiebreak.xlsx", tie)
    out = tmp_path / "audits"
    path = expert.import_review([a, t], out)
    audit = json.loads(path.read_text())
    res = audit["data"]
    assert res["raters"] == {"primary": ["dual:r1", "dual:r2"], "tiebreak": ["tiebreak:r1"]}
    inter = {(r["question"], r["model"]): r for r in res["interrater"]}
    for j, q in enumerate(QIDS):
        x = [r1_label(i, j) for i in range(len(rids))]
        y = [r2_label(i, j) for i in range(len(rids))]
        got = inter[(q, "all")]
        assert got["n"] == len(rids)
        assert got["kappa"] == pytest.approx(kappa_by_hand(x, y), abs=1e-4)
        assert got["agreement_pct"] == pytest.approx(100 * sum(u == v for u, v in zip(x, y)) / len(rids), abs=0.01)
        assert got["tiebroken"] == got["disagreements"] and got["unresolved"] == 0
    allx = [r1_label(i, j) for i in range(len(rids)) for j in range(len(QIDS))]
    ally = [r2_label(i, j) for i in range(len(rids)) for j in range(len(QIDS))]
    assert inter[("all", "all")]["kappa"] == pytest.approx(kappa_by_hand(allx, ally), abs=1e-4)

    def resolved(i, j):
        return r1_label(i, j) if r1_label(i, j) == r2_label(i, j) else tie_label[(i, j)]

    shares = {(s["model"], s["question"]): s for s in res["shares"]}
    for model in ("openai/model-a", "openai/model-b"):
        idx = [i for i, r in enumerate(rows) if r["model"] == model]
        for j, q in enumerate(QIDS):
            yes = sum(resolved(i, j) for i in idx)
            assert (shares[(model, q)]["yes"], shares[(model, q)]["n"]) == (yes, len(idx))
    # expert (resolved grader_equivalent) vs the grader's hidden verdicts
    jg = QIDS.index("grader_equivalent")
    g = [verdict(int(r["case_id"].split("_")[1]), r["trial"], r["release"]) for r in rows]
    e = [resolved(i, jg) for i in range(len(rows))]
    gv = res["grader_vs_expert"]
    assert gv["conversations"] == len(rows)
    assert gv["agreement_pct"] == pytest.approx(100 * sum(u == v for u, v in zip(e, g)) / len(rows), abs=0.01)
    assert gv["kappa"] == pytest.approx(kappa_by_hand(e, g), abs=1e-4)
    assert gv["grader"] == ["upstream-gpt4"]
    # the audit dict the leaderboard reads, and the resolved labels beside it
    assert audit["id"] == "expert-review" and {t["name"] for t in audit["tables"]} >= {"Inter-rater agreement (first two raters)"}
    # the ratings are a scores table (metric expert_rating): each rater's answer and the resolved label
    import pyarrow.parquet as pq

    table = pq.read_table(out / "expert-review.scores.parquet")
    conform_scores(table.replace_schema_metadata(None))  # a valid scores table
    ratings = pl.from_arrow(table)
    assert set(ratings["metric"]) == {"expert_rating"}
    labels = ratings.filter(pl.col("scorer") == review.EXPERTS)
    assert labels.height == len(rows) * len(QIDS)
    assert set(labels["label"].unique().to_list()) == {"agreed", "tiebreak"}
    assert (labels["status"] == "ok").all()
    yes = {(r["review_id"], r["question"]): r["value"] for r in labels.iter_rows(named=True)}
    assert all(yes[(rid, q)] == float(resolved(i, j)) for i, rid in enumerate(rids) for j, q in enumerate(QIDS))
    raters = ratings.filter(pl.col("scorer") != review.EXPERTS)
    assert set(raters["scorer"]) == {"rater:dual:r1", "rater:dual:r2", "rater:tiebreak:r1"}


def test_two_files_each_filled_by_one_rater_pair_up(world, tmp_path, capsys):
    sheet = export(world, tmp_path / "sheet.xlsx", n=2)
    rids = [r["review_id"] for r in read_rows(sheet)]
    a = fill(
        sheet,
        tmp_path / "alice.xlsx",
        {(rid, "r1", q): "yes" if (i + j) % 3 else "no" for i, rid in enumerate(rids) for j, q in enumerate(QIDS)},
    )
    b = fill(
        sheet,
        tmp_path / "bob.xlsx",
        {(rid, "r1", q): "yes" if (i + j) % 3 else "no" for i, rid in enumerate(rids) for j, q in enumerate(QIDS)},
    )
    rc = cli_main(["review", "import", str(a), str(b), "--out", str(tmp_path / "o")])
    assert rc == 0
    res = json.loads((tmp_path / "o" / "expert-review.json").read_text())["data"]
    assert res["raters"]["primary"] == ["alice:r1", "bob:r1"]
    overall = next(r for r in res["interrater"] if r["question"] == "all" and r["model"] == "all")
    assert overall["agreement_pct"] == 100.0 and overall["kappa"] == 1.0
    assert "inter-rater  all" in capsys.readouterr().out


# -- refusals --------------------------------------------------------------------------------
def test_a_malformed_sheet_is_refused_with_sheet_row_and_column_and_nothing_is_written(world, tmp_path, capsys):
    sheet = export(world, tmp_path / "sheet.xlsx", n=1)
    rids = [r["review_id"] for r in read_rows(sheet)]
    answers = {(rid, s, q): "yes" for rid in rids for s in ("r1", "r2") for q in QIDS}
    answers[(rids[1], "r2", "patient_grounded")] = "maybe"
    answers[(rids[2], "r1", "doctor_history")] = None
    bad = fill(sheet, tmp_path / "bad.xlsx", answers)
    # an id the key does not know
    wb = openpyxl.load_workbook(bad)
    ws = wb[review.REVIEW_SHEET]
    ws.cell(5, header_index(ws)["review_id"]).value = "model-z|case_1|t0"
    wb.save(bad)
    out = tmp_path / "o"
    with pytest.raises(CraftMDError) as err:
        expert.import_review([bad], out)
    msg = str(err.value)
    assert "nothing imported" in msg
    assert "bad.xlsx [review] row 3, r2:patient_grounded: 'maybe' is not yes/no" in msg
    assert "bad.xlsx [review] row 4, r1:doctor_history: blank answer" in msg
    assert "row 5: unknown review_id 'model-z|case_1|t0'" in msg
    assert not out.exists()
    rc = cli_main(["review", "import", str(bad), "--out", str(out)])
    assert rc == 2
    err_line = capsys.readouterr().err.strip()
    assert err_line.count("\n") == 0 and "3 problem(s)" in err_line
    assert not out.exists()


def test_not_a_review_file_and_an_empty_sheet_are_refused(world, tmp_path):
    other = tmp_path / "other.xlsx"
    wb = openpyxl.Workbook()
    wb.active.append(["something", "else"])
    wb.save(other)
    with pytest.raises(CraftMDError, match="other.xlsx: not a review workbook"):
        expert.import_review([other], tmp_path / "o")
    sheet = export(world, tmp_path / "sheet.xlsx", n=1)
    with pytest.raises(CraftMDError, match="hold no answers yet"):
        expert.import_review([sheet], tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_parse_answer():
    assert review.parse_answer(" Yes ") is True and review.parse_answer("n") is False
    assert review.parse_answer(1) is True and review.parse_answer(False) is False
    assert review.parse_answer("") is None and review.parse_answer(None) is None
    assert review.parse_answer("unsure") == "unsure"


@pytest.mark.parametrize("column", ["release", "case_id"])
def test_a_rating_never_moves_to_what_an_edited_column_names(world, tmp_path, column):
    """A row's release and case are its key's (the hidden sheet written at export): an edited column is a problem."""
    sheet = export(world, tmp_path / "sheet.xlsx", n=1)
    rids = [r["review_id"] for r in read_rows(sheet)]
    filled = fill(sheet, tmp_path / "filled.xlsx", {(rid, s, q): "yes" for rid in rids for s in ("r1", "r2") for q in QIDS})
    wb = openpyxl.load_workbook(filled)
    ws = wb[review.REVIEW_SHEET]
    ws.cell(2, header_index(ws)[column]).value = "model-z" if column == "release" else "case_99"
    wb.save(filled)
    out = tmp_path / "o"
    with pytest.raises(CraftMDError, match=f"row 2: its {column} is not the one .* was exported with"):
        expert.import_review([filled], out)
    assert not out.exists()
