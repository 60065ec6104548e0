"""PyramidKV (arXiv 2406.02069, Cai et al. 2024): SnapKV scoring with pyramid-shaped layer budgets.

Lower layers keep more: beyond the window, layer ``l`` keeps ``max - l * (max - min) / (L - 1)``
with ``min = (k - w) / beta`` and ``max = 2 (k - w) - min`` (the paper's schedule), so the mean is
the uniform budget ``k``; rounded so the total is exactly ``L * k``. Defaults: ``beta=20,
window=32, budget=0.25``; ``beta >= 1`` (below 1 the pyramid would widen with depth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy, allocate

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class PyramidKV(Policy):
    beta: float = 20.0

    name: ClassVar[str] = "pyramidkv"

    def __post_init__(self):
        super().__post_init__()
        if not (math.isfinite(self.beta) and self.beta >= 1):  # below 1 the pyramid turns upside down
            raise FIError(f"beta must be a finite number >= 1, got {self.beta}")

    def scores(self, s: Signals, layer: int):
        return s.attention[layer]

    def layer_budgets(self, s: Signals, k: int) -> list[int]:
        import torch

        n_layers, extra = s.num_layers, k - self.window
        low = extra / self.beta
        high = 2 * extra - low
        steps = torch.arange(n_layers, dtype=torch.float64) / max(n_layers - 1, 1)
        weights = self.window + high - steps * (high - low)
        lo, hi = self.bounds(s)
        return allocate(weights, min(n_layers * k, sum(hi)), lo, hi)
