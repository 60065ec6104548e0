"""An independent oracle for compressed caches (shared by the generation and replay tests): the full model
without any cache, eager attention, with a per-layer, per-KV-head mask of which entries each query
cannot see. Built by hand from keep maps, never from the code under test's masks."""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

BLOCKED: dict = {}  # layer -> bool [Hkv, n, n] (query, key): True where the entry is hidden from the query


def _masked_eager(module, query, key, value, attention_mask, *args, scaling=None, dropout=0.0, **kwargs):
    # args: a dropout passed by position (kvpress's attention patch does, once kvpress is imported)
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)
    v = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, k.transpose(2, 3)) * scaling  # [1, Hq, n, n]
    n = scores.shape[-1]
    pos = torch.arange(n)
    blocked = (pos[None, :] > pos[:, None]) | BLOCKED[module.layer_idx].repeat_interleave(groups, dim=0)  # causal too
    scores = scores.masked_fill(blocked[None], float("-inf"))
    out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("test_masked_eager", _masked_eager)
AttentionMaskInterface.register("test_masked_eager", sdpa_mask)


def masked_logits(model, ids: torch.Tensor, blocked: dict) -> torch.Tensor:
    """Float32 logits at every position of ``ids`` (one uncached forward) with ``blocked[layer]``
    ``[Hkv, n, n]`` hidden from each query, besides the causal mask."""
    BLOCKED.clear()
    BLOCKED.update(blocked)
    previous = model.config._attn_implementation
    model.set_attn_implementation("test_masked_eager")
    try:
        with torch.no_grad():
            return model(ids[None]).logits[0].float()
    finally:
        model.set_attn_implementation(previous)
