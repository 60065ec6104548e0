"""Eviction policies (docs/method.md, "Eviction policies"): budgets, the window, InfoKV = SnapKV at
alpha = 1, and *which* entries each policy keeps, against a brute-force ranking written here (scores
from the trace's signals, which tests/test_signals.py checks against the eager model; H2O's
accumulated attention from the eager model's ``output_attentions`` directly)."""

from __future__ import annotations

import math

import pytest
import torch

from fi_toolkit.budget import Budget
from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.policies import H2O, POLICIES, InfoKV, KNorm, PyramidKV, SnapKV, StreamingLLM, allocate, make_policy
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import probe_document
from fi_toolkit.probe.selections import parse_selection
from fi_toolkit.signals.trace import SignalConfig, trace_prefix

P, W = 200, 16


@pytest.fixture(scope="module")
def eager():
    return tiny_model(seed=0, attn_implementation="eager")


@pytest.fixture(scope="module")
def trace(eager, tiny_ids):
    return trace_prefix(eager.model, tiny_ids, P, SignalConfig(window=W))


def _top(scores: torch.Tensor, n: int, offset: int = 0) -> set[int]:
    """Brute-force top-n of a 1-D score list (ties to the earlier position), as positions + offset."""
    order = sorted(range(scores.numel()), key=lambda i: (-float(scores[i]), i))
    return {offset + i for i in order[:n]}


def _expected_keep(scores_lhp: torch.Tensor, counts: list[int]) -> list[list[set[int]]]:
    """Per layer and head: the window plus the top (count - W) of the scored positions [0, P - W)."""
    window = set(range(P - W, P))
    return [[_top(scores_lhp[l][h][: P - W], counts[l] - W) | window for h in range(scores_lhp.shape[1])]
            for l in range(len(counts))]


def _assert_keeps(km, expected):
    for layer, heads in enumerate(expected):
        for head, want in enumerate(heads):
            assert set(km.keep[layer][head].tolist()) == want, (km.label, layer, head)


def _largest_remainder(shares: list[float], total: int) -> list[int]:
    out = [math.floor(x) for x in shares]
    for i in sorted(range(len(shares)), key=lambda i: (out[i] - shares[i], i))[: total - sum(out)]:
        out[i] += 1
    return out


def _infokv_scores(trace, alpha: float, tau: float) -> torch.Tensor:
    """The method's S written out here: alpha * A + (1 - alpha) * softmax over [0, P - W) of (D + tau) * H."""
    e = (trace.distance.double() + tau) * trace.entropy.double()[None]  # [L, P]
    soft = torch.softmax(e[:, : P - W], dim=-1)[:, None]  # [L, 1, P - W]
    return alpha * trace.attention.double()[..., : P - W] + (1 - alpha) * soft


def _h2o_scores(eager, ids) -> torch.Tensor:
    """Attention received from the window queries, summed over them, per KV head (GQA group mean),
    from the eager model's own output_attentions."""
    with torch.no_grad():
        att = eager.model(ids[:P][None], output_attentions=True).attentions  # L x [1, Hq, P, P]
    hkv = eager.config.num_key_value_heads
    return torch.stack([a[0, :, P - W :, :].sum(dim=1).view(hkv, -1, P).mean(dim=1) for a in att]).double()


@pytest.mark.parametrize("name", sorted(POLICIES) + ["infokv-adaptive"])
@pytest.mark.parametrize("budget", ["keep=0.3", "remove=0.7", 0.3, 60, "remove=140"])
def test_every_policy_keeps_its_budget_and_the_window(trace, name, budget):
    policy = make_policy(name, budget=budget, window=W)
    km = policy.keep_map(trace)
    k = 60  # every spelling above means 60 of the 200 entries stay
    counts = km.counts()
    assert len(counts) == trace.num_layers
    if name in ("pyramidkv", "infokv-adaptive"):
        assert sum(counts) == trace.num_layers * k  # the total is exact
        assert all(W <= c <= P for c in counts)
        assert len(set(counts)) > 1  # really uneven
    else:
        assert counts == [k] * trace.num_layers
    assert km.n_removed(P) == P - k and km.n_kept(P) == k
    for idx in km.keep:
        assert idx.shape[0] == trace.num_kv_heads
        for head in idx:
            assert torch.equal(head, torch.unique(head))  # sorted, no duplicates
            assert set(range(P - W, P)) <= set(head.tolist())  # the window, always
            assert head.min() >= 0 and head.max() < P


