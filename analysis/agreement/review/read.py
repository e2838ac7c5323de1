"""Reading filled-in reviews: our workbooks and upstream's two kinds of annotation file (detected by their header), into
one :class:`~.records.ReviewInput`; every problem is collected with its file, sheet, row and column, and nothing is
returned if there is one."""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections import defaultdict
from pathlib import Path

from craftmd import CraftMDError

from .records import (
    KEY_COLUMNS,
    KEY_SHEET,
    REVIEW_SHEET,
    UPSTREAM_AGENT_HEADER,
    UPSTREAM_GRADER_ROWS,
    CaseCount,
    Rating,
    ReviewInput,
    Unit,
    _Problems,
    parse_answer,
    question_ids,
    upstream_question_map,
)


def _cell_text(v) -> str:
    return "" if v is None else str(v).strip()


def _is_upstream_header(row) -> bool:
    """Upstream's header: case_id … correct diagnosis, then Q1, Q2, Q3 (d2 spells out each question after a colon)."""
    cells = [_cell_text(v) for v in row[: len(UPSTREAM_AGENT_HEADER)]]
    if len(cells) < len(UPSTREAM_AGENT_HEADER) or cells[:6] != UPSTREAM_AGENT_HEADER[:6]:
        return False
    return [c.split(":", 1)[0].strip() for c in cells[6:]] == UPSTREAM_AGENT_HEADER[6:]


