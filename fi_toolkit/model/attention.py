"""Attention over caches whose layers hold different numbers of entries (uneven per-layer budgets).

After an adaptive or PyramidKV eviction, layer ``l`` of the cache holds ``k_l`` prefix entries.
transformers sizes one attention mask for all layers (from layer 0), which breaks every other layer.
:func:`ragged_attention` switches the model, for the duration of a ``with`` block, to a registered
attention function that re-aligns a 4-D mask to each layer's key length: the mask is right-aligned
(the newest keys keep their causal pattern) and cropped or left-padded with "visible" on the
prefix side. That is exact whenever every cached prefix entry is visible, which is the case after a
physical gather (evicted entries are gone, not masked). Single-token decoding passes no mask at all.

Keep maps whose KV heads keep different counts are held padded (each head's row repeats its last kept
slot): inside :func:`hidden_slots` the same wrapper also hides those dead slots per KV head.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.models.llama.modeling_llama import eager_attention_forward

from fi_toolkit.errors import FIError


def align_mask(mask: torch.Tensor | None, key_len: int) -> torch.Tensor | None:
    """Right-align a ``[B, 1, q, K]`` mask to ``key_len`` keys (crop or pad the prefix side as visible)."""
    if mask is None or mask.dim() != 4 or mask.shape[-1] == key_len:
        return mask
    extra = mask.shape[-1] - key_len
    if extra > 0:  # a copy: a view that starts mid-row trips CUDA's memory-efficient SDPA ("misaligned address")
        return mask[..., extra:].contiguous()
    return F.pad(mask, (-extra, 0), value=True if mask.dtype == torch.bool else 0.0)


# Per-head dead slots of a compressed decoder (uneven per-head keep maps held in a padded dense cache, as
# kvpress's AdaKV does): while a `hidden_slots` block runs, the ragged attention also hides, per layer and KV
# head, the cached slots marked dead. One decoder's forward at a time (set around each of its forwards).
_DEAD: dict = {}


def hide_dead(mask: torch.Tensor | None, dead: torch.Tensor, groups: int, query: torch.Tensor, key_len: int):
    """A ``[B, 1, q, K]`` mask right-aligned to this layer's keys (bool, True: visible; additive float; or None:
    causal) -> ``[B, Hq, q, K]`` with the first ``p`` keys hidden per head where ``dead [Hkv, p]`` is True
    (``[B, Hkv, p]``: per batch row). Query head ``h`` reads KV head ``h // groups``. Hidden keys get exactly zero
    weight: False in a bool mask, ``finfo.min`` in a float one (every query still sees its own key, so no row is
    all hidden)."""
    q, p = query.shape[-2], dead.shape[-1]
    hidden = F.pad(dead.to(query.device).repeat_interleave(groups, dim=-2), (0, key_len - p))
    hidden = hidden[None, :, None, :] if dead.dim() == 2 else hidden[:, :, None, :]
    if mask is None:  # causal, right-aligned: query i sees keys [0, key_len - q + i]
        keys = torch.arange(key_len, device=query.device)
        causal = keys[None, :] <= torch.arange(key_len - q, key_len, device=query.device)[:, None]
        mask = torch.zeros(causal.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~causal, torch.finfo(query.dtype).min
        )[None, None]
    if mask.dtype == torch.bool:
        return mask & ~hidden
    return torch.where(hidden, torch.tensor(torch.finfo(mask.dtype).min, dtype=mask.dtype, device=mask.device), mask)


def _ragged(attention_fn):
    def forward(module, query, key, value, attention_mask, *args, **kwargs):
        mask = align_mask(attention_mask, key.shape[-2])
        dead = _DEAD.get("slots")
        if dead is not None and dead[module.layer_idx] is not None:
            mask = hide_dead(mask, dead[module.layer_idx], query.shape[1] // key.shape[1], query, key.shape[-2])
        return attention_fn(module, query, key, value, mask, *args, **kwargs)

    return forward


def dropout_by_name(attention_fn):
    """``attention_fn`` taking a positional ``dropout`` as the keyword it is. kvpress's attention patch
    (applied to every registered attention function when kvpress is imported) passes ``dropout`` as the
    sixth positional argument, which is eager attention's ``scaling``."""

    def forward(module, query, key, value, attention_mask, *args, **kwargs):
        if args:
            kwargs["dropout"], args = args[0], args[1:]
        return attention_fn(module, query, key, value, attention_mask, *args, **kwargs)

    return forward


