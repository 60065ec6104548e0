"""SnapKV (arXiv 2404.14469, Li et al. 2024): keep the entries the observation window attends to most.

Score: window attention of the last ``window`` queries, averaged over them, average-pooled over
positions (kernel 7), averaged over each GQA group. Defaults: ``window=32, budget=0.25`` (the pool
kernel is a signal option, ``SignalConfig.pool_kernel``). Equals InfoKV with ``alpha=1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class SnapKV(Policy):
    name: ClassVar[str] = "snapkv"

    def scores(self, s: Signals, layer: int):
        return s.attention[layer]