@pytest.mark.parametrize("name", ["snapkv", "rpc"])
def test_attention_policies_keep_the_top_window_attention(trace, name):
    """SnapKV, and RPC on a prefill (nothing protected there), keep the top pooled window attention."""
    km = make_policy(name, budget=60, window=W).keep_map(trace)
    _assert_keeps(km, _expected_keep(trace.attention, [60] * trace.num_layers))


@pytest.mark.parametrize("alpha, tau", [(0.7, 0.5), (0.9, 1.0), (0.0, 1.0)])
def test_infokv_keeps_the_top_of_the_method_score(trace, alpha, tau):
    km = InfoKV(alpha=alpha, tau=tau, budget=60, window=W).keep_map(trace)
    _assert_keeps(km, _expected_keep(_infokv_scores(trace, alpha, tau), [60] * trace.num_layers))


def test_adaptive_infokv_budgets_and_ranking(trace):
    k = 60
    km = InfoKV(budget=k, window=W, adaptive=True).keep_map(trace)
    e = ((trace.distance.double() + 1.0) * trace.entropy.double()[None])[:, : P - W].mean(dim=1)
    shares = (e / e.sum() * trace.num_layers * k).tolist()
    assert all(W <= x <= P for x in shares)  # no layer is clamped in this setting
    counts = _largest_remainder(shares, trace.num_layers * k)
    assert km.counts() == counts
    _assert_keeps(km, _expected_keep(_infokv_scores(trace, 0.9, 1.0), counts))


def test_pyramidkv_budgets_follow_the_paper_schedule_and_rank_by_attention(trace):
    k, beta, n_layers = 60, 20.0, trace.num_layers
    low = (k - W) / beta
    high = 2 * (k - W) - low
    shares = [W + high - l * (high - low) / (n_layers - 1) for l in range(n_layers)]
    counts = _largest_remainder(shares, n_layers * k)
    km = PyramidKV(budget=k, window=W, beta=beta).keep_map(trace)
    assert km.counts() == counts and counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    _assert_keeps(km, _expected_keep(trace.attention, counts))


def test_streaming_keeps_sinks_and_the_most_recent(trace):
    km = StreamingLLM(budget=50, window=W, sinks=4).keep_map(trace)
    expected = list(range(4)) + list(range(P - 46, P))
    for idx in km.keep:
        for head in idx:
            assert head.tolist() == expected


def test_knorm_keeps_the_lowest_key_norms(trace):
    km = KNorm(budget=60, window=W).keep_map(trace)
    norms = torch.stack([k[0].double().norm(dim=-1) for k in trace.keys])  # [L, Hkv, P]
    _assert_keeps(km, _expected_keep(-norms, [60] * trace.num_layers))


def test_h2o_at_prefill_keeps_the_top_accumulated_attention_of_the_eager_model(eager, tiny_ids, trace):
    scores = _h2o_scores(eager, tiny_ids)
    torch.testing.assert_close(trace.accumulated.double(), scores, rtol=1e-4, atol=1e-6)  # one scale: a sum
    km = H2O(budget=60, window=W).keep_map(trace)
    _assert_keeps(km, _expected_keep(scores, [60] * trace.num_layers))


def test_random_is_seeded(trace):
    a = make_policy("random", budget=60, window=W, seed=1).keep_map(trace)
    b = make_policy("random", budget=60, window=W, seed=1).keep_map(trace)
    c = make_policy("random", budget=60, window=W, seed=2).keep_map(trace)
    assert all(torch.equal(x, y) for x, y in zip(a.keep, b.keep))
    assert any(not torch.equal(x, y) for x, y in zip(a.keep, c.keep))


