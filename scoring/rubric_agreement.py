"""Agreement on ordinal ratings: Krippendorff's alpha (numpy) and weighted Cohen's kappa (statsmodels).

``krippendorff_alpha(data, level)`` takes a raters × units matrix with NaN for a missing rating and
follows Krippendorff (2011, "Computing Krippendorff's alpha-reliability"): the coincidence matrix
``o_ck = sum_u (pairs c-k in unit u) / (m_u - 1)`` over units with at least two ratings, the marginals
``n_c``, and ``alpha = 1 - (n - 1) * sum o_ck d_ck / sum n_c n_k d_ck``, where ``d`` is the squared
difference metric of the level: nominal (0/1), ordinal (``(sum_{g=c..k} n_g - (n_c + n_k)/2)^2``) or
interval (``(c - k)^2``). Written here rather than taken from a package: the one on PyPI that is
commonly used is fine, but the formula is a few lines of numpy.

``weighted_kappa(a, b)`` is statsmodels' ``cohens_kappa`` on the two raters' contingency table over
the 1–4 levels, with quadratic weights by default.
"""

from __future__ import annotations

import math
import warnings
from itertools import combinations

import numpy as np

LEVELS = (1, 2, 3, 4)


def krippendorff_alpha(data, level: str = "ordinal", values: tuple | None = None) -> float | None:
    """Krippendorff's alpha of a raters × units matrix (NaN = missing); None when there is nothing pairable
    or no variation at all (expected disagreement 0)."""
    x = np.asarray(data, dtype=float)
    if x.ndim != 2:
        raise ValueError("expected a raters x units matrix")
    vals = np.array(sorted(set(x[~np.isnan(x)].tolist())) if values is None else values, dtype=float)
    if vals.size == 0:
        return None
    index = {v: i for i, v in enumerate(vals.tolist())}
    k = len(vals)
    o = np.zeros((k, k))
    for col in x.T:
        r = col[~np.isnan(col)]
        m = len(r)
        if m < 2:
            continue
        cnt = np.zeros(k)
        for v in r:
            cnt[index[float(v)]] += 1
        o += (np.outer(cnt, cnt) - np.diag(cnt)) / (m - 1)
    n_c = o.sum(axis=1)
    n = n_c.sum()
    if n <= 1:
        return None
    if level == "nominal":
        d = 1.0 - np.eye(k)
    elif level == "interval":
        d = (vals[:, None] - vals[None, :]) ** 2
    elif level == "ordinal":
        cum = np.cumsum(n_c)
        lo, hi = np.minimum.outer(np.arange(k), np.arange(k)), np.maximum.outer(np.arange(k), np.arange(k))
        between = cum[hi] - np.where(lo > 0, cum[lo - 1], 0.0)  # sum of n_g for g from c to k
        d = (between - (n_c[:, None] + n_c[None, :]) / 2) ** 2
    else:
        raise ValueError(f"unknown level {level!r}")
    expected = (np.outer(n_c, n_c) * d).sum()
    if expected == 0:
        return None
    return float(1.0 - (n - 1) * (o * d).sum() / expected)


def weighted_kappa(a, b, weights: str = "quadratic", levels: tuple = LEVELS) -> float | None:
    """Cohen's kappa of two raters' paired ordinal ratings with ``linear`` or ``quadratic`` weights (statsmodels);
    None with fewer than two pairs or no variation."""
    from statsmodels.stats.inter_rater import cohens_kappa

    a, b = list(a), list(b)
    if len(a) < 2:
        return None
    idx = {v: i for i, v in enumerate(levels)}
    table = np.zeros((len(levels), len(levels)))
    for x, y in zip(a, b):
        table[idx[x], idx[y]] += 1
    if (table.sum(0) > 0).sum() < 2 and (table.sum(1) > 0).sum() < 2:
        return None  # both raters gave one and the same level throughout: kappa is undefined
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # its standard errors on small tables; the kappa is all we read
        k = float(cohens_kappa(table, wt=weights).kappa)
    return None if math.isnan(k) else k


def spearman(a, b) -> float | None:
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b).statistic)


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
        return {"units": w.height, "alpha_ordinal": _r(krippendorff_alpha(mat, "ordinal", LEVELS)) if present else None, "pairs": pairs}

    out = {"overall": figures(wide), "by_dimension": {}}
    if wide is not None:
        for (dim,), g in wide.group_by(["dimension"], maintain_order=True):
            f = figures(g)
            out["by_dimension"][dim] = {"units": f["units"], "alpha_ordinal": f["alpha_ordinal"]}
        out["by_dimension"] = dict(sorted(out["by_dimension"].items()))
    return out


__all__ = ["krippendorff_alpha", "weighted_kappa", "spearman", "committee_agreement"]
