"""Eviction policies, one small dataclass per file (kvpress style), behind one contract:
``policy.keep_map(signals) -> KeepMap`` where ``signals`` is a prefill :class:`~fi_toolkit.trace.Trace`
or the decoding :class:`Signals`. Add a policy: add a file and one line in ``POLICIES``.
"""

from __future__ import annotations

from ..errors import FIError
from ..budget import Budget
from .base import Policy, Signals, allocate, select
from .h2o import H2O
from .infokv import InfoKV
from .knorm import KNorm
from .pyramidkv import PyramidKV
from .random import RandomPolicy
from .rpc import RPC
from .snapkv import SnapKV
from .streaming import StreamingLLM

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
    if key.startswith("kvpress:"):  # a kvpress press (fi_toolkit.kvpress_bridge), with the budget given
        from ..kvpress_bridge import press_policy

        return press_policy(name, kwargs.get("budget"), kwargs.get("window"))
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
