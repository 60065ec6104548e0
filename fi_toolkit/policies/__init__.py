"""Eviction policies, one small dataclass per file (kvpress style), behind one contract:
``policy.keep_map(signals) -> KeepMap`` where ``signals`` is a prefill :class:`~fi_toolkit.signals.trace.Trace`
or the decoding :class:`Signals`. Add a policy: add a file and one line in ``POLICIES``.
"""

from __future__ import annotations

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy, Signals, allocate, select
from fi_toolkit.policies.h2o import H2O
from fi_toolkit.policies.infokv import InfoKV
from fi_toolkit.policies.knorm import KNorm
from fi_toolkit.policies.pyramidkv import PyramidKV
from fi_toolkit.policies.random import RandomPolicy
from fi_toolkit.policies.rpc import RPC
from fi_toolkit.policies.snapkv import SnapKV
from fi_toolkit.policies.streaming import StreamingLLM

POLICIES: dict[str, type[Policy]] = {
    "infokv": InfoKV,
    "snapkv": SnapKV,
    "pyramidkv": PyramidKV,
    "streaming": StreamingLLM,
    "h2o": H2O,
    "knorm": KNorm,
    "random": RandomPolicy,
    "rpc": RPC,
}


def make_policy(name: str, **kwargs) -> Policy:
    """``make_policy("infokv", budget="keep=0.25", alpha=0.9)``; options a policy does not have are ignored."""
    key = name.strip().lower()
    if key == "infokv-adaptive":
        key, kwargs = "infokv", {**kwargs, "adaptive": True}
    if key not in POLICIES:
        raise FIError(f"unknown policy '{name}' (choose from {', '.join(POLICIES)}, infokv-adaptive, "
                      "kvpress:NAME)")
    cls = POLICIES[key]
    fields = cls.__dataclass_fields__
    return cls(**{k: v for k, v in kwargs.items() if k in fields and v is not None})


__all__ = [
    "POLICIES", "Budget", "H2O", "InfoKV", "KNorm", "Policy", "PyramidKV", "RPC", "RandomPolicy", "Signals", "SnapKV",
    "StreamingLLM", "allocate", "make_policy", "select",
]
