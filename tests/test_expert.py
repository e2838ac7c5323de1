"""The paper's expert figures, recomputed from the annotations in the pinned source."""

from __future__ import annotations

import io
import json

import openpyxl
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.analysis.agreement import expert, review

FILES = [*expert.AGENT_FILES, expert.GRADER_FILE]


@pytest.fixture(scope="module")
def results(source):
    return expert.upstream_expert_results(source)


@pytest.fixture(scope="module")
def raw(source):
    return source.read_files(FILES)


def test_grader_agreement_with_dermatologists_reproduces_the_published_93_35(results):
    gc = results["grader_counts"]
    assert gc["agreement_pct"] == expert.PUBLISHED_GRADER_AGREEMENT_PCT == 93.35
    assert (gc["cases"], gc["trials"], gc["trial_disagreements"]) == (310, 1550, 103)
    assert gc["cases_in_sheet"] == 317 and gc["cases_unscored"] == 7
    # the sheet's extracted answers are the recorded GPT-4 grader's, trial by trial
    assert gc["extracted_matching_grader"] == gc["extracted_total"] == 1585
    # the stricter reading (same count per case) does not give the published figure
    assert gc["count_equal_pct"] == 86.77
    assert 0.8 < gc["spearman_rho"] < 0.95


def _sheet_answers(data: bytes) -> dict[tuple[str, str, str], str]:
    """(model, case, Q) -> answer, read plainly with openpyxl (an independent reading of the sheets)."""
    wb = openpyxl.load_workbook(io.BytesIO(data), read_only=True)
    out = {}
    for ws in wb.worksheets:
        rows = list(ws.iter_rows(values_only=True))
        for row in rows[6:]:
            if row and row[0]:
                for k, q in enumerate(("Q1", "Q2", "Q3")):
                    if row[6 + k] is not None:
                        out[(ws.title, row[0].replace(".json", ""), q)] = row[6 + k].strip().lower()
    return out


def test_inter_rater_kappa_and_shares_match_an_independent_reading(results, raw):
    d1, d2, d3 = (_sheet_answers(raw[f]) for f in expert.AGENT_FILES)
    qmap = review.upstream_question_map()
    inter = {(r["question"], r["model"]): r for r in results["interrater"]}
    for q in ("Q1", "Q2", "Q3"):
        both = sorted(k for k in d1 if k[2] == q and k in d2)
        assert len(both) == 60  # 15 shared conversations x 4 models
        a = [d1[k] == "yes" for k in both]
        b = [d2[k] == "yes" for k in both]
        n = len(a)
        po = sum(x == y for x, y in zip(a, b)) / n
        pe = (sum(a) / n) * (sum(b) / n) + (1 - sum(a) / n) * (1 - sum(b) / n)
        got = inter[(qmap[q], "all")]
        assert got["kappa"] == pytest.approx((po - pe) / (1 - pe), abs=1e-4)
        assert got["agreement_pct"] == pytest.approx(100 * po, abs=0.01)
        # every disagreement was broken by the third dermatologist
        disagree = [k for k in both if d1[k] != d2[k]]
        assert all(k in d3 for k in disagree)
        assert got["tiebroken"] == len(disagree) and got["unresolved"] == 0
        # shares: union of both raters' conversations, ties broken by d3
        for model in ("GPT-4", "GPT-3.5", "LLaMA2", "Mistral-v2"):
            keys = {k for k in (*d1, *d2) if k[0] == model and k[2] == q}
            final = [d1[k] if k not in d2 else d2[k] if k not in d1 else d1[k] if d1[k] == d2[k] else d3[k] for k in keys]
            share = next(s for s in results["shares"] if s["model"] == model and s["question"] == qmap[q])
            assert (share["yes"], share["n"]) == (final.count("yes"), 45)


def test_the_published_per_model_figures(results):
    share = {(s["model"], s["question"]): s["share_pct"] for s in results["shares"]}
    assert share[("GPT-4", "doctor_one_dx")] == 53.33
    assert share[("GPT-4", "doctor_history")] == 71.11
    assert share[("GPT-4", "patient_terminology")] == 15.56
    assert share[("Mistral-v2", "patient_terminology")] == 0.0


