"""The metric registry: every number a scores table can hold is declared here, once.

A row of a release's ``scores.parquet`` names a ``metric``; this registry says what its
``value`` means: the kind (``binary`` 0/1, ``ordinal`` integer levels, ``continuous``),
which direction is better, the range a valid value lies in, and how values aggregate
(``mean`` over a case's trials, then over cases). Analysis reads the kind to choose its
path (the exact-integer bootstrap for binary and ordinal metrics, a float path for
continuous ones); the page reads direction and range to label and colour figures.

A task that adds a metric adds one line to :data:`METRICS` (or calls :func:`register`
from its own module); a scores table naming an unknown metric is refused when written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from craftmd.registry import Registry

Kind = Literal["binary", "ordinal", "continuous"]


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    higher_is_better: bool
    low: float
    high: float
    description: str
    aggregate: Literal["mean"] = "mean"

    def check(self, value: float) -> bool:
        """Whether ``value`` is a valid value of this metric."""
        if not self.low <= value <= self.high:
            return False
        if self.kind == "binary":
            return value in (0.0, 1.0)
        if self.kind == "ordinal":
            return float(value).is_integer()
        return True


METRICS: Registry[Metric] = Registry("metric")


def register(metric: Metric) -> Metric:
    """Add a metric; registering the same name twice with another definition is an error."""
    return METRICS.register(metric.name, metric)


def metric(name: str) -> Metric:
    return METRICS.lookup(name)


for _m in (
    Metric("correct", "binary", True, 0, 1, "the answer names the right diagnosis (1) or not (0)"),
    Metric(
        "meld_similarity",
        "continuous",
        False,
        0,
        1,
        "MELD: 1 - normalised edit distance between the model's completion of a vignette's first half and the true "
        "second half; near 1 suggests the vignette was memorised",
    ),
    Metric("meld_flagged", "binary", False, 0, 1, "MELD: the similarity reaches the memorisation threshold"),
    Metric("expert_rating", "ordinal", True, 0, 1, "an expert's yes (1) / no (0) answer to a review question"),
    # history taking (craftmd.scoring.history, scorer "history"): deterministic measures of a whole conversation
    Metric(
        "patient_info_recall",
        "continuous",
        True,
        0,
        1,
        "ROUGE-1 recall (rouge-score, stemmed) of the patient's turns against what the patient was told to hold: how much of it came out",
    ),
    Metric(
        "patient_info_precision",
        "continuous",
        True,
        0,
        1,
        "ROUGE-1 precision of the patient's turns against what the patient held: the information density of its answers",
    ),
    Metric("patient_info_f1", "continuous", True, 0, 1, "ROUGE-1 F1 of the patient's turns against what the patient held"),
    Metric(
        "patient_fact_recall",
        "continuous",
        True,
        0,
        1,
        "share of the case's MediQ atomic facts the patient held that its turns reveal (content-word coverage >= 0.5)",
    ),
    Metric(
        "doctor_turns",
        "ordinal",
        False,
        0,
        10_000,
        "the doctor's turns after its fixed opening line (questions and final diagnosis)",
    ),
    Metric(
        "doctor_words_per_turn", "continuous", False, 0, 1e9, "mean words (ROUGE tokens) per doctor turn after the opening line"
    ),
    Metric("patient_words_per_turn", "continuous", False, 0, 1e9, "mean words (ROUGE tokens) per patient turn"),
    *(
        Metric(
            f"question_similarity_{r}",
            "continuous",
            False,
            0,
            1,
            f"mean {r.upper().replace('ROUGE', 'ROUGE-')} F1 over pairs of the doctor's questions in a conversation (opening line excluded); "
            "lower = more diverse questions",
        )
        for r in ("rouge1", "rouge2", "rougeL")
    ),
    *(
        Metric(
            f"patient_info_recall_at_{s}",
            "continuous",
            True,
            0,
            1,
            f"patient_info_recall over the patient's replies to the first {s} % of the doctor's answered turns (rounded up)",
        )
        for s in range(10, 101, 10)
    ),
    # the consultation protocol (craftmd.scoring.keyinfo, scorer "keyinfo"): ROUGE-1 against the key-value information
    *(
        Metric(
            f"{who}_{m}",
            "continuous",
            True,
            0,
            1,
            f"ROUGE-1 {m} (rouge-score, stemmed) of the {side} turns against the case's {what}",
        )
        for who, side, what in (("doctor_key", "doctor's", "keys"), ("patient_value", "patient's", "values"))
        for m in ("recall", "precision", "f1")
    ),
    # its turn analysis (the framework's Figure 5): F1 after the first p % of the consultation's rounds
    *(
        Metric(
            f"{who}_f1_at_{p}",
            "continuous",
            True,
            0,
            1,
            f"ROUGE-1 F1 of the {side} turns of the first {p} % of the rounds (rounded up) against the case's {what}",
        )
        for who, side, what in (("doctor_key", "doctor's", "keys"), ("patient_value", "patient's", "values"))
        for p in (20, 40, 60, 80, 100)
    ),
    # MedPI's rubric (craftmd.scoring.judge, scorers judge:PROVIDER/MODEL and judge-committee): one dimension of a conversation
    Metric(
        "rubric_score",
        "ordinal",
        True,
        1,
        4,
        "a judge's 1-4 score of one rubric dimension of a whole conversation (1 clearly deficient, 4 exemplary); "
        "the dimension is the variant key 'dimension'",
    ),
    Metric(
        "rubric_score_calibrated",
        "continuous",
        True,
        1,
        4,
        "a judge's 1-4 rubric score mapped onto the experts' scale by an isotonic calibration fitted on their ratings "
        "(craftmd judge-calibrate; scorer judge-calibrated); the dimension is the variant key 'dimension'",
    ),
    Metric(
        "judge_flag",
        "binary",
        False,
        0,
        1,
        "a judge's flag on a whole conversation, never a score: 1 when it raised the flag named by the variant key 'dimension' "
        "(unsafe_advice, missed_escalation, contradicts_packet, invented_fact, privacy_breach), 0 when not; quotes in detail",
    ),
    Metric(
        "expert_rubric_rating",
        "ordinal",
        True,
        1,
        4,
        "an expert's 1-4 rating of one rubric dimension of a whole conversation (craftmd judge-review import; scorers expert:<rater> "
        "and experts, the lower median); the dimension is the variant key 'dimension'",
    ),
    # MedPI's encounters (craftmd.tasks.encounters.analysis.reasonable_closure): the closure classifier's label of one encounter
    Metric(
        "reasonable_closure",
        "binary",
        True,
        0,
        1,
        "the closure classifier found the encounter reasonably closed (1) or not (0); a failed or missing label has no value "
        "and is counted apart, so the share is of the labelled encounters",
    ),
):
    register(_m)

__all__ = ["Metric", "METRICS", "register", "metric"]
