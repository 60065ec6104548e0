"""The size of a work unit (``--unit-sets``, ``--unit-candidates``, ``--unit-policies``), checked without
numpy or pandas, so the command line refuses a bad one before anything heavy is imported
(:mod:`fi_toolkit.runs.resumable` splits the documents into such units)."""

from __future__ import annotations

from fi_toolkit.errors import FIError

MAX_UNIT_SIZE = 1_000_000  # items per work unit: past any document's sets, candidates or replays; more is a typo


def check_unit_size(size: int, option: str) -> int:
    """``unit_sets`` / ``unit_candidates`` / ``unit_policies`` (``option``, the parameter's name): 0 (one unit
    per document) to ``MAX_UNIT_SIZE``."""
    if size < 0:
        raise FIError(f"{option} must be >= 0 (0: one unit per document), got {size}", parameter=option)
    if size > MAX_UNIT_SIZE:
        raise FIError(
            f"{option} must be at most {MAX_UNIT_SIZE:,} items per unit (0: one unit per document), got {size}",
            parameter=option,
        )
    return size
