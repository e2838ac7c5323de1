"""The CRAFT-MD protocol: prompts, the doctor-patient conversation, and the questions.

Everything the models are told comes from a versioned prompt set (``prompts/<name>/``);
this module only fills the templates and runs the turn-taking. A prompt set whose folder
holds ``upstream.json`` speaks upstream CRAFT-MD's own prompts, rendered from its pinned
code (:mod:`craftmd.upstream_prompts`) in the roles and order of upstream's GPT path (or,
``message_roles="opensource"``, of its open-source path), an image job in those of its
multimodal path; the cells upstream has no prompt for use the package's wording of the
set ``upstream.json`` names.

- The doctor (the model under test) has the system prompt with the case's specialty and
  opens with the prompt set's opening line. The doctor's view is OpenAI messages where
  the patient speaks as ``user``.
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
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Awaitable, Callable

from craftmd import CraftMDError

from craftmd.models.base import Completion, Message, Sampling
from craftmd.samples import Sample
from craftmd.upstream_prompts import (
    IMAGE_SPECIALTY,
    UpstreamCase,
    UpstreamCode,
    upstream_cases,
    upstream_code,
    upstream_image_cases,
    upstream_prompts_sha256,
)

PROMPTS_DIR = Path(__file__).parent / "prompts"
DEFAULT_PROMPT_SET = "craftmd-v1"
FINAL_MARK = "Final Diagnosis"
IMAGE_MARK = "<image>"  # how an image part is written in a release's text messages

#: The (setting, format) cells upstream's code has a prompt for, and the function that words each question.
UPSTREAM_CELLS = {
    ("vignette", "mcq4"): "get_vignette_mcq_prompt",
    ("vignette", "frq"): "get_vignette_frq_prompt",
    ("multiturn", "mcq4"): "get_mcq_after_conversation_prompt",
    ("multiturn", "frq"): "get_frq_after_conversation_prompt",
    ("singleturn", "mcq4"): "get_mcq_after_conversation_prompt",
    ("singleturn", "frq"): "get_frq_after_conversation_prompt",
    ("summarized", "mcq4"): "get_vignette_mcq_prompt",
    ("summarized", "frq"): "get_vignette_frq_prompt",
}
#: The cells of an image job (an NEJM case shown with its image) upstream's multimodal path (``craftmd_multimodal``)
#: has a prompt for, and the function that words each question: the vignette questions are its own (the image beside
#: them), the questions after a conversation and on the summary the text path's. The task poses no MCQ on image cases
#: (the pinned data holds no choices for them).
UPSTREAM_IMAGE_CELLS = {
    ("vignette", "frq"): "get_vignette_frq_prompt_multimodal",
    ("multiturn", "frq"): "get_frq_after_conversation_prompt",
    ("singleturn", "frq"): "get_frq_after_conversation_prompt",
    ("summarized", "frq"): "get_vignette_frq_prompt",
}
#: Every upstream function an upstream prompt set renders.
UPSTREAM_FUNCTIONS = sorted(
    {
        *UPSTREAM_CELLS.values(),
        *UPSTREAM_IMAGE_CELLS.values(),
        "get_doctor_prompt",
        "get_doctor_prompt_multimodal",
        "get_patient_prompt",
        "convert_to_summarized_prompt",
    }
)
#: Upstream's two message layouts (src/craftmd.py): craftmd_gpt's system prompts, craftmd_opensource's user turns.
MESSAGE_ROLES = ("gpt", "opensource")

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
        self.upstream: UpstreamCode | None = None  # upstream's parsed code, for a set that speaks upstream's prompts
        self.own: PromptSet | None = None  # the package's wording for what upstream has no prompt for
        if "upstream.json" in self.files:
            self._read_upstream(root)

    def _read_upstream(self, root: Path) -> None:
        spec = json.loads(self.files["upstream.json"])
        try:
            self.upstream = upstream_code()
        except CraftMDError as exc:
            raise CraftMDError(
                f"{exc} (prompt set {self.name} reads upstream's code; --prompt-set craftmd-v1 needs none)"
            ) from None
        if spec.get("commit") != self.upstream.commit:
            raise CraftMDError(
                f"prompt set {self.name!r} reads commit {spec.get('commit')}, not the pinned {self.upstream.commit}"
            )
        self.functions = tuple(UPSTREAM_FUNCTIONS)
        for f in self.functions:
            self.upstream.template(f)  # an unknown function: one line now, before any call
        self.own = PromptSet(spec["own"], root)
        self.specialties = self.own.specialties

    @cached_property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for name, text in sorted(self.files.items()):
            h.update(name.encode() + b"\0" + text.encode() + b"\0")
        if self.upstream is not None:  # and what it renders from: upstream's templates and facts, the own set
            h.update(upstream_prompts_sha256(self.functions).encode() + b"\0")
            h.update(f"{self.upstream.opening}\0{self.upstream.opensource_message_cap}\0{self.own.sha256}".encode())
            h.update(json.dumps(self.upstream.image_message).encode())
        return h.hexdigest()

    def describe(self) -> dict:
        out = {"name": self.name, "sha256": self.sha256}
        if self.upstream is not None:
            out["upstream"] = {
                "commit": self.upstream.commit,
                "functions": list(self.functions),
                "functions_sha256": upstream_prompts_sha256(self.functions),
                "cells": [f"{s}:{f}" for s, f in UPSTREAM_CELLS] + [f"{s}:{f}:image" for s, f in UPSTREAM_IMAGE_CELLS],
                "conversation": "upstream's doctor, patient, opening and summarizer; an image job's doctor prompt and "
                "vignette questions its multimodal path's, the image a part of their system message",
            }
            out["own"] = {
                **self.own.describe(),
                "cells": "every other setting:format, of text and image jobs",
            }
        return out

    def text(self, name: str, **fields) -> str:
        try:
            template = self.files[name]
        except KeyError:
            if self.own is not None:
                return self.own.text(name, **fields)
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
        """The doctor's view without its last turn when the conversation ended on one (the final diagnosis; the
        question at upstream's open-source cap)."""
        turns = self.turns
        if self.ended in ("final_diagnosis", "no_question", "max_turns") and turns and turns[-1]["role"] == "assistant":
            turns = turns[:-1]
        return self.prefix + turns

    def first_turn(self) -> list[Message]:
        """The doctor's opening and the patient's first answer."""
        return self.prefix + self.turns[:2]

    def record(self) -> list[dict]:
        """The doctor's view as text messages, for conversations.parquet."""
        return [{"role": m["role"], "content": text_of(m["content"])} for m in self.messages]


