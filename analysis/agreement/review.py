"""The expert-review loop: sheets for clinicians out, their answers in, agreement computed.

``export_review`` samples conversations from one or more releases (stratified per model ×
dataset, single-diagnosis cases first, as the paper did) into an .xlsx workbook with the
questions of ``review_questions.json`` as answer columns, one column set per rater
(``r1:``, ``r2:``) for dual annotation, and a hidden ``key`` sheet holding the grader's
verdict on each conversation (hidden so raters answer blind).

``read_review_files`` reads filled-in workbooks, and also upstream's own annotation files
(detected by their header), into one typed :class:`ReviewInput`; every problem (unknown id,
blank or malformed answer) is collected with its file, sheet, row and column, and nothing is
returned or written if there is one. ``summarise`` computes:

* inter-rater agreement between the first two raters (percent agreement and Cohen's kappa,
  statsmodels) per question, per model × question and pooled;
* the resolved label of each conversation and question: the only rating, the agreed rating,
  or, where the two disagree, the first tie-break rater's (third and later rater sets);
* per model × question the share of *yes* among resolved labels;
* expert vs grader: percent agreement, kappa and Spearman's rho (scipy) of the resolved
  ``grader_equivalent`` label against the grader's verdict; for upstream's per-case
  dermatologist counts (0–5 of the trials correct), see :func:`grader_count_agreement`.

Rater sets are taken in the order given: files in argument order, ``r1`` before ``r2``
within a file; sets with no answer at all are skipped. The first two non-empty sets are the
primary raters and must be complete on the conversations they cover; later sets are
tie-breakers and may be blank except where they break a tie.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import re
import zipfile
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from craftmd import CraftMDError
from craftmd.agreement import kappa, spearman_test
from craftmd.atomic import atomic_write_bytes, atomic_write_json
from craftmd.scoring.judge import transcript

QUESTIONS_FILE = Path(__file__).resolve().parent / "review_questions.json"
FORMAT = "craftmd-expert-review"
REVIEW_SHEET, KEY_SHEET, INSTRUCTIONS_SHEET = "review", "key", "instructions"
INFO_COLUMNS = ["review_id", "model", "release", "dataset", "case_id", "trial", "vignette", "conversation", "final_diagnosis", "correct_answer"]
KEY_COLUMNS = ["review_id", "release", "case_id", "trial", "grader", "grader_correct"]
RATER_SETS = ("r1", "r2")
YES = {"yes", "y", "true", "1"}
NO = {"no", "n", "false", "0"}
#: Upstream's clinical-LLM / patient-AI validation sheets (one sheet per model).
UPSTREAM_AGENT_HEADER = ["case_id", "case_vignette", "question", "multi-turn conversation", "final diagnosis", "correct diagnosis", "Q1", "Q2", "Q3"]
#: Upstream's grader validation CSV: a transposed table, these labels in its first column.
UPSTREAM_GRADER_ROWS = ["trial_0", "trial_1", "trial_2", "trial_3", "trial_4", "correct_ans", "dermatologist_accuracy"]
#: Grader preference when exporting without --grader.
GRADER_PREFERENCE = ("llm:", "upstream-gpt4", "offline")
MAX_REPORTED = 6


# -- questions ---------------------------------------------------------------------
def load_questions() -> dict:
    try:
        q = json.loads(QUESTIONS_FILE.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CraftMDError(f"cannot read the review questions {QUESTIONS_FILE}: {exc}") from None
    return q


def question_ids() -> list[str]:
    return [q["id"] for q in load_questions()["questions"]]


def upstream_question_map() -> dict[str, str]:
    """Upstream's column name (Q1..Q3) -> our question id."""
    return {q["upstream"]: q["id"] for q in load_questions()["questions"] if q.get("upstream")}


def questions_sha256() -> str:
    return hashlib.sha256(QUESTIONS_FILE.read_bytes()).hexdigest()


# -- typed records -----------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """One conversation under review."""

    unit: str
    model: str
    case_id: str
    trial: int | None = None
    dataset: str | None = None


