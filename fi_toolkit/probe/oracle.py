"""The FI oracle's scores: estimated Forward Influence of every (layer, KV head, position) on a
future chunk, given to :class:`~fi_toolkit.policies.fi_oracle.FIOracle` as a signal (``Signals.fi_estimates``),
by which it keeps per head with every policy's selection (:func:`~fi_toolkit.policies.base.select`). It sees
the future: an upper reference for the heuristics (the headroom, :mod:`fi_toolkit.probe.headroom`), not a policy.

- ``estimator=fisher``: the per-(layer, KV head) Fisher estimate ``head_fi`` of
  :func:`~fi_toolkit.probe.estimator.fisher_fi` (one forward, ``samples`` backwards).
- ``estimator=exact``: exact leave-one-out FI per position (one masked forward per candidate
  position, :func:`~fi_toolkit.probe.forward_influence.forward_influence`), shared by every layer and head;
  for small prefixes.
- ``rounds=R``: the ``n - k`` evictions happen in ``R`` rounds of ``round((n - k) r / R)`` cumulative
  removals; each round re-estimates with the earlier removals masked (the Fisher estimate's base
  eviction; for ``exact``, each candidate is removed on top of them). Removed entries score -1, below
  every estimate, so the rounds' keep sets shrink monotonically.
- ``seed=N``: the seed of the Fisher estimate's label draws (default 0). Another seed is another draw of the
  same estimate: the headroom tables measure the oracle at seeds 0 and 1 for its own noise
  (:mod:`fi_toolkit.probe.headroom`).

**Reproducible** (``precision=float64``, what the default ``auto`` picks on a CPU): the same model, document and
options give the same keep map on any thread count and in any run. In the model's float32 a reduction's result
depends on its order, which
the BLAS picks by thread count (and CPU), and a label drawn near a boundary of the sampling distribution flips:
SmolLM2, *Alice*, p = 512, chunk 512:640, keep 25 %, 1 against 2 threads, 3 of 2,048 labels differed, scores
moved up to 12-fold and 122 of 46,080 keep-map entries flipped (p = 128, chunk 128:160: 22 of 11,520). So the
estimate is computed in float64 (:func:`~fi_toolkit.model.precision.float64_compute`), from a prefix cache
recomputed in float64 from ``ids[:p]`` (:func:`float64_trace`: the trace's own float32 cache moves with the
thread count too): there the two thread counts' scores agreed to 6.5e-15 relative (5e-8 at p = 128, most likely
where a model's own float32 cast, Llama's RMSNorm normalises in float32, rounded one value the other way) and no
entry flipped (``tests/test_oracle.py``). **Tie-break, the stated tolerance**: the keep map ranks the estimates
rounded to float32 with a stable sort, so entries whose estimates round to the same float32 (within ~6e-8 relative) keep
the earlier position; two runs' keep maps can still differ only where, at a head's cut, two entries' float64
estimates lie within their noise (~1e-14 relative; ~1e-7 after such a cast) of each other or of a float32
rounding boundary between them. **Cost** (that setting at p = 512, one thread, SmolLM2 on an idle moment of a
shared 2-core CPU): 15.9 s per keep map against 6.5 in float32, 2.4x (the float64 prefill, ~2.5 s, is shared by
every round, budget and seed on one trace: 13.5 s, 2.1x, then; widening the weights, ~1 s, is paid per estimate);
memory: 8 bytes per weight while it runs, and the float64 prefix cache of the last two traces. ``precision=model``
computes in the model's dtype: the earlier, faster estimate, whose keep map the thread count can change.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Sequence

import torch
from transformers import DynamicCache

from fi_toolkit.errors import FIError
from fi_toolkit.eviction import KeepMap, TokenSet
from fi_toolkit.model.architectures import context_limit
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.model.precision import float64_compute
from fi_toolkit.policies.base import Signals
from fi_toolkit.policies.fi_oracle import REMOVED_SCORE, FIOracle, remove_in_rounds
from fi_toolkit.probe.chunks import Chunk, check_chunks
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.probe.forward_influence import forward_influence
from fi_toolkit.signals.trace import Trace

_FIRST_ROUNDS: dict[tuple, tuple[weakref.ref, torch.Tensor]] = {}  # estimates at the full cache, per trace
_KEEP_FIRST_ROUNDS = 4
_WIDE_TRACES: dict[tuple, tuple[weakref.ref, Trace]] = {}  # the float64 prefix cache, per trace and model


def _first_round(key: tuple, trace: Trace, compute) -> torch.Tensor:
    """The full-cache estimate (round 1) of one trace, chunk and estimator, shared by every budget and
    rounds count probed on that trace (it does not depend on them); the last few are kept."""
    hit = _FIRST_ROUNDS.get((id(trace), *key))
    if hit is not None and hit[0]() is trace:
        return hit[1].clone()
    scores = compute()
    while len(_FIRST_ROUNDS) >= _KEEP_FIRST_ROUNDS:
        _FIRST_ROUNDS.pop(next(iter(_FIRST_ROUNDS)))
    _FIRST_ROUNDS[(id(trace), *key)] = (weakref.ref(trace), scores.clone())
    return scores


def oracle_chunk(
    policy: FIOracle, chunks: Sequence[Chunk] | None, prefix_len: int, doc_len: int, max_context: int | None = None
) -> Chunk:
    """The chunk the oracle scores: its ``chunk`` option, else the first probed chunk; checked against
    the compression point, the document and the model's context."""
    span = policy.span
    if span is None:
        if not chunks:
            raise FIError("fi-oracle: no chunk to score; give chunk=START:END or probe at least one chunk")
        chunk = chunks[0]
    else:
        chunk = Chunk(*span)
    try:
        check_chunks([chunk], prefix_len, doc_len, max_context)
    except FIError as exc:
        raise FIError(f"fi-oracle: {exc}") from None
    return chunk