def test_review_import_of_the_upstream_files_is_the_same_code_path(source, raw, results, tmp_path, capsys):
    paths = []
    for f in FILES:
        p = tmp_path / f.rsplit("/", 1)[1]
        p.write_bytes(raw[f])
        paths.append(str(p))
    rc = cli_main(["review", "import", *paths, "--out", str(tmp_path / "o"), "--id", "expert-upstream"])
    assert rc == 0
    assert "grader vs dermatologists: 93.35 % agreement over 310 cases" in capsys.readouterr().out
    data = json.loads((tmp_path / "o" / "expert-upstream.json").read_text())["data"]
    for key in ("interrater", "shares", "grader_counts", "raters", "files"):
        assert data[key] == json.loads(json.dumps(results[key])), key


def test_upstream_audit_dict(source, results):
    audit = expert.upstream_expert_audit(source, results)
    assert audit["id"] == "expert-upstream"
    assert set(audit) >= {"id", "title", "description", "tables", "figures"}
    assert "93.35 %" in audit["description"]
    for t in audit["tables"]:
        assert all(len(r) == len(t["columns"]) for r in t["rows"])


def test_a_changed_upstream_sheet_is_refused_with_its_place(source, raw, tmp_path):
    text = raw[expert.GRADER_FILE].decode("utf-8")
    lines = text.split("\n")
    i = next(k for k, line in enumerate(lines) if line.startswith("dermatologist_accuracy,"))
    cells = lines[i].split(",")
    cells[3] = "7"
    lines[i] = ",".join(cells)
    bad = tmp_path / "validation_graderai.csv"
    bad.write_text("\n".join(lines))
    with pytest.raises(CraftMDError, match=r"column D \(case_2\): dermatologist_accuracy '7' is not a count 0–5"):
        expert.import_review([bad], tmp_path / "o", source=source)
    wb = openpyxl.load_workbook(io.BytesIO(raw[expert.AGENT_FILES[0]]))
    wb["GPT-4"].cell(8, 1).value = "case_999999.json"
    wb["GPT-4"].cell(9, 8).value = "perhaps"
    bad_x = tmp_path / "d1.xlsx"
    wb.save(bad_x)
    with pytest.raises(CraftMDError) as err:
        expert.import_review([bad_x], tmp_path / "o", dataset_dir=None)
    # case_999999 is a well-formed id; only a dataset or the source can say it is unknown
    assert "d1.xlsx [GPT-4] row 9, column H (Q2): 'perhaps' is not yes/no" in str(err.value)
    assert not (tmp_path / "o").exists()


def test_grader_verdicts_from_a_release_give_the_same_agreement(source, raw, tmp_path):
    """`review import validation_graderai.csv --release DIR`: the verdicts come from the release's scores."""
    import pyarrow as pa

    from craftmd.release import RunRecord, write_release
    from craftmd.scoring.scorers import scores_from_grades

    derm = [c for c, _ in expert.upstream_derm_cases(source)]
    files = source.read_files(["results/gpt4_1106/case_*.json"])
    answers, grades = [], []
    for cid in derm:
        rec = json.loads(files[f"results/gpt4_1106/{cid}.json"])
        for t in range(5):
            tr = rec[f"trial_{t}"]
            key = {"case_id": cid, "trial": t, "setting": "vignette", "format": "frq", "with_image": False}
            text = tr.get("vignette_frq")
            answers.append(
                {
                    **key,
                    "response": text if isinstance(text, str) else None,
                    "status": "ok" if isinstance(text, str) else "missing",
                }
            )
            detail = {"evaluation": tr.get("evaluation_vignette_frq"), "extracted_ans": tr.get("extracted_ans_vignette_frq")}
            grades.append({**key, "grader": "upstream-gpt4", "resolved": None, "resolved_kind": "none",
                           "correct": tr.get("evaluation_vignette_frq") == 1, "detail": json.dumps(detail)})  # fmt: skip
    rel = write_release(tmp_path / "gpt4_1106", RunRecord(task="craftmd", release="gpt4_1106", kind="upstream", model="gpt4_1106", source={}),
                        {"answers": pa.Table.from_pylist(answers)},
                        scores=(scores_from_grades(grades), {"upstream-gpt4": {}}))  # fmt: skip
    csv = tmp_path / "validation_graderai.csv"
    csv.write_bytes(raw[expert.GRADER_FILE])
    path = expert.import_review([csv], tmp_path / "o", release=rel, source=source, audit_id="grader-check")
    gc = json.loads(path.read_text())["data"]["grader_counts"]
    assert gc["agreement_pct"] == 93.35 and gc["extracted_matching_grader"] == 1585