@dataclass(frozen=True)
class Rating:
    unit: str
    question: str
    rater: str
    value: bool
    where: str


@dataclass(frozen=True)
class CaseCount:
    """Upstream grader validation: a dermatologist's count of correct trials for one case."""

    case_id: str
    expert_correct: int | None  # 0..5, None where the case was not scored
    correct_answer: str
    extracted: tuple[str | None, ...]  # the grader's extracted answer per trial, as the sheet shows it
    where: str


@dataclass
class ReviewInput:
    files: list[dict] = field(default_factory=list)
    units: dict[str, Unit] = field(default_factory=dict)
    ratings: list[Rating] = field(default_factory=list)
    raters: list[str] = field(default_factory=list)  # non-empty rater sets, in order
    grader_labels: dict[str, bool | None] = field(default_factory=dict)  # unit -> grader's verdict
    grader_names: set[str] = field(default_factory=set)
    counts: list[CaseCount] = field(default_factory=list)
    conversations: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # unit -> (roles, contents) upstream's sheet shows

    @property
    def primary(self) -> list[str]:
        return self.raters[:2]

    @property
    def tiebreak(self) -> list[str]:
        return self.raters[2:]


class _Problems:
    def __init__(self):
        self.items: list[str] = []

    def add(self, msg: str) -> None:
        self.items.append(msg)

    def raise_if_any(self, what: str) -> None:
        if self.items:
            shown = "; ".join(self.items[:MAX_REPORTED])
            more = f" (and {len(self.items) - MAX_REPORTED} more)" if len(self.items) > MAX_REPORTED else ""
            raise CraftMDError(f"{what}: {len(self.items)} problem(s), nothing imported: {shown}{more}")


