"""H2O, heavy-hitter oracle (arXiv 2306.14048, Zhang et al. 2023): keep the entries with the largest
accumulated attention, plus the recent window.

"Accumulated" here is the attention an entry has received from every query available without an
``N x N`` matrix: at prefill, the sum over the observation-window queries (the window attention
times ``window``; so H2O ranks the prompt like SnapKV); during generation, plus the attention of
every generated token, added step by step (mean over each GQA group) and carried through
compressions. The paper also accumulates over all prompt queries, which would need the full
attention matrix. Defaults: ``window=32`` (the recent part), ``budget=0.25``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Policy, Signals


@dataclass
class H2O(Policy):
    name: ClassVar[str] = "h2o"
    tracks_accumulated: ClassVar[bool] = True

    def scores(self, s: Signals, layer: int):
        if s.accumulated is not None:
            return s.accumulated[layer]
        return s.attention[layer] * s.window
