"""Per-token signals of SPEC "Signals", as pure tensor functions (float32 results).

Shapes: ``L`` layers, ``Hq`` query heads, ``Hkv`` KV heads, ``w`` window, ``p`` prefix length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
        out[start : start + block] = topk_entropy(lm_head(hidden[start : start + block]), k)
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


def window_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    pool_kernel: int = 7,
) -> torch.Tensor:
    """Window attention per KV head, SPEC signal 4.

    ``queries [Hq, w, hd]`` are the RoPE-rotated queries of the last ``w`` positions of the prefix,
    ``keys [Hkv, p, hd]`` the rotated keys of the whole prefix. Causal softmax in float32, mean over
    the window queries, average pool over the scored positions ``[0, p - w)`` (the window's own
    scores are left unpooled: pooling across the boundary would leak window mass into the last
    scored tokens), then the mean over the query heads of each GQA group -> ``[Hkv, p]``.
    """
    n_q, w, _ = queries.shape
    n_kv, p, _ = keys.shape
    groups = n_q // n_kv
    k = keys.float().repeat_interleave(groups, dim=0)  # query head h reads KV head h // groups
    scores = torch.matmul(queries.float(), k.transpose(1, 2)) * scaling  # [Hq, w, p]
    query_pos = torch.arange(p - w, p, device=keys.device)[:, None]
    key_pos = torch.arange(p, device=keys.device)[None, :]
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    attn = torch.softmax(scores, dim=-1).mean(dim=1)  # [Hq, p]
    attn = torch.cat([pool_scores(attn[:, : p - w], pool_kernel), attn[:, p - w :]], dim=-1)
    return attn.view(n_kv, groups, p).mean(dim=1)


def layer_entropy_score(distance: torch.Tensor, entropy: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """``E^(l)_i = (D^(l)_i + tau) * H_i`` -> ``[L, n]``; ``tau`` keeps the score alive where ``D = 0``."""
    return (distance + tau) * entropy.unsqueeze(0)


def infokv_score(attention: torch.Tensor, layer_entropy: torch.Tensor, alpha: float, scored: int) -> torch.Tensor:
    """``S = alpha * A + (1 - alpha) * softmax_i(E)`` over the scored positions ``[0, scored)``.

    ``attention [L, Hkv, p]``, ``layer_entropy [L, p]`` -> ``[L, Hkv, scored]``. ``alpha = 1`` returns
    the attention scores unchanged (SnapKV scoring); ``alpha = 0`` pure entropy scoring.
    """
    soft = torch.softmax(layer_entropy[:, :scored].float(), dim=-1).unsqueeze(1)
    return alpha * attention[..., :scored] + (1.0 - alpha) * soft
