"""The MedQA filter: which MedQA-USMLE items are diagnosis vignettes, as code.

CRAFT-MD keeps the MedQA items whose question is about a patient's diagnosis:
naming it, or establishing it (next diagnostic step, confirming test), or what
comes with it (its cause, organism, associated findings, risk factors). It leaves
out questions about treatment and management, pharmacology, mechanisms,
statistics and ethics/communication, and items that are not patient vignettes.

:func:`select` is the rule. ``craftmd build --medqa FILE.jsonl`` runs it over a
file in MedQA's own JSONL format (one object per line with ``question``,
``options`` ``{"A": ..., ...}``, ``answer``, ``answer_idx``, ``meta_info``) and
builds the ``medqa_usmle`` config from its picks; the build report gives its
recall on the upstream picks that the source carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from craftmd import CraftMDError
from craftmd.jsonl import json_lines
from craftmd.dataset_builder import transform as T
from craftmd.dataset_builder.mediq import strip_number
from craftmd.dataset_builder.schema import text_sample
from craftmd.samples import Sample

#: Task types (see :func:`transform.task_type`) the rule keeps.
KEEP_TASKS = ("diagnosis", "next_step", "confirm_test", "cause", "organism", "associated_finding", "risk_factor")
# A patient vignette names its patient.
_PATIENT = re.compile(
    r"\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten)[- ](year|month|week|day|hour)s?[- ]old\b|"
    r"\b(newborn|neonate|infant|toddler|boy|girl|man|woman|patient|child|partner|he|she)\b",
    re.IGNORECASE,
)
# The question has to be about the patient's condition: its diagnosis, its cause or its organism.
_ABOUT_DX = re.compile(r"\bdiagnos\w*|\b(cause[ds]?|etiology|organisms?|pathogens?|infectious agents?)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reason: str  # "diagnosis vignette (<task type>)" or why it is left out
    task_type: str


def select(text: str) -> Verdict:
    """The rule, on one MedQA item's ``question`` text (vignette + question sentence)."""
    vignette, raw_q = T.split_question(text, colon_stems=True)
    if raw_q is None:
        return Verdict(False, "no question sentence", "other")
    question = T.clean_question(raw_q)
    kind = T.task_type(question)
    if not _PATIENT.search(vignette):
        return Verdict(False, "not a patient vignette", kind)
    if not _ABOUT_DX.search(question):
        return Verdict(False, f"question not about a diagnosis ({kind})", kind)
    if kind not in KEEP_TASKS:
        return Verdict(False, f"{kind} question", kind)
    return Verdict(True, f"diagnosis vignette ({kind})", kind)


@dataclass(frozen=True)
class MedQAItem:
    line: int
    question: str
    options: dict[str, str]
    answer: str
    answer_idx: str
    facts: tuple[str, ...] | None = None  # the line's own atomic facts, when it has a 'facts' list (MediQ's shape)


def read_jsonl(path: Path | str) -> list[MedQAItem]:
    """Items of a MedQA JSONL file, checked field by field (errors name file and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CraftMDError(f"{path}: cannot read MedQA file ({exc})") from None
    items = []
    for n, d in json_lines(text, str(path)):
        if not isinstance(d, dict):
            raise CraftMDError(f"{path}:{n}: expected a JSON object")
        q, opts, idx = d.get("question"), d.get("options"), d.get("answer_idx")
        if not isinstance(q, str) or not q.strip():
            raise CraftMDError(f"{path}:{n}: missing 'question'")
        if not isinstance(opts, dict) or len(opts) < 2 or not all(isinstance(v, str) for v in opts.values()):
            raise CraftMDError(f"{path}:{n}: 'options' must map letters to texts")
        if idx not in opts:
            raise CraftMDError(f"{path}:{n}: 'answer_idx' {idx!r} is not one of the options {sorted(opts)}")
        answer = d.get("answer", opts[idx])
        if T.normalize_ws(str(answer)) != T.normalize_ws(opts[idx]):
            raise CraftMDError(f"{path}:{n}: 'answer' does not match options[{idx!r}]")
        facts = d.get("facts")
        if facts is not None and (not isinstance(facts, list) or not all(isinstance(f, str) and f.strip() for f in facts)):
            raise CraftMDError(f"{path}:{n}: 'facts' must be a list of texts")
        if facts is not None and not facts:
            raise CraftMDError(f"{path}:{n}: 'facts' is an empty list (leave the field out to use the vignette's sentences)")
        items.append(
            MedQAItem(
                n,
                q,
                {k: opts[k] for k in sorted(opts)},
                opts[idx],
                idx,
                tuple(strip_number(f) for f in facts) if facts is not None else None,
            )
        )
    if not items:
        raise CraftMDError(f"{path}: no MedQA items")
    return items


def case_from_item(item: MedQAItem) -> Sample:
    """A picked MedQA item as a text case (``case_id`` = ``medqa_<line>``, no specialty)."""
    vignette, raw_q = T.split_question(item.question, colon_stems=True)
    letters = sorted(item.options)
    choices = tuple(T.clean_option(item.options[k]) for k in letters)
    idx = letters.index(item.answer_idx)
    # no upstream results for these items: the paper's key is the answer itself
    return text_sample(
        f"medqa_{item.line}", "medqa_usmle", None, vignette, T.clean_question(raw_q), choices, idx, choices[idx], None
    )


def pick(items: list[MedQAItem]) -> tuple[list[Sample], dict[str, int]]:
    """The cases the rule keeps, and how many items each verdict reason covered."""
    cases, reasons = [], {}
    for item in items:
        v = select(item.question)
        reasons[v.reason] = reasons.get(v.reason, 0) + 1
        if v.keep:
            cases.append(case_from_item(item))
    return cases, dict(sorted(reasons.items()))


@dataclass(frozen=True)
class Recall:
    picks: int
    kept: int
    dropped: list[tuple[str, str, str]]  # (case_id, reason, question)
    reasons: dict[str, int]  # verdict reason -> picks

    @property
    def recall(self) -> float:
        return self.kept / self.picks if self.picks else 0.0


def recall_on(texts: dict[str, str]) -> Recall:
    """The rule's recall on upstream's picks (case_id -> CSV text), each drop listed."""
    dropped, reasons = [], {}
    for cid, text in texts.items():
        v = select(text)
        reasons[v.reason] = reasons.get(v.reason, 0) + 1
        if not v.keep:
            _, raw_q = T.split_question(text, colon_stems=True)
            dropped.append((cid, v.reason, T.clean_question(raw_q)))
    reasons = dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return Recall(len(texts), len(texts) - len(dropped), dropped, reasons)
