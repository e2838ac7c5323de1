"""The expert review's form: its questions (``review_questions.json``), the workbook's sheets and columns, the typed
records a filled-in review is read into, and how an answer cell reads (yes/no/blank)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from craftmd import CraftMDError

QUESTIONS_FILE = Path(__file__).resolve().parent.parent / "review_questions.json"
FORMAT = "craftmd-expert-review"
REVIEW_SHEET, KEY_SHEET, INSTRUCTIONS_SHEET = "review", "key", "instructions"
INFO_COLUMNS = [
    "review_id",
    "model",
    "release",
    "dataset",
    "case_id",
    "trial",
    "vignette",
    "conversation",
    "final_diagnosis",
    "correct_answer",
]
KEY_COLUMNS = ["review_id", "release", "case_id", "trial", "grader", "grader_correct"]
RATER_SETS = ("r1", "r2")
YES = {"yes", "y", "true", "1"}
NO = {"no", "n", "false", "0"}
#: Upstream's clinical-LLM / patient-AI validation sheets (one sheet per model).
UPSTREAM_AGENT_HEADER = [
    "case_id",
    "case_vignette",
    "question",
    "multi-turn conversation",
    "final diagnosis",
    "correct diagnosis",
    "Q1",
    "Q2",
    "Q3",
]
#: Upstream's grader validation CSV: a transposed table, these labels in its first column.
UPSTREAM_GRADER_ROWS = ["trial_0", "trial_1", "trial_2", "trial_3", "trial_4", "correct_ans", "dermatologist_accuracy"]
#: Grader preference when exporting without --grader.
GRADER_PREFERENCE = ("llm:", "upstream-gpt4", "offline")
MAX_REPORTED = 6


EXPERTS = "experts"  # the scorer of the resolved labels; each rater's own answers are scorer rater:<name>


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
    conversations: dict[str, tuple[list[str], list[str]]] = field(
        default_factory=dict
    )  # unit -> (roles, contents) upstream's sheet shows

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
