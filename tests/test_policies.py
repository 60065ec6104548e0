"""Eviction policies (docs/method.md, "Eviction policies"): budgets, the window, InfoKV = SnapKV at
alpha = 1, and *which* entries each policy keeps, against a brute-force ranking written here (scores
from the trace's signals, which tests/test_signals.py checks against the eager model; H2O's
accumulated attention from the eager model's ``output_attentions`` directly)."""

from __future__ import annotations

import dataclasses
import math
import re
import sys

import pandas as pd
import pytest
import torch

from fi_toolkit.budget import Budget
from fi_toolkit.compress.decoder import signal_config_for
from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.policies import (
    H2O,
    RPC,
    Adaptive,
    InfoKV,
    KNorm,
    PyramidKV,
    RandomPolicy,
    Signals,
    SnapKV,
    StreamingLLM,
    allocate,
    entries,
    make_policy,
    parse_policy,
    split_policies,
)
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import probe_document
from fi_toolkit.probe.selections import parse_selection
from fi_toolkit.signals.trace import SignalConfig, trace_prefix

P, W = 200, 16
POLICIES = {e.name: e.cls for e in entries() if e.kind == "policy"}  # those that compress from their name alone


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
    return [
        [_top(scores_lhp[l][h][: P - W], counts[l] - W) | window for h in range(scores_lhp.shape[1])]
        for l in range(len(counts))
    ]


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


@pytest.mark.parametrize("name", sorted(POLICIES) + ["infokv-adaptive"])  # the FI oracle: tests/test_oracle.py
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
    km = Adaptive(InfoKV(budget=k, window=W)).keep_map(trace)
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


@pytest.mark.parametrize(
    "text", ["1.5", "-3", "abc", "nan", "inf", "keep=", "keep=-0.1", "hold=0.2", "remove=x", "keep=0.2=0.3", "-0.5"]
)
def test_bad_budget_strings(text):
    with pytest.raises(FIError):
        Budget.parse(text)


