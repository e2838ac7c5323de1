"""The CRAFT-MD protocol: prompts, the doctor-patient conversation, and the questions.

Everything the models are told comes from a versioned prompt set (``prompts/<name>/``);
this module only fills the templates and runs the turn-taking:

- The doctor (the model under test) has the system prompt with the case's specialty and
  opens with "Hi! What symptoms are you facing today?". The doctor's view is OpenAI
  messages where the patient speaks as ``user``.
- The patient-AI sees the same dialogue with the roles flipped (the doctor speaks as
  ``user``) under its own system prompt holding the vignette (or the history only).
- The conversation ends when a doctor turn contains "Final Diagnosis" or asks no
  question (no "?"), or when the doctor has had ``max_turns`` turns (``max_turns``),
  or when a call ends in a refusal or an error.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Awaitable, Callable

from craftmd import CraftMDError

from craftmd.models.base import Completion, Message, Sampling
from craftmd.samples import Sample

PROMPTS_DIR = Path(__file__).parent / "prompts"
DEFAULT_PROMPT_SET = "craftmd-v1"
FINAL_MARK = "Final Diagnosis"
IMAGE_MARK = "<image>"  # how an image part is written in a release's text messages

Call = Callable[[list[Message], Sampling], Awaitable[Completion]]


class PromptSet:
    """A folder of prompt files, identified by its name and a sha256 over every file."""

    def __init__(self, name: str = DEFAULT_PROMPT_SET, root: Path = PROMPTS_DIR):
        self.name = name
        self.dir = root / name
        if not self.dir.is_dir():
            known = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
            raise CraftMDError(f"unknown prompt set {name!r}; known: {', '.join(known)}")
        self.files = {p.name: p.read_text(encoding="utf-8") for p in sorted(self.dir.iterdir()) if p.is_file()}
        specialties = json.loads(self.files.get("specialties.json", "{}"))  # a set without it names no specialty
        self.specialties = {k: v for k, v in specialties.items() if not k.startswith("_")}

    @cached_property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for name, text in sorted(self.files.items()):
            h.update(name.encode() + b"\0" + text.encode() + b"\0")
        return h.hexdigest()

    def describe(self) -> dict:
        return {"name": self.name, "sha256": self.sha256}

    def text(self, name: str, **fields) -> str:
        try:
            template = self.files[name]
        except KeyError:
            raise CraftMDError(f"prompt set {self.name!r} has no {name}") from None
        return template.format(**fields) if fields else template

    def specialty_clause(self, specialty: str | None) -> str:
        named = self.specialties.get(specialty, specialty) if specialty else None
        return f" specializing in {named}" if named else ""


def image_url(data: bytes) -> str:
    """A data URL for image bytes (the format read from the bytes themselves)."""
    from PIL import Image

    try:
        fmt = (Image.open(io.BytesIO(data)).format or "jpeg").lower()
    except Exception:
        raise CraftMDError("an image in the dataset cannot be read") from None
    return f"data:image/{fmt};base64,{base64.b64encode(data).decode()}"


def text_of(content) -> str:
    """Message content as text; image parts become ``<image>``."""
    if isinstance(content, str):
        return content
    parts = []
    for p in content:
        parts.append(p.get("text", "") if p.get("type") == "text" else IMAGE_MARK)
    return "\n".join(parts)


@dataclass
class Conversation:
    prefix: list[Message]  # system prompt (and the image message), before the dialogue
    turns: list[Message] = field(default_factory=list)  # the dialogue: assistant = doctor, user = patient
    ended: str | None = None
    error: str | None = None

    @property
    def messages(self) -> list[Message]:
        return self.prefix + self.turns

    @property
    def n_turns(self) -> int:
        return sum(m["role"] == "assistant" for m in self.turns)

    def patient_turns(self) -> list[str]:
        return [m["content"] for m in self.turns if m["role"] == "user"]

    def for_question(self) -> list[Message]:
        """The doctor's view without the final-diagnosis turn."""
        turns = self.turns
        if self.ended in ("final_diagnosis", "no_question") and turns and turns[-1]["role"] == "assistant":
            turns = turns[:-1]
        return self.prefix + turns

    def first_turn(self) -> list[Message]:
        """The doctor's opening and the patient's first answer."""
        return self.prefix + self.turns[:2]

    def record(self) -> list[dict]:
        """The doctor's view as text messages, for conversations.parquet."""
        return [{"role": m["role"], "content": text_of(m["content"])} for m in self.messages]


