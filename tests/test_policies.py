"""Eviction policies (SPEC "Eviction policies"): budgets, the window, InfoKV = SnapKV at alpha = 1,
each policy's ranking against an independent computation, and the probe's ``policy:NAME@R``."""

from __future__ import annotations

import pytest
import torch

from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.experiment import probe_document
from fi_toolkit.policies import (
    POLICIES,
    H2O,
    InfoKV,
    KNorm,
    PyramidKV,
    SnapKV,
    StreamingLLM,
    allocate,
    make_policy,
    parse_budget,
)
from fi_toolkit.probe import Chunk
from fi_toolkit.selections import parse_selection
from fi_toolkit.signals import infokv_score
from fi_toolkit.trace import SignalConfig, trace_prefix

P, W = 200, 16


@pytest.fixture(scope="module")
def trace(tiny, tiny_ids):
    return trace_prefix(tiny.model, tiny_ids, P, SignalConfig(window=W))


def _top(scores: torch.Tensor, n: int) -> set[int]:
    """Independent top-n by sorting in numpy order (ties to the earlier position)."""
    order = sorted(range(scores.numel()), key=lambda i: (-float(scores[i]), i))
    return set(order[:n])


@pytest.mark.parametrize("name", sorted(POLICIES) + ["infokv-adaptive"])
@pytest.mark.parametrize("budget", [0.3, 120])
def test_every_policy_keeps_its_budget_and_the_window(trace, name, budget):
    policy = make_policy(name, budget=budget, window=W)
    km = policy.keep_map(trace)
    k = round(budget * P) if isinstance(budget, float) else budget
    counts = km.counts()
    assert len(counts) == trace.num_layers
    if name in ("pyramidkv", "infokv-adaptive"):
        assert sum(counts) == trace.num_layers * k  # the total is exact
        assert all(W <= c <= P for c in counts)
        assert len(set(counts)) > 1  # really uneven
    else:
        assert counts == [k] * trace.num_layers
    for idx in km.keep:
        assert idx.shape[0] == trace.num_kv_heads
        for head in idx:
            assert torch.equal(head, torch.unique(head))  # sorted, no duplicates
            assert set(range(P - W, P)) <= set(head.tolist())  # the window, always
            assert head.min() >= 0 and head.max() < P


def test_infokv_alpha_one_keeps_exactly_snapkv(trace, smollm, alice):
    for tr, window in ((trace, W), (trace_prefix(smollm.model, alice.ids, 300, SignalConfig()), 32)):
        a = InfoKV(alpha=1.0, budget=0.2, window=window).keep_map(tr)
        b = SnapKV(budget=0.2, window=window).keep_map(tr)
        for la, lb in zip(a.keep, b.keep):  # layer by layer, head by head
            assert torch.equal(la, lb)
        c = InfoKV(alpha=0.5, budget=0.2, window=window).keep_map(tr)
        assert any(not torch.equal(la, lc) for la, lc in zip(a.keep, c.keep))  # alpha matters


def test_infokv_keeps_the_top_of_the_spec_score(trace):
    """Against SPEC's S computed by signals.infokv_score from the Trace, one head at a time."""
    alpha, tau, k = 0.7, 0.5, 60
    s = infokv_score(trace.attention, trace.layer_entropy(tau), alpha, trace.scored)  # [L, Hkv, p - w]
    km = InfoKV(alpha=alpha, tau=tau, budget=k, window=W).keep_map(trace)
    for layer in range(trace.num_layers):
        for head in range(trace.num_kv_heads):
            expected = _top(s[layer, head], k - W) | set(range(P - W, P))
            assert set(km.keep[layer][head].tolist()) == expected


def test_adaptive_budgets_follow_mean_layer_entropy(trace):
    k = 60
    km = InfoKV(budget=k, window=W, adaptive=True).keep_map(trace)
    e = trace.layer_entropy()[:, : trace.scored].mean(dim=1).double()
    share = e / e.sum() * trace.num_layers * k
    counts = torch.tensor(km.counts(), dtype=torch.float64)
    assert counts.sum() == trace.num_layers * k
    assert (counts - share).abs().max() < 1.0  # rounding only (no layer clamped here)


def test_pyramid_budgets_decrease_with_depth(trace):
    counts = PyramidKV(budget=60, window=W).keep_map(trace).counts()
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    assert counts[-1] == W + round((60 - W) / 20)  # the top layer: window + (k - w) / beta


