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

from . import Experiment as E
from . import Task, register

_S, _M = "standard", "no_exam"

EXPERIMENTS = (
    # setting                format       conversation  exam   image  options
    E("vignette",            "mcq4",      None,         False, False, "choices4"),
    E("vignette",            "mcq_many",  None,         False, False, "diagnoses"),
    E("vignette",            "frq",       None,         False, True,  None),
    E("vignette",            "top3",      None,         False, True,  None),
    E("multiturn",           "mcq4",      _S,           False, False, "choices4"),
    E("multiturn",           "mcq_many",  _S,           False, False, "diagnoses"),
    E("multiturn",           "frq",       _S,           False, True,  None),
    E("multiturn",           "top3",      _S,           False, True,  None),
    E("singleturn",          "mcq4",      _S,           False, False, "choices4"),
    E("singleturn",          "mcq_many",  _S,           False, False, "diagnoses"),
    E("singleturn",          "frq",       _S,           False, True,  None),
    E("singleturn",          "top3",      _S,           False, True,  None),
    E("summarized",          "mcq4",      _S,           False, False, "choices4"),
    E("summarized",          "mcq_many",  _S,           False, False, "diagnoses"),
    E("summarized",          "frq",       _S,           False, True,  None),
    E("summarized",          "top3",      _S,           False, True,  None),
    E("exam",                "mcq4",      None,         True,  False, "choices4"),
    E("exam",                "mcq_many",  None,         True,  False, "diagnoses"),
    E("exam",                "frq",       None,         True,  False, None),
    E("exam",                "top3",      None,         True,  False, None),
    E("multiturn_no_exam",   "mcq4",      _M,           True,  False, "choices4"),
    E("multiturn_no_exam",   "mcq_many",  _M,           True,  False, "diagnoses"),
    E("multiturn_no_exam",   "frq",       _M,           True,  False, None),
    E("multiturn_no_exam",   "top3",      _M,           True,  False, None),
    E("multiturn_plus_exam", "mcq4",      _S,           True,  False, "choices4"),
    E("multiturn_plus_exam", "mcq_many",  _S,           True,  False, "diagnoses"),
    E("multiturn_plus_exam", "frq",       _S,           True,  False, None),
    E("multiturn_plus_exam", "top3",      _S,           True,  False, None),
)  # fmt: skip

TASK = register(
    Task(
        name="craftmd",
        description="CRAFT-MD: the doctor interviews a patient-AI holding a case vignette, then names the diagnosis",
        dataset="craftmd",
        experiments=EXPERIMENTS,
        conversations=(_S, _M),
        scorers=("paper", "strict", "offline"),
        metrics=("correct",),
    )
)
