"""Per-token Forward Influence of every prefix position from gradients: the Fisher estimator.

Exact leave-one-out FI costs one forward over ``[p, max r_c)`` per candidate. Here key ``j`` gets an
additive bias ``b_j`` on its attention logits, in every layer and head, for every query at ``t >= p``
(removing ``j`` is ``b_j -> -inf``). At ``b = 0`` the KL and its gradient vanish, so for small ``b``
``KL_t(b) ~ 1/2 b^T F_t b`` with ``F_t = E_{y~P_t}[grad_b log P_t(y) grad_b log P_t(y)^T]``, the
Fisher information of the bias. The estimate of ``FI_j`` on chunk ``C`` is

    fi_j = 1/2 * sum_{t in C} F_t[j, j] / |C|  =  lim_{eps -> 0} FI(b_j = -eps) / eps^2,

the curvature of FI at the full cache: it ranks positions (validated against exact leave-one-out in
``analyses/estimator.py``); its scale is not that of FI at removal.

**Sampled** (:func:`fisher_fi`, the default): draw ``y_t ~ P_t`` (the model's own distribution, a
seeded generator) at every ``t`` of the chunk and take ``g = grad_b sum_t log P_t(y_t)`` in one
backward pass for every ``j`` at once. The score has zero mean and the labels at different ``t`` are
independent given the (teacher-forced) inputs, so ``E[g_j^2] = sum_t F_t[j, j]``: ``1/2 g_j^2 / |C|``
is unbiased; ``samples`` draws give its mean and standard error. The backward starts at the final
hidden states with ``dlog P_t(y)/dh_t = W_y - sum_v P_tv W_v`` (``W``: the LM head), so no
``[n, V]`` gradient is formed. Weights are frozen: only the bias gets a gradient.

**Full-vocabulary expectation** (:func:`expected_fisher`): per candidate, forward-mode AD gives
``dh_t/db_j`` and ``F_t[j, j] = Var_{y~P_t}(W_y . dh_t/db_j)`` exactly. One forward-mode pass per
candidate (about the cost of a leave-one-out forward), so it serves the tests and small candidate
sets, not all positions.

**Per layer and KV head**: the bias is one leaf ``B [L, H_kv, p]``; layer ``l`` adds ``B[l, h]`` to the
logits of the query heads of KV group ``h`` (a registered attention function around the model's own,
:func:`attention_bias`: the bias enters through the mask, no model surgery). The all-layers bias is
``B[:, :, j]`` moved together, whose gradient is the sum over layers and heads, so one backward gives
all three: every layer and head, one layer (``layer_fi``), one layer's KV head (``head_fi``). While
gradients flow, that function computes the attention itself (:class:`~fi_toolkit.probe.bias_attention.BiasedAttention`),
with a backward that forms only the gradients the estimate needs (the bias's, the queries', the fed
tokens' keys and values); autograd through the model's attention took 1.6-1.9 times as long per draw
(``benchmarks/bench_estimator_backward.py``).

**At a base eviction** (``removed``, the FI oracle's later rounds, :mod:`fi_toolkit.probe.oracle`): the
entries already removed get a constant bias of ``finfo.min`` (exactly zero attention weight, as the
probe's masks), the labels are drawn from the evicted model's own distribution, and the estimate is
the curvature there: how much the evicted model's predictions still depend on each remaining entry.
Removed entries get an estimate of exactly 0 (no attention weight, no gradient).

**On any cache** (:func:`fisher_cache_fi`, the decoding oracle, :mod:`fi_toolkit.compress.lookahead`): the
same estimate per slot of a :class:`CachePrefix`, a compressed decoder's cache of ``n`` slots followed by
tokens fed from absolute position ``start`` (rotary phases as decoding feeds them; ``n < start``).

**Precision**: the model's compute dtype (float32 for a float32 or upcast model); inside
:func:`~fi_toolkit.model.precision.float64_compute` (the FI oracle's default) the bias, its gradient and the
label distributions are float64 as well. In float32 the estimate moves with the BLAS thread count at ~1e-6
relative, and a label drawn near a boundary of the sampling distribution flips (SmolLM2, *Alice*, p = 512, a
128-token chunk: 3 of 2,048 labels between 1 and 2 threads, so some scores changed 12-fold).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

from fi_toolkit.errors import FIError
from fi_toolkit.eviction import shared_cache
from fi_toolkit.model.architectures import context_limit
from fi_toolkit.model.attention import register_wrapped
from fi_toolkit.model.checkpointing import checkpointed_layers
from fi_toolkit.model.precision import compute_dtype
from fi_toolkit.probe.bias_attention import BiasedAttention
from fi_toolkit.probe.chunks import Chunk, check_chunks
from fi_toolkit.probe.estimator_options import (  # noqa: F401  (importable here too)
    DEFAULT_SAMPLES,
    ESTIMATORS,
    MAX_SAMPLES,
    check_samples,
)
from fi_toolkit.probe.forward_influence import _capture_positions, _continuation_hidden
from fi_toolkit.signals.trace import Trace, decoder_parts

_BIAS: list = [None]  # the bias [L, H_kv, p] the biased attention functions add while attention_bias is active


def _biased(attention_fn):
    def forward(module, query, key, value, attention_mask, *args, **kwargs):
        bias = _BIAS[0]
        if _by_hand(bias, query, key, attention_mask, args, kwargs):
            scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
            out = BiasedAttention.apply(query, key, value, attention_mask, bias[module.layer_idx], scale)
            return out, None
        if bias is not None and attention_mask is not None:
            b = bias[module.layer_idx].repeat_interleave(query.shape[1] // bias.shape[1], dim=0)  # [H_q, p]
            b = F.pad(b, (0, attention_mask.shape[-1] - b.shape[-1]))  # prefix keys only; the continuation's get 0
            attention_mask = attention_mask + b[None, :, None, :].to(attention_mask.dtype)
        return attention_fn(module, query, key, value, attention_mask, *args, **kwargs)

    return forward


def _by_hand(bias, query, key, attention_mask, args, kwargs) -> bool:
    """Whether the gradient pass can take :class:`BiasedAttention`: a bias that needs a gradient (not
    forward-mode AD), batch 1, one additive ``[1, 1, n, K]`` mask, and nothing the function does not implement."""
    return (
        bias is not None
        and torch.is_grad_enabled()
        and bias.requires_grad
        and forward_ad.unpack_dual(bias).tangent is None
        and query.shape[0] == 1
        and attention_mask is not None
        and attention_mask.dtype.is_floating_point
        and tuple(attention_mask.shape) == (1, 1, query.shape[2], key.shape[2])
        and not args
        and not kwargs.get("dropout")
        and kwargs.get("softcap") is None
        and kwargs.get("s_aux") is None
    )


BIASED = register_wrapped("fi_biased", _biased)


@contextmanager
def attention_bias(model: torch.nn.Module, bias: torch.Tensor, eager: bool = False):
    """Inside the block, layer ``l`` adds ``bias[l, h]`` ``[L, H_kv, p]`` to the attention logits of
    KV group ``h`` for the ``p`` prefix keys (4-D float masks only); the weights are frozen, so only
    ``bias`` can receive a gradient. ``eager`` runs eager attention (forward-mode AD needs it)."""
    previous = model.config._attn_implementation
    if previous not in BIASED:
        raise FIError(f"the gradient estimator needs sdpa or eager attention, not '{previous}'")
    grads = [q.requires_grad for q in model.parameters()]
    model.set_attn_implementation(BIASED["eager" if eager else previous])
    model.requires_grad_(False)
    _BIAS[0] = bias
    try:
        yield model
    finally:
        _BIAS[0] = None
        model.set_attn_implementation(previous)
        for q, g in zip(model.parameters(), grads):
            q.requires_grad_(g)


@dataclass
class FisherEstimate:
    """Estimated FI of every prefix position ``j in [0, p)`` per chunk (float64, nats, the mean over the chunk).

    ``fi [p, K]``: every layer and head; ``se [p, K]``: its standard error over the samples (0 for
    the full-vocabulary expectation); ``layer_fi [L, p, K]``: the bias on one layer; ``head_fi
    [L, H_kv, p, K]``: on one layer's KV head. ``samples`` is 0 for the full-vocabulary expectation.
    """

    chunks: list[Chunk]
    samples: int
    fi: torch.Tensor
    se: torch.Tensor
    layer_fi: torch.Tensor
    head_fi: torch.Tensor
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)


CHECKPOINT_ABOVE = 2**31  # bytes of kept graph above which fisher_fi checkpoints (the Reference's keep_bytes too)


def graph_bytes(config, prefix: int, n: int, block: int) -> int:
    """The size of the graph :func:`fisher_fi` keeps without checkpointing, for ``n`` continuation
    tokens after ``prefix`` in query blocks of ``block``: per layer, float32, what the forward saves for
    backward (:func:`kept_graph_bytes` on the tiny Llama and SmolLM2): per token two hidden-size and
    three MLP-width vectors and the queries; per query block the keys and values it sees, per KV head,
    and one attention map (query heads x block x keys; :class:`~fi_toolkit.probe.bias_attention.BiasedAttention`)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * config.hidden_size + 3 * config.intermediate_size + heads * head_dim
    per_block = sum(
        (heads * min(block, n - a) + kv_heads * 2 * head_dim) * (prefix + min(n, a + block)) for a in range(0, n, block)
    )
    return 4 * config.num_hidden_layers * (n * per_token + per_block)


