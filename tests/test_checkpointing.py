"""The estimator's memory bound: per-layer checkpointing gives the same estimates from a smaller graph."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fi_toolkit import SignalConfig
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi, graph_bytes, kept_graph_bytes, needs_checkpoint
from fi_toolkit.signals.trace import trace_prefix

P = 200
CHUNKS = [Chunk(200, 260), Chunk(330, 400)]


@pytest.fixture(scope="module")
def trace(tiny, tiny_ids):
    return trace_prefix(tiny.model, tiny_ids, P, SignalConfig(window=16))


@pytest.mark.parametrize("block", [512, 64])  # one query block; four, whose recomputes replay the cache
def test_checkpointed_estimate_equals_the_kept_graph(tiny, tiny_ids, trace, block):
    kw = dict(samples=3, seed=7, block=block)
    kept = fisher_fi(tiny.model, trace, tiny_ids, CHUNKS, checkpoint=False, **kw)
    ckpt = fisher_fi(tiny.model, trace, tiny_ids, CHUNKS, checkpoint=True, **kw)
    assert kept.meta["checkpoint"] is False and ckpt.meta["checkpoint"] is True
    for name in ("fi", "se", "layer_fi", "head_fi"):
        np.testing.assert_allclose(getattr(ckpt, name).numpy(), getattr(kept, name).numpy(), rtol=1e-6, atol=0)
    assert kept.fi[: P - 16].min() > 0  # not a comparison of zeros
    layers = tiny.model.model.layers
    assert all("forward" not in layer.__dict__ for layer in layers)  # the wrappers are gone


def test_checkpointing_keeps_a_smaller_graph_and_the_estimate_of_its_size_holds(tiny, tiny_ids, trace):
    kept = kept_graph_bytes(tiny.model, trace, tiny_ids, CHUNKS, checkpoint=False)
    ckpt = kept_graph_bytes(tiny.model, trace, tiny_ids, CHUNKS, checkpoint=True)
    assert ckpt < 0.2 * kept, (ckpt, kept)
    estimate = graph_bytes(tiny.model.config, P, max(c.end for c in CHUNKS) - P, 512)
    assert 0.8 < estimate / kept < 1.25, (estimate, kept)


def test_checkpoint_is_chosen_above_the_graph_budget():
    smollm = SimpleNamespace(
        num_attention_heads=9,
        num_key_value_heads=3,
        hidden_size=576,
        head_dim=64,
        intermediate_size=1536,
        num_hidden_layers=30,
    )  # SmolLM2-135M's shape
    assert not needs_checkpoint(smollm, 1024, 256, 512)  # ~0.6 GiB: keep the graph (faster)
    assert needs_checkpoint(smollm, 1024, 1024, 512)  # ~2.7 GiB
    assert graph_bytes(smollm, 1024, 1024, 512) > 4 * graph_bytes(smollm, 1024, 256, 512)
