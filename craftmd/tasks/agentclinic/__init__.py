"""AgentClinic's OSCE cases (Schmidgall et al. 2024, arXiv 2405.07960; MIT) under this package's own protocol.

The doctor under test has a budget of messages and is told how many it has used; it may order examinations and tests
(``REQUEST TEST: <test>``, answered by a **measurement** agent holding the case's findings) and ends with
``DIAGNOSIS READY: <diagnosis>``; a **patient** agent holds the patient's facts; a **moderator** says whether the
diagnosis names the case's. The doctor and the patient may each be given one of AgentClinic's cognitive or implicit
biases. The cases are read in place from the pinned AgentClinic archive (:mod:`.cases`); the prompts are this
package's own words (``prompts/agentclinic-v1/``), so its numbers are its own, not comparable with AgentClinic's
published ones (every release's run record says so, and the board too).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from craftmd.samples import Config, Dataset, register_dataset
from craftmd.tasks.base import Experiment, Role, Table, Task, register

from . import scorers  # noqa: F401  (registers the task's scorers)
from .analysis import ANALYSIS
from .cases import CASE_SETS, load_cases, locate, own_file
from .environment import ENVIRONMENT
from .protocol import AgentClinic

#: The biases a run may give each role (AgentClinic's list; their texts are the prompt set's ``biases.json``).
COGNITIVE = {
    "doctor": ("recency", "frequency", "false_consensus", "status_quo", "confirmation"),
    "patient": ("recency", "frequency", "false_consensus", "self_diagnosis"),
}
IMPLICIT = ("gender", "race", "sexual_orientation", "cultural", "education", "religion", "socioeconomic")
BIASES = {role: ("none", *names, *IMPLICIT) for role, names in COGNITIVE.items()}
#: Why a conversation stopped: the doctor gave its diagnosis, its budget was spent, or a call failed.
ENDINGS = ("diagnosis", "out_of_budget", "refusal", "error")
MODERATOR_STATUS = ("ok", "invalid", "not_asked", "refusal", "error")

#: ``osce``: one row per (case, trial): the case set, whether the doctor was shown the case's image, the budget, the
#: doctor's messages (each uses one of the budget's), the tests it requested (as it named them), its diagnosis (null
#: when it gave none), the reference diagnosis, how the conversation ended, and the moderator's verdict (``yes``/``no``;
#: null unless ``moderator_status`` is ok), its reply and what went wrong where something did.
OSCE = pa.schema(
    [
        ("case_id", pa.string()),
        ("trial", pa.int16()),
        ("case_set", pa.string()),
        ("with_image", pa.bool_()),
        ("budget", pa.int16()),
        ("questions_used", pa.int16()),
        ("tests_requested", pa.int16()),
        ("tests", pa.list_(pa.string())),
        ("diagnosis", pa.string()),
        ("reference", pa.string()),
        ("ended", pa.string()),
        ("moderator_status", pa.string()),
        ("moderator_verdict", pa.string()),
        ("moderator_reply", pa.string()),
        ("error", pa.string()),
    ]
)

ROLES = (
    Role("doctor", "the model under test: asks, orders tests and gives its diagnosis within its budget"),
    Role("patient", "the patient: answers from the case's patient facts, never naming the diagnosis"),
    Role("measurement", "holds the case's examination findings and test results, reports what is ordered", default="patient"),
    Role("moderator", "says whether the doctor's diagnosis names the case's (Yes/No)", default="patient"),
)


def _choice(value: str, known: tuple[str, ...], what: str) -> str:
    if value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")
    return value


class Options(BaseModel):
    """The options of the AgentClinic protocol (``-T key=value``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    budget: int = Field(
        20, ge=1, description="the doctor's messages in all (AgentClinic's default: 20)", json_schema_extra={"protocol": True}
    )
    doctor_bias: str = Field(
        "none", description=f"a bias for the doctor: {', '.join(BIASES['doctor'])}", json_schema_extra={"protocol": True}
    )
    patient_bias: str = Field(
        "none", description=f"a bias for the patient: {', '.join(BIASES['patient'])}", json_schema_extra={"protocol": True}
    )
    case_set: str = Field(
        "medqa",
        description=f"the cases: {', '.join(CASE_SETS)} (the NEJM sets need their images), or a .jsonl file of cases in "
        "AgentClinic's MedQA shape",
        json_schema_extra={"protocol": True},
    )
    image_dir: str | None = Field(
        None, description="a folder holding the NEJM cases' images (<id>.jpg, ...), instead of NEJM's server"
    )

    @field_validator("doctor_bias")
    @classmethod
    def _doctor_bias(cls, v: str) -> str:
        return _choice(v, BIASES["doctor"], "doctor bias")

    @field_validator("patient_bias")
    @classmethod
    def _patient_bias(cls, v: str) -> str:
        return _choice(v, BIASES["patient"], "patient bias")

    @field_validator("case_set")
    @classmethod
    def _case_set(cls, v: str) -> str:
        return v if own_file(v) else _choice(v, tuple(CASE_SETS), "case set")


DATASET = register_dataset(
    Dataset(
        "agentclinic",
        tuple(
            Config(name, "osce", f"AgentClinic's {file}, read in place from the pinned archive")
            for name, (file, _, _) in CASE_SETS.items()
        ),
        description="AgentClinic (Schmidgall et al. 2024): OSCE cases from MedQA and NEJM Image Challenge cases",
    )
)


def case_texts(dataset_dir: Path) -> dict[str, str] | None:
    """Its test cases' texts (:attr:`craftmd.tasks.Task.cases`): every case of the four sets, what the patient and the
    measurement agent hold, read from the pinned source (``dataset_dir``'s, else ``../shared/sources``); None where it
    is not at hand (the overlap names the task as not compared)."""
    from craftmd import CraftMDError

    try:
        locate(dataset_dir)
    except CraftMDError:  # no pinned source at hand (a damaged one is not this: it is one line, from load_cases)
        return None
    return {c.case_id: f"{c.patient}\n{c.exam}" for s in CASE_SETS for c in load_cases(dataset_dir, s)[0]}


TASK = register(
    Task(
        name="agentclinic",
        description="AgentClinic's OSCE cases: the doctor asks and orders tests within a budget, a measurement agent reports, "
        "a moderator judges the diagnosis (this package's protocol and prompts)",
        dataset="agentclinic",
        experiments=(Experiment("osce", "conversation", "osce", image=True),),
        conversations=("osce",),
        scorers=("agentclinic-moderator", "agentclinic-offline"),
        metrics=("correct",),
        variant_keys=("conversation",),
        endings=ENDINGS,
        required_tables=("conversations", "osce"),
        extra_tables=(
            Table(
                "osce",
                OSCE,
                ("case_id", "trial"),
                (("ended", ENDINGS), ("moderator_status", MODERATOR_STATUS)),
                ("diagnosis", "moderator_verdict", "moderator_reply", "error"),
            ),  # fmt: skip
        ),
        protocol=AgentClinic,
        roles=ROLES,
        options=Options,
        folder=Path(__file__).parent,
        analysis=ANALYSIS,
        environment=ENVIRONMENT,
        cases=case_texts,
        version=1,  # the comparability version (CHANGELOG.md, "Changes that move scores")
    )
)

__all__ = ["TASK", "ROLES", "Options", "BIASES", "ENDINGS", "OSCE", "DATASET"]
