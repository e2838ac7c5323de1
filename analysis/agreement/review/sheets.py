"""The review workbook: the sampled conversations with one answer column set per rater and a hidden ``key`` sheet (the
grader's verdicts, so raters answer blind), written byte-for-byte deterministic (``export_review``)."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import zipfile
from pathlib import Path

from craftmd import CraftMDError
from craftmd.analysis.escape import FORMULA_START
from craftmd.atomic import atomic_write_bytes

from .records import (
    FORMAT,
    INFO_COLUMNS,
    INSTRUCTIONS_SHEET,
    KEY_COLUMNS,
    KEY_SHEET,
    RATER_SETS,
    REVIEW_SHEET,
    load_questions,
    questions_sha256,
)
from .sample import _open_releases, sample_review_rows


def _deterministic_xlsx(data: bytes) -> bytes:
    """Rewrite an .xlsx so the same content gives the same bytes (fixed zip and document dates)."""
    fixed = "2000-01-01T00:00:00Z"
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            body = src.read(info.filename)
            if info.filename == "docProps/core.xml":
                body = re.sub(
                    rb"(<dcterms:(created|modified)[^>]*>)[^<]*(</dcterms:\2>)", rb"\g<1>" + fixed.encode() + rb"\g<3>", body
                )
            zi = zipfile.ZipInfo(info.filename, date_time=(2000, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o600 << 16
            dst.writestr(zi, body)
    return out.getvalue()


_FORMULA = re.compile(FORMULA_START)


def _as_text(wb) -> None:
    """Every cell of ``wb`` whose text a spreadsheet would take for a formula (an answer, a model name or a release id
    starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return: the rule the CSV tables follow,
    :data:`craftmd.analysis.escape.FORMULA_START`) stored as text and marked so (Excel's quote prefix): shown and read
    back exactly as it is, never run, not even when a rater edits the cell."""
    for ws in wb.worksheets:
        for row in ws.iter_rows():
            for cell in row:
                if isinstance(cell.value, str) and _FORMULA.match(cell.value):
                    cell.data_type = "s"
                    cell.quotePrefix = True


def build_workbook(rows: list[dict], keys: list[dict], meta: dict) -> bytes:
    from openpyxl import Workbook
    from openpyxl.styles import Alignment, Font
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.datavalidation import DataValidation

    q = load_questions()
    wb = Workbook()
    wb.properties.creator = "craftmd"
    fixed = dt.datetime(2000, 1, 1)
    wb.properties.created = wb.properties.modified = fixed

    ins = wb.active
    ins.title = INSTRUCTIONS_SHEET
    ins.append(["format", FORMAT, q["version"]])
    ins.append(["instructions", q["instructions"]])
    for k in sorted(meta):
        ins.append([k, json.dumps(meta[k], sort_keys=True) if not isinstance(meta[k], str) else meta[k]])
    ins.append([])
    ins.append(["question", "agent", "text", "answers"])
    for item in q["questions"]:
        ins.append([item["id"], item["agent"], item["text"], " / ".join(q["answers"])])
    ins.column_dimensions["A"].width = 22
    ins.column_dimensions["C"].width = 110

    ws = wb.create_sheet(REVIEW_SHEET)
    answer_cols = [f"{r}:{qq['id']}" for r in RATER_SETS for qq in q["questions"]]
    header = INFO_COLUMNS + [c for r in RATER_SETS for c in [*(f"{r}:{qq['id']}" for qq in q["questions"]), f"{r}:comment"]]
    ws.append(header)
    for c in ws[1]:
        c.font = Font(bold=True)
    for r in rows:
        ws.append([r[c] for c in INFO_COLUMNS] + [None] * (len(header) - len(INFO_COLUMNS)))
    widths = {"vignette": 60, "conversation": 90, "final_diagnosis": 30, "correct_answer": 24, "review_id": 28}
    wrap = Alignment(wrap_text=True, vertical="top")
    for j, name in enumerate(header, 1):
        letter = get_column_letter(j)
        ws.column_dimensions[letter].width = widths.get(name, 14 if ":" in name else 12)
        if name in ("vignette", "conversation", "final_diagnosis"):
            for cell in ws[letter][1:]:
                cell.alignment = wrap
    if rows:
        dv = DataValidation(type="list", formula1='"yes,no"', allow_blank=True, showErrorMessage=True,
                            errorTitle="yes or no", error="Answer yes or no.")  # fmt: skip
        for name in answer_cols:
            letter = get_column_letter(header.index(name) + 1)
            dv.add(f"{letter}2:{letter}{len(rows) + 1}")
        ws.add_data_validation(dv)
    ws.freeze_panes = "B2"

    return keyed_workbook_bytes(wb, keys, KEY_COLUMNS)


def keyed_workbook_bytes(wb, keys: list[dict], columns: list[str], sheet: str = KEY_SHEET) -> bytes:
    """A review workbook with its hidden key sheet (``columns`` of ``keys``) added, as deterministic .xlsx bytes; every
    text that starts like a formula kept as text (:func:`_as_text`). Both review exports (``review export``,
    ``judge-review export``) are written here."""
    key = wb.create_sheet(sheet)
    key.append(columns)
    for k in keys:
        key.append([k[c] for c in columns])
    key.sheet_state = "hidden"
    _as_text(wb)
    buf = io.BytesIO()
    wb.save(buf)
    return _deterministic_xlsx(buf.getvalue())


def export_review(releases, dataset_dir, out, *, n: int, seed: int, grader: str | None = None, overwrite: bool = False) -> Path:
    """Write the review workbook ``out`` (.xlsx): ``n`` conversations per model × dataset."""
    out = Path(out)
    if out.suffix.lower() != ".xlsx":
        raise CraftMDError(f"{out}: the review sheet is an .xlsx file")
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    rels = _open_releases(releases if isinstance(releases, (list, tuple)) else [releases])
    rows, keys = sample_review_rows(rels, dataset_dir, n, seed, grader)
    meta = {"seed": seed, "n_per_stratum": n, "releases": [r.id for r in rels], "questions_sha256": questions_sha256()}
    data = build_workbook(rows, keys, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, data, overwrite=overwrite)  # or made meanwhile: refused
    return out
