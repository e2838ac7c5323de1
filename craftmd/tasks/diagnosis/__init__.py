"""CRAFT-MD's diagnosis task (Johri et al., Nature Medicine 2025).

A doctor-LLM meets a case in one of seven settings and names the diagnosis in one of four
formats. The table below is the whole experiment matrix: for each setting × format, which
conversation the question reads, whether the case must have its history and exam findings
apart, whether NEJM image cases take part, and which options an MCQ offers. A sample that
lacks what a cell needs is not posed in it (and the release holds no row for it).

Settings: ``vignette`` (the whole vignette), ``multiturn`` (the doctor-patient conversation,
its final-diagnosis turn removed), ``singleturn`` (the patient's first turn), ``summarized``
(a third-person summary of the patient's turns), ``exam`` (exam findings only),
``multiturn_no_exam`` (a conversation where the patient knows the history only),
``multiturn_plus_exam`` (the conversation with the exam findings appended).
Formats: ``mcq4`` (the case's four choices), ``mcq_many`` (every diagnosis of the dataset),
``frq`` (free response), ``top3`` (a three-item differential).
"""

from __future__ import annotations

from pathlib import Path

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from craftmd.answer_order import ANSWER_ORDERS, AnswerOrder
from craftmd.dataset import case_texts
from craftmd.generation.questions import ConversationOptions
from craftmd.tasks.base import Role, Task, parse_matrix, register

from .analysis import ANALYSIS
from .environment import ENVIRONMENT
from .protocol import CraftMD

#: setting × format -> conversation read (standard / no_exam / -), needs history and exam apart,
#: open to NEJM image cases, MCQ options offered (the case's four choices / the dataset's diagnoses / -).
EXPERIMENTS = parse_matrix("""
setting              format    conversation  exam  image  options
vignette             mcq4      -             no    no     choices4
vignette             mcq_many  -             no    no     diagnoses
vignette             frq       -             no    yes    -
vignette             top3      -             no    yes    -
multiturn            mcq4      standard      no    no     choices4
multiturn            mcq_many  standard      no    no     diagnoses
multiturn            frq       standard      no    yes    -
multiturn            top3      standard      no    yes    -
singleturn           mcq4      standard      no    no     choices4
singleturn           mcq_many  standard      no    no     diagnoses
singleturn           frq       standard      no    yes    -
singleturn           top3      standard      no    yes    -
summarized           mcq4      standard      no    no     choices4
summarized           mcq_many  standard      no    no     diagnoses
summarized           frq       standard      no    yes    -
summarized           top3      standard      no    yes    -
exam                 mcq4      -             yes   no     choices4
exam                 mcq_many  -             yes   no     diagnoses
exam                 frq       -             yes   no     -
exam                 top3      -             yes   no     -
multiturn_no_exam    mcq4      no_exam       yes   no     choices4
multiturn_no_exam    mcq_many  no_exam       yes   no     diagnoses
multiturn_no_exam    frq       no_exam       yes   no     -
multiturn_no_exam    top3      no_exam       yes   no     -
multiturn_plus_exam  mcq4      standard      yes   no     choices4
multiturn_plus_exam  mcq_many  standard      yes   no     diagnoses
multiturn_plus_exam  frq       standard      yes   no     -
multiturn_plus_exam  top3      standard      yes   no     -
""")


class CraftMDOptions(ConversationOptions):
    """CRAFT-MD's options (``-T key=value``)."""

    message_roles: Literal["gpt", "opensource"] = Field(
        "gpt",
        description="upstream's message layout: gpt (its GPT path: prompts as system messages) or opensource (its "
        "open-source path, for chat templates without a system role: prompts as user turns, a 30-message cap)",
    )
    answer_order: AnswerOrder = Field(
        ANSWER_ORDERS[0],
        description="the order the MCQ options are shown in: upstream (the published runs' order) or shuffled (each "
        "case, trial and format its own permutation, from order_seed; the correct letter follows its choice); part of "
        "the protocol, so the two are never ranked as one",
        json_schema_extra={"protocol": True},
    )
    order_seed: int = Field(
        0, ge=0, description="the seed of answer_order=shuffled's permutations (recorded)", json_schema_extra={"protocol": True}
    )

    @field_validator("order_seed")
    @classmethod
    def _seed_needs_shuffled(cls, v: int, info: ValidationInfo) -> int:
        if v and info.data.get("answer_order") != "shuffled":
            raise ValueError("order_seed is the seed of answer_order=shuffled: give -T answer_order=shuffled too")
        return v


def cases(dataset_dir: Path) -> dict[str, str] | None:
    """Its test cases' texts (:attr:`craftmd.tasks.Task.cases`): every text case's vignette, then the NEJM image cases'
    (``nejm_image/<id>`` where a text case has the id)."""
    return case_texts(dataset_dir, ("all", "nejm_image"))


ROLES = (
    Role("doctor", "the model under test: interviews the patient, then answers the questions"),
    Role("patient", "the patient-AI: holds the case's vignette (or its history only) and answers the doctor"),
    Role("summarizer", "summarizes the patient's turns for the summarized setting", default="patient"),
)


TASK = register(
    Task(
        name="craftmd",
        description="CRAFT-MD: the doctor interviews a patient-AI holding a case vignette, then names the diagnosis",
        dataset="craftmd",
        experiments=EXPERIMENTS,
        conversations=("standard", "no_exam"),
        scorers=("paper", "strict", "offline", "history"),
        metrics=("correct",),
        protocol=CraftMD,
        roles=ROLES,
        options=CraftMDOptions,
        paired_settings=tuple(dict.fromkeys(e.setting for e in EXPERIMENTS)),
        upstream=True,  # upstream's recorded results (craftmd ingest) are releases of this task
        submissions=True,  # craftmd submit takes answers to its experiments
        folder=Path(__file__).parent,
        analysis=ANALYSIS,
        environment=ENVIRONMENT,
        cases=cases,
        version=2,  # the comparability version (CHANGELOG.md, "Changes that move scores")
    )
)