class Protocol:
    """Builds every message list of the protocol from a prompt set."""

    def __init__(self, prompts: PromptSet, max_turns: int = 60):
        self.p = prompts
        self.max_turns = max_turns

    # --- the conversation ---------------------------------------------------------------
    def doctor_prefix(self, case: Sample, with_image: bool) -> list[Message]:
        system = self.p.text(
            "doctor_system.txt",
            specialty=self.p.specialty_clause(case.specialty),
            image=self.p.text("doctor_image.txt") if with_image else "",
        )
        prefix: list[Message] = [{"role": "system", "content": system}]
        if with_image:
            prefix.append({"role": "user", "content": self.image_parts(case)})
        return prefix

    def image_parts(self, case: Sample, text: str | None = None) -> list[dict]:
        if case.image is None:
            raise CraftMDError(f"{case.case_id}: no image")
        return [
            {"type": "text", "text": text if text is not None else self.p.text("image_caption.txt")},
            {"type": "image_url", "image_url": {"url": image_url(case.image)}},
        ]

    def patient_messages(self, knowledge: str, conv: Conversation) -> list[Message]:
        flipped = [{"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]} for m in conv.turns]
        return [{"role": "system", "content": self.p.text("patient_system.txt", vignette=knowledge)}] + flipped

    async def converse(
        self,
        case: Sample,
        knowledge: str,
        with_image: bool,
        doctor: Call,
        patient: Call,
        sampling_doctor: Sampling,
        sampling_patient: Sampling,
        opening: str | None = None,
    ) -> Conversation:
        """Run one conversation; ``knowledge`` is what the patient knows (vignette or history).

        The doctor opens with the prompt set's opening line, or, given ``opening``, the patient opens with it."""
        conv = Conversation(self.doctor_prefix(case, with_image))
        if opening is None:
            conv.turns.append({"role": "assistant", "content": self.p.text("doctor_opening.txt")})
        else:
            conv.turns.append({"role": "user", "content": opening})
        while True:
            if conv.turns[-1]["role"] == "assistant":
                c = await patient(self.patient_messages(knowledge, conv), sampling_patient)
                if c.status != "ok":
                    conv.ended, conv.error = c.status, c.error
                    return conv
                conv.turns.append({"role": "user", "content": c.text})
            if conv.n_turns >= self.max_turns:
                conv.ended = "max_turns"
                return conv
            c = await doctor(conv.messages, sampling_doctor)
            if c.status != "ok":
                conv.ended, conv.error = c.status, c.error
                return conv
            conv.turns.append({"role": "assistant", "content": c.text})
            if FINAL_MARK in c.text:
                conv.ended = "final_diagnosis"
                return conv
            if "?" not in c.text:
                conv.ended = "no_question"
                return conv

    # --- summaries ------------------------------------------------------------------
    def summarizer_messages(self, conv: Conversation) -> list[Message]:
        statements = "\n".join(" ".join(t.split()) for t in conv.patient_turns())
        return [
            {"role": "system", "content": self.p.text("summarizer_system.txt")},
            {"role": "user", "content": self.p.text("summarizer_user.txt", statements=statements)},
        ]

    # --- questions ------------------------------------------------------------------
    def question_block(self, case: Sample, fmt: str, many_options: list[str]) -> str:
        question = case.question.strip() or "What is the most likely diagnosis?"
        options = list(case.choices) if fmt == "mcq4" else many_options if fmt == "mcq_many" else []
        return self.p.text(f"format_{fmt}.txt", question=question, options="\n".join(f"- {o}" for o in options))

    def question_messages(
        self,
        case: Sample,
        setting: str,
        fmt: str,
        with_image: bool,
        *,
        conv: Conversation | None = None,
        summary: str | None = None,
        many_options: list[str] = (),
    ) -> list[Message]:
        block = self.question_block(case, fmt, list(many_options))
        text = self.p.text(
            f"setting_{setting}.txt",
            question_block=block,
            vignette=case.vignette,
            physical_exam=case.physical_exam,
            summary=summary or "",
        )
        if setting in ("multiturn", "multiturn_no_exam", "multiturn_plus_exam"):
            return conv.for_question() + [{"role": "user", "content": text}]
        if setting == "singleturn":
            return conv.first_turn() + [{"role": "user", "content": text}]
        system = self.p.text(
            "answer_system.txt",
            specialty=self.p.specialty_clause(case.specialty),
            image=self.p.text("doctor_image.txt") if with_image else "",
        )
        content = self.image_parts(case, text) if with_image else text
        return [{"role": "system", "content": system}, {"role": "user", "content": content}]