def parse_answer(value) -> bool | None | str:
    """yes/no (also y/n, true/false, 1/0, any case) -> bool; blank -> None; anything else -> the text (malformed)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if not text:
        return None
    if text in YES:
        return True
    if text in NO:
        return False
    return str(value)


# -- export ------------------------------------------------------------------------------
def _open_releases(paths) -> list:
    from craftmd.release import find_releases, read_release

    found = {}
    for p in paths:
        p = Path(p)
        rels = [read_release(p)] if (p / "manifest.json").exists() else find_releases(p)
        if not rels:
            raise CraftMDError(f"{p}: no release found")
        for r in rels:
            found.setdefault(r.id, r)
    return [found[k] for k in sorted(found)]


def _pick_grader(names: list[str], wanted: str | None) -> str | None:
    if wanted:
        return wanted if wanted in names else None
    for pref in GRADER_PREFERENCE:
        hits = sorted(n for n in names if n.startswith(pref)) if pref.endswith(":") else [n for n in names if n == pref]
        if hits:
            return hits[0]
    return None


def _stratum_rng(seed: int, *labels: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32("|".join(labels).encode())])


def sample_review_rows(releases, dataset_dir, n: int, seed: int, grader: str | None = None) -> tuple[list[dict], list[dict]]:
    """The sampled rows (sheet) and key rows: ``n`` conversations per release × dataset source."""
    import polars as pl

    from craftmd.dataset import load_config
    from craftmd.release import natural_key

    if n < 1:
        raise CraftMDError("--n must be at least 1")
    cases = load_config(dataset_dir, "all").select("case_id", "source", "vignette", "answer", "single_dx")
    by_case = {r["case_id"]: r for r in cases.iter_rows(named=True)}
    rows, keys, skipped = [], [], []
    for rel in releases:
        conv = pl.from_arrow(rel.table("conversations")).filter(
            (pl.col("conversation") == "standard") & ~pl.col("with_image")
        )
        if conv.height == 0:
            skipped.append(rel.id)  # e.g. an image-only release
            continue
        ans = pl.from_arrow(rel.table("answers")).filter(
            (pl.col("setting") == "multiturn") & (pl.col("format") == "frq") & ~pl.col("with_image")
        )
        final = {(r["case_id"], r["trial"]): r for r in ans.iter_rows(named=True)}
        verdict, gname = {}, None
        if rel.has("scores"):
            grades = rel.verdicts(setting="multiturn", format="frq", with_image=False)
            gname = _pick_grader(sorted(grades["grader"].unique().to_list()), grader)
            if grader and gname is None:
                raise CraftMDError(f"release {rel.id}: no multiturn FRQ grades by grader {grader!r}")
            if gname:
                for r in grades.filter(pl.col("grader") == gname).iter_rows(named=True):
                    verdict[(r["case_id"], r["trial"])] = r["correct"]
        trials: dict[str, list[int]] = defaultdict(list)
        msgs = {}
        for r in conv.iter_rows(named=True):
            if r["case_id"] not in by_case:
                raise CraftMDError(f"release {rel.id}: case {r['case_id']} is not in the dataset {dataset_dir}")
            trials[r["case_id"]].append(r["trial"])
            msgs[(r["case_id"], r["trial"])] = r["messages"]
        strata: dict[str, list[str]] = defaultdict(list)
        for cid in sorted(trials, key=natural_key):
            strata[by_case[cid]["source"]].append(cid)
        for source in sorted(strata):
            rng = _stratum_rng(seed, rel.id, source)
            ids = strata[source]
            single = [c for c in ids if by_case[c]["single_dx"] is True]
            other = [c for c in ids if by_case[c]["single_dx"] is not True]
            order = [single[i] for i in rng.permutation(len(single))] + [other[i] for i in rng.permutation(len(other))]
            chosen = order[:n]
            for cid in sorted(chosen, key=natural_key):
                trial = int(sorted(trials[cid])[int(rng.integers(len(trials[cid])))])
                c = by_case[cid]
                a = final.get((cid, trial))
                if a is None:
                    fd = "(no answer recorded)"
                elif a["status"] != "ok" or a["response"] is None:
                    fd = f"(no answer: {a['status']})"
                else:
                    fd = a["response"]
                rid = f"{rel.id}|{cid}|t{trial}"
                rows.append({
                    "review_id": rid, "model": rel.manifest.model, "release": rel.id, "dataset": source,
                    "case_id": cid, "trial": trial, "vignette": c["vignette"],
                    "conversation": transcript(msgs[(cid, trial)]), "final_diagnosis": fd, "correct_answer": c["answer"],
                })  # fmt: skip
                v = verdict.get((cid, trial))
                keys.append({
                    "review_id": rid, "release": rel.id, "case_id": cid, "trial": trial,
                    "grader": gname or "", "grader_correct": "" if v is None else ("yes" if v else "no"),
                })  # fmt: skip
    if not rows:
        raise CraftMDError(f"no standard text conversations to review in release(s) {', '.join(skipped)}")
    return rows, keys


def _deterministic_xlsx(data: bytes) -> bytes:
    """Rewrite an .xlsx so the same content gives the same bytes (fixed zip and document dates)."""
    fixed = "2000-01-01T00:00:00Z"
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            body = src.read(info.filename)
            if info.filename == "docProps/core.xml":
                body = re.sub(rb"(<dcterms:(created|modified)[^>]*>)[^<]*(</dcterms:\2>)", rb"\g<1>" + fixed.encode() + rb"\g<3>", body)
            zi = zipfile.ZipInfo(info.filename, date_time=(2000, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o600 << 16
            dst.writestr(zi, body)
    return out.getvalue()


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
    """A review workbook with its hidden key sheet (``columns`` of ``keys``) added, as deterministic .xlsx bytes."""
    key = wb.create_sheet(sheet)
    key.append(columns)
    for k in keys:
        key.append([k[c] for c in columns])
    key.sheet_state = "hidden"
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
    atomic_write_bytes(out, data)
    return out


# -- import: reading and validating --------------------------------------------------------
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
    raise CraftMDError(f"{name}: not a review file (a CSV must be upstream's grader validation, rows {', '.join(UPSTREAM_GRADER_ROWS)})")


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
    # The key sheet names every conversation this workbook may hold.
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
        trial = k.get("trial") or (_cell_text(cells[col["trial"]]) if "trial" in col else None)
        try:
            trial_n = int(float(trial)) if trial not in (None, "") else None
        except ValueError:
            problems.add(f"{name} [{REVIEW_SHEET}] row {rn}: trial {trial!r} is not a number")
            continue
        unit = Unit(
            rid,
            _cell_text(cells[col["model"]]),
            _cell_text(cells[col["case_id"]]),
            trial_n,
            _cell_text(cells[col["dataset"]]) if "dataset" in col else None,
        )
        prev = inp.units.get(rid)
        if prev is not None and (prev.model, prev.case_id) != (unit.model, unit.case_id):
            problems.add(f"{name} [{REVIEW_SHEET}] row {rn}: {rid} is {unit.model}/{unit.case_id} here but {prev.model}/{prev.case_id} in an earlier file")
            continue
        inp.units.setdefault(rid, unit)
        if k:
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
        for s, qs in sorted(sets.items()):
            rater = f"{stem}:{s}"
            for q, i in qs.items():
                v = parse_answer(cells[i])
                where = f"{name} [{REVIEW_SHEET}] row {rn}, {s}:{q}"
                set_rows[rater].append((rid, q, v, where))


_TURN = re.compile(r"(?:^|\n)\s*(Doctor-AI|Patient-AI)\s*:\s*")


def sheet_conversation(text: str) -> tuple[list[str], list[str]]:
    """(roles, contents) of a conversation as upstream's sheets write it ("Doctor-AI : …" lines; doctor = assistant)."""
    parts = _TURN.split(text)
    return ["assistant" if who == "Doctor-AI" else "user" for who in parts[1::2]], [c.strip() for c in parts[2::2]]


