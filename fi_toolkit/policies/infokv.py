"""InfoKV (arXiv 2606.26875, "Information-Aware KV Cache Compression for Long Reasoning").

``S = alpha * A + (1 - alpha) * softmax(E^(l))``, ``E^(l) = (D^(l) + tau) * H`` (docs/method.md,
signals 3-5), computed by :func:`fi_toolkit.signals.formulas.infokv_score`, the same function the trace uses;
the softmax runs over the slots the policy may evict (``[protected, n - w)``).
Defaults: ``alpha=0.9, tau=1.0, top_k=256, window=32, budget=0.25``. ``alpha=1`` is SnapKV scoring
exactly. Adaptive budgets (``Adaptive(InfoKV())``, spelled ``infokv-adaptive`` or ``adaptive(infokv)``)
give layer ``l`` the share ``mean(E^(l)) / sum_m mean(E^(m))`` of ``L * k`` entries (total exact, each
layer within ``[window, held]``): :meth:`InfoKV.layer_weight` is ``mean(E^(l))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    import torch

    from fi_toolkit.signals.policy_view import Signals


@dataclass
class InfoKV(Policy):
    alpha: float = 0.9
    tau: float = 1.0
    top_k: int = 256  # entropy over the top-k logits (used when signals are traced for this policy)

    name: ClassVar[str] = "infokv"
    needs_token_signals: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.alpha <= 1.0:  # also refuses NaN
            raise FIError(f"alpha must lie in [0, 1], got {self.alpha}")
        if not math.isfinite(self.tau):
            raise FIError(f"tau must be a finite number, got {self.tau}")
        if self.tau < 0:
            raise FIError(f"tau must be >= 0, got {self.tau}")
        if self.top_k < 1:
            raise FIError(f"top_k must be >= 1, got {self.top_k}")

    def layer_entropy(self, s: Signals, layer: int) -> torch.Tensor:
        """``E^(l)`` over the candidate slots ``[protected, n - w)`` -> ``[Hkv, m]``."""
        from fi_toolkit.signals.formulas import layer_entropy_score

        lo, hi = s.protected[layer], s.slots(layer) - s.window
        return layer_entropy_score(s.distance[layer][:, lo:hi], s.entropy[layer][:, lo:hi], self.tau)

    def scores(self, s: Signals, layer: int) -> torch.Tensor:
        """``S`` on the candidate slots, the window attention ``A`` elsewhere -> ``[Hkv, n_l]``."""
        from fi_toolkit.signals.formulas import infokv_score

        lo, hi = s.protected[layer], s.slots(layer) - s.window
        out = s.attention[layer].float().clone()
        out[:, lo:hi] = infokv_score(out[:, lo:hi], self.layer_entropy(s, layer), self.alpha)
        return out

    def layer_weight(self, s: Signals, layer: int) -> torch.Tensor:
        """``mean(E^(l))`` over the candidate slots and heads (the paper's adaptive layer budgets)."""
        return self.layer_entropy(s, layer).mean()
