"""The judges' committee agreement on a judge scores table (:func:`committee_agreement`): Krippendorff's ordinal alpha
over all judges and each pair's quadratic-weighted kappa, overall and per dimension (the statistics are
:mod:`craftmd.agreement`'s).
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from craftmd.agreement import LEVELS, krippendorff_alpha, weighted_kappa


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def committee_agreement(table, member_names: list[str]) -> dict:
    """The judges' agreement on a judge scores table: overall and per dimension, Krippendorff's ordinal alpha
    over all judges, and per pair of judges the quadratic-weighted kappa on the units both scored."""
    import polars as pl

    df = pl.from_arrow(table).filter(pl.col("scorer").is_in(member_names), pl.col("status") == "ok")
    unit = ["case_id", "trial", "conversation", "with_image", "dimension"]
    wide = df.pivot(on="scorer", index=unit, values="value").sort(unit) if df.height else None

    def figures(w) -> dict:
        if w is None or w.height == 0:
            return {"units": 0, "alpha_ordinal": None, "pairs": []}
        present = [m for m in member_names if m in w.columns]
        mat = np.array([w[m].fill_null(float("nan")).to_numpy() for m in present], dtype=float) if present else np.empty((0, 0))
        pairs = []
        for x, y in combinations(present, 2):
            both = w.filter(pl.col(x).is_not_null(), pl.col(y).is_not_null())
            a, b = both[x].cast(pl.Int64).to_list(), both[y].cast(pl.Int64).to_list()
            pairs.append({"a": x, "b": y, "n": len(a), "weighted_kappa": _r(weighted_kappa(a, b)),
                          "exact_agreement": _r(float(np.mean(np.array(a) == np.array(b)))) if a else None})  # fmt: skip
        return {
            "units": w.height,
            "alpha_ordinal": _r(krippendorff_alpha(mat, "ordinal", LEVELS)) if present else None,
            "pairs": pairs,
        }

    out = {"overall": figures(wide), "by_dimension": {}}
    if wide is not None:
        for (dim,), g in wide.group_by(["dimension"], maintain_order=True):
            f = figures(g)
            out["by_dimension"][dim] = {"units": f["units"], "alpha_ordinal": f["alpha_ordinal"]}
        out["by_dimension"] = dict(sorted(out["by_dimension"].items()))
    return out


__all__ = ["committee_agreement"]