def _read_upstream_agents(name: str, stem: str, wb, inp: ReviewInput, problems: _Problems, set_rows: dict, known: set | None) -> None:
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
                set_rows[rater].append((uid, q, parse_answer(cells[i]), f"{name} [{ws.title}] row {rn}, column {col_letter} ({UPSTREAM_AGENT_HEADER[i]})"))


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
            problems.add(f"{name} row {at['correct_ans'] + 1}, column {letter} ({h}): correct answer {correct!r} is not the source's {answer.strip()!r} for {case_id}")
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
                problems.add(f"{name} row {at['dermatologist_accuracy'] + 1}, column {letter} ({h}): dermatologist_accuracy {raw!r} is not a count 0–5")
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


# -- statistics ---------------------------------------------------------------------------
def _pct(num: int, den: int) -> float | None:
    return round(100.0 * num / den, 2) if den else None


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else round(float(x), nd)


def resolve(inp: ReviewInput) -> dict[tuple[str, str], dict]:
    """(unit, question) -> {value, how, ratings}: how = single | agreed | tiebreak | unresolved."""
    by: dict[tuple[str, str], dict[str, bool]] = defaultdict(dict)
    for r in inp.ratings:
        by[(r.unit, r.question)][r.rater] = r.value
    out = {}
    a_b = inp.primary
    for key, vals in by.items():
        prim = [vals[r] for r in a_b if r in vals]
        if not prim:
            continue  # tie-break answers alone never make a label (validation refuses them)
        if len(prim) == 1:
            out[key] = {"value": prim[0], "how": "single", "ratings": vals}
        elif prim[0] == prim[1]:
            out[key] = {"value": prim[0], "how": "agreed", "ratings": vals}
        else:
            tb = next((vals[r] for r in inp.tiebreak if r in vals), None)
            out[key] = {"value": tb, "how": "tiebreak" if tb is not None else "unresolved", "ratings": vals}
    return out


