"""The in-house KeyDiff, ExpectedAttention and TOVA features against kvpress's own presses' ``score`` (the kvpress
venv; skipped without kvpress)."""

from __future__ import annotations

import copy

import pytest
import torch

from fi_toolkit import SignalConfig
from fi_toolkit.model.architectures import queries
from fi_toolkit.policies.learned.features import (
    FUTURE_POSITIONS,
    average_rotation,
    expected_attention,
    keydiff,
    learned_matrix,
)
from fi_toolkit.signals.formulas import QUERY_SINKS, add_query_moments
from fi_toolkit.signals.policy_view import Signals
from fi_toolkit.signals.trace import trace_prefix

pytestmark = pytest.mark.kvpress
P = 64


def test_keydiff_scores_as_kvpress_keydiffpress():
    press_module = pytest.importorskip("kvpress.presses.keydiff_press")
    keys = torch.randn(1, 3, 50, 16, generator=torch.Generator().manual_seed(0)) + 0.5
    theirs = press_module.KeyDiffPress(compression_ratio=0.5).score(None, None, keys, None, None, {})[0]
    ours = keydiff(keys)
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-5, atol=1e-6)
    assert torch.equal(ours.argsort(dim=-1, stable=True), theirs.double().argsort(dim=-1, stable=True))


def _prefill_inputs(model, ids, layer):
    """A trace of ``ids[:P]`` on ``model`` and, captured from ``layer``'s attention, its input rows and their
    position embeddings (what kvpress's presses score with at a prefill)."""
    captured = {}

    def hook(_module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        cos, sin = kwargs["position_embeddings"]
        if "h" in captured:  # a chunked prefill: the chunks in order
            h = torch.cat([captured["h"], h], dim=1)
            cos, sin = torch.cat([captured["pe"][0], cos], dim=1), torch.cat([captured["pe"][1], sin], dim=1)
        captured.update(h=h, pe=(cos, sin))

    handle = model.base_model.layers[layer].self_attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        trace = trace_prefix(model, ids, P, SignalConfig(window=8))
    finally:
        handle.remove()
    return trace, captured["h"], captured["pe"]


@pytest.mark.parametrize("layer", [0, 3])
def test_expected_attention_and_tova_score_as_kvpress_presses(tiny, tiny_ids, layer):
    """The features read from a trace's signals equal ``ExpectedAttentionPress.score`` and ``TOVAPress.score``
    on the same attention module, its input rows, keys and values (float64 copy of the model: the press computes
    in the model's dtype)."""
    ea = pytest.importorskip("kvpress.presses.expected_attention_press")
    tova_press = pytest.importorskip("kvpress.presses.tova_press")
    from fi_toolkit.integrations.kvpress.decoding import rotary_on_modules

    model = copy.deepcopy(tiny.model).double()
    trace, hidden, rope = _prefill_inputs(model, tiny_ids, layer)
    ours = learned_matrix(Signals.from_trace(trace), layer, ["expected_attention", "tova"], "produced", 1.0)
    keys, values = trace.keys[layer], trace.values[layer]
    with torch.no_grad(), rotary_on_modules(model) as attention:
        module = attention[layer]
        theirs_ea = ea.ExpectedAttentionPress().score(module, hidden, keys, values, None, {})[0]
        theirs_tova = tova_press.TOVAPress().score(module, hidden, keys, values, None, {"position_embeddings": rope})[0]
        # the same module, hidden states, keys and values given to the in-house functions directly
        moments = add_query_moments(None, queries(module, hidden[:, QUERY_SINKS:])[0])
        rotation = average_rotation(model.base_model.rotary_emb, P, FUTURE_POSITIONS, keys.shape[-1], keys)
        direct = expected_attention(moments, keys, values, rotation)
    torch.testing.assert_close(ours[0], theirs_ea, rtol=1e-6, atol=0)
    torch.testing.assert_close(direct, theirs_ea, rtol=1e-6, atol=0)
    torch.testing.assert_close(ours[1], theirs_tova.double(), rtol=1e-6, atol=0)
    assert theirs_ea.shape == ours[0].shape and not torch.equal(ours[0][0], ours[0][1])  # per KV head


def test_expected_attention_scores_as_kvpress_in_float32(tiny, tiny_ids):
    """On the float32 model itself the two agree to float32's precision, and keep the same entries."""
    ea = pytest.importorskip("kvpress.presses.expected_attention_press")
    from fi_toolkit.integrations.kvpress.decoding import rotary_on_modules

    layer = 2
    trace, hidden, _ = _prefill_inputs(tiny.model, tiny_ids, layer)
    ours = learned_matrix(Signals.from_trace(trace), layer, ["expected_attention"], "produced", 1.0)[0]
    with torch.no_grad(), rotary_on_modules(tiny.model) as attention:
        theirs = ea.ExpectedAttentionPress().score(
            attention[layer], hidden, trace.keys[layer], trace.values[layer], None, {}
        )[0]
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-5, atol=0)
    k = P // 4
    assert torch.equal(
        ours.topk(k, dim=-1).indices.sort().values, theirs.double().topk(k, dim=-1).indices.sort().values
    )
