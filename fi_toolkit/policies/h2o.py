"""H2O, heavy-hitter oracle (arXiv 2306.14048, Zhang et al. 2023): keep the entries with the largest
accumulated attention, plus the recent window.

"Accumulated" is one quantity on one scale: the softmax attention an entry has received, summed
over queries, unpooled, averaged over each GQA group (:func:`fi_toolkit.signals.formulas.attention_received`).
At prefill the queries are the observation window's (the full ``N x N`` matrix the paper sums over
is never built); during generation every generated token's attention is added step by step and
carried through compressions. Defaults: ``window=32`` (the recent part), ``budget=keep=0.25``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class H2O(Policy):
    name: ClassVar[str] = "h2o"
    tracks_accumulated: ClassVar[bool] = True

    def scores(self, s: Signals, layer: int):
        if s.accumulated is None:
            raise FIError("h2o needs accumulated attention; these signals were tracked without it")
        return s.accumulated[layer]