def register_wrapped(prefix: str, wrap) -> dict[str, str]:
    """Register ``wrap(sdpa)`` and ``wrap(eager)`` as attention functions ``<prefix>_sdpa`` and
    ``<prefix>_eager`` (with the masks their base builds) -> {base implementation: registered name}."""
    names = {"sdpa": f"{prefix}_sdpa", "eager": f"{prefix}_eager"}
    for base, forward, mask in (
        ("sdpa", sdpa_attention_forward, sdpa_mask),
        ("eager", eager_attention_forward, eager_mask),
    ):
        AttentionInterface.register(names[base], dropout_by_name(wrap(forward)))
        AttentionMaskInterface.register(names[base], mask)
    return names


RAGGED = register_wrapped("fi_ragged", _ragged)


@contextmanager
def ragged_attention(model: torch.nn.Module):
    """Run ``model`` with per-layer mask alignment inside the block; restores its implementation after."""
    previous = model.config._attn_implementation
    if previous in RAGGED.values():
        yield model
        return
    if previous not in RAGGED:
        raise FIError(f"uneven per-layer caches need sdpa or eager attention, not '{previous}'")
    model.set_attn_implementation(RAGGED[previous])
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


@contextmanager
def hidden_slots(model: torch.nn.Module, dead: list[torch.Tensor | None] | None):
    """Run ``model``'s forwards inside the block under :func:`ragged_attention` with, per layer, the cached slots
    ``dead[l] [Hkv, p_l]`` (True: a pad slot no query may see; ``[B, Hkv, p_l]``: per batch row) hidden per KV
    head: a padded dense cache then attends exactly as the uneven cache it holds (kvpress's AdaKV masks the same way).
    ``dead=None`` (every head even): nothing changes, the block runs as it would without this."""
    if dead is None:
        yield model
        return
    previous = _DEAD.get("slots")
    with ragged_attention(model):
        _DEAD["slots"] = dead
        try:
            yield model
        finally:
            _DEAD["slots"] = previous


# Per-head visibility of the prefix (uneven per-head keep maps, AdaKV-style): while a
# `head_masked_attention` block runs, every layer's attention hides, per query head, the prefix
# entries its KV head does not keep. One active mask at a time (the probe runs one map per forward).
_HEAD_MASK: dict = {}


def head_mask(mask: torch.Tensor, visible: torch.Tensor, groups: int) -> torch.Tensor:
    """``mask [B, 1, q, K]`` (additive float) -> ``[B, Hq, q, K]`` with the first ``p`` keys hidden per
    head where ``visible [Hkv, p]`` is False (``finfo.min``: exactly zero weight, as the probe's
    token-set mask). Query head ``h`` reads KV head ``h // groups``."""
    hq, p = visible.shape[0] * groups, visible.shape[1]
    hidden = ~visible.repeat_interleave(groups, dim=0)  # [Hq, p]
    out = mask.expand(mask.shape[0], hq, -1, -1).clone()
    out[..., :p] = out[..., :p].masked_fill(hidden[None, :, None, :], torch.finfo(mask.dtype).min)
    return out


def _head_masked(attention_fn):
    def forward(module, query, key, value, attention_mask, *args, **kwargs):
        visible = _HEAD_MASK.get("visible")
        if visible is not None:
            if attention_mask is None or attention_mask.dtype == torch.bool:
                raise FIError("per-head masking needs the probe's additive float mask")
            groups = query.shape[1] // key.shape[1]
            attention_mask = head_mask(attention_mask, visible[module.layer_idx], groups)
        return attention_fn(module, query, key, value, attention_mask, *args, **kwargs)

    return forward


HEAD_MASKED = register_wrapped("fi_head_masked", _head_masked)


@contextmanager
def head_masked_attention(model: torch.nn.Module, visible: torch.Tensor):
    """Run ``model`` with ``visible [L, Hkv, p]`` (True: the entry stays) applied per layer and KV head
    to the first ``p`` keys of every attention call inside the block (the probe's masked path passes
    an explicit additive mask; this widens it per head). Restores the implementation after."""
    previous = model.config._attn_implementation
    if previous not in HEAD_MASKED:
        raise FIError(f"per-head keep maps need sdpa or eager attention, not '{previous}'")
    _HEAD_MASK["visible"] = visible
    model.set_attn_implementation(HEAD_MASKED[previous])
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)
        _HEAD_MASK.clear()