def grader_count_agreement(expert: list[int], grader: list[int], trials: int = 5) -> dict:
    """Agreement of per-case counts of correct trials (expert vs grader), the paper's figure.

    ``agreement`` = 1 − Σ|grader − expert| / (trials × cases): the share of trials on which the
    two agree when trials are matched so that agreement is greatest — the only per-trial
    agreement the counts determine (the dermatologists recorded a count, not which trials).
    Also: the share of cases with equal counts, and Spearman's rho of the counts (scipy).
    """
    n = len(expert)
    if n == 0:
        return {"cases": 0, "agreement": None, "count_equal": None, "spearman_rho": None, "spearman_p": None}
    e, g = np.asarray(expert), np.asarray(grader)
    diff = int(np.abs(e - g).sum())
    rho, p = spearman_test(e, g)
    return {
        "cases": n,
        "trials": trials * n,
        "trial_disagreements": diff,
        "agreement": round(1.0 - diff / (trials * n), 6),
        "agreement_pct": _pct(trials * n - diff, trials * n),
        "count_equal": round(float((e == g).mean()), 6),
        "count_equal_pct": _pct(int((e == g).sum()), n),
        "spearman_rho": _r(rho, 6),
        "spearman_p": _r(p, 12),
        "expert_accuracy_pct": _pct(int(e.sum()), trials * n),
        "grader_accuracy_pct": _pct(int(g.sum()), trials * n),
    }


def counts_agreement(counts: list[CaseCount], case_labels: dict[tuple[str, int], dict]) -> dict:
    """A grader's per-trial verdicts (``case_labels``: (case_id, trial) -> {"correct": …}) against the
    experts' counts of correct trials, over the cases the experts scored (:func:`grader_count_agreement`)."""
    scored = [c for c in counts if c.expert_correct is not None]
    missing = [(c.case_id, t) for c in scored for t in range(5) if (c.case_id, t) not in case_labels]
    if missing:
        raise CraftMDError(f"no grader verdict for {missing[0][0]} trial {missing[0][1]} (and {len(missing) - 1} more)")
    grader_counts = [sum(bool(case_labels[(c.case_id, t)]["correct"]) for t in range(5)) for c in scored]
    return grader_count_agreement([c.expert_correct for c in scored], grader_counts)


