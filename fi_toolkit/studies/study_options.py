"""The studies' options checked without torch, pandas or scipy (the command line refuses a bad one before
anything heavy is imported; :mod:`fi_toolkit.studies.study` runs the studies): ``--candidates``,
``--estimator`` with ``--samples`` and ``--validate``, ``--unit-candidates``."""

from __future__ import annotations

import re

from fi_toolkit.errors import FIError
from fi_toolkit.probe.estimator_options import ESTIMATORS, check_samples
from fi_toolkit.runs.units import check_unit_size

SAMPLINGS = ("all", "sample", "stratified")


def parse_candidates(spec: str) -> tuple[str, int | None]:
    """``"all"`` -> ("all", None); ``"sample:256"`` -> ("sample", 256); ``"stratified:64"`` -> ("stratified", 64)."""
    text = spec.strip().lower()
    if text == "all":
        return "all", None
    m = re.fullmatch(r"(sample|stratified):(\d+)", text)
    if not m or int(m.group(2)) < 1:
        raise FIError(
            f"invalid candidates '{spec}': use 'all', 'sample:N' (uniform) or 'stratified:N' "
            "(by entropy, reweighted) with N >= 1, e.g. sample:256",
            parameter="candidates",
        )
    return m.group(1), int(m.group(2))


def check_unit_candidates(unit_candidates: int, estimator: str) -> None:
    """``--unit-candidates`` lies in ``[0, MAX_UNIT_SIZE]`` and splits exact per-token FI only."""
    check_unit_size(unit_candidates, "unit_candidates")
    if unit_candidates and estimator != "exact":
        raise FIError(
            "unit_candidates splits exact per-token FI; the fisher estimate is one unit per document",
            parameter="unit_candidates",
        )


def check_estimator(estimator: str, samples: int, validate: int, candidates: int) -> None:
    """``--estimator`` is exact or fisher; ``--samples >= 1``; ``--validate`` within ``[0, candidates]``."""
    if estimator not in ESTIMATORS:
        raise FIError(f"unknown estimator '{estimator}' (choose {' or '.join(ESTIMATORS)})", parameter="estimator")
    check_samples(samples)
    if validate < 0 or validate > candidates:
        raise FIError(
            f"validate {validate} must lie in [0, {candidates}], the number of candidate positions",
            parameter="validate",
        )
