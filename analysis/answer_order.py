"""The answer-order effect: a model's MCQ accuracy with its options shuffled minus in upstream's order, with a paired
case-bootstrap CI (``tables/order_tests.csv``, written only when some model has runs in both orders).

``sql/order_pairs`` pairs the releases (one model, protocols that differ in ``-T answer_order`` alone) and lists each
case's trials on both sides; a case scores the mean of its trials on each side, the difference is the mean over the
cases both have of (shuffled - upstream), and its interval resamples those cases (:mod:`.bootstrap`: the same draws as
every other interval of ``n`` cases, exact integer sums), with the paired bootstrap's two-sided p-value.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from . import runner
from .bootstrap import DEFAULT_B, DEFAULT_SEED, Resampler, paired_p, scale

#: The columns of tables/order_tests.csv.
ORDER_TEST_COLUMNS = [
    "model",
    "upstream_release",
    "other_release",
    "answer_order",
    "setting",
    "format",
    "grader",
    "n_cases",
    "upstream_accuracy",
    "other_accuracy",
    "diff",
    "ci_low",
    "ci_high",
    "p_value",
]
KEYS = ["model", "upstream_release", "other_release", "answer_order", "grader", "setting", "format"]
DECIMALS = 6


def order_tests(con, *, B: int = DEFAULT_B, seed: int = DEFAULT_SEED) -> pl.DataFrame | None:
    """The table (:data:`ORDER_TEST_COLUMNS`) of a prepared connection (:func:`craftmd.analysis.tables.prepared_connection`),
    or None when no model has runs in two orders."""
    rows = pl.from_arrow(runner.run(con, "order_pairs"))
    if rows.is_empty():
        return None
    L = scale(np.concatenate([rows["upstream_trials"].to_numpy(), rows["other_trials"].to_numpy()]))
    R = Resampler(B=B, seed=seed)
    cells = []
    for key, g in rows.group_by(KEYS, maintain_order=True):
        # each case's score on each side as an integer numerator over L (exact sums: the same bytes on any machine)
        up = g["upstream_correct"].to_numpy().astype(np.int64) * (L // g["upstream_trials"].to_numpy().astype(np.int64))
        other = g["other_correct"].to_numpy().astype(np.int64) * (L // g["other_trials"].to_numpy().astype(np.int64))
        d = other - up
        cells.append((dict(zip(KEYS, key)), up, other, d, R.add(d)))
    R.run()
    out = []
    for key, up, other, d, h in cells:
        n = len(d)
        low, high = R.quantiles(h)
        out.append({**key, "n_cases": n, "upstream_accuracy": up.sum() / (n * L), "other_accuracy": other.sum() / (n * L),
                    "diff": d.sum() / (n * L), "ci_low": low / (n * L), "ci_high": high / (n * L),
                    "p_value": paired_p(R.resampled(h), float(d.sum()))})  # fmt: skip
    num = ["upstream_accuracy", "other_accuracy", "diff", "ci_low", "ci_high", "p_value"]
    return pl.DataFrame(out).with_columns(pl.col(num).round(DECIMALS)).select(ORDER_TEST_COLUMNS)


__all__ = ["order_tests", "ORDER_TEST_COLUMNS"]
