"""Keep maps whose KV heads keep different counts (AdaKV-style presses): the probe masks each
head's entries in every layer's attention, checked against an independent oracle (an uncached eager
forward with a hand-built per-head mask, tests/oracles.py); compressed decoding refuses them."""

from __future__ import annotations

import pytest
import torch
from oracles import masked_logits

from fi_toolkit.eviction import KeepMap, gather_cache
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.forward_influence import forward_influence
from fi_toolkit.signals.trace import SignalConfig, trace_prefix

P = 96


def uneven_map(layers: int, heads: int, p: int, seed: int = 0) -> KeepMap:
    """Each layer and head keeps its own random share of the prefix (sink and last 8 always)."""
    gen = torch.Generator().manual_seed(seed)
    per_layer = []
    for _ in range(layers):
        rows = []
        for _ in range(heads):
            count = int(torch.randint(20, p - 20, (1,), generator=gen))
            middle = 1 + torch.randperm(p - 9, generator=gen)[: count - 9]
            rows.append(torch.sort(torch.cat([torch.tensor([0]), middle, torch.arange(p - 8, p)])).values)
        per_layer.append(rows)
    return KeepMap.from_heads("uneven", per_layer)


def test_from_heads_pads_uneven_rows_and_keeps_even_maps_plain():
    even = KeepMap.from_heads("even", [[torch.tensor([0, 2, 5]), torch.tensor([1, 2, 3])]])
    assert not even.uneven and torch.equal(even.keep[0], torch.tensor([[0, 2, 5], [1, 2, 3]]))
    m = KeepMap.from_heads("m", [[torch.tensor([0, 2, 5]), torch.tensor([4])], [torch.tensor([1]), torch.tensor([3])]])
    assert m.uneven and [c.tolist() for c in m.head_counts] == [[3, 1], [1, 1]]
    assert torch.equal(m.keep[0], torch.tensor([[0, 2, 5], [4, 4, 4]]))  # padded with its last position
    vis = m.visible(6)
    assert vis[0].sum(dim=1).tolist() == [3, 1] and vis[1].sum(dim=1).tolist() == [1, 1]
    assert m.n_removed(6) == 6 - 6 / 4  # the mean over layers and heads
    keys = torch.arange(2 * 6, dtype=torch.float32).view(1, 2, 6, 1).expand(1, 2, 6, 4)
    gathered = gather_cache([keys] * 2, [keys] * 2, m, None)  # padded rows: the decoder hides the pads
    assert gathered.layers[0].keys[0, :, :, 0].tolist() == [[0, 2, 5], [10, 10, 10]]


def kl_rows(full: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    logp, logq = torch.log_softmax(full.double(), -1), torch.log_softmax(other.double(), -1)
    return (logp.exp() * (logp - logq)).sum(-1)


def test_uneven_keep_map_probe_equals_the_per_head_masked_oracle(tiny, tiny_ids):
    model = tiny.model
    trace = trace_prefix(model, tiny_ids, P, SignalConfig(window=8))
    keep_map = uneven_map(4, 2, P)
    assert keep_map.uneven
    chunks = [Chunk(P, 160), Chunk(200, 260)]
    result = forward_influence(model, trace, tiny_ids, [keep_map], chunks)

    n = 260
    blocked = {}
    for layer, vis in enumerate(keep_map.visible(P)):
        b = torch.zeros(2, n, n, dtype=torch.bool)
        b[:, P:, :P] = ~vis[:, None, :]  # queries after p do not see the evicted prefix entries
        blocked[layer] = b
    ids = tiny_ids[:n]
    full = masked_logits(model, ids, {layer: torch.zeros(2, n, n, dtype=torch.bool) for layer in range(4)})
    pruned = masked_logits(model, ids, blocked)
    kl = kl_rows(full, pruned)
    oracle = torch.stack([kl[c.start : c.end].mean() for c in chunks]).float()
    assert float(oracle.min()) > 1e-4  # the eviction matters, so agreement means something
    assert torch.allclose(result.fi()[0], oracle, rtol=1e-4, atol=1e-6)


def test_even_map_through_the_head_mask_equals_the_gather_path(tiny, tiny_ids):
    """The same even keep map measured both ways (marked uneven by hand to force the per-head mask)."""
    model = tiny.model
    trace = trace_prefix(model, tiny_ids, P, SignalConfig(window=8))
    gen = torch.Generator().manual_seed(3)
    rows = [[torch.sort(torch.randperm(P, generator=gen)[:40]).values for _ in range(2)] for _ in range(4)]
    even = KeepMap.from_heads("even", rows)
    masked = KeepMap("masked", even.keep, {}, [torch.full((2,), 40)] * 4)
    fi = forward_influence(model, trace, tiny_ids, [even, masked], [Chunk(P, 200)]).fi()
    assert masked.uneven and not even.uneven
    assert torch.allclose(fi[0], fi[1], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kind", ["ragged", "head_masked", "biased"])
def test_registered_attention_takes_dropout_by_position(tiny, kind):
    """kvpress's attention patch (active once kvpress is imported) calls every registered attention
    function with ``dropout`` as the sixth positional argument, which is eager attention's ``scaling``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from fi_toolkit.model.attention import HEAD_MASKED, RAGGED
    from fi_toolkit.probe.estimator import BIASED

    fn = ALL_ATTENTION_FUNCTIONS[{"ragged": RAGGED, "head_masked": HEAD_MASKED, "biased": BIASED}[kind]["eager"]]
    module = tiny.model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 4, 3, 16, generator=gen),
        torch.randn(1, 2, 3, 16, generator=gen),
        torch.randn(1, 2, 3, 16, generator=gen),
    )
    by_name = fn(module, q, k, v, None, dropout=0.0, scaling=0.25)[0]
    by_position = fn(module, q, k, v, None, 0.0, scaling=0.25)[0]  # as kvpress's patch calls it
    assert torch.equal(by_name, by_position)


def test_a_cropped_mask_is_its_own_aligned_tensor():
    """A layer holding fewer keys than layer 0 gets the mask's last ``key_len`` columns as a fresh tensor: a view
    that starts mid-row made CUDA's memory-efficient SDPA fail with "misaligned address" (seen on an H200 probing
    PyramidKV at p = 2048), which no CPU run shows. The values are the right-aligned columns, computed here by hand."""
    from fi_toolkit.model.attention import align_mask

    mask = torch.randn(2, 1, 3, 11)
    out = align_mask(mask, 6)
    assert out.is_contiguous() and out.storage_offset() == 0
    assert torch.equal(out, torch.stack([mask[..., 5 + j] for j in range(6)], dim=-1))
    assert align_mask(mask, 11) is mask  # nothing to align: the same tensor
