"""Correlation coefficients with paired bootstrap intervals (scipy.stats), weighted or not (the interval of a
mean is :func:`fi_toolkit.intervals.mean_interval`).

Unweighted coefficients equal ``scipy.stats.spearmanr`` / ``pearsonr`` / ``kendalltau``; weighted ones
serve stratified candidate samples (inverse inclusion probabilities, see :mod:`.per_token`).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from fi_toolkit.errors import FIError
from fi_toolkit.intervals import bootstrap_interval

METHODS = ("spearman", "pearson", "kendall")


def _pearson(x, y, axis=-1):
    xm = x - x.mean(axis=axis, keepdims=True)
    ym = y - y.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (xm * ym).sum(axis=axis) / np.sqrt((xm * xm).sum(axis=axis) * (ym * ym).sum(axis=axis))


def _spearman(x, y, axis=-1):
    return _pearson(stats.rankdata(x, axis=axis), stats.rankdata(y, axis=axis), axis=axis)


def _kendall(x, y):
    return stats.kendalltau(x, y).statistic


def weighted_pearson(x, y, w) -> float:
    w = w / w.sum()
    xm, ym = x - (w * x).sum(), y - (w * y).sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        return float((w * xm * ym).sum() / np.sqrt((w * xm * xm).sum() * (w * ym * ym).sum()))


def weighted_ranks(x, w) -> np.ndarray:
    """Weighted mid-ranks: the weight strictly below each value plus half the weight of its ties."""
    below = (w[None, :] * (x[None, :] < x[:, None])).sum(axis=1)
    tied = (w[None, :] * (x[None, :] == x[:, None])).sum(axis=1)
    return below + 0.5 * tied


def weighted_spearman(x, y, w) -> float:
    return weighted_pearson(weighted_ranks(x, w), weighted_ranks(y, w), w)


def weighted_kendall(x, y, w) -> float:
    """Tau-b over pairs weighted ``w_i w_j``."""
    sx, sy = np.sign(x[:, None] - x[None, :]), np.sign(y[:, None] - y[None, :])
    ww = w[:, None] * w[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        return float((ww * sx * sy).sum() / np.sqrt((ww * (sx != 0)).sum() * (ww * (sy != 0)).sum()))


# method -> (scipy point estimate with p-value, bootstrap statistic, is it vectorized, weighted statistic)
_METHODS = {
    "spearman": (stats.spearmanr, _spearman, True, weighted_spearman),
    "pearson": (stats.pearsonr, _pearson, True, weighted_pearson),
    "kendall": (stats.kendalltau, _kendall, False, weighted_kendall),
}


def correlation(
    x,
    y,
    method: str = "spearman",
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    weights=None,
) -> dict:
    """Coefficient, p-value and paired percentile bootstrap interval of ``x`` vs ``y`` (non-finite pairs dropped).

    Unweighted (``weights`` None or all equal): equal to ``scipy.stats.<method>`` and
    ``scipy.stats.bootstrap((x, y), stat, paired=True, method="percentile",
    rng=np.random.default_rng(seed))`` on the same arrays. Weighted: the weighted coefficient, no
    p-value (NaN), the bootstrap over (x, y, w) triples. Constant input or fewer than 3 pairs gives
    NaN (a correlation is undefined there).
    """
    if method not in _METHODS:
        raise FIError(f"unknown correlation method '{method}' (choose from {', '.join(METHODS)})")
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y, w = x[ok], y[ok], w[ok]
    weighted = bool(w.size and np.ptp(w) > 0)
    row = {
        "method": method,
        "weighted": weighted,
        "rho": np.nan,
        "p_value": np.nan,
        "ci_low": np.nan,
        "ci_high": np.nan,
        "n": int(x.size),
    }
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return row
    point, statistic, vectorized, weighted_statistic = _METHODS[method]
    if weighted:
        row["rho"] = weighted_statistic(x, y, w)
        data, stat, vectorized = (x, y, w), weighted_statistic, False
    else:
        res = point(x, y)
        row["rho"], row["p_value"] = float(res.statistic), float(res.pvalue)
        data, stat = (x, y), statistic
    if n_resamples > 0:
        row["ci_low"], row["ci_high"] = bootstrap_interval(
            data, stat, paired=True, vectorized=vectorized, n_resamples=n_resamples, confidence=confidence, seed=seed
        )
    return row