def kept_graph_bytes(
    model, trace: Trace, ids: torch.Tensor, chunks: Sequence[Chunk], checkpoint: bool, block: int = 512
) -> int:
    """Measured: the bytes of new tensors :func:`fisher_fi`'s forward saves for backward outside any
    checkpointed region (unique storages, weights and the trace's keys and values excluded), i.e. the
    graph kept between its backward passes. Runs the forward only."""
    p, device, cont, capture, _ = _prepare(model, trace, ids, chunks)
    known = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *trace.keys, *trace.values]}
    seen: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in known:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    bias = torch.zeros(trace.num_layers, trace.num_kv_heads, p, device=device, requires_grad=True)
    cache = shared_cache(trace.keys, trace.values, 1, model.config)
    bounded = checkpointed_layers(model, cache) if checkpoint else nullcontext()
    with (
        torch.enable_grad(),
        attention_bias(model, bias),
        bounded,
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        _hidden(model, trace, cont, capture, block, cache)
    return sum(seen.values())


def needs_checkpoint(config, prefix: int, n: int, block: int) -> bool:
    """Checkpoint when the kept graph would exceed :data:`CHECKPOINT_ABOVE`: below it, keeping the
    graph is faster (no recompute per backward); above it, memory grows with ``n (prefix + n)``."""
    return graph_bytes(config, prefix, n, block) > CHECKPOINT_ABOVE


def _prepare(model, trace: Trace, ids: torch.Tensor, chunks: Sequence[Chunk]):
    p = trace.prefix_len
    check_chunks(chunks, p, ids.numel(), context_limit(model.config))
    device = trace.keys[0].device
    end = max(c.end for c in chunks)
    positions = _capture_positions(chunks)
    rows = [((positions >= c.start) & (positions < c.end)).to(device) for c in chunks]
    return p, device, ids[p:end].to(device), (positions - p).to(device), rows


def _hidden(
    model,
    trace: Trace | CachePrefix,
    cont: torch.Tensor,
    capture: torch.Tensor,
    block: int,
    cache=None,
    start: int | None = None,
) -> torch.Tensor:
    """Final-normed hidden states at the chunk positions of the full-cache continuation ``[n, d]``, fed at
    absolute positions ``start ..`` (default: the prefix length, a prefill cache of positions ``0 .. p-1``)."""
    p = trace.prefix_len
    cache = shared_cache(trace.keys, trace.values, 1, model.config) if cache is None else cache
    visible = torch.ones(1, p, dtype=torch.bool, device=cont.device)
    return _continuation_hidden(model, cache, cont[None], p if start is None else start, visible, capture, block)[0]


@torch.no_grad()
def _label_terms(hidden: torch.Tensor, lm_head, samples: int, generator: torch.Generator, block: int):
    """Sampled labels ``y [n, S]`` from each row's own distribution and the rows' mean output
    embedding ``sum_v P_v W_v`` ``[n, d]``, the LM head streamed ``block`` rows at a time."""
    weight = lm_head.weight
    labels, mean_w = [], []
    for a in range(0, hidden.shape[0], block):
        logits = lm_head(hidden[a : a + block])
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        labels.append(torch.multinomial(probs, samples, replacement=True, generator=generator))
        mean_w.append(probs.to(weight.dtype) @ weight)
    return torch.cat(labels), torch.cat(mean_w)


def fisher_fi(
    model,
    trace: Trace,
    ids: torch.Tensor,
    chunks: Sequence[Chunk],
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    block: int = 512,
    on_progress: Callable[[int], None] | None = None,
    checkpoint: bool | None = None,
    removed: torch.Tensor | None = None,
) -> FisherEstimate:
    """The sampled Fisher estimate of per-token FI for every prefix position (module docstring).

    One forward over ``[p, max r_c)`` with gradients to the bias, then ``samples`` backward passes per
    chunk through the same graph. Deterministic for a ``seed`` (labels come from a seeded generator).
    ``on_progress(1)`` after each sample. ``checkpoint``: recompute each decoder layer in every backward
    instead of keeping its activations (:mod:`fi_toolkit.model.checkpointing`; same estimates, bounded
    memory, more time); ``None`` decides by :func:`needs_checkpoint`. ``removed``: bool ``[L, H_kv, p]``,
    a base eviction whose entries are masked in every forward and backward (module docstring).
    """
    check_samples(samples)
    t0 = time.perf_counter()
    p, device, cont, capture, rows = _prepare(model, trace, ids, chunks)
    return _estimate(
        model,
        trace,
        cont,
        capture,
        rows,
        [len(c) for c in chunks],
        chunks,
        samples,
        seed,
        block,
        on_progress,
        checkpoint,
        removed,
        None,
        t0,
    )


@dataclass
class CachePrefix:
    """A cache that is not a prefill's: ``keys[l]``/``values[l]`` ``[1, H_kv, n, head_dim]`` (``n`` slots, the
    same in every layer, keys RoPE-rotated at the positions they were fed at), followed by tokens fed from
    absolute position ``start`` (a compressed decoder's cache: ``n < start``)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    start: int

    def __post_init__(self):
        if len({k.shape[2] for k in self.keys}) != 1:
            raise FIError("the Fisher estimate on a cache needs the same number of slots in every layer")

    @property
    def prefix_len(self) -> int:
        return self.keys[0].shape[2]

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_kv_heads(self) -> int:
        return self.keys[0].shape[1]


def fisher_cache_fi(
    model,
    prefix: CachePrefix,
    cont: torch.Tensor,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    block: int = 512,
    checkpoint: bool | None = None,
    removed: torch.Tensor | None = None,
) -> FisherEstimate:
    """:func:`fisher_fi` on any cache: the estimated FI of every slot of ``prefix`` (a
    :class:`CachePrefix`) on the continuation ``cont [m]``, fed at absolute positions ``prefix.start ..``
    (one chunk, every fed token). Slot ``j`` of the returned tensors is the cache's slot ``j``
    (``head_fi [L, H_kv, n, 1]``); ``removed`` bool ``[L, H_kv, n]`` as in :func:`fisher_fi`."""
    check_samples(samples)
    t0 = time.perf_counter()
    device = prefix.keys[0].device
    limit = context_limit(model.config)
    if cont.numel() < 1:
        raise FIError("the Fisher estimate on a cache needs at least one continuation token")
    if limit is not None and prefix.start + cont.numel() > limit:
        raise FIError(f"the continuation ends at {prefix.start + cont.numel()}, past the model's context of {limit}")
    m = cont.numel()
    chunk = Chunk(prefix.start, prefix.start + m)
    capture = torch.arange(m, device=device)
    rows = [torch.ones(m, dtype=torch.bool, device=device)]
    return _estimate(
        model,
        prefix,
        cont.to(device),
        capture,
        rows,
        [m],
        [chunk],
        samples,
        seed,
        block,
        None,
        checkpoint,
        removed,
        prefix.start,
        t0,
    )


def _estimate(
    model,
    trace: Trace | CachePrefix,
    cont: torch.Tensor,
    capture: torch.Tensor,
    rows: list[torch.Tensor],
    sizes: list[int],
    chunks: Sequence[Chunk],
    samples: int,
    seed: int,
    block: int,
    on_progress: Callable[[int], None] | None,
    checkpoint: bool | None,
    removed: torch.Tensor | None,
    start: int | None,
    t0: float,
) -> FisherEstimate:
    """The body of :func:`fisher_fi` and :func:`fisher_cache_fi`: ``cont [m]`` fed after the cache of
    ``trace`` at ``start`` (None: its length), the chunks' rows ``rows[k]`` bool ``[len(capture)]`` of
    ``sizes[k]`` tokens each."""
    p, device = trace.prefix_len, trace.keys[0].device
    if checkpoint is None:
        checkpoint = needs_checkpoint(model.config, p, cont.numel(), block)
    lm_head = decoder_parts(model)[2]
    n_layers, n_heads, n_chunks = trace.num_layers, trace.num_kv_heads, len(chunks)
    dtype = torch.float64 if compute_dtype(model) == torch.float64 else torch.float32  # (float64_compute)
    bias = torch.zeros(n_layers, n_heads, p, device=device, dtype=dtype, requires_grad=True)
    with torch.enable_grad():  # (a decoder compresses under no_grad)
        applied = bias if removed is None else bias + base_bias(removed, (n_layers, n_heads, p), device, dtype)
    total = torch.zeros(p, n_chunks, dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    layer = torch.zeros(n_layers, p, n_chunks, dtype=torch.float64)
    head = torch.zeros(n_layers, n_heads, p, n_chunks, dtype=torch.float64)
    generator = torch.Generator(device=device).manual_seed(seed)
    cache = shared_cache(trace.keys, trace.values, 1, model.config)
    bounded = checkpointed_layers(model, cache) if checkpoint else nullcontext()
    with torch.enable_grad(), attention_bias(model, applied), bounded:
        hidden = _hidden(model, trace, cont, capture, block, cache, start)
        labels, mean_w = _label_terms(hidden.detach(), lm_head, samples, generator, block)
        for s in range(samples):
            score = lm_head.weight[labels[:, s]] - mean_w  # d log P_t(y_t) / d h_t
            for k, (size, in_chunk) in enumerate(zip(sizes, rows)):
                (g,) = torch.autograd.grad(
                    hidden,
                    bias,
                    grad_outputs=score * in_chunk[:, None].to(score.dtype),
                    retain_graph=s < samples - 1 or k < n_chunks - 1,
                )
                g = g.detach().double().cpu()
                half_sq = 0.5 / size
                x = g.sum(dim=(0, 1)).square_().mul_(half_sq)
                total[:, k] += x
                total_sq[:, k] += x.square()
                layer[..., k] += g.sum(dim=1).square_().mul_(half_sq)
                head[..., k] += g.square_().mul_(half_sq)
            if on_progress:
                on_progress(1)
    mean = total / samples
    se = (
        ((total_sq / samples - mean.square()).clamp_min(0) / (samples - 1)).sqrt()
        if samples > 1
        else torch.full_like(mean, float("nan"))
    )  # the standard error of the mean over samples
    return FisherEstimate(
        list(chunks),
        samples,
        mean,
        se,
        layer / samples,
        head / samples,
        time.perf_counter() - t0,
        {"seed": seed, "checkpoint": bool(checkpoint), "removed": 0 if removed is None else int(removed.sum())},
    )


def base_bias(
    removed: torch.Tensor, shape: tuple[int, int, int], device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The constant bias of a base eviction: ``finfo(float32).min`` where ``removed`` (bool ``[L, H_kv, p]``)
    is True, 0 elsewhere -> ``dtype`` ``[L, H_kv, p]`` (added to the masks, it gives exactly zero weight)."""
    if tuple(removed.shape) != shape:
        raise FIError(f"a base eviction must be [L, H_kv, p] = {list(shape)}, got {list(removed.shape)}")
    out = torch.zeros(shape, device=device, dtype=dtype)
    return out.masked_fill_(removed.to(device), torch.finfo(torch.float32).min)


@torch.no_grad()  # forward-mode AD is not affected by no_grad
def expected_fisher(
    model,
    trace: Trace,
    ids: torch.Tensor,
    positions: torch.Tensor,
    chunks: Sequence[Chunk],
    block: int = 512,
    layer: int | None = None,
    head: int | None = None,
) -> torch.Tensor:
    """The full-vocabulary expectation of the estimate (no sampling) at ``positions`` -> ``[len(positions), K]``
    float64: per position one forward-mode pass gives ``dh_t/db_j`` (the bias on every layer and head,
    or on ``layer`` only, or on its KV ``head`` only), then ``1/2 mean_{t in C} Var_{y~P_t}(W_y . dh_t/db_j)``
    over the full vocabulary, in float64."""
    p, device, cont, capture, rows = _prepare(model, trace, ids, chunks)
    lm_head = decoder_parts(model)[2]
    weight = lm_head.weight.double()
    out = torch.zeros(len(positions), len(chunks), dtype=torch.float64)
    shape = (trace.num_layers, trace.num_kv_heads, p)
    for i, j in enumerate(torch.as_tensor(positions).tolist()):
        tangent = torch.zeros(shape, device=device)
        tangent[(slice(None) if layer is None else layer, slice(None) if head is None else head, j)] = 1.0
        with forward_ad.dual_level():
            bias = forward_ad.make_dual(torch.zeros(shape, device=device), tangent)
            with attention_bias(model, bias, eager=True):
                primal, dh = forward_ad.unpack_dual(_hidden(model, trace, cont, capture, block))
        per_row = torch.zeros(primal.shape[0], dtype=torch.float64)
        for a in range(0, primal.shape[0], block):
            probs = torch.softmax(lm_head(primal[a : a + block]).double(), dim=-1)
            dz = dh[a : a + block].double() @ weight.T  # d z_t / d b_j over the vocabulary
            centred = dz - (probs * dz).sum(-1, keepdim=True)
            per_row[a : a + block] = (probs * centred.square()).sum(-1).cpu()
        for k, in_chunk in enumerate(rows):
            out[i, k] = 0.5 * per_row[in_chunk.cpu()].mean()
    return out