@pytest.mark.parametrize(
    "spec, kept",
    [
        ("0.25", 50),
        ("keep=0.25", 50),
        ("remove=0.75", 50),
        ("keep=50", 50),
        ("remove=150", 50),
        ("50", 50),
        (0.25, 50),
        (50, 50),
        ("keep=1.0", 200),
        ("remove=0", 200),
        ("keep=0.0", 0),
        ("remove=1.0", 0),
        ("keep=0.0025", 1),
        ("remove=0.0025", 199),
    ],  # 0.5 rounds half up on either side
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
    assert list(table.selection) == [
        "policy:infokv@keep=0.3",
        "policy:pyramidkv@remove=0.7",
        "policy:snapkv@keep=60",
        "attention:remove=0.7",
    ]
    # one denominator (the prefix): every row removes 140 and keeps 60 entries per layer and head
    assert table.n_removed.tolist() == pytest.approx([P - 60] * 4)
    assert table.n_kept.tolist() == pytest.approx([60] * 4)
    assert (table.fi > 0).all()
    km = parse_selection("policy:infokv@0.3")[0].resolve(trace, alpha=0.9)
    expected = InfoKV(budget=0.3, window=W).keep_map(trace)
    assert all(torch.equal(a, b) for a, b in zip(km.keep, expected.keep))


@pytest.mark.parametrize(
    "spec", ["policy:magic@0.2", "policy:infokv", "policy:infokv@2.5", "policy:snapkv@x", "policy:snapkv@keep=nan"]
)
def test_bad_policy_selections(spec):
    with pytest.raises(FIError):
        parse_selection(spec)


# --- Adaptive(policy) and the spelling NAME[:key=value,...] -------------------------------------------


def _adaptive_reference(weights: torch.Tensor, scores_lhp: torch.Tensor, k: int) -> tuple[list[int], list]:
    """Today's adaptive arithmetic written out: layer shares of L * k by ``weights`` through ``allocate``
    (bounds [window, held]), then each head's top (share - W) of the candidates plus the window."""
    n_layers = scores_lhp.shape[0]
    counts = allocate(weights, n_layers * k, [W] * n_layers, [P] * n_layers)
    return counts, _expected_keep(scores_lhp, counts)


@pytest.mark.parametrize("k, alpha, tau", [(60, 0.9, 1.0), (30, 0.5, 2.0), (120, 0.0, 0.0)])
def test_adaptive_infokv_equals_the_old_infokv_adaptive_keep_map(trace, k, alpha, tau):
    e = (trace.distance.double() + tau) * trace.entropy.double()[None]  # E^(l) = (D + tau) * H, [L, P]
    counts, expected = _adaptive_reference(e[:, : P - W].mean(dim=1), _infokv_scores(trace, alpha, tau), k)
    spelled = [
        Adaptive(InfoKV(alpha=alpha, tau=tau, budget=k, window=W)),
        parse_policy(f"adaptive(infokv):alpha={alpha},tau={tau}", k, W),
        parse_policy(f"infokv-adaptive:alpha={alpha},tau={tau}", k, W),
        make_policy("infokv-adaptive", budget=k, window=W, alpha=alpha, tau=tau),
    ]
    for policy in spelled:
        km = policy.keep_map(trace)
        assert km.counts() == counts and sum(counts) == trace.num_layers * k
        _assert_keeps(km, expected)
    assert spelled[0] == spelled[1] == spelled[2] == spelled[3]
    assert spelled[0].label == spelled[3].label == f"infokv-adaptive@keep={k}"  # result tables' name, as before
    assert spelled[1].label == f"infokv-adaptive:alpha={alpha!r},tau={tau!r}@keep={k}"


def test_adaptive_snapkv_shares_layers_by_the_attention_on_evictable_entries(trace):
    # the random model's layers attend alike; scaling layer l's attention by l + 1 keeps each layer's
    # ranking and makes the layers' weights differ
    s = Signals.from_trace(trace)
    s.attention = [a * (layer + 1) for layer, a in enumerate(s.attention)]
    attention = torch.stack(s.attention).double()  # [L, Hkv, P]
    k = 60
    counts, expected = _adaptive_reference(attention[..., : P - W].mean(dim=(1, 2)), attention, k)
    km = parse_policy("adaptive(snapkv)", k, W).keep_map(s)
    assert counts == sorted(counts) and counts[0] < counts[-1] and km.counts() == counts
    _assert_keeps(km, expected)
    assert km.label == f"policy:snapkv-adaptive@keep={k}"
    assert parse_policy("snapkv-adaptive", k, W) == Adaptive(SnapKV(budget=k, window=W))
    plain = parse_policy("adaptive(snapkv)", k, W).keep_map(trace)  # unscaled: the shares of the trace's own weights
    weights = trace.attention.double()[..., : P - W].mean(dim=(1, 2))
    assert plain.counts() == _adaptive_reference(weights, trace.attention, k)[0]


def test_adaptive_follows_the_wrapped_policy():
    h2o, rpc, infokv = (Adaptive(p) for p in (H2O(), RPC(), InfoKV(alpha=0.5, top_k=64, window=16, budget=0.3)))
    assert h2o.tracks_accumulated and not h2o.needs_token_signals and h2o.compress_prompt
    assert not rpc.compress_prompt and not rpc.tracks_accumulated
    assert infokv.needs_token_signals and (infokv.alpha, infokv.top_k, infokv.window) == (0.5, 64, 16)
    assert infokv.budget == Budget.parse(0.3)
    config = signal_config_for(infokv)  # the signal options follow the wrapped policy
    assert (config.alpha, config.top_k, config.window) == (0.5, 64, 16)


@pytest.mark.smollm
def test_policy_selection_with_alpha_one_keeps_exactly_snapkv(trace, smollm, alice):
    for tr in (trace, trace_prefix(smollm.model, alice.ids, 300, SignalConfig())):
        [sel] = parse_selection("policy:infokv@0.25:alpha=1")
        assert sel.label == "policy:infokv@keep=0.25:alpha=1.0"
        a = sel.resolve(tr, alpha=0.3)  # the spelled option overrides the run's --alpha
        b = SnapKV(budget=0.25, window=tr.config.window).keep_map(tr)
        assert all(torch.equal(la, lb) for la, lb in zip(a.keep, b.keep))
        c = parse_selection("policy:infokv@0.25")[0].resolve(tr, alpha=0.3)
        assert any(not torch.equal(la, lc) for la, lc in zip(a.keep, c.keep))


def test_policy_selection_with_alpha_one_keeps_exactly_snapkv_on_the_tiny_model(trace):
    a = parse_selection("policy:infokv@0.25:alpha=1")[0].resolve(trace, alpha=0.3)
    b = SnapKV(budget=0.25, window=W).keep_map(trace)
    assert a.label == "policy:infokv@keep=0.25:alpha=1.0" and a.meta["policy"] == "infokv:alpha=1.0"
    assert all(torch.equal(la, lb) for la, lb in zip(a.keep, b.keep))


@pytest.mark.parametrize(
    "text, direct",
    [
        ("infokv:alpha=0.5,tau=2,top_k=64", InfoKV(alpha=0.5, tau=2.0, top_k=64, budget=0.3, window=W)),
        ("infokv:top-k=64", InfoKV(top_k=64, budget=0.3, window=W)),
        (" InfoKV : alpha = 0.25 ", InfoKV(alpha=0.25, budget=0.3, window=W)),
        ("pyramidkv:beta=10", PyramidKV(beta=10.0, budget=0.3, window=W)),
        ("streaming:sinks=2", StreamingLLM(sinks=2, budget=0.3, window=W)),
        ("random:seed=7", RandomPolicy(seed=7, budget=0.3, window=W)),
        ("snapkv:window=8", SnapKV(budget=0.3, window=8)),
        ("adaptive(infokv):alpha=0.5", Adaptive(InfoKV(alpha=0.5, budget=0.3, window=W))),
        ("adaptive(h2o)", Adaptive(H2O(budget=0.3, window=W))),
    ],
)
def test_options_parse_to_the_dataclass_built_directly(text, direct):
    policy = parse_policy(text, "keep=0.3", W)
    assert policy == direct and type(policy) is type(direct)
    for f in dataclasses.fields(direct):  # the field's own type, not a string or a float for an int
        assert type(getattr(policy, f.name)) is type(getattr(direct, f.name)), f.name
    assert parse_policy(policy.label.partition("@")[0], "keep=0.3", W) == direct  # labels parse back
    if ":" in text:
        assert policy.label.startswith(policy.name) and ":" in policy.name  # the label names the options


def test_spelled_options_override_the_global_defaults_which_go_only_where_they_fit():
    p = parse_policy("infokv:alpha=0.5", 0.3, W, alpha=0.9, tau=3.0, top_k=16)
    assert (p.alpha, p.tau, p.top_k) == (0.5, 3.0, 16) and p.label == "infokv:alpha=0.5@keep=0.3"
    assert parse_policy("snapkv", 0.3, W, alpha=0.9, tau=3.0, top_k=16) == SnapKV(budget=0.3, window=W)
    assert parse_policy("infokv", 0.3, W, alpha=None).alpha == 0.9  # None: the policy's default
    assert parse_policy("infokv", 0.3, W).label == "infokv@keep=0.3"  # no options spelled: the name alone


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alpha": 0.5}, "snapkv has no option 'alpha' (its options: budget, window)"),
        ({"nonsense": 1}, "snapkv has no option 'nonsense'"),
        ({"adaptive": True}, "snapkv has no option 'adaptive'"),
    ],
)
def test_make_policy_refuses_keywords_the_policy_does_not_have(kwargs, message):
    with pytest.raises(FIError, match=re.escape(message)):
        make_policy("snapkv", budget=0.3, **kwargs)
    assert make_policy("infokv", budget=0.3, alpha=0.5) == InfoKV(budget=0.3, alpha=0.5)