def summarise(inp: ReviewInput, case_labels: dict[tuple[str, int], dict] | None = None) -> dict:
    """Every figure of the review: inter-rater agreement, shares, expert vs grader.

    ``case_labels`` maps (case_id, trial) to {"correct": bool, "extracted": str | None}: the
    grader's per-trial verdicts for upstream's grader-validation counts.
    """
    qtext = {q["id"]: q["text"] for q in load_questions()["questions"]}
    res = resolve(inp)
    units = inp.units
    models = sorted({u.model for u in units.values()})
    questions = [q for q in qtext if any(k[1] == q for k in res)]
    out: dict = {
        "files": inp.files,
        "raters": {"primary": inp.primary, "tiebreak": inp.tiebreak},
        "questions": {q: qtext[q] for q in questions},
        "questions_sha256": questions_sha256(),
        "conversations": len({k[0] for k in res}),
    }
    # Inter-rater agreement of the two primary raters.
    inter = []
    if len(inp.primary) == 2:
        a, b = inp.primary
        for q in [*questions, None]:
            for m in [None, *models]:
                pairs = [
                    (v["ratings"][a], v["ratings"][b], v["how"])
                    for (u, qq), v in sorted(res.items())
                    if (q is None or qq == q) and (m is None or units[u].model == m) and a in v["ratings"] and b in v["ratings"]
                ]
                if not pairs:
                    continue
                xa, xb = [p[0] for p in pairs], [p[1] for p in pairs]
                agree = sum(p[0] == p[1] for p in pairs)
                inter.append({
                    "question": q or "all", "model": m or "all", "n": len(pairs),
                    "agreement_pct": _pct(agree, len(pairs)), "kappa": _r(kappa(xa, xb)),
                    "disagreements": len(pairs) - agree,
                    "tiebroken": sum(p[2] == "tiebreak" for p in pairs),
                    "unresolved": sum(p[2] == "unresolved" for p in pairs),
                })  # fmt: skip
    out["interrater"] = inter
    # Shares of yes among resolved labels, per model and question (and per rater).
    shares = []
    for m in [*models, None]:
        for q in questions:
            cells = [(u, v) for (u, qq), v in sorted(res.items()) if qq == q and (m is None or units[u].model == m)]
            resolved = [v["value"] for _, v in cells if v["value"] is not None]
            row = {
                "model": m or "all", "question": q, "n": len(resolved), "yes": sum(resolved),
                "share_pct": _pct(sum(resolved), len(resolved)), "unresolved": len(cells) - len(resolved),
            }  # fmt: skip
            for r in inp.primary:
                own = [v["ratings"][r] for _, v in cells if r in v["ratings"]]
                row[f"share_pct[{r}]"] = _pct(sum(own), len(own))
                row[f"n[{r}]"] = len(own)
            shares.append(row)
    out["shares"] = shares
    # Expert vs grader, per conversation (our sheets).
    pairs = [
        (v["value"], inp.grader_labels[u]) for (u, q), v in sorted(res.items())
        if q == "grader_equivalent" and v["value"] is not None and inp.grader_labels.get(u) is not None
    ]  # fmt: skip
    if pairs:
        e = [p[0] for p in pairs]
        g = [p[1] for p in pairs]
        agree = sum(x == y for x, y in pairs)
        rho = spearman_test(np.array(e, float), np.array(g, float)) if len(set(e)) > 1 and len(set(g)) > 1 else None
        out["grader_vs_expert"] = {
            "grader": sorted(inp.grader_names),
            "conversations": len(pairs),
            "agreement_pct": _pct(agree, len(pairs)),
            "kappa": _r(kappa(e, g)),
            "spearman_rho": _r(rho[0]) if rho is not None else None,
            "spearman_p": _r(rho[1], 12) if rho is not None else None,
            "expert_correct_pct": _pct(sum(e), len(e)),
            "grader_correct_pct": _pct(sum(g), len(g)),
        }
    # Upstream grader validation: per-case counts.
    if inp.counts:
        if case_labels is None:
            raise CraftMDError("upstream's grader validation needs the grader's per-trial verdicts (a release or the source)")
        scored = [c for c in inp.counts if c.expert_correct is not None]
        stats = counts_agreement(inp.counts, case_labels)
        same = sum(
            (case_labels.get((c.case_id, t), {}).get("extracted") or "") == (c.extracted[t] or "")
            for c in inp.counts for t in range(5)
        )  # fmt: skip
        stats.update({
            "cases_in_sheet": len(inp.counts),
            "cases_unscored": len(inp.counts) - len(scored),
            "extracted_matching_grader": same,
            "extracted_total": 5 * len(inp.counts),
            "definition": "1 - sum over scored cases of |grader's correct trials - dermatologist's count| / (5 x cases)",
        })  # fmt: skip
        out["grader_counts"] = stats
    return out


#: The audit's tables of lists: (results key, table name, column -> field).
_LISTED = (
    ("interrater", "Inter-rater agreement (first two raters)",
     {"question": "question", "model": "model", "both rated": "n", "agreement %": "agreement_pct", "Cohen's kappa": "kappa",
      "disagreements": "disagreements", "tie-broken": "tiebroken", "unresolved": "unresolved"}),
    ("shares", "Share answered yes (after tie-breaks)",
     {"model": "model", "question": "question", "conversations": "n", "yes": "yes", "share %": "share_pct", "unresolved": "unresolved"}),
)  # fmt: skip
#: The audit's tables of figures: (results key, table name).
_FIGURES = (("grader_vs_expert", "Grader-AI vs experts (per conversation)"),
            ("grader_counts", "Grader-AI vs dermatologists (correct trials per case, 0–5)"))


