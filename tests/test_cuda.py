"""The CUDA path on the tiny random Llama: the probe's exactness contract, the noise floors of the two
arithmetics, and compressed decoding's budget and memory accounting. Skipped without a GPU;
benchmarks/gpu_check.py runs these (`pytest -m cuda`) beside its benchmarks."""

from __future__ import annotations

import pytest
import torch
from cases import CHUNKS, P, probe_sets, single_tokens

from fi_toolkit.compress.decoder import generate
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.model.precision import upcast_compute
from fi_toolkit.policies import InfoKV
from fi_toolkit.probe.forward_influence import forward_influence, forward_influence_by_deletion
from fi_toolkit.signals.trace import SignalConfig, trace_prefix

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CFG = SignalConfig(window=16)


def _model(dtype=torch.float32, upcast=True):
    model = tiny_model(seed=0).model.to(device="cuda", dtype=dtype)
    return upcast_compute(model) if upcast else model


@pytest.mark.parametrize("batch_size", [1, 8])
def test_probe_on_cuda_equals_deletion_and_the_cpu(tiny, tiny_ids, batch_size):
    """The masked path on the GPU agrees with physical deletion on the GPU and with the CPU probe;
    the null control is exactly 0 where the batch shape is the reference's (batch 1)."""
    model, sets = _model(), probe_sets()
    trace = trace_prefix(model, tiny_ids, P, CFG)
    gpu = forward_influence(model, trace, tiny_ids, sets, CHUNKS, batch_size=batch_size, controls=True).fi()
    cpu = forward_influence(tiny.model, trace_prefix(tiny.model, tiny_ids, P, CFG), tiny_ids, sets, CHUNKS).fi()
    for i, s in enumerate(sets):
        deleted = forward_influence_by_deletion(model, trace, tiny_ids, s.removed, CHUNKS)
        assert (gpu[i + 2] - deleted).abs().max() <= 1e-5 and deleted.max() > 1e-5, s.label
    torch.testing.assert_close(gpu[2:], cpu, rtol=1e-4, atol=1e-5)
    assert gpu[1].abs().max() < 1e-7  # control:reorder: float32 rounding only
    if batch_size == 1:
        assert (gpu[0] == 0).all()
    else:
        assert gpu[0].abs().max() < 1e-7


def test_upcast_lowers_the_noise_floor_on_cuda(tiny_ids):
    floors = {}
    for upcast in (False, True):
        model = _model(torch.bfloat16, upcast)
        trace = trace_prefix(model, tiny_ids, P, CFG)
        result = forward_influence(model, trace, tiny_ids, single_tokens(8), CHUNKS, controls=True)
        assert torch.isfinite(result.fi()).all()
        floors[upcast] = result.noise_floor().max()
    assert floors[False] > 1e-6 and floors[True] < 1e-7 and floors[True] < floors[False] / 1000


def test_compressed_decoding_on_cuda_keeps_its_budget_and_measures_memory(tiny_ids):
    budget, interval = 48, 10
    stats = generate(
        _model(),
        None,
        tiny_ids[:P],
        InfoKV(budget=budget, window=16),
        max_new_tokens=40,
        interval=interval,
        eos_token_id=[],
    ).stats
    assert stats.prefill_compressed and stats.compression_steps == [10, 20, 30]
    assert max(stats.cache_lengths) == budget + interval
    assert stats.peak_memory_kind == "cuda max allocated" and stats.peak_memory_bytes > stats.peak_cache_bytes > 0
