"""Integration: the real embedded SmolLM2-135M on a real bundled document."""

from __future__ import annotations

import math

import pytest
import torch

from fi_toolkit.eviction import TokenSet
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import probe_document, trace_document
from fi_toolkit.probe.forward_influence import forward_influence, forward_influence_by_deletion
from fi_toolkit.signals.trace import SignalConfig

pytestmark = pytest.mark.smollm
P = 512
CHUNKS = [Chunk(512, 544), Chunk(608, 640)]


@pytest.fixture(scope="module")
def trace(smollm, alice):
    return trace_document(smollm, alice, P, SignalConfig())


def test_model_is_the_real_embedded_smollm2(smollm):
    c = smollm.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (30, 9, 3, 49152)
    ids = smollm.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        nxt = smollm.model(ids).logits[0, -1].argmax().item()
    assert smollm.tokenizer.decode([nxt]).strip() == "Paris"


def test_signals_on_a_real_document_are_well_formed(trace):
    assert trace.entropy.shape == (P,) and trace.distance.shape == (30, P) and trace.attention.shape == (30, 3, P)
    assert (trace.entropy >= 0).all() and (trace.entropy <= math.log(256) + 1e-4).all()
    assert ((trace.distance >= -1e-5) & (trace.distance <= 2 + 1e-5)).all()
    # Window attention is a mean of probability rows, so it sums to at most 1 over positions; zero-padded
    # pooling (SnapKV's) loses up to 3/7 of the mass of position 0, the attention sink.
    sums = trace.attention.sum(-1)
    assert (sums <= 1 + 1e-5).all() and (sums >= 4 / 7 - 1e-3).all()
    # Attention sinks: position 0 gets far more attention than an average position.
    assert trace.attention.mean(dim=(0, 1))[0] > 10 * trace.attention.mean()


def test_masked_probe_equals_deletion_and_a_masked_full_forward_on_smollm2(smollm, alice, trace):
    from oracles import fi_by_masked_full_forward

    gen = torch.Generator().manual_seed(0)
    sets = [
        TokenSet("random40", 4 + torch.randperm(P - 36, generator=gen)[:40]),
        TokenSet("sink0", [0]),
        TokenSet("block", torch.arange(100, 160)),
        TokenSet("empty", []),
    ]
    masked = forward_influence(smollm.model, trace, alice.ids, sets, CHUNKS, batch_size=3).fi()
    assert torch.equal(masked[3], torch.zeros(len(CHUNKS)))  # the empty set, through the real path
    for i, s in enumerate(sets[:3]):
        deleted = forward_influence_by_deletion(smollm.model, trace, alice.ids, s.removed, CHUNKS)
        oracle = fi_by_masked_full_forward(smollm.model, alice.ids, s.removed, P, CHUNKS)
        assert (masked[i] - deleted).abs().max().item() <= 1e-5, (s.label, masked[i], deleted)
        assert (masked[i] - oracle).abs().max().item() <= 1e-5, (s.label, masked[i], oracle)
        assert (oracle > 1e-5).all()


def test_probe_document_table(smollm, alice, trace):
    table = probe_document(
        smollm,
        alice,
        CHUNKS,
        ["entropy:remove=0.1", "attention:keep=0.9", "random:remove=0.1@0-1", "positions:0", "policy:snapkv@keep=0.9"],
        trace=trace,
    )
    assert len(table) == (2 + 6) * len(CHUNKS)
    assert (table[table.selection == "control:null"]["fi"] == 0).all()
    assert (table[table.selection == "control:reorder"]["fi"].abs() < 1e-8).all()
    table = table[table.selector != "control"]
    assert (table["fi"] > 0).all() and not table["below_noise_floor"].any()
    n = round(0.1 * P)  # one denominator: the whole prefix; keep=0.9 and remove=0.1 remove the same count
    assert set(table[table.selector != "positions"]["n_removed"]) == {n}
    assert set(table[table.selector != "positions"]["n_kept"]) == {P - n}
    assert set(table["entropy_of"]) == {"produced"}
    ent = table[table.selection == "entropy:remove=0.1"]["mean_entropy"].iloc[0]
    rnd = table[table.selector == "random"]["mean_entropy"].mean()
    assert ent > rnd  # the entropy selector picks high-entropy tokens
    # Removing the first attention sink hurts more than removing 47 random tokens.
    sink = table[table.selection == "positions:0"]["fi"].mean()
    assert sink > table[table.selector == "random"]["fi"].mean()
