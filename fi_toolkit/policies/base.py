"""The policy contract: signals in, keep map out (docs/method.md, "Eviction policies").

Signals live in *slot space*: slot ``j`` of layer ``l``, KV head ``h`` is the ``j``-th entry of that
head's cache, whose original position is ``positions[l][h, j]``. Right after a prefill, slots are
positions (``Signals.from_trace``); during decoding, earlier compressions have made the positions of
each head different, and per-position signals (H, D) are gathered into slot space. The last
``window`` slots are the most recent tokens (always kept); the first ``protected[l]`` slots are never
evicted (the prompt, when it is not compressible). A keep map lists, per layer, the sorted slots
each head keeps (``[Hkv, k_l]``), which for a prefill are prompt positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError

if TYPE_CHECKING:  # torch (and what needs it) is imported where it is used: naming a policy needs none of it
    import torch

    from fi_toolkit.eviction import KeepMap
    from fi_toolkit.signals.policy_view import Signals


def __getattr__(name: str):
    """``Signals`` (defined with the signals; policies import it from here), imported on first use."""
    if name == "Signals":
        from fi_toolkit.signals.policy_view import Signals

        return Signals
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def as_signals(signals) -> Signals:
    from fi_toolkit.signals.policy_view import Signals

    return signals if isinstance(signals, Signals) else Signals.from_trace(signals)


def allocate(weights: torch.Tensor, total: int, lo: list[int], hi: list[int]) -> list[int]:
    """Split ``total`` over layers in proportion to ``weights``, each in ``[lo_l, hi_l]``, summing exactly.

    Shares are ``clamp(lambda * w_l, lo_l, hi_l)`` with ``lambda`` found by bisection so that they
    sum to ``total``; they are then rounded by largest remainder, so the total is exact.

    Args:
        weights: ``[L]`` non-negative weights, one per layer.
        total: entries to split, ``sum(lo) <= total <= sum(hi)``.
        lo: per-layer lower bounds, ``L`` ints.
        hi: per-layer upper bounds, ``L`` ints.

    Returns:
        ``L`` ints, each in ``[lo_l, hi_l]``, summing to ``total``.
    """
    import torch

    n = len(lo)
    if total < sum(lo) or total > sum(hi):
        raise FIError(f"cannot split {total} entries over {n} layers within [{sum(lo)}, {sum(hi)}]")
    w = weights.detach().double().clamp_min(0).cpu()
    w = w if w.sum() > 0 else torch.ones(n, dtype=torch.float64)
    lo_t, hi_t = torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64)

    def shares(lam: float) -> torch.Tensor:
        return torch.minimum(torch.maximum(lam * w, lo_t), hi_t)

    a, b = 0.0, float(hi_t.max() / w[w > 0].min()) + 1.0
    for _ in range(200):
        mid = (a + b) / 2
        a, b = (mid, b) if shares(mid).sum() < total else (a, mid)
    share = shares(b).tolist()
    out = [min(h, max(l, math.floor(x))) for x, l, h in zip(share, lo, hi)]
    order = sorted(range(n), key=lambda i: (out[i] - share[i], i))  # largest fractional part first
    while sum(out) != total:
        step = 1 if sum(out) < total else -1
        for i in order if step > 0 else reversed(order):
            if sum(out) != total and lo[i] <= out[i] + step <= hi[i]:
                out[i] += step
    return out


def select(scores: torch.Tensor, keep: int, protected: int, window: int) -> torch.Tensor:
    """Sorted slots ``[Hkv, keep]``: the protected slots, the window, and the top-scored of the rest.

    Args:
        scores: ``[Hkv, n]``, higher = keep; only slots ``[protected, n - window)`` are read.
        keep: slots kept per head, ``protected + window <= keep <= n``.
        protected: the first slots, always kept (RPC's prompt; 0 otherwise).
        window: the last slots, always kept.

    Returns:
        ``[Hkv, keep]`` int64 slot indices, sorted per head; ties go to the earlier slot.
    """
    import torch

    hkv, n = scores.shape
    device = scores.device
    candidates = scores[:, protected : n - window].float()
    if not torch.isfinite(candidates).all():
        raise FIError(
            "a policy produced non-finite scores (NaN or inf) for entries it may evict; refusing to rank them"
        )
    if keep >= n:
        return torch.arange(n, device=device).expand(hkv, n).clone()
    picks = keep - protected - window
    if picks < 0:
        raise FIError(f"a budget of {keep} cannot hold the {protected} protected entries and the window of {window}")
    order = torch.sort(candidates, dim=-1, descending=True, stable=True).indices[:, :picks] + protected
    fixed = torch.cat([torch.arange(protected, device=device), torch.arange(n - window, n, device=device)])
    return torch.sort(torch.cat([fixed.expand(hkv, -1), order], dim=-1), dim=-1).values


def select_across_heads(scores: torch.Tensor, keep: int, protected: int, window: int) -> list[torch.Tensor]:
    """Per KV head, its sorted kept slots when a layer's budget is shared over its heads by scores (AdaKV,
    arXiv 2407.11550): every head keeps its protected slots and its window, and the
    ``Hkv * (keep - protected - window)`` top-scored candidates over all the heads together fill the rest, so
    the layer keeps exactly what :func:`select` keeps in all, and one head may keep more than ``keep``, another
    fewer (never fewer than ``protected + window``).

    Args:
        scores: ``[Hkv, n]``, higher = keep, comparable across heads; only slots ``[protected, n - window)``
            are read, in their own dtype (float64 scores are not rounded).
        keep: the uniform per-head budget, ``protected + window <= keep <= n``.
        protected: the first slots of every head, always kept.
        window: the last slots of every head, always kept.

    Returns:
        ``Hkv`` sorted int64 tensors of slot indices. Ties go to the earlier slot, then the lower head, so
        equal scores keep what :func:`select` keeps (the earliest candidates of every head).
    """
    import torch

    hkv, n = scores.shape
    device = scores.device
    candidates = scores[:, protected : n - window]
    if not torch.isfinite(candidates).all():
        raise FIError(
            "a policy produced non-finite scores (NaN or inf) for entries it may evict; refusing to rank them"
        )
    if keep >= n:
        return [torch.arange(n, device=device) for _ in range(hkv)]
    picks = keep - protected - window
    if picks < 0:
        raise FIError(f"a budget of {keep} cannot hold the {protected} protected entries and the window of {window}")
    slot_major = candidates.t().reshape(-1)  # index j * Hkv + h: a stable sort puts ties in slot, then head order
    order = torch.sort(slot_major, descending=True, stable=True).indices[: hkv * picks]
    chosen = torch.zeros(hkv, candidates.shape[1], dtype=torch.bool, device=device)
    chosen[order % hkv, order // hkv] = True
    fixed = torch.cat([torch.arange(protected, device=device), torch.arange(n - window, n, device=device)])
    return [torch.sort(torch.cat([fixed, torch.nonzero(c).flatten() + protected])).values for c in chosen]


def select_live(
    scores: torch.Tensor, keep: int, protected: int, window: int, dead: torch.Tensor, across_heads: bool = False
) -> list[torch.Tensor]:
    """:func:`select` (``across_heads``: :func:`select_across_heads`) over each head's *live* slots, as if its dead
    slots (``dead [Hkv, n]``, True: the pad of an uneven keep map held in a dense cache) were deleted: a head's
    protected slots are its first ``protected`` live ones, its window its last ``window`` live ones, and only the
    live slots between are candidates (their scores must be finite; dead slots' scores are never read). A head
    holding ``keep`` live slots or fewer keeps them all. Across heads, the layer keeps ``Hkv * keep`` live slots
    in all (everything live, if fewer): every head's protected slots and window, then the top-scored candidates
    over all the heads (ties: the earlier slot, then the lower head). A dead slot is never kept.

    Returns:
        ``Hkv`` sorted int64 tensors of slot indices (counts may differ per head).
    """
    import torch

    hkv, n = scores.shape
    if keep - protected - window < 0:
        raise FIError(f"a budget of {keep} cannot hold the {protected} protected entries and the window of {window}")
    live = ~dead.to(scores.device)
    held = live.sum(dim=1)  # [Hkv]
    rank = live.cumsum(dim=1) - 1  # each slot's index among its head's live slots
    fixed = live & ((rank < protected) | (rank >= (held - window)[:, None]))
    candidates = live & ~fixed
    values = scores if across_heads else scores.float()
    if not torch.isfinite(values[candidates]).all():
        raise FIError(
            "a policy produced non-finite scores (NaN or inf) for entries it may evict; refusing to rank them"
        )
    ranked = values.masked_fill(~candidates, float("-inf"))
    chosen = fixed.clone()
    if across_heads:
        if int(held.sum()) <= hkv * keep:
            chosen = live
        else:
            picks = hkv * keep - int(fixed.sum())
            slot_major = ranked.t().reshape(-1)  # index j * Hkv + h: ties in slot, then head order
            order = torch.sort(slot_major, descending=True, stable=True).indices[:picks]
            chosen[order % hkv, order // hkv] = True
    else:
        for h in range(hkv):
            if int(held[h]) <= keep:
                chosen[h] = live[h]
            else:
                order = torch.sort(ranked[h], descending=True, stable=True).indices[: keep - protected - window]
                chosen[h, order] = True
    return [torch.nonzero(c).flatten() for c in chosen]


@dataclass
class Policy:
    """Base of every policy: a :class:`~fi_toolkit.budget.Budget` and the observation window.

    The budget acts on the entries the policy may compress: at a point that has seen ``n`` tokens
    whose first ``protected`` are never evicted (RPC's prompt), the cache keeps
    ``protected + budget.kept(n - protected)`` entries per layer and head, window included. A bare
    number is what is kept (``0.25``: a quarter; ``512``: 512 entries). Subclasses define
    :meth:`scores` (higher = keep) and may override :meth:`layer_budgets` (uneven per-layer budgets) and
    :meth:`layer_weight` (what :class:`~fi_toolkit.policies.adaptive.Adaptive` shares layer budgets by).
    Every field but ``budget`` is an option of the command line's spelling ``NAME:key=value``
    (:mod:`fi_toolkit.policies.registry`); a subclass validates its fields in ``__post_init__`` with messages
    that name them."""

    budget: Budget | str | float | int = "keep=0.25"
    window: int = 32

    name: ClassVar[str] = "policy"
    compress_prompt: ClassVar[bool] = True  # RPC: False (only generated tokens are compressed)
    needs_signals: ClassVar[bool] = True  # False: no signal tracking during generation
    needs_token_signals: ClassVar[bool] = False  # True: H and D^(l) per token (InfoKV), not only window queries
    tracks_accumulated: ClassVar[bool] = False  # H2O: accumulate attention over decoding steps
    prefill_only: ClassVar[bool] = False  # kvpress presses: compress the prompt only, never while decoding
    no_layer_weight: ClassVar[str] = ""  # why Adaptive refuses the policy (no scores to share layers by); "": it can
    uneven_heads: ClassVar[bool] = False  # True: heads of a layer keep different counts (decoding pads and masks)
    needs_model: ClassVar[bool] = False  # True: scores from the model's own forward of the tokens (the surrogate)

    def __post_init__(self):
        self.budget = Budget.parse(self.budget)
        if self.window < 1:
            raise FIError(f"window must be >= 1, got {self.window}")

    @property
    def label(self) -> str:
        return f"{self.name}@{self.budget.label}"

    def kept_total(self, seen: int, protected: int = 0) -> int:
        """Entries per layer and head that stay at a point that has seen ``seen`` tokens (unvalidated)."""
        return protected + self.budget.kept(seen - protected)

    def tokens(self, seen: int, protected: int = 0) -> int:
        """:meth:`kept_total`, validated: the budget must fit the compressible tokens and exceed the window."""
        n = seen - protected
        if self.budget.exceeds(n):
            raise FIError(
                f"budget {self.budget.label} asks for more than the {n} compressible tokens "
                f"(the sequence length is {seen})"
            )
        kept = self.budget.kept(n)
        if kept <= self.window:
            raise FIError(
                f"budget {self.budget.label} keeps {kept} of {n} tokens, not above the window of {self.window}: "
                "nothing but the window would fit"
            )
        return protected + kept

    def scores(self, s: Signals, layer: int) -> torch.Tensor:  # pragma: no cover - abstract
        """How much each entry of one layer should stay.

        Args:
            s: the signals, per layer ``l`` lists of ``[Hkv, n_l]`` tensors in slot space (``s.keys[l]``:
                ``[1, Hkv, n_l, head_dim]``; see :class:`Signals`).
            layer: the layer ``l`` to score, ``0 <= l < s.num_layers``.

        Returns:
            ``[Hkv, n_l]``, higher = keep. Only the candidate slots ``[s.protected[l], n_l - s.window)`` are
            ranked (the protected slots and the window are always kept); they must be finite.
        """
        raise NotImplementedError

    def layer_weight(self, s: Signals, layer: int) -> torch.Tensor:
        """The weight :class:`~fi_toolkit.policies.adaptive.Adaptive` gives layer ``layer`` (a scalar tensor;
        budgets are shared in proportion to it): by default the mean of :meth:`scores` over the candidate
        slots ``[protected, n_l - w)`` and the heads (0 when the layer has none)."""
        import torch

        lo, hi = s.protected[layer], s.slots(layer) - s.window
        if hi <= lo:
            return torch.zeros((), dtype=torch.float64)
        dead = s.dead_in(layer)
        if dead is not None:  # dead slots are no candidates
            live = ~dead[:, lo:hi]
            return self.scores(s, layer)[:, lo:hi].double()[live].mean() if bool(live.any()) else live.new_zeros(())
        return self.scores(s, layer)[:, lo:hi].double().mean()

    def layer_budgets(self, s: Signals, k: int) -> list[int]:
        """Uniform: every layer keeps ``k`` (or everything it holds, if less)."""
        return [min(k, s.slots(layer)) for layer in range(s.num_layers)]

    def bounds(self, s: Signals) -> tuple[list[int], list[int]]:
        """Per-layer ``[lo, hi]`` for uneven budgets: at least protected + window, at most what is held."""
        hi = [s.slots(layer) for layer in range(s.num_layers)]
        lo = [min(h, s.protected[layer] + s.window) for layer, h in enumerate(hi)]
        return lo, hi

    def keep_map(self, signals) -> KeepMap:
        """Signals (a :class:`~fi_toolkit.signals.trace.Trace` or :class:`Signals`) -> :class:`KeepMap`."""
        from fi_toolkit.eviction import KeepMap

        s = as_signals(signals)
        if s.window != self.window:
            raise FIError(f"{self.name}: signals were traced with window {s.window}, the policy uses {self.window}")
        k = self.tokens(s.seen, max(s.protected))
        budgets = self.layer_budgets(s, k)
        meta = {
            "selector": f"policy:{self.name}",
            "budget": self.budget.label,
            "policy": self.name,
            "per_layer": budgets,
        }
        if s.dead is not None and any(s.dead_in(layer) is not None for layer in range(s.num_layers)):
            return KeepMap.from_heads(f"policy:{self.label}", self.live_heads(s, budgets), meta)
        keep = [
            select(self.scores(s, layer), budgets[layer], s.protected[layer], s.window) for layer in range(s.num_layers)
        ]
        return KeepMap(f"policy:{self.label}", keep, meta)

    def keep_map_across_heads(self, signals) -> KeepMap:
        """:meth:`keep_map` with each layer's budget (the uniform ``k`` per head, times ``Hkv``) shared over its
        KV heads by :meth:`scores_for_heads` (``across_heads=True``; :func:`select_across_heads`, AdaKV's
        allocation): an uneven keep map. The ``heads=global`` option of the learned policy and the surrogate."""
        from fi_toolkit.eviction import KeepMap

        s = as_signals(signals)
        if s.window != self.window:
            raise FIError(f"{self.name}: signals were traced with window {s.window}, the policy uses {self.window}")
        budgets = self.layer_budgets(s, self.tokens(s.seen, max(s.protected)))
        heads = self.live_heads(s, budgets, across_heads=True)
        meta = {
            "selector": f"policy:{self.name}",
            "budget": self.budget.label,
            "policy": self.name,
            "per_layer": budgets,
            "heads": "global",
        }
        return KeepMap.from_heads(f"policy:{self.label}", heads, meta)

    def live_heads(self, s: Signals, budgets: list[int], across_heads: bool = False) -> list[list[torch.Tensor]]:
        """Per layer, each head's kept slots when the cache holds dead slots (:func:`select_live`; a layer
        without any, :func:`select` or :func:`select_across_heads`)."""
        out = []
        for layer in range(s.num_layers):
            scores, dead = self.scores_for_heads(s, layer, across_heads), s.dead_in(layer)
            args = (budgets[layer], s.protected[layer], s.window)
            if dead is not None:
                out.append(select_live(scores, *args, dead, across_heads))
            elif across_heads:
                out.append(select_across_heads(scores, *args))
            else:
                out.append(list(select(scores, *args)))
        return out

    def scores_for_heads(self, s: Signals, layer: int, across_heads: bool) -> torch.Tensor:
        """The scores :meth:`live_heads` ranks: :meth:`scores` (a policy ranking across heads says otherwise)."""
        return self.scores(s, layer)