def exact_scores(
    model,
    trace: Trace,
    ids: torch.Tensor,
    chunk: Chunk,
    base: torch.Tensor,
    batch_size: int | None = None,
    block: int = 512,
) -> torch.Tensor:
    """Exact FI on ``chunk`` of removing each position not in ``base`` (bool ``[p]``, already removed) on
    top of ``base`` -> ``[p]`` float64 (``REMOVED_SCORE`` at ``base``)."""
    p = trace.prefix_len
    out = torch.full((p,), REMOVED_SCORE, dtype=torch.float64)
    gone = torch.nonzero(base).flatten()
    candidates = torch.nonzero(~base).flatten().tolist()
    sets = [TokenSet(f"loo:{j}", torch.cat([gone, torch.tensor([j])])) for j in candidates]
    fi = forward_influence(model, trace, ids, sets, [chunk], batch_size=batch_size, block=block).fi()[:, 0]
    out[candidates] = fi.double()
    return out


def oracle_scores(
    policy: FIOracle, model, trace: Trace, ids: torch.Tensor, chunk: Chunk, removed: torch.Tensor, block: int = 512
) -> torch.Tensor:
    """Per (layer, KV head, position) the estimated FI on ``chunk`` with ``removed`` (bool ``[L, H_kv, p]``)
    already evicted -> float64 ``[L, H_kv, p]``, ``REMOVED_SCORE`` at the removed entries."""
    shape = (trace.num_layers, trace.num_kv_heads, trace.prefix_len)
    if not removed.any():
        key = (
            chunk,
            str(policy.estimator),
            policy.samples,
            policy.seed,
            str(policy.precision),
            block,
            id(model),
            tuple(ids[trace.prefix_len : chunk.end].tolist()),
        )
        return _first_round(key, trace, lambda: _scores(policy, model, trace, ids, chunk, removed, block, shape))
    return _scores(policy, model, trace, ids, chunk, removed, block, shape)


def _scores(
    policy: FIOracle,
    model,
    trace: Trace,
    ids: torch.Tensor,
    chunk: Chunk,
    removed: torch.Tensor,
    block: int,
    shape: tuple[int, int, int],
) -> torch.Tensor:
    if policy.in_float64(next(model.parameters()).device.type):
        with float64_compute(model):
            return _estimates(policy, model, _wide_trace(model, trace, ids), ids, chunk, removed, block, shape)
    return _estimates(policy, model, trace, ids, chunk, removed, block, shape)


