"""KNorm (arXiv 2406.11430, Devoto et al. 2024): keep the entries whose keys have the lowest L2 norm.

Low key norm correlates with high attention; no query or signal is needed. Defaults:
``window=32, budget=0.25``. Not adaptive: its scores (negative norms) say nothing about how much a layer
needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class KNorm(Policy):
    name: ClassVar[str] = "knorm"
    needs_signals: ClassVar[bool] = False
    no_layer_weight: ClassVar[str] = "scores by negative key norms, not a mass to share layer budgets by"

    def scores(self, s: Signals, layer: int):
        return -s.keys[layer][0].float().norm(dim=-1)