@pytest.mark.smollm
def test_infokv_alpha_one_keeps_exactly_snapkv(trace, smollm, alice):
    for tr, window in ((trace, W), (trace_prefix(smollm.model, alice.ids, 300, SignalConfig()), 32)):
        a = InfoKV(alpha=1.0, budget=0.2, window=window).keep_map(tr)
        b = SnapKV(budget=0.2, window=window).keep_map(tr)
        for la, lb in zip(a.keep, b.keep):  # layer by layer, head by head
            assert torch.equal(la, lb)
        c = InfoKV(alpha=0.5, budget=0.2, window=window).keep_map(tr)
        assert any(not torch.equal(la, lc) for la, lc in zip(a.keep, c.keep))  # alpha matters


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"budget": W}, "not above the window"),
        ({"budget": 0.05}, "not above the window"),  # round(0.05 * 200) = 10 <= 16
        ({"budget": "remove=0.95"}, "not above the window"),
        ({"budget": P + 1}, "more than the 200 compressible tokens"),
        ({"budget": "remove=201"}, "more than the 200 compressible tokens"),
    ],
)
def test_impossible_budgets_are_errors(trace, kwargs, message):
    with pytest.raises(FIError, match=message):
        SnapKV(window=W, **kwargs).keep_map(trace)


@pytest.mark.parametrize("text", ["1.5", "-3", "abc", "nan", "inf", "keep=", "keep=-0.1", "hold=0.2", "remove=x",
                                  "keep=0.2=0.3", "-0.5"])
def test_bad_budget_strings(text):
    with pytest.raises(FIError):
        Budget.parse(text)


@pytest.mark.parametrize(
    "spec, kept",
    [("0.25", 50), ("keep=0.25", 50), ("remove=0.75", 50), ("keep=50", 50), ("remove=150", 50), ("50", 50),
     (0.25, 50), (50, 50), ("keep=1.0", 200), ("remove=0", 200), ("keep=0.0", 0), ("remove=1.0", 0),
     ("keep=0.0025", 1), ("remove=0.0025", 199)],  # 0.5 rounds half up on either side
)
def test_budget_spellings_have_one_meaning(spec, kept):
    b = Budget.parse(spec)
    assert b.kept(200) == kept and b.removed(200) == 200 - kept
    assert b.compression_ratio(200) == pytest.approx((200 - kept) / 200)  # kvpress's compression_ratio
    assert Budget.parse(b.label) == b  # labels read back as the same budget


def test_unknown_policy():
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


def test_probe_policy_selection_is_a_keep_map(tiny, tiny_ids):
    trace = trace_prefix(tiny.model, tiny_ids, P, SignalConfig(window=W))
    doc = Document("tiny", "", tiny_ids, "memory")
    specs = ["policy:infokv@keep=0.3", "policy:pyramidkv@remove=0.7", "policy:snapkv@60", "attention:remove=0.7"]
    table = probe_document(tiny, doc, [Chunk(P, 260)], specs, config=SignalConfig(window=W), trace=trace)
    table = table[table.selector != "control"]
    assert list(table.selection) == ["policy:infokv@keep=0.3", "policy:pyramidkv@remove=0.7", "policy:snapkv@keep=60",
                                     "attention:remove=0.7"]
    # one denominator (the prefix): every row removes 140 and keeps 60 entries per layer and head
    assert table.n_removed.tolist() == pytest.approx([P - 60] * 4)
    assert table.n_kept.tolist() == pytest.approx([60] * 4)
    assert (table.fi > 0).all()
    km = parse_selection("policy:infokv@0.3")[0].resolve(trace, alpha=0.9)
    expected = InfoKV(budget=0.3, window=W).keep_map(trace)
    assert all(torch.equal(a, b) for a, b in zip(km.keep, expected.keep))


@pytest.mark.parametrize("spec", ["policy:magic@0.2", "policy:infokv", "policy:infokv@2.5", "policy:snapkv@x",
                                  "policy:snapkv@keep=nan"])
def test_bad_policy_selections(spec):
    with pytest.raises(FIError):
        parse_selection(spec)
