"""The tests' shared oracles: independent computations that share no code with what they check.

Each builds its answer from plain transformers (an uncached forward, eager attention weights, a mask
written here) and never from the toolkit's masks, caches, attention functions or shortcuts, so a
plausible bug in the code under test makes the comparison fail. Test files import them from here,
never from each other.

- :func:`masked_logits`: the full model without a cache, eager attention, a per-layer, per-KV-head
  mask of which entries each query cannot see (compressed caches, uneven heads).
- :func:`masked_reference_logits`: the same for the keys a prefill keep map evicted.
- :func:`fi_by_masked_full_forward`: FI from one uncached forward under an explicit mask.
- :func:`pooled_window_attention`: window attention from eager ``output_attentions`` and scipy pooling.
- :func:`assert_prefill_compression_equals_masked_model`, :func:`assert_full_budget_greedy_equals_plain_generate`:
  the compressor's two contracts (masked model; full budget = ``model.generate``).
"""

from __future__ import annotations

import copy

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from fi_toolkit.compress.decoder import CompressedDecoder, generate
from fi_toolkit.policies import InfoKV

P, W = 120, 16  # the compressor oracles' prompt length and window (tests/test_generate.py's)


# -- compressed caches: the full model with a hand-built mask ----------------------------------------

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


def masked_reference_logits(model, ids: torch.Tensor, keep: list[torch.Tensor]) -> torch.Tensor:
    """Logits at every position of ``ids`` when positions >= P cannot see what ``keep`` evicted."""
    n = ids.numel()
    blocked = {}
    for layer, idx in enumerate(keep):
        evicted = torch.ones(idx.shape[0], P, dtype=torch.bool)
        evicted.scatter_(1, idx.cpu(), False)
        blocked[layer] = torch.zeros(idx.shape[0], n, n, dtype=torch.bool)
        blocked[layer][:, P:, :P] = evicted[:, None, :]
    return masked_logits(model, ids, blocked)


def assert_prefill_compression_equals_masked_model(model, ids: torch.Tensor, policy) -> None:
    """Compress the first P tokens with ``policy``, feed 4 more: their logits are the full model's with
    what the keep map evicted hidden from them (an eviction that changed nothing does not count)."""
    from fi_toolkit.model.attention import ragged_attention

    decoder = CompressedDecoder(model, policy, 200)
    try:
        with ragged_attention(model):
            _, keep = decoder.prefill(ids[:P])
            steps = [decoder.step(int(t)) for t in ids[P : P + 4]]
    finally:
        decoder.close()
    assert keep is not None and decoder.lengths() == [c + 4 for c in keep.counts()]
    reference = masked_reference_logits(model, ids[: P + 4], keep.keep)
    for i, logits in enumerate(steps):
        assert (logits - reference[P + i]).abs().max().item() <= 1e-5
    full = model(ids[None, : P + 1]).logits[0, P].float()
    assert (steps[0] - full).abs().max().item() > 1e-3  # the eviction really changed something


def assert_full_budget_greedy_equals_plain_generate(model, ids: torch.Tensor, budget) -> None:
    """A budget that never evicts: 30 greedy tokens after the first P of ``ids`` = ``model.generate``'s."""
    ids = ids[:P]
    plain = model.generate(ids[None], max_new_tokens=30, do_sample=False, pad_token_id=0)[0, P:].tolist()
    result = generate(model, None, ids, InfoKV(budget=budget, window=W), max_new_tokens=30, interval=5)
    assert result.tokens == plain
    assert result.stats.compressions == 0 and not result.stats.prefill_compressed
    assert result.stats.note.startswith("nothing evicted")  # said, not silent


# -- probe and signals ------------------------------------------------------------------------------


def fi_by_masked_full_forward(model, ids, removed, p, chunks) -> torch.Tensor:
    """An oracle that shares nothing with the probe: one forward over the whole sequence ``[0, max r_c)``
    with no cache, under an explicit mask (written here) in which every query at ``t >= p`` cannot
    see the removed keys, compared with the plain causal forward; KL in float64."""
    n = max(c.end for c in chunks)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    allowed[p:, torch.as_tensor(removed, dtype=torch.long)] = False
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(1, 1, n, n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    with torch.no_grad():
        full = torch.log_softmax(model(ids[:n][None]).logits[0].double(), -1)
        pruned = torch.log_softmax(model(ids[:n][None], attention_mask=mask).logits[0].double(), -1)
    kl = (full.exp() * (full - pruned)).sum(-1)
    return torch.stack([kl[c.start : c.end].mean() for c in chunks]).float()


def eager_twin(model):
    """The same weights with eager attention, whose output_attentions the oracles read."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    return eager


def pooled_window_attention(model, ids: torch.Tensor, window: int, kernel: int = 7) -> list[torch.Tensor]:
    """From the eager model's output_attentions over ``ids`` (no cache, no compression): the mean over
    the last ``window`` query rows, zero-padded uniform pooling over ``[0, n - window)``, GQA-group mean."""
    import numpy as np
    from scipy.ndimage import convolve1d

    eager = eager_twin(model)
    n = ids.numel()
    with torch.no_grad():
        att = eager(ids[None], output_attentions=True).attentions
    out = []
    for a in att:
        rows = a[0, :, n - window :, :].double().mean(dim=1).numpy()  # [Hq, n]
        scored = convolve1d(rows[:, : n - window], np.ones(kernel) / kernel, axis=-1, mode="constant")
        rows = np.concatenate([scored, rows[:, n - window :]], axis=-1)
        hkv = model.config.num_key_value_heads
        out.append(torch.from_numpy(rows).view(hkv, -1, n).mean(dim=1))
    return out
