"""What the protocols that pose questions after a conversation share (CRAFT-MD's, the consultation's).

Which experiments a run selects (``--experiments``), the cells of a task's matrix a case is posed in, the
``conversations`` row of a conversation and the failure it passes on to the answers that read it, and the
expected cost of one conversation (for ``--estimate``). The conversation itself is
:class:`craftmd.generation.protocol.Protocol`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from craftmd import CraftMDError
from craftmd.dataset import load_config
from craftmd.samples import Sample
from craftmd.tasks.base import Task

from .protocol import Conversation
from .runner import Estimate, tally, tokens

#: For estimates: a typical conversation's doctor turns (upstream GPT-4's median is about this) and reply tokens.
EXPECTED_TURNS = 10
EXPECTED_REPLY = 60


class ConversationOptions(BaseModel):
    """The options of the protocols built on CRAFT-MD's conversation (``-T key=value``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_turns: int = Field(60, ge=1, description="most doctor turns in a conversation (upstream's longest had 59)")


def parse_experiments(names: list[str] | None, task: Task) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``multiturn,frq`` → (settings, formats); a name may be a setting, a format or setting:format."""
    if not names:
        return task.settings, task.formats
    settings, formats = [], []
    for raw in names:
        for part in raw.split(":"):
            part = part.strip()
            if part in task.settings:
                settings.append(part)
            elif part in task.formats:
                formats.append(part)
            else:
                raise CraftMDError(
                    f"unknown experiment {part!r}; settings: {', '.join(task.settings)}; formats: {', '.join(task.formats)}"
                )
    keep = lambda xs, order: tuple(x for x in order if x in xs)  # noqa: E731
    return keep(settings, task.settings) or task.settings, keep(formats, task.formats) or task.formats


def load_diagnoses(dataset: Path) -> list[str]:
    """The dataset's list of diagnoses (the ``mcq_many`` options); empty when the dataset has none."""
    try:
        df = load_config(dataset, "diagnoses")
    except CraftMDError:
        return []
    return [d for d in df["diagnosis"].to_list() if d]


def plan_cells(task: Task, settings, formats, case: Sample, with_image: bool, many: list[str]) -> list[tuple[str, str]]:
    """The (setting, format) cells of ``task``'s matrix, among those selected, whose needs ``case`` meets."""
    image_case = case.source == "nejm_image"
    out = []
    for s in settings:
        for f in formats:
            e = task.experiment(s, f)
            if e is None or (image_case and not e.image):
                continue
            if e.exam and not (case.has_exam and case.history):
                continue
            if e.options == "choices4" and len(case.choices) != 4:
                continue
            if e.options == "diagnoses" and not many:
                continue
            out.append((s, f))
    return out


def failure(conv: Conversation, what: str) -> tuple[str, str] | None:
    """(status, reason) of a conversation that failed, for the answers it blocks; None when it did not."""
    if conv.ended not in ("refusal", "error"):
        return None
    return conv.ended, f"the {what} failed: {conv.error or conv.ended}"


def conversation_row(case_id: str, trial: int, kind: str, with_image: bool, conv: Conversation, summary: str | None) -> dict:
    """A ``conversations`` row of the release."""
    return {
        "case_id": case_id,
        "trial": trial,
        "conversation": kind,
        "with_image": with_image,
        "messages": conv.record(),
        "summary": summary,
        "n_turns": conv.n_turns,
        "ended": conv.ended,
        "error": conv.error if conv.ended in ("refusal", "error") else None,
    }


def conversation_estimate(est: dict[str, Estimate], max_turns: int, max_tokens: int, knowledge: str) -> int:
    """Add a conversation of the expected length (the doctor's and the patient's calls) to ``est``; returns the tokens
    of its transcript."""
    turns, reply = min(EXPECTED_TURNS, max_turns), min(EXPECTED_REPLY, max_tokens)
    base = 150 + tokens(knowledge)
    grown = reply * turns * (turns - 1)  # each turn re-sends the turns before it
    est["doctor"].add(turns, 150 * turns + grown, reply * turns, max_turns)
    est["patient"].add(turns, base * turns + grown, reply * turns, max_turns)
    return 2 * turns * reply


def produced(rows: dict[str, list[dict]]) -> list[str]:
    """The summary's line on what a run made: conversations (failed) and answers by status."""
    convs, answers = rows.get("conversations", []), rows.get("answers", [])
    failed = sum(c["ended"] in ("refusal", "error") for c in convs)
    status = ", ".join(f"{k} {v}" for k, v in tally(answers, "status").items())
    return [f"{len(convs)} conversations ({failed} failed), {len(answers)} answers ({status})"]


def no_jobs_message(settings, formats) -> str:
    return f"none of the experiments {', '.join(settings)} × {', '.join(formats)} applies to the selected cases"


__all__ = [
    "ConversationOptions",
    "produced",
    "no_jobs_message",
    "parse_experiments",
    "load_diagnoses",
    "plan_cells",
    "failure",
    "conversation_row",
    "conversation_estimate",
    "EXPECTED_TURNS",
    "EXPECTED_REPLY",
]
