"""Forward Influence (docs/method.md) on the tiny random Llama: the exactness contract and its oracles."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch
from cases import CHUNKS, P, probe_sets
from oracles import fi_by_masked_full_forward

from fi_toolkit.errors import FIError
from fi_toolkit.eviction import TokenSet
from fi_toolkit.probe.chunks import Chunk, check_chunks, parse_chunk
from fi_toolkit.probe.forward_influence import forward_influence, forward_influence_by_deletion
from fi_toolkit.probe.kl import kl_from_reference, log_sum_exp
from fi_toolkit.signals.trace import SignalConfig, trace_prefix


@pytest.fixture(scope="module")
def trace(tiny, tiny_ids):
    return trace_prefix(tiny.model, tiny_ids, P, SignalConfig(window=16))


def test_masked_batched_probe_equals_an_independent_masked_full_forward(tiny, tiny_ids, trace):
    sets = probe_sets()
    masked = forward_influence(tiny.model, trace, tiny_ids, sets, CHUNKS, batch_size=3, block=64).fi()
    for i, s in enumerate(sets):
        oracle = fi_by_masked_full_forward(tiny.model, tiny_ids, s.removed, P, CHUNKS)
        assert (masked[i] - oracle).abs().max().item() <= 1e-5, (s.label, masked[i], oracle)
        assert oracle.min() > 1e-5  # the comparison is not between two zeros


def test_masked_batched_probe_equals_physical_deletion(tiny, tiny_ids, trace):
    sets = probe_sets()
    masked = forward_influence(tiny.model, trace, tiny_ids, sets, CHUNKS, batch_size=3, block=64).fi()
    for i, s in enumerate(sets):
        deleted = forward_influence_by_deletion(tiny.model, trace, tiny_ids, s.removed, CHUNKS)
        assert (masked[i] - deleted).abs().max().item() <= 1e-5, s.label
        assert deleted.max() > 1e-5  # the comparison is not between two zeros


@pytest.mark.parametrize("batch_size", [1, 3])
def test_empty_eviction_runs_the_real_path_and_is_exactly_zero(tiny, tiny_ids, trace, batch_size):
    """No shortcut: the empty set goes through the batched masked forward like any other set, so a
    path that perturbed the continuation (a wrong mask, positions or cache) would give FI > 0."""
    sets = [TokenSet("empty", [])] + probe_sets()
    ticks = []
    result = forward_influence(
        tiny.model, trace, tiny_ids, sets, CHUNKS, batch_size=batch_size, on_progress=ticks.append
    )
    assert sum(ticks) == len(sets)
    fi = result.fi()
    assert fi.dtype == torch.float32 and torch.equal(fi[0], torch.zeros(len(CHUNKS)))
    # KL is not clamped: the only slack allowed is float32 rounding, far below any real effect here.
    assert result.kl.min() >= -1e-6 and (fi[1:] > 1e-5).all()


def test_keeping_everything_through_the_gather_path_gives_zero(tiny, tiny_ids, trace):
    """The physical path with nothing removed reproduces the reference (up to float rounding)."""
    nothing = TokenSet("nothing", []).keep_map(P, trace.num_layers, trace.num_kv_heads)
    fi = forward_influence(tiny.model, trace, tiny_ids, [nothing], CHUNKS).fi()
    assert fi.abs().max() <= 1e-6


def test_keep_map_path_equals_token_set_path(tiny, tiny_ids, trace):
    s = probe_sets()[1]
    km = s.keep_map(P, trace.num_layers, trace.num_kv_heads)
    fi = forward_influence(tiny.model, trace, tiny_ids, [s, km], CHUNKS).fi()
    assert (fi[0] - fi[1]).abs().max() <= 1e-5


def test_several_chunks_in_one_pass_equal_separate_runs(tiny, tiny_ids, trace):
    sets = probe_sets()[:3]
    together = forward_influence(tiny.model, trace, tiny_ids, sets, CHUNKS).fi()
    for j, chunk in enumerate(CHUNKS):
        alone = forward_influence(tiny.model, trace, tiny_ids, sets, [chunk]).fi()[:, 0]
        torch.testing.assert_close(together[:, j], alone, rtol=0, atol=1e-6)


def test_batch_size_and_block_size_do_not_change_fi(tiny, tiny_ids, trace):
    sets = probe_sets()
    a = forward_influence(tiny.model, trace, tiny_ids, sets, CHUNKS, batch_size=1, block=512).fi()
    b = forward_influence(tiny.model, trace, tiny_ids, sets, CHUNKS, batch_size=5, block=37).fi()
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_kl_rows_equal_scipy_relative_entropy():
    gen = torch.Generator().manual_seed(4)
    ref_logits, logits = torch.randn(6, 50, generator=gen) * 2, torch.randn(3, 6, 50, generator=gen) * 2
    ref_logp = torch.log_softmax(ref_logits, -1)
    ours = kl_from_reference(ref_logp.exp(), ref_logits, log_sum_exp(ref_logits), logits).numpy()
    p = scipy.special.softmax(ref_logits.double().numpy(), -1)
    q = scipy.special.softmax(logits.double().numpy(), -1)
    expected = scipy.stats.entropy(p[None].repeat(3, 0), q, axis=-1)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shift", [0.0, 4.0, -37.3, 300.0])
@pytest.mark.parametrize("scale", [4.0, 20.0])
def test_kl_is_accurate_where_per_token_fi_lives(shift, scale):
    """Near-identical distributions over a 49,152-token vocabulary (KL ~ 1e-7 to 1e-6, the size of
    far-chunk per-token FI), with and without a constant logit shift and with flat or peaked
    distributions: a float32 log-softmax is off by up to ~4e-6 here; ours must stay within 3e-8."""
    gen = torch.Generator().manual_seed(0)
    ref_logits = torch.randn(16, 49152, generator=gen) * scale
    logits = (ref_logits + shift + 1e-3 * torch.randn(16, 49152, generator=gen))[None]
    ours = kl_from_reference(torch.softmax(ref_logits, -1), ref_logits, log_sum_exp(ref_logits), logits).double()
    lp, lq = torch.log_softmax(ref_logits.double(), -1), torch.log_softmax(logits[0].double(), -1)
    exact = (lp.exp() * (lp - lq)).sum(-1)
    assert exact.max() < 2e-6 and (ours[0] - exact).abs().max() < 3e-8
    same = kl_from_reference(torch.softmax(ref_logits, -1), ref_logits, log_sum_exp(ref_logits), ref_logits[None])
    assert torch.equal(same, torch.zeros(1, 16))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("9:3", "smaller than end"),
        ("5:5", "smaller than end"),
        ("a:b", "START:END"),
        ("10", "START:END"),
        ("-1:4", ">= 0"),
    ],
)
def test_bad_chunks_are_refused(spec, message):
    with pytest.raises(FIError, match=message):
        parse_chunk(spec)


def test_chunk_range_checks():
    with pytest.raises(FIError, match="before the compression point"):
        check_chunks([Chunk(100, 200)], 150, 1000, 8192)
    with pytest.raises(FIError, match="document's end"):
        check_chunks([Chunk(200, 2000)], 150, 1000, 8192)
    with pytest.raises(FIError, match="context"):
        check_chunks([Chunk(200, 900)], 150, 1000, 512)


def test_bfloat16_model_gives_float32_signals_and_close_fi(tiny_ids):
    """The CUDA path runs models in bf16; signals and KL are still float32. Checked here on the CPU."""
    from fi_toolkit.model.loading import tiny_model

    lm32 = tiny_model(seed=0)
    lm16 = tiny_model(seed=0)
    lm16.model.to(torch.bfloat16)
    sets = probe_sets()[:2]
    fis = []
    for lm in (lm32, lm16):
        tr = trace_prefix(lm.model, tiny_ids, P, SignalConfig(window=16))
        assert tr.entropy.dtype == tr.attention.dtype == tr.distance.dtype == torch.float32
        fis.append(forward_influence(lm.model, tr, tiny_ids, sets, CHUNKS).fi())
    assert torch.isfinite(fis[1]).all() and (fis[1] > 0).all()
    torch.testing.assert_close(fis[1], fis[0], rtol=0.25, atol=1e-4)
