"""Agreement statistics, one home: Cohen's kappa (plain and weighted), Krippendorff's alpha, Spearman's rho, Kendall's tau, ROC AUC
with a case-bootstrap CI. The grader audit, the expert and rubric reviews, the judges' committee, the calibration
and the validity audits all take them from here.

Library functions where they exist (statsmodels' ``cohens_kappa``, scipy's ``spearmanr``, ``kendalltau`` and ``mannwhitneyu``);
Krippendorff's alpha is a few lines of numpy (no maintained permissive package in the lock).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

#: The rubric's 1-4 levels, the default of the ordinal statistics.
LEVELS = (1, 2, 3, 4)


def kappa(a, b) -> float | None:
    """Cohen's kappa of two boolean label vectors (statsmodels; None when undefined: no labels, or one class only)."""
    from statsmodels.stats.inter_rater import cohens_kappa

    a = np.asarray(a, bool)
    b = np.asarray(b, bool)
    table = np.array([[np.sum(~a & ~b), np.sum(~a & b)], [np.sum(a & ~b), np.sum(a & b)]], float)
    pe = (table.sum(0) * table.sum(1)).sum() / table.sum() ** 2 if table.sum() else 1.0
    if table.sum() == 0 or pe >= 1.0:
        return None
    return float(cohens_kappa(table, return_results=False))


def weighted_kappa(a, b, weights: str = "quadratic", levels: tuple = LEVELS) -> float | None:
    """Cohen's kappa of two raters' paired ordinal ratings with ``linear`` or ``quadratic`` weights (statsmodels, on
    their contingency table over ``levels``); None with fewer than two pairs or no variation."""
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


def krippendorff_alpha(data, level: str = "ordinal", values: tuple | None = None) -> float | None:
    """Krippendorff's alpha of a raters × units matrix (NaN = missing); None when there is nothing pairable
    or no variation at all (expected disagreement 0).

    After Krippendorff (2011, "Computing Krippendorff's alpha-reliability"): the coincidence matrix
    ``o_ck = sum_u (pairs c-k in unit u) / (m_u - 1)`` over units with at least two ratings, the marginals ``n_c``,
    and ``alpha = 1 - (n - 1) * sum o_ck d_ck / sum n_c n_k d_ck``, where ``d`` is the squared difference metric of
    the level: nominal (0/1), ordinal (``(sum_{g=c..k} n_g - (n_c + n_k)/2)^2``) or interval (``(c - k)^2``)."""
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


def spearman(a, b) -> float | None:
    """Spearman's rho (scipy); None with fewer than three pairs or a side without variation."""
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b).statistic)


def spearman_test(a, b) -> tuple[float, float]:
    """Spearman's rho and its two-sided p-value (scipy), as they come (NaN where undefined)."""
    from scipy.stats import spearmanr

    res = spearmanr(a, b)
    return float(res.statistic), float(res.pvalue)


def kendall_tau(a, b) -> float | None:
    """Kendall's tau-b of two rankings (scipy); None where it is undefined (a side without variation)."""
    from scipy.stats import kendalltau

    t = float(kendalltau(a, b).statistic)
    return None if math.isnan(t) else t


def auc(yes: list[float], no: list[float]) -> float | None:
    """ROC AUC of a score for yes-vs-no labels: Mann–Whitney U / (n1 n0) (ties count one half); None if a class is empty."""
    from scipy.stats import mannwhitneyu

    if not yes or not no:
        return None
    return float(mannwhitneyu(yes, no).statistic) / (len(yes) * len(no))


def auc_ci(values: list[float], labels: list[bool], groups: list[str], *, B: int = 2000, seed: int = 14) -> tuple:
    """AUC and its 95 % case-bootstrap CI (resampling cases: a case's conversations go together); seeded.

    A resample is a vector of how often each conversation was drawn; its AUC is the Mann–Whitney U of
    the drawn sample, ``sum_ij w_i w_j [v_i > v_j] (+ 1/2 on ties)`` over yes-no pairs, divided by the
    numbers of yes and no drawn — the same figure :func:`auc` gives for the drawn sample, for every
    resample at once."""
    v, y = np.asarray(values, float), np.asarray(labels, bool)
    point = auc(v[y].tolist(), v[~y].tolist())
    cases = sorted(set(groups))
    of_case = np.searchsorted(cases, np.asarray(groups))
    rng = np.random.default_rng(seed)
    drawn = np.stack([np.bincount(rng.integers(0, len(cases), len(cases)), minlength=len(cases)) for _ in range(B)])
    w = drawn[:, of_case].astype(float)  # B x n: how often each conversation is in each resample
    wins = (v[:, None] > v[None, :]) + 0.5 * (v[:, None] == v[None, :])  # n x n
    pos, neg = w * y, w * ~y
    n1, n0 = pos.sum(1), neg.sum(1)
    ok = (n1 > 0) & (n0 > 0)
    u = np.einsum("bi,ij,bj->b", pos[ok], wins, neg[ok])
    got = u / (n1[ok] * n0[ok])
    lo, hi = (float(np.percentile(got, 2.5)), float(np.percentile(got, 97.5))) if got.size else (None, None)
    return point, lo, hi


__all__ = ["kappa", "weighted_kappa", "krippendorff_alpha", "spearman", "spearman_test", "kendall_tau", "auc", "auc_ci", "LEVELS"]
