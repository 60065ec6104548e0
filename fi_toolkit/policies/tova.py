"""TOVA, token omission via attention (Oren et al., arXiv 2401.06104; kvpress's ``TOVAPress``): keep the entries
the last query attends to most.

Score: :func:`fi_toolkit.policies.learned.features.tova`, the softmax attention of the last row's query over the cache,
averaged over every query head of the layer (the paper's layer-wise variant, as kvpress: one score for every KV
head). Equal to the press's ``score`` (tests/test_features_kvpress.py); the most recent ``window`` entries are
always kept, as by every policy here (the paper keeps none by rule). Defaults: ``window=32, budget=0.25``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class TOVA(Policy):
    name: ClassVar[str] = "tova"

    def scores(self, s: Signals, layer: int):
        from fi_toolkit.policies.learned.features import tova_scores

        return tova_scores(s, layer)