def review_audit(results: dict, *, audit_id: str = "expert-review", title: str = "Expert review", intro: str = "") -> dict:
    """The audit dict (leaderboard) of :func:`summarise`'s results."""
    tables = []
    for key, name, columns in _LISTED:  # rows of results[key], one column per field
        if results.get(key):
            tables.append({"name": name, "columns": list(columns), "rows": [[r[f] for f in columns.values()] for r in results[key]]})
    for key, name in _FIGURES:  # one row per figure of results[key]
        if results.get(key):
            rows = [[k, ", ".join(v) if isinstance(v, list) else v] for k, v in results[key].items()]
            tables.append({"name": name, "columns": ["metric", "value"], "rows": rows})
    qs = "; ".join(f"{k}: {v}" for k, v in results.get("questions", {}).items())
    desc = "\n\n".join(x for x in (intro, f"Questions — {qs}" if qs else "") if x)
    return {"id": audit_id, "title": title, "description": desc, "tables": tables, "figures": [], "data": results}


EXPERTS = "experts"  # the scorer of the resolved labels; each rater's own answers are scorer rater:<name>


def resolved_table(inp: ReviewInput):
    """The review as scores rows (metric ``expert_rating``, 1 yes / 0 no): per conversation and question,
    each rater's answer (scorer ``rater:<name>``) and the resolved label (scorer ``experts``; its label says
    how: single, agreed, tiebreak; an unresolved one has status error and no value). Variant keys: the
    reviewed release (``model``), the ``question`` and the sheet's ``review_id``."""
    import pyarrow as pa

    res = resolve(inp)
    cols = {k: [] for k in ("case_id", "trial", "model", "question", "review_id", "scorer", "metric", "value", "label", "detail", "status")}

    def add(unit, u, q, scorer, value, label, detail):
        for k, v in (("case_id", unit.case_id), ("trial", unit.trial), ("model", unit.model), ("question", q), ("review_id", u),
                     ("scorer", scorer), ("metric", "expert_rating"), ("value", None if value is None else float(value)),
                     ("label", label), ("detail", detail), ("status", "error" if value is None else "ok")):
            cols[k].append(v)

    for (u, q), v in sorted(res.items()):
        unit = inp.units[u]
        ratings = {k: v["ratings"][k] for k in sorted(v["ratings"])}
        for rater, value in ratings.items():
            add(unit, u, q, f"rater:{rater}", value, None, None)
        add(unit, u, q, EXPERTS, v["value"], v["how"], json.dumps(ratings, sort_keys=True))
    return pa.table(cols)


#: tables/expert_tests.csv: McNemar's test between two reviewed models on the experts' resolved labels.
EXPERT_TEST_COLUMNS = ["question", "model_a", "model_b", "n_cases", "yes_a", "yes_b", "n10", "n01", "diff", "p_value", "p_adjusted", "test"]


def model_tests(inp: ReviewInput):
    """McNemar's test between every two reviewed models, per question, on the experts' resolved labels (after
    tie-breaks) of the cases both were rated on (the paper's Supplementary Table 18): a case is a pair, ``n10`` the
    cases where model a's conversation got yes and b's no, ``n01`` the reverse; exact below 25 discordant cases, as
    the accuracy tests (:func:`craftmd.analysis.stats.mcnemar_p`). ``diff``: a's share of yes minus b's over the paired
    cases. Holm within each question across its pairs of models. A unit reviewed more than once per case and model
    (several trials) is refused: the pairing would be ambiguous."""
    import polars as pl

    from craftmd.analysis.stats import holm, mcnemar_p

    res = resolve(inp)
    label: dict[tuple[str, str, str], bool] = {}  # (question, model, case_id) -> resolved yes/no
    for (u, q), v in sorted(res.items()):
        if v["value"] is None:
            continue
        unit = inp.units[u]
        key = (q, unit.model, unit.case_id)
        if key in label:
            raise CraftMDError(f"model {unit.model!r} was reviewed more than once on {unit.case_id} ({q}): cannot pair models by case")
        label[key] = v["value"]
    rows = []
    for q in sorted({k[0] for k in label}):
        models = sorted({k[1] for k in label if k[0] == q})
        for i, a in enumerate(models):
            for b in models[i + 1 :]:
                cases = sorted({k[2] for k in label if k[:2] == (q, a)} & {k[2] for k in label if k[:2] == (q, b)})
                if not cases:
                    continue
                xa = [label[(q, a, c)] for c in cases]
                xb = [label[(q, b, c)] for c in cases]
                n10 = sum(x and not y for x, y in zip(xa, xb))
                n01 = sum(y and not x for x, y in zip(xa, xb))
                rows.append({"question": q, "model_a": a, "model_b": b, "n_cases": len(cases), "yes_a": sum(xa), "yes_b": sum(xb),
                             "n10": n10, "n01": n01, "diff": round((sum(xa) - sum(xb)) / len(cases), 6),
                             "p_value": mcnemar_p(n10, n01), "test": "mcnemar"})  # fmt: skip
    types = {"question": pl.String, "model_a": pl.String, "model_b": pl.String, "n_cases": pl.Int64, "yes_a": pl.Int64, "yes_b": pl.Int64,
             "n10": pl.Int64, "n01": pl.Int64, "diff": pl.Float64, "p_value": pl.Float64, "test": pl.String}  # fmt: skip
    df = pl.DataFrame(rows, schema=types)
    return df.with_columns(pl.Series("p_adjusted", holm(df, ["question"]), dtype=pl.Float64)).select(EXPERT_TEST_COLUMNS)


