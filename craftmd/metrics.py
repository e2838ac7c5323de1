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
):
    register(_m)

__all__ = ["Metric", "METRICS", "register", "metric"]