def _detect(name: str, data: bytes):
    """('craftmd' | 'upstream-agents', workbook) or ('upstream-grader', rows)."""
    if data[:2] == b"PK":
        from openpyxl import load_workbook

        try:
            wb = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
        except Exception as exc:  # openpyxl raises many kinds on a broken file
            raise CraftMDError(f"{name}: not a readable .xlsx workbook ({type(exc).__name__}: {exc})") from None
        if REVIEW_SHEET in wb.sheetnames:
            first = next(wb[REVIEW_SHEET].iter_rows(min_row=1, max_row=1, values_only=True), ())
            if first and _cell_text(first[0]) == "review_id":
                return "craftmd", wb
        for ws in wb.worksheets:
            for row in ws.iter_rows(min_row=1, max_row=20, values_only=True):
                if _is_upstream_header(row):
                    return "upstream-agents", wb
        raise CraftMDError(
            f"{name}: not a review workbook (expected a '{REVIEW_SHEET}' sheet starting with review_id, "
            f"or upstream's header {UPSTREAM_AGENT_HEADER[0]}, …, Q3)"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CraftMDError(f"{name}: neither an .xlsx workbook nor a UTF-8 CSV") from None
    rows = list(csv.reader(io.StringIO(text)))
    labels = [r[0].strip() if r else "" for r in rows]
    if all(lbl in labels for lbl in UPSTREAM_GRADER_ROWS):
        return "upstream-grader", rows
    raise CraftMDError(
        f"{name}: not a review file (a CSV must be upstream's grader validation, rows {', '.join(UPSTREAM_GRADER_ROWS)})"
    )


def _read_craftmd(name: str, stem: str, wb, inp: ReviewInput, problems: _Problems, set_rows: dict) -> None:
    qids = question_ids()
    ws = wb[REVIEW_SHEET]
    rows = list(ws.iter_rows(values_only=True))
    header = [_cell_text(v) for v in rows[0]]
    missing = [c for c in ["review_id", "model", "case_id"] if c not in header]
    if missing:
        problems.add(f"{name} [{REVIEW_SHEET}] row 1: missing column(s) {missing}")
        return
    col = {h: i for i, h in enumerate(header) if h}
    sets = _rater_columns(name, col, qids, problems)
    key = _key_sheet(name, wb, problems)
    seen: dict[str, int] = {}
    for rn, row in enumerate(rows[1:], start=2):
        cells = list(row) + [None] * (len(header) - len(row))
        rid = _cell_text(cells[col["review_id"]])
        if not rid:
            if any(_cell_text(v) for v in cells):
                problems.add(f"{name} [{REVIEW_SHEET}] row {rn}: blank review_id")
            continue
        if rid in seen:
            problems.add(f"{name} [{REVIEW_SHEET}] row {rn}: review_id {rid} repeats row {seen[rid]}")
            continue
        seen[rid] = rn
        if KEY_SHEET in wb.sheetnames and rid not in key:
            problems.add(f"{name} [{REVIEW_SHEET}] row {rn}: unknown review_id {rid!r}")
            continue
        k = key.get(rid, {})
        unit = _row_unit(name, rn, rid, k, cells, col, inp, problems)
        if unit is None:
            continue
        inp.units.setdefault(rid, unit)
        if k:
            _key_verdict(name, rid, k, inp, problems)
        for s, qs in sorted(sets.items()):
            rater = f"{stem}:{s}"
            for q, i in qs.items():
                v = parse_answer(cells[i])
                where = f"{name} [{REVIEW_SHEET}] row {rn}, {s}:{q}"
                set_rows[rater].append((rid, q, v, where))


def _rater_columns(name: str, col: dict[str, int], qids: list[str], problems: _Problems) -> dict[str, dict[str, int]]:
    """The review sheet's answer columns: rater set -> question -> column; an unknown or missing one is a problem."""
    sets: dict[str, dict[str, int]] = defaultdict(dict)
    for h, i in col.items():
        m = re.fullmatch(r"(r\d+):(\w+)", h)
        if not m:
            continue
        if m.group(2) == "comment":
            continue
        if m.group(2) not in qids:
            problems.add(f"{name} [{REVIEW_SHEET}] row 1: unknown question column {h!r}")
            continue
        sets[m.group(1)][m.group(2)] = i
    for s, qs in sorted(sets.items()):
        absent = [q for q in qids if q not in qs]
        if absent:
            problems.add(f"{name} [{REVIEW_SHEET}] row 1: rater set {s} lacks column(s) {[f'{s}:{q}' for q in absent]}")
    return sets


def _key_sheet(name: str, wb, problems: _Problems) -> dict[str, dict]:
    """The hidden key sheet: review_id -> its row (the sheet names every conversation this workbook may hold)."""
    key: dict[str, dict] = {}
    if KEY_SHEET not in wb.sheetnames:
        problems.add(f"{name}: no '{KEY_SHEET}' sheet (export the sheet with `craftmd review export`)")
    else:
        krows = list(wb[KEY_SHEET].iter_rows(values_only=True))
        kh = [_cell_text(v) for v in (krows[0] if krows else ())]
        if kh[: len(KEY_COLUMNS)] != KEY_COLUMNS:
            problems.add(f"{name} [{KEY_SHEET}] row 1: expected columns {KEY_COLUMNS}")
        else:
            for r in krows[1:]:
                d = dict(zip(KEY_COLUMNS, (_cell_text(v) for v in r)))
                if d["review_id"]:
                    key[d["review_id"]] = d
    return key


def _row_unit(
    name: str, rn: int, rid: str, k: dict, cells: list, col: dict[str, int], inp: ReviewInput, problems: _Problems
) -> Unit | None:
    """The conversation a review row rates; None (a problem added) when its trial is no number or an earlier file
    gave the same review_id to another model or case."""
    edited = [
        c for c in ("release", "case_id") if k.get(c) is not None and c in col and _cell_text(cells[col[c]]) != _cell_text(k[c])
    ]
    if edited:  # the row's conversation is the one its key names: an edited column never moves a rating elsewhere
        problems.add(f"{name} [{REVIEW_SHEET}] row {rn}: its {' and '.join(edited)} is not the one {rid} was exported with")
        return None
    trial = k.get("trial") or (_cell_text(cells[col["trial"]]) if "trial" in col else None)
    try:
        trial_n = int(float(trial)) if trial not in (None, "") else None
    except ValueError:
        problems.add(f"{name} [{REVIEW_SHEET}] row {rn}: trial {trial!r} is not a number")
        return None
    unit = Unit(
        rid,
        _cell_text(cells[col["model"]]),
        _cell_text(cells[col["case_id"]]),
        trial_n,
        _cell_text(cells[col["dataset"]]) if "dataset" in col else None,
    )
    prev = inp.units.get(rid)
    if prev is not None and (prev.model, prev.case_id) != (unit.model, unit.case_id):
        problems.add(
            f"{name} [{REVIEW_SHEET}] row {rn}: {rid} is {unit.model}/{unit.case_id} here but {prev.model}/{prev.case_id} in an earlier file"
        )
        return None
    return unit


def _key_verdict(name: str, rid: str, k: dict, inp: ReviewInput, problems: _Problems) -> None:
    """The grader's verdict on a conversation from the key sheet (one verdict across files)."""
    g = parse_answer(k.get("grader_correct"))
    if isinstance(g, str):
        problems.add(f"{name} [{KEY_SHEET}]: grader_correct of {rid} is {g!r}, not yes/no")
    else:
        old = inp.grader_labels.get(rid)
        if old is not None and g is not None and old != g:
            problems.add(f"{name} [{KEY_SHEET}]: grader verdict on {rid} differs from an earlier file")
        elif g is not None or rid not in inp.grader_labels:
            inp.grader_labels[rid] = g
        if k.get("grader"):
            inp.grader_names.add(k["grader"])


_TURN = re.compile(r"(?:^|\n)\s*(Doctor-AI|Patient-AI)\s*:\s*")


def sheet_conversation(text: str) -> tuple[list[str], list[str]]:
    """(roles, contents) of a conversation as upstream's sheets write it ("Doctor-AI : …" lines; doctor = assistant)."""
    parts = _TURN.split(text)
    return ["assistant" if who == "Doctor-AI" else "user" for who in parts[1::2]], [c.strip() for c in parts[2::2]]


def _read_upstream_agents(
    name: str, stem: str, wb, inp: ReviewInput, problems: _Problems, set_rows: dict, known: set | None
) -> None:
    qmap = upstream_question_map()
    rater = stem
    for ws in wb.worksheets:
        rows = list(ws.iter_rows(values_only=True))
        start = None
        for i, row in enumerate(rows[:20]):
            if _is_upstream_header(row):
                start = i
                break
        if start is None:
            problems.add(f"{name} [{ws.title}]: no header row {UPSTREAM_AGENT_HEADER[0]}, …, Q3 in the first 20 rows")
            continue
        qcols = {qmap[h]: UPSTREAM_AGENT_HEADER.index(h) for h in ("Q1", "Q2", "Q3")}
        seen: dict[str, int] = {}
        for rn, row in enumerate(rows[start + 1 :], start=start + 2):
            cells = list(row) + [None] * (len(UPSTREAM_AGENT_HEADER) - len(row))
            raw = _cell_text(cells[0])
            if not raw:
                if any(_cell_text(v) for v in cells[: len(UPSTREAM_AGENT_HEADER)]):
                    problems.add(f"{name} [{ws.title}] row {rn}: blank case_id")
                continue
            case_id = raw[:-5] if raw.endswith(".json") else raw
            if not re.fullmatch(r"case_\d+", case_id) or (known is not None and case_id not in known):
                problems.add(f"{name} [{ws.title}] row {rn}: unknown case id {raw!r}")
                continue
            uid = f"{ws.title}|{case_id}"
            if uid in seen:
                problems.add(f"{name} [{ws.title}] row {rn}: {case_id} repeats row {seen[uid]}")
                continue
            seen[uid] = rn
            inp.units.setdefault(uid, Unit(uid, ws.title, case_id))
            if cells[3]:
                inp.conversations.setdefault(uid, sheet_conversation(str(cells[3])))
            for q, i in qcols.items():
                col_letter = chr(ord("A") + i)
                set_rows[rater].append(
                    (
                        uid,
                        q,
                        parse_answer(cells[i]),
                        f"{name} [{ws.title}] row {rn}, column {col_letter} ({UPSTREAM_AGENT_HEADER[i]})",
                    )
                )


def _read_upstream_grader(name: str, rows: list[list[str]], inp: ReviewInput, problems: _Problems, derm_cases) -> None:
    if derm_cases is None:
        problems.add(f"{name}: upstream's grader validation needs the pinned source to name its cases")
        return
    at = {r[0].strip(): i for i, r in enumerate(rows) if r and r[0].strip() in UPSTREAM_GRADER_ROWS}
    header_i = next((i for i, r in enumerate(rows) if len(r) > 1 and r[1].strip() == "case_0"), None)
    if header_i is None:
        problems.add(f"{name}: no header row of case columns (case_0, case_1, …)")
        return
    header = [c.strip() for c in rows[header_i]]
    cols = [(j, h) for j, h in enumerate(header) if j > 0 and h]
    if len(cols) != len(derm_cases):
        problems.add(f"{name}: {len(cols)} case columns, but the source has {len(derm_cases)} Dermatology cases")
        return

    def cell(label: str, j: int) -> str:
        r = rows[at[label]]
        return r[j].strip() if j < len(r) else ""

    for k, (j, h) in enumerate(cols):
        letter = _col_letter(j)
        if h != f"case_{k}":
            problems.add(f"{name} row {header_i + 1}, column {letter}: expected case_{k}, found {h!r}")
            continue
        case_id, answer = derm_cases[k]
        correct = cell("correct_ans", j)
        if correct != answer.strip():
            problems.add(
                f"{name} row {at['correct_ans'] + 1}, column {letter} ({h}): correct answer {correct!r} is not the source's {answer.strip()!r} for {case_id}"
            )
            continue
        raw = cell("dermatologist_accuracy", j)
        count: int | None
        if raw == "":
            count = None
        else:
            try:
                f = float(raw)
            except ValueError:
                f = -1.0
            if not (f.is_integer() and 0 <= f <= 5):
                problems.add(
                    f"{name} row {at['dermatologist_accuracy'] + 1}, column {letter} ({h}): dermatologist_accuracy {raw!r} is not a count 0–5"
                )
                continue
            count = int(f)
        extracted = tuple((cell(f"trial_{t}", j) or None) for t in range(5))
        inp.counts.append(CaseCount(case_id, count, correct, extracted, f"{name} column {letter} ({h})"))


def _col_letter(j: int) -> str:
    from openpyxl.utils import get_column_letter

    return get_column_letter(j + 1)


def read_review_files(
    files: list[tuple[str, bytes]],
    *,
    known_case_ids: set[str] | None = None,
    derm_cases: list[tuple[str, str]] | None = None,
) -> ReviewInput:
    """Read and validate review files given as (name, bytes); raise on any problem.

    ``known_case_ids``: the dataset's case ids (checks upstream sheets' ids); ``derm_cases``:
    (case_id, answer) of the source's Dermatology cases in file order (names upstream's
    grader-validation columns).
    """
    if not files:
        raise CraftMDError("no review files given")
    inp = ReviewInput()
    problems = _Problems()
    set_rows: dict[str, list[tuple]] = defaultdict(list)  # rater -> (unit, question, value, where)
    stems: dict[str, int] = {}
    for name, data in files:
        layout, obj = _detect(name, data)
        stem = Path(name).stem
        stems[stem] = stems.get(stem, 0) + 1
        if stems[stem] > 1:
            stem = f"{stem}#{stems[stem]}"
        inp.files.append({"file": Path(name).name, "sha256": hashlib.sha256(data).hexdigest(), "layout": layout})
        if layout == "craftmd":
            _read_craftmd(name, stem, obj, inp, problems, set_rows)
        elif layout == "upstream-agents":
            _read_upstream_agents(name, stem, obj, inp, problems, set_rows, known_case_ids)
        else:
            _read_upstream_grader(name, obj, inp, problems, derm_cases)
    # Rater sets: non-empty ones, in order; malformed answers are errors wherever they are.
    for rater, items in set_rows.items():
        for unit, q, v, where in items:
            if isinstance(v, str):
                problems.add(f"{where}: {v!r} is not yes/no")
    raters = [r for r, items in set_rows.items() if any(isinstance(v, bool) for _, _, v, _ in items)]
    primary = raters[:2]
    covered: set[str] = set()
    for rater in primary:
        for unit, q, v, where in set_rows[rater]:
            covered.add(unit)
            if v is None:
                problems.add(f"{where}: blank answer")
    for rater in raters[2:]:
        for unit, q, v, where in set_rows[rater]:
            if isinstance(v, bool) and unit not in covered:
                problems.add(f"{where}: tie-break for {unit}, which no primary rater rated")
    problems.raise_if_any("review import")
    inp.raters = raters
    inp.ratings = [
        Rating(unit, q, rater, v, where) for rater in raters for unit, q, v, where in set_rows[rater] if isinstance(v, bool)
    ]
    if not inp.ratings and not inp.counts:
        raise CraftMDError("review import: the files hold no answers yet")
    return inp
