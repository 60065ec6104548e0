"""Per-token Forward Influence: which candidate positions to measure, and their leave-one-out FI.

``FI_j = FI({j}; C)`` for candidate positions ``j`` of ``[sinks, p - w)``, after the noise controls;
:class:`Measured` carries one document's values to :mod:`.correlation` and :mod:`.agreement`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from fi_toolkit.errors import FIError
from fi_toolkit.eviction import TokenSet
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import fi_table
from fi_toolkit.probe.forward_influence import ProbeResult, forward_influence
from fi_toolkit.signals.trace import Trace
from fi_toolkit.studies.study_options import SAMPLINGS, parse_candidates  # noqa: F401  (importable here too)


def candidate_positions(
    trace: Trace, spec: str = "sample:256", sinks: int = 4, seed: int = 0
) -> tuple[torch.Tensor, np.ndarray]:
    """Candidate positions from ``[sinks, p - w)`` and each one's weight (inverse inclusion probability,
    normalised to mean 1): ``all`` and ``sample:N`` (uniform) weigh every position equally."""
    kind, n = parse_candidates(spec)
    if seed < 0:
        raise FIError(f"seed must be >= 0, got {seed}", parameter="seed")
    if sinks < 0 or sinks >= trace.scored:
        raise FIError(
            f"sinks {sinks} leaves no candidates: the scored prefix [0, {trace.scored}) has {trace.scored} positions",
            parameter="sinks",
        )
    pool = torch.arange(sinks, trace.scored)
    if n is None or n >= pool.numel():
        return pool, np.ones(pool.numel())
    rng = np.random.default_rng(seed)
    if kind == "sample":
        picked = np.sort(rng.choice(pool.numel(), size=n, replace=False))
        return pool[picked], np.ones(n)
    order = np.argsort(trace.entropy[pool].numpy(), kind="stable")
    strata = np.array_split(order, n)
    picked = np.array([int(rng.choice(stratum)) for stratum in strata])
    weights = np.array([len(stratum) for stratum in strata], dtype=np.float64)
    by_position = np.argsort(picked)
    return pool[picked[by_position]], weights[by_position] / weights.mean()


def per_token_fi(
    model,
    trace: Trace,
    ids: torch.Tensor,
    positions: torch.Tensor,
    chunks: Sequence[Chunk],
    batch_size: int | None = None,
    block: int = 512,
    on_progress: Callable[[int], None] | None = None,
    controls: bool = True,
    reference=None,
) -> ProbeResult:
    """Leave-one-out FI of every position in one batched probe, every chunk in the same pass, after the
    noise controls (rows ``[0, 2)`` of the result; the candidates follow in order). ``controls=False``
    and a shared ``reference``: a later block of a document measured in parts."""
    evictions = [TokenSet(f"positions:{int(j)}", [int(j)], {"selector": "positions"}) for j in positions]
    return forward_influence(
        model,
        trace,
        ids,
        evictions,
        chunks,
        batch_size=batch_size,
        block=block,
        on_progress=on_progress,
        controls=controls,
        reference=reference,
    )


@dataclass
class Measured:
    """Per-token FI of one document: ``fi`` and ``below`` ``[n, K]`` at ``positions`` with their
    ``weights``, the controls' table, extra per-token columns (``name -> [n, K]``) and extra tables."""

    positions: torch.Tensor
    weights: np.ndarray
    fi: np.ndarray
    below: np.ndarray
    controls: pd.DataFrame
    columns: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)


def exact_fi(
    model,
    doc,
    trace: Trace,
    chunks: Sequence[Chunk],
    candidates: str = "sample:256",
    sinks: int = 4,
    seed: int = 0,
    batch_size: int | None = None,
    block: int = 512,
    on_progress: Callable[[int], None] | None = None,
    part: slice = slice(None),
    reference=None,
):
    """Leave-one-out FI of the candidate positions, with the noise controls -> :class:`.agreement.Measured`.

    ``part``: only that block of the candidates; the controls go with the block that starts at 0, and
    the other blocks' ``below`` and ``controls`` are None (:func:`assemble_parts` completes them)."""
    positions, weights = candidate_positions(trace, candidates, sinks, seed)
    positions, weights = positions[part], weights[part]
    with_controls = part.start in (None, 0)
    result = per_token_fi(
        model, trace, doc.ids, positions, chunks, batch_size, block, on_progress, with_controls, reference
    )
    controls = result.control_rows()
    measured = [i for i in range(len(result.evictions)) if i not in controls]
    fi = result.fi()[measured].double().numpy()
    if not with_controls:
        return Measured(positions, weights, fi, None, None)
    control_table = fi_table(doc, trace, result.rows(controls))
    return Measured(
        positions,
        weights,
        fi,
        result.below_noise_floor()[measured].numpy(),
        control_table[["document", "selection", "selector", "chunk", "chunk_start", "distance_from_p", "fi"]],
    )
