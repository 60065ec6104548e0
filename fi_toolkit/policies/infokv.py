"""InfoKV (arXiv 2606.26875, "Information-Aware KV Cache Compression for Long Reasoning").

``S = alpha * A + (1 - alpha) * softmax(E^(l))``, ``E^(l) = (D^(l) + tau) * H`` (docs/method.md,
signals 3-5), computed by :func:`fi_toolkit.signals.formulas.infokv_score`, the same function the trace uses;
the softmax runs over the slots the policy may evict (``[protected, n - w)``).
Defaults: ``alpha=0.9, tau=1.0, top_k=256, window=32, budget=0.25, adaptive=False``. ``alpha=1``
is SnapKV scoring exactly. ``adaptive=True`` gives layer ``l`` the share ``mean(E^(l)) / sum_m
mean(E^(m))`` of ``L * k`` entries (total exact, each layer within ``[window, held]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy, Signals, allocate
from fi_toolkit.signals.formulas import infokv_score, layer_entropy_score


@dataclass
class InfoKV(Policy):
    alpha: float = 0.9
    tau: float = 1.0
    top_k: int = 256  # entropy over the top-k logits (used when signals are traced for this policy)
    adaptive: bool = False

    name: ClassVar[str] = "infokv"
    needs_token_signals: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.alpha <= 1.0:
            raise FIError(f"alpha must lie in [0, 1], got {self.alpha}")

    def layer_entropy(self, s: Signals, layer: int) -> torch.Tensor:
        """``E^(l)`` over the candidate slots ``[protected, n - w)`` -> ``[Hkv, m]``."""
        lo, hi = s.protected[layer], s.slots(layer) - s.window
        return layer_entropy_score(s.distance[layer][:, lo:hi], s.entropy[layer][:, lo:hi], self.tau)

    def scores(self, s: Signals, layer: int) -> torch.Tensor:
        lo, hi = s.protected[layer], s.slots(layer) - s.window
        out = s.attention[layer].float().clone()
        out[:, lo:hi] = infokv_score(out[:, lo:hi], self.layer_entropy(s, layer), self.alpha)
        return out

    def layer_budgets(self, s: Signals, k: int) -> list[int]:
        if not self.adaptive:
            return super().layer_budgets(s, k)
        weights = torch.stack([self.layer_entropy(s, layer).mean() for layer in range(s.num_layers)])
        lo, hi = self.bounds(s)
        return allocate(weights, min(s.num_layers * k, sum(hi)), lo, hi)

    @property
    def label(self) -> str:
        return f"{self.name}{'-adaptive' if self.adaptive else ''}@{self.budget.label}"
