"""The interval of a mean over independent units (documents, samples), one rule for every table and figure, and
the one paired test (:func:`paired_wilcoxon`).

:func:`mean_interval`: the percentile bootstrap interval of the mean (``scipy.stats.bootstrap``, seeded). It
lies inside the range of the values, so a mean of non-negative quantities (KL, FI, ratios of them) never gets
a negative bound. Below :func:`min_bootstrap_units` units there is no interval (NaN) and a table says why
(:data:`NEEDS_BOOTSTRAP`): with ``n`` units the resample made of one unit ``n`` times has probability
``n^(1-n)``, which at ``n <= 3`` exceeds the 2.5 % tail of a 95 % interval, so the "interval" would be the
smallest and largest value themselves (the data's range, not an estimate).
"""

from __future__ import annotations

import warnings

import numpy as np

CONFIDENCE = 0.95


def min_bootstrap_units(confidence: float = CONFIDENCE) -> int:
    """The fewest units whose percentile bootstrap interval of the mean is more than their range: the
    smallest ``n`` with ``n^(1-n) < (1 - confidence) / 2`` (4 at 95 %; module docstring)."""
    n = 2
    while n ** (1 - n) >= (1 - confidence) / 2:
        n += 1
    return n


MIN_BOOTSTRAP_UNITS = min_bootstrap_units()
NEEDS_BOOTSTRAP = f"needs ≥ {MIN_BOOTSTRAP_UNITS} documents for a bootstrap interval"


def mean_interval(
    values, n_resamples: int = 1000, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high) of the finite ``values``: the percentile bootstrap interval of the mean
    (``scipy.stats.bootstrap``, ``rng=np.random.default_rng(seed)``); NaN bounds below
    :func:`min_bootstrap_units` values or with ``n_resamples`` 0; constant values give (v, v, v)."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return (np.nan,) * 3
    mean = float(x.mean())
    if x.size < min_bootstrap_units(confidence) or n_resamples <= 0:
        return mean, np.nan, np.nan
    if np.ptp(x) == 0:
        return mean, mean, mean
    low, high = bootstrap_interval((x,), np.mean, n_resamples=n_resamples, confidence=confidence, seed=seed)
    return mean, low, high


def bootstrap_interval(
    data: tuple,
    statistic,
    *,
    paired: bool = False,
    vectorized: bool | None = None,
    n_resamples: int = 1000,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """(low, high): the percentile bootstrap interval of ``statistic`` over ``data`` (a tuple of samples,
    ``paired`` when they are resampled together), ``scipy.stats.bootstrap`` with ``rng=np.random.default_rng(seed)``.
    The one place the project bootstraps: means (:func:`mean_interval`), headroom ratios
    (:func:`fi_toolkit.probe.headroom.gap_closed`), correlations (:func:`fi_toolkit.studies.statistics.correlation`)
    and overlaps (:mod:`fi_toolkit.studies.agreement`). Degenerate resamples (a constant one) give no warning; the
    callers decide beforehand when there are too few units for an interval."""
    from scipy import stats  # here, so that importing the rule imports no scipy

    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        ci = stats.bootstrap(
            data,
            statistic,
            paired=paired,
            vectorized=vectorized,
            n_resamples=n_resamples,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        ).confidence_interval
    return float(ci.low), float(ci.high)


FEW_PAIRS, NO_DIFFERENCE = "few", "same"  # why paired_wilcoxon gives no test


def paired_wilcoxon(x, y, alternative: str = "two-sided") -> tuple[float, float, str]:
    """The Wilcoxon signed-rank test of paired values ``x`` against ``y`` (``scipy.stats.wilcoxon``; its exact null
    distribution with few pairs) -> ``(statistic, p, why)``: NaN and ``why`` :data:`FEW_PAIRS` below two pairs,
    :data:`NO_DIFFERENCE` where every pair is equal (no test is defined), else ``why`` ''. The one paired test of
    the studies and summaries; each table words ``why`` its own way."""
    from scipy import stats

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        return float("nan"), float("nan"), FEW_PAIRS
    if not np.any(x != y):
        return float("nan"), float("nan"), NO_DIFFERENCE
    w = stats.wilcoxon(x, y, alternative=alternative)
    return float(w.statistic), float(w.pvalue), ""