def _wide_trace(model, trace: Trace, ids: torch.Tensor) -> Trace:
    """:func:`float64_trace`, shared by every round, budget and label seed of the oracle on one trace and model
    (the last two are kept)."""
    hit = _WIDE_TRACES.get((id(trace), id(model)))
    if hit is not None and hit[0]() is trace:
        return hit[1]
    wide = float64_trace(model, trace, ids)
    while len(_WIDE_TRACES) >= 2:
        _WIDE_TRACES.pop(next(iter(_WIDE_TRACES)))
    _WIDE_TRACES[id(trace), id(model)] = (weakref.ref(trace), wide)
    return wide


@torch.no_grad()
def float64_trace(model, trace: Trace, ids: torch.Tensor) -> Trace:
    """``trace`` with its prefix cache recomputed by ``model`` (inside :func:`float64_compute`: in float64) from
    ``ids[:p]``, in the trace's prefill chunks; its signals are the trace's own."""
    p, device = trace.prefix_len, trace.keys[0].device
    cache = DynamicCache(config=model.config)
    for a in range(0, p, trace.config.prefill_chunk):
        b = min(p, a + trace.config.prefill_chunk)
        model.base_model(
            input_ids=ids[a:b].to(device)[None],
            position_ids=torch.arange(a, b, device=device)[None],
            use_cache=True,
            **cache_kwargs(model.base_model, cache),
        )
    keys, values = [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    return dataclasses.replace(trace, keys=keys, values=values)


def _estimates(
    policy: FIOracle,
    model,
    trace: Trace,
    ids: torch.Tensor,
    chunk: Chunk,
    removed: torch.Tensor,
    block: int,
    shape: tuple[int, int, int],
) -> torch.Tensor:
    if policy.estimator == "exact":
        base = removed.all(dim=(0, 1))
        if not torch.equal(removed, base.expand(shape)):
            raise FIError("fi-oracle estimator=exact removes whole positions; its base must be the same for every head")
        scores = exact_scores(model, trace, ids, chunk, base, block=block).expand(shape).clone()
    else:
        est = fisher_fi(
            model,
            trace,
            ids,
            [chunk],
            samples=policy.samples,
            seed=policy.seed,
            block=block,
            removed=removed if removed.any() else None,
        )
        scores = est.head_fi[..., 0].clone()
    return scores.masked_fill_(removed, REMOVED_SCORE)


def oracle_keep_map(
    policy: FIOracle, model, trace: Trace, ids: torch.Tensor, chunks: Sequence[Chunk] | None = None, block: int = 512
) -> KeepMap:
    """The oracle's keep map for ``trace`` (a prefill of ``ids[:p]``), per layer and KV head, at the
    policy's budget: the policy scores the trace's signals with the last round's estimates as ``fi_estimates``."""
    p = trace.prefix_len
    chunk = oracle_chunk(policy, chunks, p, ids.numel(), context_limit(model.config))
    signals = Signals.from_trace(trace)
    if signals.window != policy.window:
        raise FIError(f"fi-oracle: signals were traced with window {signals.window}, the policy uses {policy.window}")
    shape = (trace.num_layers, trace.num_kv_heads, p)
    scores, removed, history = remove_in_rounds(
        lambda removed: oracle_scores(policy, model, trace, ids, chunk, removed, block),
        shape,
        policy.tokens(p),
        policy.rounds,
        0,
        policy.window,
    )
    signals.fi_estimates = [s.float() for s in scores]
    keep_map = policy.keep_map(signals)
    if not torch.equal(~keep_map.visible(p), removed):  # pragma: no cover - the last round is the policy's selection
        raise FIError("fi-oracle: the keep map differs from the last round's selection")
    label = f"policy:{policy.label}"
    keep_map.label = label
    keep_map.meta.update(
        selector="oracle:fi-oracle",
        oracle=True,
        oracle_chunk=chunk.label,
        rounds=policy.rounds,
        estimator=str(policy.estimator),
        label_seed=policy.seed,
        precision=str(policy.precision),
        removed_per_round=history,
    )
    return keep_map
