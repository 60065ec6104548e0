"""StreamingLLM (arXiv 2309.17453, Xiao et al. 2023): attention sinks plus the most recent tokens.

Keeps the first ``sinks`` positions and the ``budget - sinks`` most recent ones (which include the
window). No signals needed. Defaults: ``sinks=4, window=32, budget=0.25``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class StreamingLLM(Policy):
    sinks: int = 4

    name: ClassVar[str] = "streaming"
    needs_signals: ClassVar[bool] = False
    no_layer_weight: ClassVar[str] = "keeps tokens by position, with no scores to weigh layers by"

    def __post_init__(self):
        super().__post_init__()
        if self.sinks < 0:
            raise FIError(f"sinks must be >= 0, got {self.sinks}")

    def scores(self, s: Signals, layer: int):
        import torch

        pos = s.positions[layer].float()
        return torch.where(pos < self.sinks, pos.max() + 1, pos)  # sinks above every recent position
