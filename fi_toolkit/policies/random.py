"""Random eviction: a control baseline (as in kvpress' RandomPress; no paper of its own, cf. the
random baselines of SnapKV, arXiv 2404.14469). Keeps the window plus a uniformly random subset,
drawn independently per layer and head from ``seed``. Defaults: ``seed=0, window=32, budget=0.25``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fi_toolkit.policies.base import Policy, Signals


@dataclass
class RandomPolicy(Policy):
    seed: int = 0

    name: ClassVar[str] = "random"
    needs_signals: ClassVar[bool] = False

    def scores(self, s: Signals, layer: int):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + layer * 7919 + s.seen)
        hkv = s.keys[layer].shape[1]
        return torch.rand(hkv, s.slots(layer), generator=gen).to(s.keys[layer].device)
