"""Random eviction: a control baseline (as in kvpress' RandomPress; no paper of its own, cf. the
random baselines of SnapKV, arXiv 2404.14469). Keeps the window plus a uniformly random subset,
drawn independently per layer and head from ``seed``. Defaults: ``seed=0, window=32, budget=0.25``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class RandomPolicy(Policy):
    seed: int = 0

    name: ClassVar[str] = "random"
    needs_signals: ClassVar[bool] = False
    no_layer_weight: ClassVar[str] = "draws its scores at random, with nothing to weigh layers by"

    def __post_init__(self):
        super().__post_init__()
        if self.seed < 0:
            raise FIError(f"seed must be >= 0, got {self.seed}")

    def scores(self, s: Signals, layer: int):
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + layer * 7919 + s.seen)
        hkv = s.keys[layer].shape[1]
        return torch.rand(hkv, s.slots(layer), generator=gen).to(s.keys[layer].device)
