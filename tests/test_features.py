"""The learned policy's extra features (:mod:`fi_toolkit.policies.learned.features`) against explicit loops over
slots with Python's math (no torch vector code), the value side against the attention module's own
``o_proj`` run on each head's value placed alone in its input, and their independence of the text after
the compression point."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fi_toolkit import SignalConfig
from fi_toolkit.errors import FIError
from fi_toolkit.policies.learned.features import FUTURE_POSITIONS, learned_matrix, wo_vnorm
from fi_toolkit.signals.formulas import QUERY_SINKS
from fi_toolkit.signals.policy_view import Signals
from fi_toolkit.signals.trace import trace_prefix

P = 64
CONFIG = SignalConfig(window=8)


def _cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a)) / math.sqrt(sum(y * y for y in b))


def test_keydiff_depth_and_head_by_explicit_loops(tiny, tiny_ids):
    s = Signals.from_trace(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    layer = 2
    x = learned_matrix(s, layer, ["keydiff", "depth", "kv_head"], "produced", 1.0)
    keys = s.keys[layer][0].double().tolist()  # [Hkv][n][d]
    for h, head in enumerate(keys):
        unit = [[v / math.sqrt(sum(c * c for c in k)) for v in k] for k in head]
        anchor = [sum(u[i] for u in unit) / len(unit) for i in range(len(unit[0]))]
        for j, k in enumerate(head):
            assert math.isclose(x[0, h, j].item(), -_cos(k, anchor), rel_tol=1e-9, abs_tol=1e-12)
            assert x[1, h, j].item() == layer / s.num_layers and x[2, h, j].item() == h


def _wo_vnorm_by_o_proj(model, s, layer):
    """``[Hkv][n]`` mean over the group's query heads of ``||o_proj(x)||``, ``x`` zero but for head h's slice
    ``= v`` (the module's bias, if any, taken off), norms in Python's math."""
    attn = model.base_model.layers[layer].self_attn
    values = s.values[layer][0]  # [Hkv, n, d]
    hkv, n, d = values.shape
    hq = model.config.num_attention_heads
    bias = attn.o_proj(torch.zeros(hq * d))
    out = []
    for k in range(hkv):
        heads = range(k * hq // hkv, (k + 1) * hq // hkv)
        row = []
        for j in range(n):
            norms = []
            for h in heads:
                x = torch.zeros(hq * d)
                x[h * d : (h + 1) * d] = values[k, j]
                y = (attn.o_proj(x) - bias).tolist()
                norms.append(math.sqrt(sum(c * c for c in y)))
            row.append(sum(norms) / len(norms))
        out.append(row)
    return out


def test_value_side_by_the_modules_own_o_proj(tiny, tiny_ids):
    s = Signals.from_trace(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    assert tiny.model.config.num_attention_heads == 2 * s.keys[0].shape[1]  # two query heads per KV head
    for layer in (0, 3):
        x = learned_matrix(s, layer, ["vnorm", "wo_vnorm", "acc_wo_vnorm"], "produced", 1.0)
        wo = _wo_vnorm_by_o_proj(tiny.model, s, layer)
        values = s.values[layer][0].double().tolist()
        acc = s.accumulated[layer].tolist()
        for k, head in enumerate(values):
            for j, v in enumerate(head):
                assert math.isclose(x[0, k, j].item(), math.sqrt(sum(c * c for c in v)), rel_tol=1e-9)
                assert math.isclose(x[1, k, j].item(), wo[k][j], rel_tol=1e-5)
                assert math.isclose(x[2, k, j].item(), acc[k][j] * wo[k][j], rel_tol=1e-5, abs_tol=1e-12)


def test_value_side_reads_the_model_when_the_signals_carry_no_projections(tiny, tiny_ids):
    s = Signals.from_trace(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    with_model = dataclasses.replace(s, out_proj=None, model=tiny.model)
    torch.testing.assert_close(
        learned_matrix(with_model, 1, ["wo_vnorm"], "produced", 1.0),
        learned_matrix(s, 1, ["wo_vnorm"], "produced", 1.0),
    )
    with pytest.raises(FIError, match="wo_vnorm needs the attention's o_proj weight"):
        learned_matrix(dataclasses.replace(s, out_proj=None), 1, ["wo_vnorm"], "produced", 1.0)
    with pytest.raises(FIError, match="vnorm needs the cache's values"):
        learned_matrix(dataclasses.replace(s, values=None), 1, ["vnorm"], "produced", 1.0)


def test_features_at_p_ignore_the_text_after_it(tiny, tiny_ids):
    names = ["keydiff", "depth", "kv_head", "log_accumulated", "attention", "vnorm", "wo_vnorm", "acc_wo_vnorm"]
    names += ["expected_attention", "tova"]
    full = Signals.from_trace(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    cut = Signals.from_trace(trace_prefix(tiny.model, tiny_ids[:P].clone(), P, CONFIG))
    for layer in range(full.num_layers):
        torch.testing.assert_close(
            learned_matrix(full, layer, names, "produced", 1.0), learned_matrix(cut, layer, names, "produced", 1.0)
        )


def test_wo_vnorm_follows_an_o_proj_changed_in_place():
    """The head Gram matrices are kept per weight; a weight scaled in place scales wo_vnorm with it."""
    gen = torch.Generator().manual_seed(0)
    weight, values = torch.randn(12, 8, generator=gen), torch.randn(1, 2, 5, 2, generator=gen)  # 4 heads, 2 KV
    first = wo_vnorm(values, weight)
    assert torch.equal(wo_vnorm(values, weight), first)
    weight.mul_(3.0)
    torch.testing.assert_close(wo_vnorm(values, weight), 3.0 * first)


def test_expected_attention_and_tova_by_explicit_loops(tiny, tiny_ids):
    """ExpectedAttention from the queries of rows [QUERY_SINKS, P) recomputed by the module's own q_proj (mean and
    covariance by loops over rows, RoPE's rotation averaged over P .. P + 511 by Python's math), TOVA from the
    last row's rotated query, each slot by a loop."""
    s = Signals.from_trace(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    layer, model = 1, tiny.model
    attn = model.base_model.layers[layer].self_attn
    hq, d = model.config.num_attention_heads, attn.head_dim
    hkv, group = s.keys[layer].shape[1], hq // s.keys[layer].shape[1]
    captured = []
    handle = attn.register_forward_pre_hook(lambda m, a, kw: captured.append(kw["hidden_states"]), with_kwargs=True)
    try:
        trace_prefix(model, tiny_ids, P, CONFIG)
    finally:
        handle.remove()
    with torch.no_grad():
        q = attn.q_proj(torch.cat(captured, dim=1)[0]).double().view(P, hq, d)[QUERY_SINKS:]  # [m, Hq, d]
    m = q.shape[0]
    inv = [model.config.rope_parameters["rope_theta"] ** (-2 * (i % (d // 2)) / d) for i in range(d)]
    cos = [sum(math.cos(t * f) for t in range(P, P + FUTURE_POSITIONS)) / FUTURE_POSITIONS for f in inv]
    sin = [sum(math.sin(t * f) for t in range(P, P + FUTURE_POSITIONS)) / FUTURE_POSITIONS for f in inv]
    rot = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d):
        rot[i, i] = cos[i]
        rot[i, (i + d // 2) % d] = -sin[i] if i < d // 2 else sin[i]
    x = learned_matrix(s, layer, ["expected_attention", "tova"], "produced", 1.0)
    keys, values = s.keys[layer][0].double(), s.values[layer][0].double()
    n = keys.shape[1]
    ea = torch.zeros(hkv, n - QUERY_SINKS, dtype=torch.float64)
    for h in range(hq):
        mean = sum(q[r, h] for r in range(m)) / m
        cov = sum(torch.outer(q[r, h] - mean, q[r, h] - mean) for r in range(m)) / m
        mean, cov = rot @ mean, rot @ cov @ rot.T
        k = keys[h // group, QUERY_SINKS:]
        logits = [float(k[j] @ mean) / math.sqrt(d) + float(k[j] @ cov @ k[j]) / d / 2 for j in range(len(k))]
        top = max(logits)
        e = [math.exp(v - top) for v in logits]
        ea[h // group] += torch.tensor([v / sum(e) for v in e], dtype=torch.float64) / group
    ea *= values[:, QUERY_SINKS:].norm(dim=-1)
    torch.testing.assert_close(x[0, :, QUERY_SINKS:], ea, rtol=1e-6, atol=0)
    torch.testing.assert_close(x[0, :, :QUERY_SINKS], (ea.max() + 1).expand(hkv, QUERY_SINKS), rtol=1e-9, atol=0)
    last = s.last_query[layer].double()  # the rotated query of row P - 1
    att = torch.zeros(n - 1, dtype=torch.float64)
    for h in range(hq):
        logits = [float(keys[h // group, j] @ last[h]) / math.sqrt(d) for j in range(n)]
        e = [math.exp(v - max(logits)) for v in logits]
        att += torch.tensor([v / sum(e) for v in e[:-1]], dtype=torch.float64) / hq
    for k in range(hkv):
        torch.testing.assert_close(x[1, k, :-1], att, rtol=1e-6, atol=0)
        assert math.isclose(x[1, k, -1].item(), att.max().item() + 1, rel_tol=1e-9)


def test_expected_attention_needs_the_rows_since_the_last_compression(tiny, tiny_ids):
    """A compression empties the query statistics (the press's buffer of rows): the feature refuses in one line
    until a row is fed, as kvpress's press cannot score without hidden states."""
    from transformers import DynamicCache

    from fi_toolkit.model.compat import cache_kwargs
    from fi_toolkit.signals.tracker import SignalTracker

    tracker = SignalTracker(CONFIG, capacity=P, accumulate=True)
    cache = DynamicCache(config=tiny.model.config)
    with tracker(tiny.model):
        hidden = tiny.model.base_model(
            input_ids=tiny_ids[:P][None], use_cache=True, **cache_kwargs(tiny.model.base_model, cache)
        )
        tracker.record(hidden.last_hidden_state[0])
    tracker.start_decoding(cache)
    positions = [torch.arange(P).expand(layer.keys.shape[1], P) for layer in cache.layers]
    assert tracker.moments[0][0] == P - QUERY_SINKS
    learned_matrix(tracker.view(positions), 0, ["expected_attention"], "produced", 1.0)
    tracker.compact([p for p in positions])
    assert tracker.moments == [None] * len(tracker.moments)
    with pytest.raises(FIError, match="expected_attention needs the statistics of the queries"):
        learned_matrix(tracker.view(positions), 0, ["expected_attention"], "produced", 1.0)
