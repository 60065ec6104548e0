"""Signals (docs/method.md, "Signals") against independent computations, on the tiny random Llama."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage
import scipy.special
import scipy.stats
import torch

from fi_toolkit.budget import Budget
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.policies.method import SET, Method
from fi_toolkit.probe.selections import Selection, token_scores
from fi_toolkit.signals import formulas as signals
from fi_toolkit.signals.trace import SignalConfig, trace_prefix


def test_topk_entropy_with_k_at_least_vocab_equals_scipy_full_entropy():
    logits = torch.randn(7, 300, generator=torch.Generator().manual_seed(0)) * 3
    expected = scipy.stats.entropy(scipy.special.softmax(logits.double().numpy(), axis=-1), axis=-1)
    for k in (300, 1000):
        np.testing.assert_allclose(signals.topk_entropy(logits, k).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_topk_entropy_renormalises_over_the_k_largest_logits():
    logits = torch.randn(5, 100, generator=torch.Generator().manual_seed(1)) * 2
    top = np.sort(logits.double().numpy(), axis=-1)[:, -10:]
    expected = scipy.stats.entropy(scipy.special.softmax(top, axis=-1), axis=-1)
    np.testing.assert_allclose(signals.topk_entropy(logits, 10).numpy(), expected, rtol=1e-5)
    assert (signals.topk_entropy(logits, 10) <= np.log(10) + 1e-6).all()


def test_streamed_entropy_equals_one_shot(tiny):
    head = tiny.model.get_output_embeddings()
    hidden = torch.randn(37, tiny.config.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = signals.topk_entropy(head(hidden), 50)
        streamed = signals.streamed_topk_entropy(hidden, head, 50, block=8)
    torch.testing.assert_close(streamed, full, rtol=0, atol=1e-6)


def test_trace_entropy_matches_model_logits(tiny, tiny_ids):
    p = 120
    trace = trace_prefix(tiny.model, tiny_ids, p, SignalConfig(window=16, top_k=40, entropy_of="next"))
    with torch.no_grad():
        logits = tiny.model(tiny_ids[:p][None]).logits[0].double().numpy()
    top = np.sort(logits, axis=-1)[:, -40:]
    expected = scipy.stats.entropy(scipy.special.softmax(top, axis=-1), axis=-1)
    np.testing.assert_allclose(trace.entropy.numpy(), expected, rtol=1e-4, atol=1e-5)
    # The default: H_i of the distribution that produced x_i (logits at i - 1); H_0 = 0.
    produced = trace_prefix(tiny.model, tiny_ids, p, SignalConfig(window=16, top_k=40))
    assert SignalConfig().entropy_of == "produced" and float(produced.entropy[0]) == 0.0
    np.testing.assert_allclose(produced.entropy[1:].numpy(), expected[:-1], rtol=1e-4, atol=1e-5)


def test_window_attention_equals_eager_output_attentions(tiny_ids):
    """Mean of eager attention over the window rows, pooled (zero-padded uniform filter over the
    scored positions) and averaged over each GQA group of query heads."""
    eager = tiny_model(seed=0, attn_implementation="eager")
    p, w, kernel = 150, 16, 7
    trace = trace_prefix(eager.model, tiny_ids, p, SignalConfig(window=w, pool_kernel=kernel))
    with torch.no_grad():
        attentions = eager.model(tiny_ids[:p][None], output_attentions=True).attentions
    n_q, n_kv = eager.config.num_attention_heads, eager.config.num_key_value_heads
    for layer, att in enumerate(attentions):
        rows = att[0, :, p - w :, :].double().mean(dim=1).numpy()  # [Hq, p]
        pooled = rows.copy()
        pooled[:, : p - w] = scipy.ndimage.uniform_filter1d(rows[:, : p - w], size=kernel, axis=-1, mode="constant")
        expected = pooled.reshape(n_kv, n_q // n_kv, p).mean(axis=1)
        np.testing.assert_allclose(trace.attention[layer].numpy(), expected, atol=1e-6)


def test_unpooled_window_attention_is_a_distribution(tiny, tiny_ids):
    trace = trace_prefix(tiny.model, tiny_ids, 100, SignalConfig(window=8, pool_kernel=1))
    torch.testing.assert_close(trace.attention.sum(-1), torch.ones(4, 2), rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [48, 199])  # the window spans two chunks; the last chunk holds one token
def test_chunked_trace_equals_single_pass(tiny, tiny_ids, chunk):
    a = trace_prefix(tiny.model, tiny_ids, 200, SignalConfig(window=16, prefill_chunk=chunk))
    b = trace_prefix(tiny.model, tiny_ids, 200, SignalConfig(window=16, prefill_chunk=4096))
    for x, y in (
        (a.entropy, b.entropy),
        (a.distance, b.distance),
        (a.attention, b.attention),
        (a.accumulated, b.accumulated),
        (a.keys[2], b.keys[2]),
    ):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


def test_representation_distance_matches_hidden_states(tiny, tiny_ids):
    """With final_norm=True, D^(l) is 1 - cos(hidden_states[l], hidden_states[L]) of output_hidden_states."""
    p = 100
    trace = trace_prefix(tiny.model, tiny_ids, p, SignalConfig(window=16, final_norm=True))
    with torch.no_grad():
        hs = tiny.model(tiny_ids[:p][None], output_hidden_states=True).hidden_states
    final = hs[-1][0].double().numpy()
    for layer in range(tiny.config.num_hidden_layers):
        h = hs[layer][0].double().numpy()
        cos = (h * final).sum(-1) / (np.linalg.norm(h, axis=-1) * np.linalg.norm(final, axis=-1))
        np.testing.assert_allclose(trace.distance[layer].numpy(), 1 - cos, atol=1e-5)


def test_default_distance_uses_the_residual_before_the_final_norm(tiny_ids):
    """h^(L) is the last decoder layer's output (captured here by an independent hook), not the
    final-normed state; a non-uniform norm weight makes the two differ."""
    lm = tiny_model(seed=0)
    with torch.no_grad():
        lm.model.model.norm.weight.uniform_(0.2, 3.0, generator=torch.Generator().manual_seed(5))
    p, grabbed = 90, {}
    handle = lm.model.model.layers[-1].register_forward_hook(lambda m, a, o: grabbed.setdefault("h", o))
    with torch.no_grad():
        hs = lm.model(tiny_ids[:p][None], output_hidden_states=True).hidden_states
    handle.remove()
    out = grabbed["h"][0] if isinstance(grabbed["h"], tuple) else grabbed["h"]
    final = out[0].double().numpy()
    pre = trace_prefix(lm.model, tiny_ids, p, SignalConfig(window=16))
    post = trace_prefix(lm.model, tiny_ids, p, SignalConfig(window=16, final_norm=True))
    for layer in range(lm.config.num_hidden_layers):
        h = hs[layer][0].double().numpy()
        cos = (h * final).sum(-1) / (np.linalg.norm(h, axis=-1) * np.linalg.norm(final, axis=-1))
        np.testing.assert_allclose(pre.distance[layer].numpy(), 1 - cos, atol=1e-5)
    assert (pre.distance - post.distance).abs().max() > 1e-2


def test_layer_entropy_and_infokv_formulas(tiny, tiny_ids):
    trace = trace_prefix(tiny.model, tiny_ids, 120, SignalConfig(window=16, tau=0.5, alpha=0.7))
    e = trace.layer_entropy()
    torch.testing.assert_close(e, (trace.distance + 0.5) * trace.entropy[None], rtol=0, atol=0)
    s = trace.infokv()
    soft = scipy.special.softmax(e[:, : trace.scored].double().numpy(), axis=-1)
    expected = 0.7 * trace.attention[..., : trace.scored].double().numpy() + 0.3 * soft[:, None, :]
    np.testing.assert_allclose(s.numpy(), expected, rtol=1e-5, atol=1e-8)
    pure = trace.infokv(alpha=0.0)
    np.testing.assert_allclose(pure[:, 0].numpy(), soft, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("amount, removed", [("remove=0.1", 20), ("keep=0.7", 60), ("remove=25", 25), ("175", 25)])
def test_infokv_with_alpha_one_selects_exactly_what_attention_selects(tiny, tiny_ids, amount, removed):
    trace = trace_prefix(tiny.model, tiny_ids, 200, SignalConfig(window=16, alpha=1.0))
    budget = Budget.parse(amount)
    by_attention = Selection("a", Method(SET, "attention", budget)).resolve(trace, sinks=4)
    by_infokv = Selection("i", Method(SET, "infokv", budget)).resolve(trace, sinks=4, alpha=1.0)
    assert torch.equal(by_attention.removed, by_infokv.removed)
    assert by_infokv.size == removed  # a share of the whole prefix p = 200; a bare number is what is kept
    by_default = Selection("i", Method(SET, "infokv", budget)).resolve(trace, sinks=4, alpha=0.5)
    assert not torch.equal(by_default.removed, by_attention.removed)
    scores = token_scores(trace, "attention")[4 : trace.scored]
    threshold = scores.sort(descending=True).values[by_attention.size - 1]
    assert (token_scores(trace, "attention")[by_attention.removed] >= threshold).all()
