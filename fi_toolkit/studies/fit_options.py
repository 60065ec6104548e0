"""The options of a policy fit (features, target, ridge penalty), checked without numpy or torch: the
command line refuses a bad one before anything heavy is imported (:mod:`fi_toolkit.studies.fit` fits)."""

from __future__ import annotations

import math
from typing import Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.policies.features import check_feature_names
from fi_toolkit.policies.fitted import FEATURES

TARGETS = ("rank", "log")
DEFAULT_FEATURES = tuple(FEATURES)  # every feature, at a prefill and while decoding
DECODING_FEATURES = tuple(f for f in FEATURES if f != "entropy_next")  # without the other convention's H


def check_fit_options(features: Sequence[str], target: str, penalty: float) -> None:
    """Refuse an unknown, missing or repeated feature, an unknown target, or a penalty that is not a finite
    number >= 0 (FIError naming the parameter)."""
    check_feature_names(features, FEATURES)
    if target not in TARGETS:
        raise FIError(f"target must be one of {', '.join(TARGETS)}, got '{target}'", parameter="target")
    ok = isinstance(penalty, (int, float)) and not isinstance(penalty, bool) and math.isfinite(penalty)
    if not (ok and penalty >= 0):
        raise FIError(f"penalty must be a finite number >= 0, got {penalty}", parameter={"penalty": "ridge"})