def test_streaming_keeps_sinks_and_the_most_recent(trace):
    km = StreamingLLM(budget=50, window=W, sinks=4).keep_map(trace)
    expected = list(range(4)) + list(range(P - 46, P))
    for idx in km.keep:
        for head in idx:
            assert head.tolist() == expected


def test_knorm_keeps_the_lowest_key_norms(trace):
    km = KNorm(budget=60, window=W).keep_map(trace)
    for layer, idx in enumerate(km.keep):
        norms = trace.keys[layer][0].norm(dim=-1)  # [Hkv, p]
        for head in range(trace.num_kv_heads):
            expected = _top(-norms[head, : P - W], 60 - W) | set(range(P - W, P))
            assert set(idx[head].tolist()) == expected


def test_h2o_at_prefill_ranks_by_window_attention(trace):
    a, b = H2O(budget=60, window=W).keep_map(trace), SnapKV(budget=60, window=W).keep_map(trace)
    assert all(torch.equal(x, y) for x, y in zip(a.keep, b.keep))


def test_random_is_seeded(trace):
    a = make_policy("random", budget=60, window=W, seed=1).keep_map(trace)
    b = make_policy("random", budget=60, window=W, seed=1).keep_map(trace)
    c = make_policy("random", budget=60, window=W, seed=2).keep_map(trace)
    assert all(torch.equal(x, y) for x, y in zip(a.keep, b.keep))
    assert any(not torch.equal(x, y) for x, y in zip(a.keep, c.keep))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"budget": W}, "not above the window"),
        ({"budget": 0.05}, "not above the window"),  # round(0.05 * 200) = 10 <= 16
        ({"budget": P + 1}, "above the sequence length"),
    ],
)
def test_impossible_budgets_are_errors(trace, kwargs, message):
    with pytest.raises(FIError, match=message):
        SnapKV(window=W, **kwargs).keep_map(trace)


@pytest.mark.parametrize("text", ["0", "1.5", "-3", "abc", "nan", "0.0"])
def test_bad_budget_strings(text):
    with pytest.raises(FIError):
        parse_budget(text)


def test_budget_forms_and_unknown_policy():
    assert parse_budget("0.25") == 0.25 and parse_budget("512") == 512 and parse_budget("1.0") == 1.0
    with pytest.raises(FIError, match="unknown policy 'magic'"):
        make_policy("magic")


def test_allocate_is_exact_and_within_bounds():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(2, 12, (1,), generator=gen))
        hi = torch.randint(20, 200, (n,), generator=gen).tolist()
        lo = [min(8, h) for h in hi]
        total = int(torch.randint(sum(lo), sum(hi) + 1, (1,), generator=gen))
        weights = torch.rand(n, generator=gen) ** 3
        out = allocate(weights, total, lo, hi)
        assert sum(out) == total
        assert all(a <= o <= b for a, o, b in zip(lo, out, hi))
    with pytest.raises(FIError):
        allocate(torch.ones(3), 5, [2, 2, 2], [10, 10, 10])


def test_probe_policy_selection_is_a_keep_map(tiny, tiny_ids, trace):
    doc = Document("tiny", "", tiny_ids, "memory")
    table = probe_document(
        tiny, doc, [Chunk(P, 260)], ["policy:infokv@0.3", "policy:pyramidkv@0.3", "policy:snapkv@60"],
        config=SignalConfig(window=W), trace=trace,
    )
    assert list(table.selection) == ["policy:infokv@0.3", "policy:pyramidkv@0.3", "policy:snapkv@60"]
    assert table.n_removed.tolist() == pytest.approx([P - 60, P - 60, P - 60])
    assert (table.fi > 0).all()
    sel = parse_selection("policy:infokv@0.3")[0]
    km = sel.resolve(trace, alpha=0.9)
    expected = InfoKV(budget=0.3, window=W).keep_map(trace)
    assert all(torch.equal(a, b) for a, b in zip(km.keep, expected.keep))


@pytest.mark.parametrize("spec", ["policy:magic@0.2", "policy:infokv", "policy:infokv@2.5", "policy:snapkv@x"])
def test_bad_policy_selections(spec):
    with pytest.raises(FIError):
        parse_selection(spec)
