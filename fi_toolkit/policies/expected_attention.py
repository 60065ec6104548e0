"""ExpectedAttention (Devoto et al., arXiv 2510.00636; kvpress's ``ExpectedAttentionPress``): keep the entries the
future queries are expected to attend to most, times their value norm.

Score: :func:`fi_toolkit.policies.learned.features.expected_attention`, the attention of a Gaussian model of the queries
(mean and covariance of the pre-RoPE queries of the rows fed since the last compression, past the first 4,
rotated by RoPE averaged over the next 512 positions) over each key, averaged over the KV group, times
``||v||``; the first 4 slots are kept as the press keeps its sinks. Equal to the press's ``score`` on the same
rows, keys and values (tests/test_features_kvpress.py); unlike the press, the most recent ``window`` entries
are always kept, as by every policy here. While decoding it needs more than 4 rows fed since the last compression
(the press's buffer of rows, emptied at each compression); the future starts at the next position. Defaults:
``window=32, budget=0.25``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    from fi_toolkit.signals.policy_view import Signals


@dataclass
class ExpectedAttention(Policy):
    name: ClassVar[str] = "expected_attention"

    def scores(self, s: Signals, layer: int):
        from fi_toolkit.policies.learned.features import expected_attention_scores

        return expected_attention_scores(s, layer)
