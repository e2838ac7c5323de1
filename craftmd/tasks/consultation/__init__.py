"""The consultation protocol of the consultation-evaluation framework, posed on CRAFT-MD's text cases.

The patient opens with a fixed *initial request* and then answers as a colloquial, lazy patient
(one point of information per short reply); the doctor asks until it stops asking. The doctor
never answers the question itself: a separate fixed **solver** model answers it from what the
conversation gathered, so doctors are compared on what they asked. The initial request and the
(key, value) items come from the dataset's ``keyinfo`` config (``craftmd keyinfo extract``); a
case without them is posed only in ``upper``.

Conversation kinds: ``consult`` (the doctor under test), and the consultation-order oracle
``oracle_direct`` / ``oracle_random`` / ``oracle_reverse`` — a scripted doctor that asks "Can you
tell me about {key}?" over the case's keys in the extracted order, a seeded shuffle of it, or its
reverse.

Settings (what the solver reads): ``upper`` (the whole vignette: the upper bound), ``lower`` (the
initial request alone: the lower bound), and ``<kind>_<p>`` for p in 20, 40, 60, 80, 100: the
conversation of that kind cut after the first ⌈p·K/100⌉ of its K rounds (a round is a doctor
question the patient answered; the doctor's closing turn is never shown). Formats: ``mcq4`` (the
case's four choices) and ``frq`` (free response), graded by CRAFT-MD's graders.
"""

from __future__ import annotations

from pathlib import Path

from craftmd.dataset import case_texts
from craftmd.generation.questions import ConversationOptions
from craftmd.tasks.base import Role, Task, parse_matrix, register

from .analysis import ANALYSIS
from .environment import ENVIRONMENT
from .protocol import CONVERSATIONS, DOCTOR_PROMPTS, SHARES, Consultation, cut


def _matrix() -> str:
    rows = ["setting format conversation exam image options"]
    for setting, conv in [("upper", "-"), ("lower", "-")] + [(f"{k}_{p}", k) for k in CONVERSATIONS for p in SHARES]:
        rows += [f"{setting} mcq4 {conv} no no choices4", f"{setting} frq {conv} no no -"]
    return "\n".join(rows)


EXPERIMENTS = parse_matrix(_matrix())


def cases(dataset_dir: Path) -> dict[str, str] | None:
    """Its test cases' texts (:attr:`craftmd.tasks.Task.cases`): the vignettes of the text cases it poses (``all``)."""
    return case_texts(dataset_dir, ("all",))


ROLES = (
    Role("doctor", "the model under test: interviews the patient"),
    Role("patient", "the lazy patient: opens with the case's initial request and answers one point at a time"),
    Role("solver", "the fixed model that answers the question from what the conversation gathered"),
)


TASK = register(
    Task(
        name="consultation",
        description="consultation: the doctor interviews a lazy patient who opens with a request; a fixed solver answers from the conversation",
        dataset="craftmd",
        experiments=EXPERIMENTS,
        conversations=CONVERSATIONS,
        patient_led=CONVERSATIONS,  # each opens with the patient's initial request
        scorers=("paper", "strict", "offline", "keyinfo"),
        metrics=("correct",),
        protocol=Consultation,
        roles=ROLES,
        options=ConversationOptions,
        prompt_labels=tuple(DOCTOR_PROMPTS.items()),  # the framework's short and long doctors
        folder=Path(__file__).parent,
        analysis=ANALYSIS,
        environment=ENVIRONMENT,
        cases=cases,
        version=1,  # the comparability version (CHANGELOG.md, "Changes that move scores")
    )
)

__all__ = ["TASK", "ROLES", "EXPERIMENTS", "CONVERSATIONS", "SHARES", "DOCTOR_PROMPTS", "cut"]
