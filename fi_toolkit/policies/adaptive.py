"""Adaptive layer budgets for any scored policy: ``Adaptive(policy)`` (as kvpress's ``AdaKVPress`` wraps a
scorer press; AdaKV, arXiv 2407.11550, shares a budget out by scores, here across layers).

The wrapped policy ranks the entries of each layer as it always does (:meth:`Policy.scores`); only the
per-layer budgets change: the ``L * k`` entries a uniform policy would keep (``k`` per layer, fewer if the
layers hold less) are split over the layers in proportion to the policy's :meth:`Policy.layer_weight`,
each layer within ``[protected + window, held]`` and the total exact (:func:`~fi_toolkit.policies.base.allocate`).
The weight of layer ``l``:

* InfoKV: ``mean(E^(l))`` over the candidate slots and heads (docs/method.md), so
  ``Adaptive(InfoKV(...))`` is what ``infokv-adaptive`` has always been;
* any other scored policy, unless it overrides ``layer_weight``: the mean of its scores over the
  candidate slots ``[protected, n - w)`` and heads. For the attention policies (SnapKV, PyramidKV, RPC,
  H2O) that is the attention the queries pay to the entries that may be evicted: layers that look
  further back keep more.

Policies without scores to weigh layers by are refused in one line (StreamingLLM, random, KNorm, kvpress
presses: :attr:`Policy.no_layer_weight` says why). Spelled ``adaptive(NAME)`` (or ``NAME-adaptive``); its
label is ``NAME-adaptive@BUDGET`` (``infokv-adaptive@keep=0.25``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy, allocate

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    import torch

    from fi_toolkit.signals.policy_view import Signals


@dataclass
class Adaptive(Policy):
    """``Adaptive(policy)``: ``policy``'s scores, budgets per layer in proportion to its layer weights.
    Its budget and window are the wrapped policy's; its options (``alpha``, ``top_k``, ...) read as the
    wrapped policy's, so the signal options follow it."""

    policy: Policy | None = None
    budget: Budget | str | float | int = field(init=False, default="keep=0.25")
    window: int = field(init=False, default=32)

    name: ClassVar[str] = "adaptive"

    def __post_init__(self):
        inner = self.policy
        if not isinstance(inner, Policy):
            raise FIError(f"Adaptive wraps a policy, got {type(inner).__name__}")
        if isinstance(inner, Adaptive):
            raise FIError(f"{inner.name} is adaptive already")
        if inner.no_layer_weight:
            raise FIError(
                f"adaptive({inner.name}): {inner.name} {inner.no_layer_weight}; wrap a scored policy "
                "(infokv, snapkv, pyramidkv, h2o, rpc)"
            )
        self.budget, self.window = inner.budget, inner.window
        super().__post_init__()
        base, colon, options = inner.name.partition(":")
        self.name = f"{base}-adaptive{colon}{options}"  # as result tables name it: infokv-adaptive

    def __getattr__(self, attr: str):
        """The wrapped policy's options (``alpha``, ``tau``, ``top_k``, ``sinks``, ...)."""
        if attr.startswith("_") or attr == "policy":
            raise AttributeError(attr)
        return getattr(self.policy, attr)

    compress_prompt = property(lambda self: self.policy.compress_prompt)
    needs_signals = property(lambda self: self.policy.needs_signals)
    needs_token_signals = property(lambda self: self.policy.needs_token_signals)
    tracks_accumulated = property(lambda self: self.policy.tracks_accumulated)
    prefill_only = property(lambda self: self.policy.prefill_only)
    uneven_heads = property(lambda self: self.policy.uneven_heads)

    def scores(self, s: Signals, layer: int) -> torch.Tensor:
        """The wrapped policy's scores ``[Hkv, n_l]`` of layer ``layer`` (higher = keep)."""
        return self.policy.scores(s, layer)

    def layer_budgets(self, s: Signals, k: int) -> list[int]:
        """``min(L * k, held)`` entries split in proportion to the layer weights, each layer within its bounds."""
        import torch

        weights = torch.stack([torch.as_tensor(self.policy.layer_weight(s, layer)) for layer in range(s.num_layers)])
        lo, hi = self.bounds(s)
        return allocate(weights, min(s.num_layers * k, sum(hi)), lo, hi)
