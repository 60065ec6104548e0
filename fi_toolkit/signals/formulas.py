"""Per-token signals of docs/method.md, "Signals", as pure tensor functions (float32 results).

Shapes: ``L`` layers, ``Hq`` query heads, ``Hkv`` KV heads, ``w`` window, ``p`` prefix length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fi_toolkit.signals.config import QUERY_SINKS  # noqa: F401 (the tracker reads it here)


def topk_entropy(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Entropy (nats) of the softmax over the ``k`` largest logits; ``k >= V`` is the full entropy."""
    logits = logits.float()
    if k < logits.shape[-1]:
        logits = logits.topk(k, dim=-1).values
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def streamed_topk_entropy(hidden: torch.Tensor, lm_head: torch.nn.Module, k: int, block: int = 512) -> torch.Tensor:
    """Top-k entropy of ``lm_head(hidden)`` for ``hidden [n, d]``, ``block`` rows at a time.

    Never holds more than ``block x V`` logits: the ``[n, V]`` matrix is never materialised.
    """
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], block):
        out[start : start + block] = topk_entropy(lm_head(hidden[start : start + block]), k).to(out.device)
    return out


def representation_distance(layer_inputs: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """``D^(l)_i = 1 - cos(h^(l)_i, h^(L)_i)`` for ``layer_inputs [L, n, d]`` and ``final [n, d]`` -> ``[L, n]``."""
    return 1.0 - F.cosine_similarity(layer_inputs.float(), final.float().unsqueeze(0), dim=-1)


def pool_scores(scores: torch.Tensor, kernel: int) -> torch.Tensor:
    """1-D average pool over the last axis, stride 1, same length (SnapKV's smoothing); 1 = off."""
    if kernel <= 1:
        return scores
    flat = scores.reshape(-1, 1, scores.shape[-1])
    pooled = F.avg_pool1d(flat, kernel_size=kernel, stride=1, padding=kernel // 2)
    return pooled.reshape(scores.shape)


def attention_received(
    queries: torch.Tensor, keys: torch.Tensor, scaling: float, dead: torch.Tensor | None = None
) -> torch.Tensor:
    """Attention each key receives, summed over ``queries``, averaged over each GQA group -> ``[Hkv, p]``.

    ``queries [Hq, n, hd]`` are the RoPE-rotated queries of the last ``n`` positions of a sequence
    whose rotated keys are ``keys [Hkv, p, hd]``; causal softmax in float32, unpooled. This is the
    one scale H2O accumulates on (window queries at prefill, each generated query after).
    ``dead [Hkv, p]`` (True: a pad slot of an uneven cache): those keys get exactly zero weight and the
    softmax runs over the others, as if they were not there (the last ``n`` slots must be live).
    """
    n_q, n, _ = queries.shape
    n_kv, p, _ = keys.shape
    groups = n_q // n_kv
    k = keys.float().repeat_interleave(groups, dim=0)  # query head h reads KV head h // groups
    scores = torch.matmul(queries.float(), k.transpose(1, 2)) * scaling  # [Hq, n, p]
    query_pos = torch.arange(p - n, p, device=keys.device)[:, None]
    key_pos = torch.arange(p, device=keys.device)[None, :]
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    if dead is not None:
        scores = scores.masked_fill(dead.to(keys.device).repeat_interleave(groups, dim=0)[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1).sum(dim=1).view(n_kv, groups, p).mean(dim=1)


def window_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    pool_kernel: int = 7,
    dead: torch.Tensor | None = None,
) -> torch.Tensor:
    """Window attention per KV head (docs/method.md, signal 4) -> ``[Hkv, p]``.

    The mean over the ``w`` window queries of :func:`attention_received` (causal softmax in float32,
    mean over each GQA group), average-pooled over the scored positions ``[0, p - w)`` (the window's
    own scores are left unpooled: pooling across the boundary would leak window mass into the last
    scored tokens). Pooling and the group mean are both linear, so their order does not matter.
    ``dead [Hkv, p]`` (True: a pad slot of an uneven cache): each head is scored over its live slots alone,
    as if the dead ones were deleted (softmax, pooling and the window's boundary), and its dead slots score 0.
    """
    if dead is not None and bool(dead.any()):  # each head over its live slots, as if its dead ones were deleted
        groups = queries.shape[0] // keys.shape[0]
        out = torch.zeros(keys.shape[:2], dtype=torch.float32, device=keys.device)
        for h, hidden in enumerate(dead.to(keys.device)):
            live = torch.nonzero(~hidden).flatten()
            head = queries[h * groups : (h + 1) * groups]
            out[h, live] = window_attention(head, keys[h : h + 1, live], scaling, pool_kernel)[0]
        return out
    w = queries.shape[1]
    p = keys.shape[1]
    attn = attention_received(queries, keys, scaling) / w
    return torch.cat([pool_scores(attn[:, : p - w], pool_kernel), attn[:, p - w :]], dim=-1)


def layer_entropy_score(distance: torch.Tensor, entropy: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """``E^(l)_i = (D^(l)_i + tau) * H_i`` (``entropy`` broadcast against ``distance``); ``tau`` keeps the
    score alive where ``D = 0``."""
    return (distance.float() + tau) * entropy.float()


def infokv_score(attention: torch.Tensor, layer_entropy: torch.Tensor, alpha: float) -> torch.Tensor:
    """``S = alpha * A + (1 - alpha) * softmax(E)``, the softmax over the last axis: the candidate positions.

    The one implementation of the InfoKV score: the trace (``Trace.infokv``) and the policy
    (``policies.InfoKV``) both call it, on the positions each may evict. ``alpha = 1`` returns the
    attention scores unchanged (SnapKV scoring); ``alpha = 0`` pure entropy scoring.
    """
    return alpha * attention.float() + (1.0 - alpha) * torch.softmax(layer_entropy.float(), dim=-1)


def entropy_of_tokens(at_position: torch.Tensor, entropy_of: str) -> torch.Tensor:
    """Per-token ``H [n]`` from the entropies ``[n]`` of the distributions computed *at* each position.

    ``"next"``: ``H_i`` is the entropy at ``i`` (predicting ``x_{i+1}``), returned as is.
    ``"produced"`` (the default): ``H_i`` is the entropy of the distribution that produced ``x_i``,
    i.e. the one computed at ``i - 1``; nothing predicted ``x_0``, so ``H_0 = 0``.
    """
    if entropy_of == "next":
        return at_position
    return torch.cat([at_position.new_zeros(1), at_position[:-1]])


def add_query_moments(moments: tuple | None, queries: torch.Tensor) -> tuple:
    """Running ``(count, sum, sum of outer products)`` of pre-RoPE queries ``[Hq, m, hd]`` -> ``(int, [Hq, hd],
    [Hq, hd, hd])``, float64 (float32 on a device without it): ExpectedAttention's query mean and covariance
    (arXiv 2510.00636) are read from them, so the rows themselves are never kept."""
    dtype = torch.float32 if queries.device.type == "mps" else torch.float64
    q = queries.to(dtype)
    count, total, outer = q.shape[1], q.sum(dim=1), torch.einsum("hmi,hmj->hij", q, q)
    if moments is None:
        return count, total, outer
    return moments[0] + count, moments[1] + total, moments[2] + outer
