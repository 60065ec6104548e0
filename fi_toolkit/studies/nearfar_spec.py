"""The near/far study's parameters, parsed and checked without torch, pandas or scipy (the command line
checks them before anything heavy is imported; :mod:`fi_toolkit.studies.nearfar` runs the study):
distances from ``p`` -> chunks, one budget and a number of seeds -> the ``--select`` specs of the sets."""

from __future__ import annotations

from typing import Sequence

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.selections import MAX_SEEDS, SCORE_SELECTORS


def nearfar_chunks(prefix: int, distances: Sequence[int], chunk_len: int) -> list[Chunk]:
    if chunk_len < 1:
        raise FIError(f"chunk_len must be >= 1, got {chunk_len}", parameter="chunk_len")
    if not distances:
        raise FIError("distances is empty: give distances from p like 0,256,512", parameter="distances")
    if any(d < 0 for d in distances):
        raise FIError("distances must be >= 0 (a chunk cannot start before p)", parameter="distances")
    if len(set(distances)) != len(distances):
        raise FIError("distances holds a distance twice", parameter="distances")
    return [Chunk(prefix + d, prefix + d + chunk_len) for d in sorted(distances)]


def parse_distances(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FIError(f"invalid distances '{text}': expected integers like 0,256,512", parameter="distances") from None


def nearfar_selections(budget: Budget | str, seeds: int) -> list[str]:
    """``--select`` specs of the study: every score-based selector and ``seeds`` random sets, one budget."""
    budget = Budget.parse(budget)
    if budget.kept(1_000_000) in (0, 1_000_000) and budget.is_share:
        raise FIError(
            f"budget {budget.label} removes nothing or everything; use a share strictly between 0 and 1",
            parameter="budget",
        )
    if not 1 <= seeds <= MAX_SEEDS:
        raise FIError(f"seeds must lie in [1, {MAX_SEEDS}], got {seeds}", parameter="seeds")
    return [f"{k}:{budget.label}" for k in SCORE_SELECTORS] + [f"random:{budget.label}@0-{seeds - 1}"]
