"""The estimators of per-token FI and the Fisher estimator's label draws, checked without torch (the
command line refuses a bad ``--estimator`` or ``--samples`` before anything heavy is imported;
:mod:`fi_toolkit.probe.estimator` is the estimator)."""

from __future__ import annotations

from fi_toolkit.errors import FIError

ESTIMATORS = ("exact", "fisher")
DEFAULT_SAMPLES = 16
MAX_SAMPLES = 10_000  # label draws per chunk: the standard error falls as 1/sqrt(samples); more is a typo


def check_samples(samples: int) -> int:
    if samples < 1:
        raise FIError(f"samples must be >= 1, got {samples}", parameter="samples")
    if samples > MAX_SAMPLES:
        raise FIError(f"samples must be at most {MAX_SAMPLES:,}, got {samples}", parameter="samples")
    return samples