@pytest.mark.parametrize(
    "text, message",
    [
        ("snapkv:alpha=0.5", "snapkv has no option 'alpha' (its options: window)"),
        ("infokv:nonsense=1", "infokv has no option 'nonsense' (its options: window, alpha, tau, top_k)"),
        ("infokv:budget=0.3", "the budget is given with the budget argument or @BUDGET"),
        ("infokv:alpha=nan", "alpha must lie in [0, 1], got nan"),
        ("infokv:alpha=2", "alpha must lie in [0, 1], got 2.0"),
        ("infokv:alpha=-0.1", "alpha must lie in [0, 1], got -0.1"),
        ("infokv:alpha=x", "alpha must be a number, got 'x'"),
        ("infokv:tau=inf", "tau must be a finite number, got inf"),
        ("infokv:tau=-1", "tau must be >= 0, got -1.0"),
        ("infokv:top_k=0", "top_k must be >= 1, got 0"),
        ("infokv:top_k=1.5", "top_k must be a whole number, got '1.5'"),
        ("infokv:alpha=0.5,alpha=0.6", "the option 'alpha' is given twice"),
        ("infokv:alpha", "expected options like infokv:key=value,key=value, got 'alpha'"),
        ("infokv:", "expected options after the colon"),
        ("snapkv:window=0", "window must be >= 1, got 0"),
        ("pyramidkv:beta=0.5", "beta must be a finite number >= 1, got 0.5"),
        ("streaming:sinks=-1", "sinks must be >= 0, got -1"),
        ("random:seed=-2", "seed must be >= 0, got -2"),
        ("adaptive(streaming)", "adaptive(streaming): streaming keeps tokens by position"),
        ("adaptive(random)", "adaptive(random): random draws its scores at random"),
        ("knorm-adaptive", "adaptive(knorm): knorm scores by negative key norms"),
        ("adaptive(infokv-adaptive)", "'infokv-adaptive' is adaptive already"),
        ("adaptive(magic)", "unknown policy 'magic'"),
        ("lru:alpha=1", "unknown policy 'lru'"),
    ],
)
def test_bad_policy_spellings_are_one_line_errors(text, message):
    with pytest.raises(FIError, match=re.escape(message)) as exc:
        parse_policy(text, 0.3, W, where=f"--policy {text}")
    assert "\n" not in str(exc.value)
    assert str(exc.value).startswith(f"--policy {text}") or "unknown policy" in str(exc.value)


