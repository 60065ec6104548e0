"""RPC, Reasoning Path Compression (arXiv 2505.13866, Song et al. 2025): periodic compression of the
generated tokens, scored by the attention of the most recent generated queries.

During generation the prompt is never compressed (``compress_prompt = False``: its slots are
protected); every ``interval`` tokens the generated entries are reduced so the whole cache fits the
budget, using the window attention of the last ``window`` generated queries (pooled like SnapKV).
Paper defaults: period 4096, selector window 32, 4x compression; here ``window=32,
budget=0.25`` and the period is ``generate(interval=...)``. On a prefill keep map (the probe)
nothing is protected, so it scores like SnapKV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class RPC(Policy):
    name: ClassVar[str] = "rpc"
    compress_prompt: ClassVar[bool] = False

    def scores(self, s: Signals, layer: int):
        return s.attention[layer]