class Protocol:
    """Builds every message list of the protocol from a prompt set.

    With an upstream prompt set, a text case's conversation, summary and the questions of :data:`UPSTREAM_CELLS` are
    upstream's messages, byte for byte, from what upstream's code passes its prompts (:func:`upstream_cases`): the
    doctor's prompt as a ``system`` message (``message_roles="opensource"``: a ``user`` turn), the question after a
    conversation as a ``system`` message after it (open-source: appended to its last message after a blank line), the
    vignette questions as one ``system`` message (open-source: ``user``), the summarized ones as one ``user`` message.
    An image job (an NEJM case shown with its image) follows upstream's multimodal path (``craftmd_multimodal``, for
    the cells of :data:`UPSTREAM_IMAGE_CELLS`; :func:`upstream_image_cases` gives its inputs): the doctor's prompt and
    the vignette question are its own functions', each the text part of one message whose content parts are laid out
    as the pinned code lays them out (a text part, then the image as a data URL; a ``system`` message, open-source:
    ``user``); its patient, opening, summarizer and the questions after a conversation are the text path's, the
    summarized question given the specialty "Other" (the pinned code names none there). Every other cell is the
    package's wording; in the open-source layout its system text becomes a user turn, joined to a user turn beside it
    after a blank line (no two user turns in a row).
    """

    def __init__(self, prompts: PromptSet, max_turns: int = 60, message_roles: str = "gpt"):
        if message_roles not in MESSAGE_ROLES:
            raise CraftMDError(f"unknown message_roles {message_roles!r}; known: {', '.join(MESSAGE_ROLES)}")
        if message_roles != "gpt" and prompts.upstream is None:
            raise CraftMDError(
                f"message_roles={message_roles} is upstream's layout: it needs an upstream prompt set, not {prompts.name!r}"
            )
        self.p = prompts
        self.max_turns = max_turns
        self.roles = message_roles
        self.up = prompts.upstream
        self.cases: dict[str, UpstreamCase] = {}
        if self.up is not None:
            self.cases = upstream_cases()

    # --- upstream's inputs ------------------------------------------------------------------
    @cached_property
    def image_cases(self) -> dict[str, UpstreamCase]:
        """What upstream's multimodal path passed its prompts for the NEJM cases (read once, when first needed)."""
        return upstream_image_cases() if self.up is not None else {}

    def upstream(self, case: Sample, with_image: bool) -> UpstreamCase | None:
        """What upstream's code passes its prompts for ``case`` (an NEJM case: what its multimodal path passed, for the
        image job and the job without the image alike); None where the package's wording applies (a package prompt
        set). A case upstream's data does not hold gets the sample's own fields."""
        if self.up is None:
            return None
        if case.source == "nejm_image":
            found = self.image_cases.get(case.case_id)
        else:
            found = self.cases.get(case.case_id) if case.source in ("medqa_usmle", "derm_public", "derm_private") else None
        if found is not None:
            return found
        named = self.p.specialties.get(case.specialty, case.specialty) if case.specialty else None
        specialty = IMAGE_SPECIALTY if with_image else named or "Other"  # "Other": upstream's functions name none
        return UpstreamCase(
            specialty, case.vignette, case.question or self.up.split["no_question"], ", ".join(case.choices), case.choices
        )

    def render(self, function: str, *args) -> str:
        return self.up.template(function).render(*args)

    def upstream_image_message(self, case: Sample, text: str) -> Message:
        """One message of upstream's multimodal path: ``text`` and the case's image as content parts, in the role and
        order the pinned code gives them (open-source layout: a ``user`` turn)."""
        role, kinds = self.up.image_message
        if case.image is None:
            raise CraftMDError(f"{case.case_id}: no image")
        parts = {
            "text": {"type": "text", "text": text},
            "image_url": {"type": "image_url", "image_url": {"url": image_url(case.image)}},
        }
        return {"role": role if self.roles == "gpt" else "user", "content": [parts[k] for k in kinds]}

    def knowledge(self, case: Sample, with_image: bool) -> str:
        """What the patient-AI of the standard conversation holds: the vignette (upstream's ``case_desc``)."""
        u = self.upstream(case, with_image)
        return u.vignette if u else case.vignette

    def layout(self, msgs: list[Message]) -> list[Message]:
        """The package's messages in the open-source layout: no system role, no two user turns in a row."""
        if self.roles == "gpt":
            return msgs
        out: list[Message] = []
        for m in msgs:
            m = {**m, "role": "user" if m["role"] == "system" else m["role"]}
            if (
                out
                and out[-1]["role"] == m["role"] == "user"
                and isinstance(out[-1]["content"], str)
                and isinstance(m["content"], str)
            ):
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{m['content']}"}
            else:
                out.append(m)
        return out

    # --- the conversation ---------------------------------------------------------------
    def doctor_prefix(self, case: Sample, with_image: bool) -> list[Message]:
        u = self.upstream(case, with_image)
        if u is not None and with_image:  # upstream's multimodal doctor: its prompt names no specialty
            return [self.upstream_image_message(case, self.render("get_doctor_prompt_multimodal"))]
        if u is not None:
            return [
                {"role": "system" if self.roles == "gpt" else "user", "content": self.render("get_doctor_prompt", u.specialty)}
            ]
        system = self.p.text(
            "doctor_system.txt",
            specialty=self.p.specialty_clause(case.specialty),
            image=self.p.text("doctor_image.txt") if with_image else "",
        )
        prefix: list[Message] = [{"role": "system", "content": system}]
        if with_image:
            prefix.append({"role": "user", "content": self.image_parts(case)})
        return self.layout(prefix)

    def image_parts(self, case: Sample, text: str | None = None) -> list[dict]:
        if case.image is None:
            raise CraftMDError(f"{case.case_id}: no image")
        return [
            {"type": "text", "text": text if text is not None else self.p.text("image_caption.txt")},
            {"type": "image_url", "image_url": {"url": image_url(case.image)}},
        ]

    def patient_messages(self, knowledge: str, conv: Conversation, upstream: bool = False) -> list[Message]:
        flipped = [{"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]} for m in conv.turns]
        if upstream:
            system = self.render("get_patient_prompt", knowledge)
        else:
            system = self.p.text("patient_system.txt", vignette=knowledge)
        return [{"role": "system", "content": system}] + flipped

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

        The doctor opens with the prompt set's opening line, or, given ``opening``, the patient opens with it. In the
        open-source layout the conversation also ends once the doctor's view holds upstream's cap of messages."""
        upstream = self.upstream(case, with_image) is not None
        conv = Conversation(self.doctor_prefix(case, with_image))
        if opening is None:
            line = self.up.opening if upstream else self.p.text("doctor_opening.txt")
            conv.turns.append({"role": "assistant", "content": line})
        else:
            conv.turns.append({"role": "user", "content": opening})
        cap = self.up.opensource_message_cap if upstream and self.roles == "opensource" else None
        while True:
            if conv.turns[-1]["role"] == "assistant":
                c = await patient(self.patient_messages(knowledge, conv, upstream), sampling_patient)
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
            if cap is not None and len(conv.messages) >= cap:  # upstream's open-source cap: its last question is dropped
                conv.ended = "max_turns"
                return conv

    # --- summaries ------------------------------------------------------------------
    def summarizer_messages(self, conv: Conversation, upstream: bool = False) -> list[Message]:
        if upstream:  # one system message; each patient turn followed by a space (upstream's get_patient_responses)
            said = "".join(f"{t} " for t in conv.patient_turns())
            return [{"role": "system", "content": self.render("convert_to_summarized_prompt", said)}]
        statements = "\n".join(" ".join(t.split()) for t in conv.patient_turns())
        return self.layout(
            [
                {"role": "system", "content": self.p.text("summarizer_system.txt")},
                {"role": "user", "content": self.p.text("summarizer_user.txt", statements=statements)},
            ]
        )

    @staticmethod
    def summary_text(text: str, upstream: bool = False) -> str:
        """The summary as the summarized questions read it (upstream's: the reply as it came)."""
        return text if upstream else text.strip()

    # --- questions ------------------------------------------------------------------
    def question_block(self, case: Sample, fmt: str, many_options: list[str]) -> str:
        question = case.question.strip() or "What is the most likely diagnosis?"
        options = list(case.choices) if fmt == "mcq4" else many_options if fmt == "mcq_many" else []
        return self.p.text(f"format_{fmt}.txt", question=question, options="\n".join(f"- {o}" for o in options))

    def upstream_question(
        self, u: UpstreamCase, setting: str, fmt: str, conv, summary, case: Sample, with_image: bool = False
    ) -> list[Message]:
        """Upstream's messages for one of :data:`UPSTREAM_CELLS` (``craftmd_gpt`` / ``craftmd_opensource``), or, for an
        image job, of :data:`UPSTREAM_IMAGE_CELLS` (``craftmd_multimodal``)."""
        function = (UPSTREAM_IMAGE_CELLS if with_image else UPSTREAM_CELLS)[(setting, fmt)]
        gpt = self.roles == "gpt"
        if setting in ("vignette", "summarized"):
            text = u.vignette if setting == "vignette" else summary
            args = (u.specialty, text, u.question, u.choices) if fmt == "mcq4" else (u.specialty, text, u.question)
            if with_image and setting == "vignette":  # the multimodal vignette question: no specialty, the image beside
                return [self.upstream_image_message(case, self.render(function, *args[1:]))]
            role = "system" if setting == "vignette" and gpt else "user"
            return [{"role": role, "content": self.render(function, *args)}]
        prompt = self.render(function, *((u.choices, u.question) if fmt == "mcq4" else (u.question,)))
        msgs = conv.for_question() if setting == "multiturn" else conv.first_turn()
        if gpt:
            return msgs + [{"role": "system", "content": prompt}]
        return msgs[:-1] + [{**msgs[-1], "content": f"{msgs[-1]['content']}\n\n{prompt}"}]

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
        order: Sequence[int] | None = None,
    ) -> list[Message]:
        """The doctor's messages for one question. ``order``: the options of an MCQ (the case's four choices for mcq4,
        ``many_options`` for mcq_many) shown in that order (``order[k]``: the option shown k-th); None: as given."""
        u = self.upstream(case, with_image)
        if order is not None and fmt == "mcq4":
            case = replace(case, choices=tuple(case.choices[i] for i in order))
            if u is not None and u.options:
                options = tuple(u.options[i] for i in order)
                u = replace(u, choices=", ".join(options), options=options)
        elif order is not None and fmt == "mcq_many":
            many_options = [many_options[i] for i in order]
        if u is not None and (setting, fmt) in (UPSTREAM_IMAGE_CELLS if with_image else UPSTREAM_CELLS):
            return self.upstream_question(u, setting, fmt, conv, summary, case, with_image)
        block = self.question_block(case, fmt, list(many_options))
        text = self.p.text(
            f"setting_{setting}.txt",
            question_block=block,
            vignette=case.vignette,
            physical_exam=case.physical_exam,
            summary=summary or "",
        )
        if setting in ("multiturn", "multiturn_no_exam", "multiturn_plus_exam"):
            return self.layout(conv.for_question() + [{"role": "user", "content": text}])
        if setting == "singleturn":
            return self.layout(conv.first_turn() + [{"role": "user", "content": text}])
        system = self.p.text(
            "answer_system.txt",
            specialty=self.p.specialty_clause(case.specialty),
            image=self.p.text("doctor_image.txt") if with_image else "",
        )
        content = self.image_parts(case, text) if with_image else text
        return self.layout([{"role": "system", "content": system}, {"role": "user", "content": content}])
