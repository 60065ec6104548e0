"""The FI oracle while decoding: a look-ahead oracle for replays of known text.

At each compression of a replay (:func:`fi_toolkit.compress.replay.replay`) that has seen ``t`` tokens,
the :class:`~fi_toolkit.policies.fi_oracle.FIOracle` scores every (layer, KV head, cache slot) of the
decoder's current, already compressed cache by the estimated Forward Influence of removing that entry
on the next ``interval`` tokens the replay will feed, ``ids[t : t + interval]`` (fewer at the end; never
a token after them): the sampled Fisher estimate of :func:`fi_toolkit.probe.estimator.fisher_cache_fi`,
a per-slot bias gradient with the continuation fed at its true absolute positions ``t ..`` (the cached
keys keep the rotary phase of the positions they were fed at). The policy then keeps per head by every
policy's rule (:meth:`~fi_toolkit.policies.base.Policy.keep_map`: budget, protected slots, window).
``rounds=R`` removes the budget in ``R`` rounds, re-estimating after each with the earlier removals
masked, as the prefill oracle does (:mod:`fi_toolkit.probe.oracle`). With ``precision=float64`` (what the
default ``auto`` picks on a CPU) the estimate runs in float64 on the cache's entries widened to float64, so the
keep map at a compression does not
move with the thread count (the cache itself is the decoder's, computed in the model's dtype).

The scores reach the policy as a signal: :func:`lookahead_estimates` computes them for the decoder's current
cache and the decoder gives them to the policy in its :class:`~fi_toolkit.signals.policy_view.Signals`
(``fi_estimates``), as it gives every policy its tracked signals.

It sees the future, so it exists only where the future is known: a replay sets
:attr:`CompressedDecoder.lookahead <fi_toolkit.compress.decoder.CompressedDecoder.lookahead>`; free
generation, tasks and ``fi generate`` have none and refuse it. A compression after the last fed token
(nothing left to look ahead to; it would affect no replayed position) is skipped.
``estimator=exact`` and ``chunk=`` are the prefill oracle's (a fixed chunk, positions shared by every
head) and are refused here (:func:`check_decoding_oracle`).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from fi_toolkit.errors import FIError
from fi_toolkit.model.attention import RAGGED
from fi_toolkit.model.precision import float64_compute
from fi_toolkit.policies.fi_oracle import REMOVED_SCORE, FIOracle, check_decoding_oracle, remove_in_rounds


@dataclass(frozen=True)
class Lookahead:
    """The known token sequence of a replay, ``ids [N]``: at a compression that has seen ``t`` tokens the
    oracle reads ``ids[t : min(t + interval, end)]`` (``end``: the tokens the replay feeds, ``N - 1``)."""

    ids: torch.Tensor
    interval: int
    end: int

    def continuation(self, seen: int) -> torch.Tensor:
        """The tokens fed after a compression at ``seen`` until the next one ``[m]`` (``m = 0``: none left)."""
        return self.ids[seen : min(seen + self.interval, self.end)]


@contextmanager
def plain_attention(model):
    """The model's base attention (sdpa or eager) inside the block: the estimator's bias wraps those,
    not the ragged alignment a replay runs under (the oracle's cache has one length in every layer)."""
    current = model.config._attn_implementation
    base = {v: k for k, v in RAGGED.items()}.get(current)
    if base is None:
        yield model
        return
    model.set_attn_implementation(base)
    try:
        yield model
    finally:
        model.set_attn_implementation(current)


def lookahead_scores(
    policy: FIOracle,
    model,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    cont: torch.Tensor,
    seen: int,
    kept: int,
    protected: int,
    window: int,
    block: int = 512,
) -> torch.Tensor:
    """Per (layer, KV head, slot) the estimated FI of removing the entry on ``cont [m]`` fed at positions
    ``seen ..`` after the cache ``keys[l]``/``values[l]`` ``[1, H_kv, n, d]`` -> float64 ``[L, H_kv, n]``;
    with ``policy.rounds = R > 1``, the last of ``R`` rounds towards ``kept`` slots per head (earlier
    rounds' removals masked and scored ``REMOVED_SCORE``)."""
    from fi_toolkit.probe.estimator import CachePrefix, fisher_cache_fi

    wide = policy.in_float64(keys[0].device.type)
    if wide:
        keys, values = [k.double() for k in keys], [v.double() for v in values]
    prefix = CachePrefix(keys, values, seen)
    shape = (prefix.num_layers, prefix.num_kv_heads, prefix.prefix_len)

    def score(removed: torch.Tensor) -> torch.Tensor:
        est = fisher_cache_fi(
            model,
            prefix,
            cont,
            samples=policy.samples,
            seed=policy.seed,
            block=block,
            removed=removed if removed.any() else None,
        )
        return est.head_fi[..., 0].clone().masked_fill_(removed, REMOVED_SCORE)

    with plain_attention(model), float64_compute(model) if wide else nullcontext():
        return remove_in_rounds(score, shape, kept, policy.rounds, protected, window)[0]


def lookahead_estimates(decoder, kept: int, protected: int) -> list[torch.Tensor] | None:
    """The look-ahead scores of ``decoder.policy`` (an :class:`FIOracle`) for the decoder's current cache, per
    layer ``[H_kv, n_l]`` float32 (its ``Signals.fi_estimates``); None when there is nothing left to look ahead
    to (the compression is skipped)."""
    if decoder.lookahead is None:
        raise FIError(
            "fi-oracle is an oracle that sees the future text: only a replay of known text "
            "(fi eval on documents) gives it a continuation; it cannot compress while generating"
        )
    cont = decoder.lookahead.continuation(decoder.seen)
    if cont.numel() == 0:
        return None
    check_decoding_oracle(decoder.policy)
    layers = decoder.cache.layers
    scores = lookahead_scores(
        decoder.policy,
        decoder.model,
        [l.keys for l in layers],
        [l.values for l in layers],
        cont,
        decoder.seen,
        kept,
        protected,
        decoder.config.window,
    )
    return [s.float() for s in scores]
