"""KNorm (arXiv 2406.11430, Devoto et al. 2024): keep the entries whose keys have the lowest L2 norm.

Low key norm correlates with high attention; no query or signal is needed. Defaults:
``window=32, budget=0.25``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fi_toolkit.policies.base import Policy, Signals


@dataclass
class KNorm(Policy):
    name: ClassVar[str] = "knorm"
    needs_signals: ClassVar[bool] = False

    def scores(self, s: Signals, layer: int):
        return -s.keys[layer][0].float().norm(dim=-1)