# -- import: the command ---------------------------------------------------------------------
def release_labels_by_grader(release_dir, setting: str = "vignette", fmt: str = "frq") -> dict[str, dict]:
    """grader -> (case_id, trial) -> {correct, extracted}, for every grader of a release's text grades."""
    from craftmd.release import read_release

    rel = read_release(release_dir)
    g = rel.verdicts(setting=setting, format=fmt, with_image=False)

    def extracted(r) -> str | None:  # the grader's raw extraction where its detail keeps it ("none", "multiple")
        try:
            d = json.loads(r["detail"]) if r["detail"] else {}
        except json.JSONDecodeError:
            d = {}
        x = d.get("extracted_ans") if isinstance(d, dict) else None
        return x if isinstance(x, str) else r["resolved"]

    out: dict[str, dict] = {}
    for r in g.iter_rows(named=True):
        if r["status"] != "ok":  # a grade that could not be produced is no verdict: left out, never counted wrong
            continue
        out.setdefault(r["grader"], {})[(r["case_id"], int(r["trial"]))] = {"correct": bool(r["correct"]), "extracted": extracted(r)}
    return out


def release_case_labels(release_dir, grader: str = "upstream-gpt4", setting: str = "vignette", fmt: str = "frq") -> dict:
    """(case_id, trial) -> {correct, extracted} from a release's grades by ``grader``."""
    labels = release_labels_by_grader(release_dir, setting, fmt).get(grader)
    if not labels:
        raise CraftMDError(f"release {Path(release_dir).name}: no {setting}/{fmt} grades by grader {grader!r}")
    return labels


def write_results(out: Path, audit: dict, table) -> Path:
    """Write ``<out>/<id>.json`` and the ratings as a scores table ``<out>/<id>.scores.parquet`` (each atomically; validated before)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{audit['id']}.json"
    return write_with_scores(path, audit, table, {EXPERTS: {"review": audit["id"], "questions": sorted(set(table.column("question").to_pylist()))}})


def write_with_scores(path: Path, results: dict, table, records: dict) -> Path:
    """Write ``results`` (JSON) to ``path`` and ``table`` as a scores table beside it (``<stem>.scores.parquet``), each
    atomically; the table is validated (:func:`craftmd.release.encode_scores`) before either is written."""
    from craftmd.release import encode_scores

    path = Path(path)
    data = encode_scores(table, records)
    atomic_write_bytes(path.with_name(f"{path.stem}.scores.parquet"), data)
    atomic_write_json(path, results)
    return path


__all__ = [
    "export_review", "write_with_scores", "read_review_files", "summarise", "review_audit", "resolve", "model_tests", "EXPERT_TEST_COLUMNS",
    "grader_count_agreement", "counts_agreement", "release_labels_by_grader", "parse_answer", "ReviewInput", "Rating", "Unit", "CaseCount",
]  # fmt: skip
