"""Eviction policies, one small dataclass per file (kvpress style), behind one contract:
``policy.keep_map(signals) -> KeepMap`` where ``signals`` is a prefill :class:`~fi_toolkit.signals.trace.Trace`
or the decoding :class:`Signals`. ``Adaptive(policy)`` gives a scored policy adaptive layer budgets.
Every policy is named in one registry (:mod:`fi_toolkit.policies.registry`: ``NAME[:key=value,...]``,
``resolve``, ``entries``); add a policy: add a file and one ``register(...)`` line there.
"""

from __future__ import annotations

from fi_toolkit.budget import Budget
from fi_toolkit.policies.adaptive import Adaptive
from fi_toolkit.policies.base import Policy, allocate, select
from fi_toolkit.policies.expected_attention import ExpectedAttention
from fi_toolkit.policies.fi_oracle import FIOracle
from fi_toolkit.policies.h2o import H2O
from fi_toolkit.policies.infokv import InfoKV
from fi_toolkit.policies.knorm import KNorm
from fi_toolkit.policies.learned import Fitted, Learned
from fi_toolkit.policies.pyramidkv import PyramidKV
from fi_toolkit.policies.random import RandomPolicy
from fi_toolkit.policies.registry import (
    entries,
    make_policy,
    parse_policy,
    policy_help,
    register,
    resolve,
    split_policies,
)
from fi_toolkit.policies.rpc import RPC
from fi_toolkit.policies.snapkv import SnapKV
from fi_toolkit.policies.streaming import StreamingLLM
from fi_toolkit.policies.tova import TOVA

__all__ = [
    "Adaptive",
    "Budget",
    "ExpectedAttention",
    "FIOracle",
    "Fitted",
    "Learned",
    "H2O",
    "InfoKV",
    "KNorm",
    "Policy",
    "PyramidKV",
    "RPC",
    "RandomPolicy",
    "Signals",
    "SnapKV",
    "StreamingLLM",
    "TOVA",
    "allocate",
    "entries",
    "make_policy",
    "parse_policy",
    "policy_help",
    "register",
    "resolve",
    "select",
    "split_policies",
]


def __getattr__(name: str):
    """``Signals`` (:mod:`fi_toolkit.signals.policy_view`, which needs torch) on first use: naming a policy needs no
    torch."""
    if name == "Signals":
        from fi_toolkit.signals.policy_view import Signals

        return Signals
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
