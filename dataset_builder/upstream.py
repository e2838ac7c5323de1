"""Reading the upstream files (bytes from :class:`craftmd.source.Source`) into typed records.

Each parser takes a file's path (for error messages) and bytes, checks the shape it
relies on, and returns plain records; a file that does not fit raises a one-line
:class:`CraftMDError` naming it.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from dataclasses import dataclass

import polars as pl
from PIL import Image as PILImage

from craftmd import CraftMDError
from craftmd.dataset_builder import transform as T
from craftmd.dataset_builder.schema import text_sample
from craftmd.samples import Sample

CASES_CSV = "data/usmle_and_derm_dataset.csv"
QC_CSV = "results/expert_annotations/case_vignette_qc.csv"
REFERENCE_RESULTS = "results/gpt4_1106/*.json"
IMAGE_RESULTS = "results/gpt4v/*.json"
#: Every pinned file pattern the builder reads.
PATTERNS = (CASES_CSV, QC_CSV, REFERENCE_RESULTS, IMAGE_RESULTS)

CASE_COLUMNS = ("case_vignette", "choice_1", "choice_2", "choice_3", "choice_4", "answer", "category", "dataset", "case_id")


@dataclass(frozen=True)
class UpstreamRow:
    """A row of ``data/usmle_and_derm_dataset.csv``."""

    case_id: str
    text: str  # vignette with its question sentence
    choices: tuple[str, str, str, str]
    answer: str
    category: str
    dataset: str


@dataclass(frozen=True)
class Reference:
    """What a results file says about its case: upstream's own question split."""

    case_id: str
    vignette: str
    question: str
    answer: str


def read_csv(path: str, data: bytes) -> pl.DataFrame:
    try:
        return pl.read_csv(io.BytesIO(data), infer_schema=False)
    except (pl.exceptions.PolarsError, UnicodeDecodeError) as exc:
        raise CraftMDError(f"{path}: unreadable CSV ({str(exc).splitlines()[0]})") from None


def parse_cases(path: str, data: bytes) -> list[UpstreamRow]:
    df = read_csv(path, data)
    missing = [c for c in CASE_COLUMNS if c not in df.columns]
    if missing:
        raise CraftMDError(f"{path}: missing column(s) {', '.join(missing)}")
    rows = []
    for n, r in enumerate(df.select(CASE_COLUMNS).iter_rows(named=True), start=2):
        empty = [c for c in CASE_COLUMNS if r[c] is None or not r[c].strip()]
        if empty:
            raise CraftMDError(f"{path}:{n}: empty {', '.join(empty)}")
        if not re.fullmatch(r"case_\d+", r["case_id"]):
            raise CraftMDError(f"{path}:{n}: malformed case_id {r['case_id']!r}")
        rows.append(
            UpstreamRow(
                case_id=r["case_id"],
                text=r["case_vignette"],
                choices=(r["choice_1"], r["choice_2"], r["choice_3"], r["choice_4"]),
                answer=r["answer"],
                category=r["category"],
                dataset=r["dataset"],
            )
        )
    ids = [r.case_id for r in rows]
    if len(set(ids)) != len(ids):
        raise CraftMDError(f"{path}: duplicate case_id values")
    return rows


def parse_qc(path: str, data: bytes) -> dict[str, bool | None]:
    """case_id -> single_dx from the dermatologists' vignette quality-control labels."""
    df = read_csv(path, data)
    need = ("case_id", "only_possible_answer", "single_most_likely_answer")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise CraftMDError(f"{path}: missing column(s) {', '.join(missing)}")
    out: dict[str, bool | None] = {}
    for r in df.iter_rows(named=True):
        try:
            cid = T.qc_case_id(r["case_id"] or "")
        except CraftMDError as exc:
            raise CraftMDError(f"{path}: {exc}") from None
        out[cid] = T.single_dx_label(r["only_possible_answer"], r["single_most_likely_answer"])
    return out


def _json(path: str, data: bytes) -> dict:
    try:
        d = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CraftMDError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise CraftMDError(f"{path}: expected a JSON object")
    return d


def parse_reference(path: str, data: bytes) -> Reference:
    d = _json(path, data)
    for key in ("case_id", "case_vignette", "question", "correct_ans"):
        if not isinstance(d.get(key), str):
            raise CraftMDError(f"{path}: missing or non-text {key!r}")
    return Reference(d["case_id"], d["case_vignette"], d["question"], d["correct_ans"])


def build_case(row: UpstreamRow, single_dx: dict[str, bool | None], paper_answer: str | None = None) -> tuple[Sample, str | None]:
    """A text case from its CSV row; also returns the raw question sentence.

    Choices and answer are cleaned (:func:`transform.clean_option`). ``paper_answer`` is
    upstream's recorded answer key (a results file's ``correct_ans``), kept verbatim; without
    one it is what upstream recorded there for every case: the CSV's answer, lower-cased.
    """
    vignette, raw_q = T.split_question(row.text)
    choices = tuple(T.clean_option(c) for c in row.choices)
    answer = T.clean_option(row.answer)
    try:
        idx = T.answer_index(list(choices), answer)
        specialty = T.map_specialty(row.category)
        source = T.map_source(row.dataset)
    except CraftMDError as exc:
        raise CraftMDError(f"{CASES_CSV}: {row.case_id}: {exc}") from None
    key = row.answer.lower() if paper_answer is None else paper_answer
    case = text_sample(
        row.case_id, source, specialty, vignette, T.clean_question(raw_q), choices, idx, key, single_dx.get(row.case_id)
    )
    return case, raw_q


_DATA_URL = re.compile(r"^data:image/([a-z0-9.+-]+);base64,", re.IGNORECASE)


def _images(obj) -> list[str]:
    """Every image data URL in a results file, in document order."""
    found: list[str] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            url = x.get("image_url")
            if isinstance(url, dict) and isinstance(url.get("url"), str):
                found.append(url["url"])
            elif isinstance(url, str):
                found.append(url)
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, list):
            stack.extend(reversed(x))
    return found


def parse_image_case(path: str, data: bytes) -> tuple[Sample, int]:
    """The NEJM case of a GPT-4V results file: its image (decoded) and texts.

    Returns the case and the number of distinct images in the file (1 when every
    trial carried the same picture).
    """
    d = _json(path, data)
    for key in ("case_id", "case_vignette", "question", "correct_ans"):
        if not isinstance(d.get(key), str):
            raise CraftMDError(f"{path}: missing or non-text {key!r}")
    urls = _images(d)
    if not urls:
        raise CraftMDError(f"{path}: no image in the messages")
    m = _DATA_URL.match(urls[0])
    if not m:
        raise CraftMDError(f"{path}: the image is not a base64 data URL")
    try:
        raw = base64.b64decode(urls[0][m.end() :], validate=True)
        with PILImage.open(io.BytesIO(raw)) as im:
            im.verify()
            fmt = (im.format or m.group(1)).lower()
    except (binascii.Error, ValueError, OSError) as exc:
        raise CraftMDError(f"{path}: undecodable image ({exc})") from None
    fmt = {"jpeg": "jpg"}.get(fmt, fmt)
    case = Sample(
        case_id=d["case_id"],
        source="nejm_image",
        image=raw,
        image_format=fmt,
        vignette=d["case_vignette"].strip(),
        question=T.clean_question(d["question"]),
        answer=T.normalize_ws(d["correct_ans"]),
    )
    return case, len(set(urls))