def test_adaptive_refuses_a_nested_adaptive_or_a_non_policy():
    with pytest.raises(FIError, match="is adaptive already"):
        Adaptive(Adaptive(InfoKV()))
    with pytest.raises(FIError, match="Adaptive wraps a policy"):
        Adaptive("infokv")


@pytest.mark.parametrize(
    "text, items",
    [
        ("infokv,snapkv", ["infokv", "snapkv"]),
        ("infokv:alpha=0.5,tau=2,snapkv", ["infokv:alpha=0.5,tau=2", "snapkv"]),
        (
            "adaptive(infokv):alpha=0.5, infokv:top_k=8,top-k=9",
            ["adaptive(infokv):alpha=0.5", "infokv:top_k=8,top-k=9"],
        ),
        (
            "kvpress:AdaKVPress/SnapKVPress:window_size=16,kernel_size=7,h2o",
            ["kvpress:AdaKVPress/SnapKVPress:window_size=16,kernel_size=7", "h2o"],
        ),
    ],
)
def test_policy_lists_split_between_policies_not_between_options(text, items):
    assert split_policies(text) == items


@pytest.mark.parametrize(
    "text, message",
    [
        ("infokv,,snapkv", "without empty items"),
        ("infokv,", "without empty items"),
        ("snapkv,snapkv", "lists an item twice"),
        ("alpha=0.5,snapkv", ""),
    ],
)
def test_bad_policy_lists(text, message):
    if not message:  # an option before any policy is an item of its own, refused as a name
        with pytest.raises(FIError, match="unknown policy 'alpha=0.5'"):
            parse_policy(split_policies(text)[0])
        return
    with pytest.raises(FIError, match=message):
        split_policies(text)


