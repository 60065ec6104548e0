"""The estimator's attention with a hand-written backward against autograd through the plain formula and
through the model's own attention (eager or sdpa): the same gradients, so the same Fisher estimate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fi_toolkit import SignalConfig
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.probe import estimator
from fi_toolkit.probe.bias_attention import ROWS, BiasedAttention
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.signals.trace import trace_prefix


def plain_attention(query, key, value, mask, bias, scale):
    """Softmax attention written out: keys and values repeated to every query head, the bias padded
    with zeros over the fed keys -> ``[1, n, H_q, hd]``."""
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    pad = torch.zeros(bias.shape[0], key.shape[2] - bias.shape[1], dtype=bias.dtype)
    full_bias = torch.cat([bias, pad], dim=1).repeat_interleave(group, dim=0)  # [H_q, K]
    logits = query @ key.transpose(-1, -2) * scale + mask + full_bias[None, :, None, :]
    return (torch.softmax(logits, dim=-1) @ value).transpose(1, 2)


@pytest.mark.parametrize("group", [1, 3])
def test_gradients_equal_autograd_through_the_plain_formula(group):
    """float64, GQA, more query rows than one block, a removed prefix entry (finfo.min) and a causal fed part:
    output and the gradients of the queries, the fed keys and values and the bias."""
    gen = torch.Generator().manual_seed(0)
    kv_heads, head_dim, p, n = 2, 8, 37, 2 * ROWS + 5
    heads = kv_heads * group

    def rand(*shape, grad=True):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_(grad)

    query = rand(1, heads, n, head_dim)
    prefix_k, prefix_v = rand(1, kv_heads, p, head_dim, grad=False), rand(1, kv_heads, p, head_dim, grad=False)
    fed_k, fed_v = rand(1, kv_heads, n, head_dim), rand(1, kv_heads, n, head_dim)
    bias = rand(kv_heads, p)
    removed = torch.zeros(kv_heads, p, dtype=torch.float64)
    removed[0, 5] = removed[1, 30] = torch.finfo(torch.float64).min
    mask = torch.zeros(1, 1, n, p + n, dtype=torch.float64)
    mask[..., p:] = torch.full((n, n), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)
    grad_out = torch.randn(1, n, heads, head_dim, generator=gen, dtype=torch.float64)
    results = []
    for attention in (BiasedAttention.apply, plain_attention):
        key, value = torch.cat([prefix_k, fed_k], dim=2), torch.cat([prefix_v, fed_v], dim=2)
        out = attention(query, key, value, mask, bias + removed, 0.3)
        grads = torch.autograd.grad(out, [query, fed_k, fed_v, bias], grad_out)
        results.append([out, *grads])
    for mine, plain in zip(*results):
        np.testing.assert_allclose(mine.detach().numpy(), plain.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert results[0][4][0, 5] == 0 and results[0][4][1, 30] == 0  # a removed entry has no weight, no gradient


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
@pytest.mark.parametrize(("block", "checkpoint", "with_removed"), [(512, False, False), (24, True, True)])
def test_fisher_estimate_equals_the_one_through_the_models_own_attention(
    architecture, block, checkpoint, with_removed, monkeypatch
):
    """Every output of :func:`fisher_fi` with the hand-written backward equals autograd through the model's
    sdpa attention (the estimator's path before it), in float32: one and two query blocks, checkpointed
    layers, a base eviction."""
    lm = tiny_model(seed=3, architecture=architecture)
    ids = torch.randint(0, 256, (160,), generator=torch.Generator().manual_seed(4))
    p = 100
    trace = trace_prefix(lm.model, ids, p, SignalConfig(window=8))
    removed = None
    if with_removed:
        removed = torch.zeros(trace.num_layers, trace.num_kv_heads, p, dtype=torch.bool)
        removed[:, 0, 10:20] = removed[1, 1, 50:60] = True
    chunks = [Chunk(100, 130), Chunk(140, 160)]
    kwargs = dict(samples=3, seed=1, block=block, checkpoint=checkpoint, removed=removed)
    calls = []
    apply = BiasedAttention.apply
    monkeypatch.setattr(estimator.BiasedAttention, "apply", lambda *args: calls.append(1) or apply(*args))
    mine = fisher_fi(lm.model, trace, ids, chunks, **kwargs)
    assert len(calls) >= trace.num_layers  # the hand-written backward did run
    monkeypatch.setattr(estimator, "_by_hand", lambda *args: False)
    theirs = fisher_fi(lm.model, trace, ids, chunks, **kwargs)
    for name in ("fi", "se", "layer_fi", "head_fi"):
        np.testing.assert_allclose(getattr(mine, name).numpy(), getattr(theirs, name).numpy(), rtol=2e-4, atol=1e-12)
    assert mine.fi[: p - 8].min() > 0  # not a comparison of zeros
    if with_removed:
        assert (mine.head_fi[:, 0, 10:20] == 0).all()