def test_every_policy_file_cites_its_paper_and_scores_state_their_shapes():
    """Each registered policy's module docstring cites a paper, and the one the registry names for it."""
    from fi_toolkit.policies import base

    for entry in entries():
        if entry.cls is None:
            continue
        doc = sys.modules[entry.cls.__module__].__doc__
        assert re.search(r"arXiv \d{4}\.\d{4,5}", doc), entry.cls.__module__
        assert not entry.paper or f"arXiv {entry.paper}" in doc, (entry.name, entry.paper)
    assert all(s in base.Policy.scores.__doc__ for s in ("[Hkv, n_l]", "layer", "higher = keep"))


def test_fi_probe_runs_a_policy_with_options_end_to_end(tiny, tiny_ids, tmp_path, monkeypatch, capsys):
    from cli_runner import run_cli

    doc = Document("tiny", "tiny", tiny_ids, "test")
    monkeypatch.setattr("fi_toolkit.model.loading.load_model", lambda *a, **k: tiny)
    monkeypatch.setattr(
        "fi_toolkit.documents.tokenize_texts",
        lambda texts, tokenizer, max_tokens=None: [Document("tiny", "tiny", tiny_ids[:max_tokens], "test")],
    )
    specs = ["policy:infokv@keep=0.25:alpha=0.5", "policy:infokv@keep=0.25", "policy:adaptive(infokv)@0.25:tau=2"]
    out = tmp_path / "run"
    args = ["probe", "--chunk", f"{P}:260", "--window", str(W), "--out", str(out)]
    code, stdout, err = run_cli([*args, *(a for s in specs for a in ("--select", s))], capsys)
    assert code == 0, err
    table = pd.read_csv(out / "fi.csv")
    rows = table[table.selector != "control"].set_index("selection")
    labels = [
        "policy:infokv@keep=0.25:alpha=0.5",
        "policy:infokv@keep=0.25",
        "policy:infokv-adaptive@keep=0.25:tau=2.0",
    ]
    assert list(rows.index) == labels and labels[0] in stdout
    assert rows.n_kept.tolist() == pytest.approx([50] * 3)
    # the same selections through the Python API, on the same document: the same numbers
    config = SignalConfig(window=W)
    direct = probe_document(tiny, doc, [Chunk(P, 260)], specs, config=config)
    direct = direct[direct.selector != "control"].set_index("selection")
    assert rows.fi.tolist() == pytest.approx(direct.fi.tolist(), rel=1e-6)
    assert rows.fi[labels[0]] != rows.fi[labels[1]]  # alpha matters
    # and the keep map of the spelled options is InfoKV(alpha=0.5)'s
    trace = trace_prefix(tiny.model, tiny_ids, P, config)
    km = parse_selection(specs[0])[0].resolve(trace)
    want = InfoKV(alpha=0.5, budget=0.25, window=W).keep_map(trace)
    assert all(torch.equal(a, b) for a, b in zip(km.keep, want.keep))


def test_spelled_alpha_and_tau_fork_from_a_shared_prefill_as_their_own_prefill(tiny, tiny_ids):
    """fi eval shares one prefill's signals (H, D, A: window and top_k) across policies; alpha and tau only
    enter a policy's scoring, so a policy spelling them forks from the shared prefill exactly as it
    compresses after its own prefill; a different top_k (other entropies) is refused."""
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.model.attention import ragged_attention

    n, model = 260, tiny.model
    parent = CompressedDecoder.shared(model, n, SignalConfig(window=W))  # alpha 0.9, tau 1
    with ragged_attention(model):
        parent.prefill(tiny_ids[:P])
    for text in ("infokv:alpha=0.5,tau=2", "adaptive(infokv):alpha=0.3", "pyramidkv:beta=4"):
        policy = parse_policy(text, 0.4, W)
        forked, keep = parent.fork(policy)
        alone = CompressedDecoder(model, policy, n)
        with ragged_attention(model):
            _, own = alone.prefill(tiny_ids[:P])
            a, b = forked.block(tiny_ids[P : P + 30]), alone.block(tiny_ids[P : P + 30])
        forked.close(), alone.close()
        assert all(torch.equal(x, y) for x, y in zip(keep.keep, own.keep)), text
        assert torch.equal(a, b), text
    with pytest.raises(FIError, match="top_k"):
        parent.fork(parse_policy("infokv:top_k=8", 0.4, W))
