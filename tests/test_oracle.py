"""The FI oracle: keep sets checked against brute force by physical deletion (no probe code),
its spelling and refusals, rounds, and on SmolLM2 its FI against every heuristic at the same budget."""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import DynamicCache

from fi_toolkit import Document, SignalConfig
from fi_toolkit.errors import FIError
from fi_toolkit.policies import FIOracle, parse_policy
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.probe.experiment import probe_document
from fi_toolkit.probe.oracle import oracle_keep_map, oracle_scores
from fi_toolkit.probe.selections import parse_selection
from fi_toolkit.signals.trace import trace_prefix

P, W = 64, 8
CHUNK = Chunk(64, 96)


@pytest.fixture(scope="module")
def trace(tiny, tiny_ids):
    return trace_prefix(tiny.model, tiny_ids, P, SignalConfig(window=W))


@torch.no_grad()
def loo_by_deletion(model, ids, p, chunk) -> torch.Tensor:
    """Exact FI on ``chunk`` of deleting each prefix position from the cache ``[p]`` float64: the prefix
    cache from a plain forward, position ``j`` sliced out of every layer's keys and values, the
    continuation re-run with its original position ids, KL in float64 (written here, no project code)."""
    out = model(input_ids=ids[None, :p], use_cache=True)
    layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    cont = ids[p : chunk.end][None]
    pos = torch.arange(p, chunk.end)[None]

    # transformers renamed past_key_values to cache within 5.x: pass it under the name this release takes
    # (an unknown keyword would be swallowed by **kwargs and the continuation run without any cache)
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def logp(kv, past):
        cache = DynamicCache(ddp_cache_data=kv, config=model.config)
        mask = torch.ones(1, past + cont.shape[1], dtype=torch.long)
        logits = model(input_ids=cont, position_ids=pos, attention_mask=mask, **{keyword: cache}).logits[0]
        return torch.log_softmax(logits.double(), -1)[chunk.start - p :]

    full = logp([(k.clone(), v.clone()) for k, v in layers], p)
    fi = torch.zeros(p, dtype=torch.float64)
    for j in range(p):
        keep = torch.tensor([i for i in range(p) if i != j])
        pruned = logp([(k[:, :, keep].clone(), v[:, :, keep].clone()) for k, v in layers], p - 1)
        fi[j] = (full.exp() * (full - pruned)).sum(-1).mean()
    return fi


def test_full_budget_removes_nothing(tiny, tiny_ids, trace):
    for estimator in ("fisher", "exact"):
        oracle = FIOracle(budget="keep=1.0", window=W, estimator=estimator, samples=2)
        keep_map = oracle_keep_map(oracle, tiny.model, trace, tiny_ids, [CHUNK])
        assert keep_map.visible(P).all()
        assert keep_map.n_removed(P) == 0


def test_exact_oracle_keeps_the_top_k_of_leave_one_out_by_deletion(tiny, tiny_ids, trace):
    fi = loo_by_deletion(tiny.model, tiny_ids, P, CHUNK)
    keep = 32  # of 64: 8 in the window, 24 picked from the 56 candidates [0, 56)
    order = torch.sort(fi[: P - W], descending=True, stable=True).indices
    gap = float(fi[order[keep - W - 1]] - fi[order[keep - W]])
    assert gap > 1e-6 * float(fi.max()), "a near-tie at the boundary would make the test fragile"
    expected = set(order[: keep - W].tolist()) | set(range(P - W, P))
    oracle = FIOracle(budget=keep, window=W, estimator="exact")
    keep_map = oracle_keep_map(oracle, tiny.model, trace, tiny_ids, [CHUNK])
    for layer in keep_map.keep:
        for head in layer:
            assert set(head.tolist()) == expected
    # its scores (the estimates the probe gives it) are the deletion values (masking equals deletion)
    none = torch.zeros(trace.num_layers, trace.num_kv_heads, P, dtype=torch.bool)
    scores = oracle_scores(oracle, tiny.model, trace, tiny_ids, CHUNK, none)
    torch.testing.assert_close(scores[0, 0, : P - W], fi[: P - W], rtol=1e-3, atol=1e-6)


def test_fisher_oracle_keeps_the_top_k_per_layer_and_head(tiny, tiny_ids, trace):
    est = fisher_fi(tiny.model, trace, tiny_ids, [CHUNK], samples=4, seed=0).head_fi[..., 0]
    oracle = FIOracle(budget="keep=0.5", window=W, samples=4)
    keep_map = oracle_keep_map(oracle, tiny.model, trace, tiny_ids, [CHUNK])
    differ = False
    for layer, kept in enumerate(keep_map.keep):
        for h in range(kept.shape[0]):
            top = torch.topk(est[layer, h, : P - W], 32 - W).indices
            assert set(kept[h].tolist()) == set(top.tolist()) | set(range(P - W, P))
        differ |= not torch.equal(kept[0], kept[1])
    assert differ, "per-head scores should give different keep sets somewhere"
    assert keep_map.meta["selector"] == "oracle:fi-oracle" and keep_map.meta["oracle"]


def test_rounds_mask_earlier_removals_and_shrink_monotonically(tiny, tiny_ids, trace):
    removed = torch.zeros(trace.num_layers, trace.num_kv_heads, P, dtype=torch.bool)
    removed[:, 0, 10:20] = True
    est = fisher_fi(tiny.model, trace, tiny_ids, [CHUNK], samples=2, removed=removed)
    assert (est.head_fi[:, 0, 10:20] == 0).all()  # no attention weight, no gradient
    assert (est.head_fi[:, 1, 10:20] > 0).all()
    oracle = FIOracle(budget="keep=0.5", window=W, rounds=3, samples=2)
    keep_map = oracle_keep_map(oracle, tiny.model, trace, tiny_ids, [CHUNK])
    assert keep_map.meta["removed_per_round"] == [11, 21, 32]
    assert keep_map.counts() == [32] * trace.num_layers


def test_spelling_label_and_refusals(tiny, tiny_ids, trace):
    (sel,) = parse_selection("policy:fi-oracle@0.5:chunk=64:96,rounds=2,estimator=exact")
    assert sel.label == "policy:fi-oracle@keep=0.5:chunk=64:96,rounds=2,estimator=exact"
    (again,) = parse_selection(sel.label)
    assert again.make_policy(W).span == (64, 96) and again.make_policy(W).rounds == 2
    for bad, message in [
        ("rounds=0", "rounds must lie in [1, 64], got 0"),
        ("rounds=-3", "rounds must lie"),
        ("rounds=nan", "rounds must be a whole number"),
        ("rounds=99999999999", "rounds must lie"),
        ("estimator=taylor", "unknown estimator 'taylor'"),
        ("chunk=96", "chunk must be START:END"),
    ]:
        with pytest.raises(FIError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_selection(f"policy:fi-oracle@0.5:{bad}")
    with pytest.raises(FIError, match="oracle that sees the future"):
        parse_policy("fi-oracle", "keep=0.5")  # as fi generate / fi eval parse their policies
    with pytest.raises(FIError, match="starts before the compression point"):
        parse_selection("policy:fi-oracle@0.5:chunk=10:40")[0].check(P, W, 4)
    doc = Document("d", "t", tiny_ids, "test")
    with pytest.raises(FIError, match="ends past the document's end"):
        probe_document(
            tiny, doc, [CHUNK], ["policy:fi-oracle@0.5:chunk=300:500"], prefix=P, config=SignalConfig(window=W)
        )
    with pytest.raises(FIError, match="only the probe computes"):
        FIOracle(budget="keep=0.5", window=W).keep_map(trace)


def test_probe_measures_the_oracle_beside_policies(tiny, tiny_ids):
    doc = Document("d", "t", tiny_ids, "test")
    table = probe_document(
        tiny,
        doc,
        [CHUNK, Chunk(128, 160)],
        ["policy:fi-oracle@0.5:samples=4", "policy:snapkv@0.5", "random:keep=0.5@0"],
        prefix=P,
        config=SignalConfig(window=W),
    )
    rows = table[table["selection"] == "policy:fi-oracle@keep=0.5:samples=4"]
    assert list(rows["selector"].unique()) == ["oracle:fi-oracle"] and len(rows) == 2
    assert (rows["n_removed"] == 32).all()


def _row(doc, selection, selector, chunk, fi, n=384.0):
    return {"document": doc, "selection": selection, "selector": selector, "n_removed": n, "chunk": chunk, "fi": fi}


def test_headroom_is_the_share_of_the_gap_closed_with_a_bootstrap_ci():
    from fi_toolkit.probe.headroom import headroom_table

    rows = []
    for d, (r0, r1, s, o, far) in enumerate(
        [(1.0, 1.2, 0.6, 0.2, 0.9), (2.0, 2.0, 1.5, 1.0, 1.1), (0.5, 0.7, 0.5, 0.1, 0.3)]
    ):
        doc = f"d{d}"
        rows += [
            _row(doc, "random:keep=0.25@0", "random", "near", r0),
            _row(doc, "random:keep=0.25@1", "random", "near", r1),
            _row(doc, "policy:snapkv@keep=0.25", "policy:snapkv", "near", s),
            _row(doc, "policy:fi-oracle@keep=0.25", "oracle:fi-oracle", "near", o),
            _row(doc, "policy:fi-oracle@keep=0.25:chunk=9:10", "oracle:fi-oracle", "near", far),
            _row(doc, "policy:snapkv@keep=0.1", "policy:snapkv", "near", 5.0, n=460.0),
        ]  # no oracle at this budget
    hr = headroom_table(pd.DataFrame(rows))
    row = hr[(hr.oracle == "policy:fi-oracle@keep=0.25") & (hr.selection == "policy:snapkv@keep=0.25")].iloc[0]
    r, s, o = (1.1 + 2.0 + 0.6) / 3, (0.6 + 1.5 + 0.5) / 3, (0.2 + 1.0 + 0.1) / 3  # by hand
    assert row.headroom == pytest.approx((r - s) / (r - o))
    assert row.fit_chunk == "near" and row.n_documents == 3
    assert np.isnan(row.ci_low) and np.isnan(row.ci_high)  # three documents: a percentile interval is their range
    fourth = [_row("d3", s_, k, "near", v) for s_, k, v in [
        ("random:keep=0.25@0", "random", 1.4), ("random:keep=0.25@1", "random", 1.6),
        ("policy:snapkv@keep=0.25", "policy:snapkv", 1.0), ("policy:fi-oracle@keep=0.25", "oracle:fi-oracle", 0.5),
    ]]  # fmt: skip
    four = headroom_table(pd.DataFrame(rows + fourth))
    row4 = four[(four.oracle == "policy:fi-oracle@keep=0.25") & (four.selection == "policy:snapkv@keep=0.25")].iloc[0]
    assert row4.n_documents == 4 and row4.ci_low <= row4.headroom <= row4.ci_high
    own = hr[(hr.oracle == hr.selection)]
    assert (own.headroom == 1.0).all()
    transfer = hr[(hr.oracle == "policy:fi-oracle@keep=0.25") & (hr.selection.str.contains("chunk=9:10"))].iloc[0]
    assert transfer.headroom == pytest.approx((r - (0.9 + 1.1 + 0.3) / 3) / (r - o))
    assert hr[hr.oracle.str.contains("chunk=9:10")].fit_chunk.unique().tolist() == ["9:10"]
    assert not (hr.n_removed == 460.0).any()


def test_headroom_figure_draws_the_reference_rows():
    from fi_toolkit.probe.headroom import headroom_table
    from fi_toolkit.report.kinds.probe import headroom_figure, reference_rows

    rows = []
    for d, scale in enumerate([1.0, 2.0, 0.5]):
        for chunk in ("512:640", "768:896"):
            rows += [
                _row(f"d{d}", "random:keep=0.25@0", "random", chunk, 1.0 * scale),
                _row(f"d{d}", "policy:snapkv@keep=0.25", "policy:snapkv", chunk, 0.6 * scale),
                _row(f"d{d}", "policy:fi-oracle@keep=0.25", "oracle:fi-oracle", chunk, 0.3 * scale),
                _row(
                    f"d{d}",
                    "policy:fi-oracle@keep=0.25:chunk=768:896",
                    "oracle:fi-oracle",
                    chunk,
                    (0.5 if chunk == "512:640" else 0.2) * scale,
                ),
            ]
    hr = headroom_table(pd.DataFrame(rows))
    ref = reference_rows(hr)
    # on 512:640 the reference is the default oracle (fit on the first chunk); on 768:896 the far one
    assert set(ref[ref.chunk == "512:640"].oracle) == {"policy:fi-oracle@keep=0.25"}
    assert set(ref[ref.chunk == "768:896"].oracle) == {"policy:fi-oracle@keep=0.25:chunk=768:896"}
    near_on_far = ref[(ref.chunk == "768:896") & (ref.selector == "oracle:fi-oracle")].iloc[0]
    assert near_on_far.bar == "ORACLE fit on 512:640" and near_on_far.headroom == pytest.approx((1 - 0.3) / (1 - 0.2))
    assert headroom_figure(hr, "test") is not None


@pytest.mark.smollm
def test_oracle_beats_every_heuristic_on_the_chunk_it_saw(smollm, alice):
    p, chunk = 256, Chunk(256, 320)
    specs = [
        "policy:fi-oracle@0.25",
        "policy:fi-oracle@0.25:rounds=2",
        "policy:snapkv@0.25",
        "policy:infokv@0.25",
        "policy:h2o@0.25",
        "policy:pyramidkv@0.25",
        "policy:streaming@0.25",
        "policy:knorm@0.25",
    ]
    table = probe_document(smollm, alice, [chunk], specs, prefix=p)
    fi = table.set_index("selection")["fi"]
    oracle = fi["policy:fi-oracle@keep=0.25"]
    for spec in specs[2:]:
        name = spec.replace("@0.25", "@keep=0.25")
        assert oracle <= fi[name], (name, oracle, fi[name])
    print("smollm p=256 keep 0.25:", fi.to_dict())


def test_nearfar_headroom_column_beside_an_oracle():
    from fi_toolkit.studies.nearfar import add_relative_columns

    base = {"document": "d", "sinks": 4, "chunk": "0:8", "distance_from_p": 0}
    rows = [
        {**base, "selection": "random:a@0", "selector": "random", "fi": 1.0},
        {**base, "selection": "random:a@1", "selector": "random", "fi": 3.0},
        {**base, "selection": "entropy:a", "selector": "entropy", "fi": 1.5},
        {**base, "selection": "policy:fi-oracle@a", "selector": "oracle:fi-oracle", "fi": 0.5},
    ]
    nf = add_relative_columns(pd.DataFrame(rows)).set_index("selection")
    assert nf.loc["entropy:a", "headroom"] == pytest.approx((2.0 - 1.5) / (2.0 - 0.5))
    assert nf.loc["policy:fi-oracle@a", "headroom"] == pytest.approx(1.0)
    assert "headroom" not in add_relative_columns(pd.DataFrame(rows[:3])).columns


def plain_fisher_head_fi(model, ids, p, chunk, samples, seed=0) -> torch.Tensor:
    """The sampled Fisher estimate per layer and KV head written out (no estimator or probe code) -> float64
    ``[L, H_kv, p]``: a plain prefill; the continuation through an attention function of this test that adds
    ``bias[l, h]`` to the logits of the prefix keys of KV group ``h``; labels drawn from the model's own
    distribution at every chunk position by a generator seeded ``seed`` (``samples`` per position, as the
    estimator draws them); per draw the gradient of ``sum_t log P_t(y_t)`` by autograd through
    ``log_softmax``, squared, halved and averaged over the chunk; the mean over draws."""
    from transformers import AttentionInterface

    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    bias = torch.zeros(layers, kv_heads, p, requires_grad=True)

    def biased(module, query, key, value, attention_mask, scaling=None, **kwargs):
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
        b = bias[module.layer_idx].repeat_interleave(group, dim=0)  # [H_q, p]
        b = torch.cat([b, torch.zeros(b.shape[0], key.shape[2] - p)], dim=1)
        logits = query @ key.transpose(-1, -2) * scaling + attention_mask + b[None, :, None, :]
        return (torch.softmax(logits, dim=-1) @ value).transpose(1, 2), None

    with torch.no_grad():
        cache = model(input_ids=ids[None, :p], use_cache=True).past_key_values
    cont = ids[p : chunk.end][None]
    n = cont.shape[1]
    mask = torch.zeros(1, 1, n, p + n)
    mask[..., p:] = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    AttentionInterface.register("plain_biased_test", biased)
    previous = config._attn_implementation
    config._attn_implementation = "plain_biased_test"
    try:
        logits = model(
            input_ids=cont, position_ids=torch.arange(p, chunk.end)[None], attention_mask=mask, **{keyword: cache}
        ).logits[0, chunk.start - p :]
    finally:
        config._attn_implementation = previous
    labels = torch.multinomial(
        torch.softmax(logits.detach().float(), -1),
        samples,
        replacement=True,
        generator=torch.Generator().manual_seed(seed),
    )
    log_p = torch.log_softmax(logits, dim=-1)
    head = torch.zeros(layers, kv_heads, p, dtype=torch.float64)
    rows = torch.arange(len(chunk))
    for s in range(samples):
        (g,) = torch.autograd.grad(log_p[rows, labels[:, s]].sum(), bias, retain_graph=s < samples - 1)
        head += 0.5 * g.double().square() / len(chunk)
    return head / samples


@torch.no_grad()
def fi_of_kept_by_deletion(model, ids, p, chunk, keep: list[torch.Tensor]) -> float:
    """FI on ``chunk`` of keeping only ``keep[l]`` ``[H_kv, k]`` of every layer's prefix cache (the other entries
    sliced out per KV head), in float64, with no project code: KL(full || kept), the mean over the chunk."""
    layers = [
        (layer.keys, layer.values) for layer in model(input_ids=ids[None, :p], use_cache=True).past_key_values.layers
    ]
    cont = ids[p : chunk.end][None]
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def log_p(kv, past):
        cache = DynamicCache(ddp_cache_data=kv, config=model.config)
        mask = torch.ones(1, past + cont.shape[1], dtype=torch.long)
        pos = torch.arange(p, chunk.end)[None]
        logits = model(input_ids=cont, position_ids=pos, attention_mask=mask, **{keyword: cache}).logits[0]
        return torch.log_softmax(logits.double(), -1)[chunk.start - p :]

    full = log_p([(k.clone(), v.clone()) for k, v in layers], p)
    gathered = []
    for (k, v), kept in zip(layers, keep):
        index = kept[None, :, :, None].expand(1, -1, -1, k.shape[-1])
        gathered.append((k.gather(2, index).clone(), v.gather(2, index).clone()))
    pruned = log_p(gathered, keep[0].shape[1])
    return float((full.exp() * (full - pruned)).sum(-1).mean())


def test_oracle_equals_a_plain_reimplementation(tiny, tiny_ids):
    """The oracle's scores, keep sets and probed FI against :func:`plain_fisher_head_fi` (the estimate written
    out) and :func:`fi_of_kept_by_deletion`: the same scores up to float32 rounding, the same kept entries
    per layer and head (no near-tie at any budget edge), the probe's FI equal to deletion's."""
    samples, keep = 6, 32
    plain = plain_fisher_head_fi(tiny.model, tiny_ids, P, CHUNK, samples)
    trace = trace_prefix(tiny.model, tiny_ids, P, SignalConfig(window=W))
    oracle = FIOracle(budget=keep, window=W, samples=samples)
    none = torch.zeros(trace.num_layers, trace.num_kv_heads, P, dtype=torch.bool)
    scores = oracle_scores(oracle, tiny.model, trace, tiny_ids, CHUNK, none)
    torch.testing.assert_close(scores, plain, rtol=1e-4, atol=1e-12)
    keep_map = oracle_keep_map(oracle, tiny.model, trace, tiny_ids, [CHUNK])
    for layer, kept in enumerate(keep_map.keep):
        for h in range(kept.shape[0]):
            ranked = torch.sort(plain[layer, h, : P - W], descending=True).values
            edge = float(ranked[keep - W - 1] - ranked[keep - W])
            assert edge > 1e-3 * float(ranked[keep - W - 1]), f"a near-tie at layer {layer}, head {h}'s budget edge"
            top = torch.topk(plain[layer, h, : P - W], keep - W).indices
            assert set(kept[h].tolist()) == set(top.tolist()) | set(range(P - W, P))
    doc = Document("d", "t", tiny_ids, "test")
    table = probe_document(
        tiny, doc, [CHUNK], [f"policy:fi-oracle@{keep}:samples={samples}"], prefix=P, config=SignalConfig(window=W)
    )
    fi = float(table[table["selector"] == "oracle:fi-oracle"]["fi"].iloc[0])
    expected = fi_of_kept_by_deletion(tiny.model, tiny_ids, P, CHUNK, keep_map.keep)
    assert expected > 0
    assert fi == pytest.approx(expected, rel=1e-5)


@pytest.mark.smollm
def test_the_oracle_keep_map_does_not_depend_on_the_thread_count(smollm, alice):
    """The same document traced and its oracle keep map computed under 1 and under 2 BLAS threads: the same keep
    map. In the model's float32 (``precision=model``) this setting flipped 22 of 11,520 entries (a label drawn on
    the other side of a sampling boundary); the float64 estimate (the default) agrees to ~1e-8 relative."""
    p, chunk, config = 128, Chunk(128, 160), SignalConfig(window=16)
    oracle = FIOracle(budget="keep=0.25", window=16)
    maps, scores = [], []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            trace = trace_prefix(smollm.model, alice.ids, p, config)
            maps.append(oracle_keep_map(oracle, smollm.model, trace, alice.ids, [chunk]).visible(p))
            none = torch.zeros(trace.num_layers, trace.num_kv_heads, p, dtype=torch.bool)
            scores.append(oracle_scores(oracle, smollm.model, trace, alice.ids, chunk, none))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(maps[0], maps[1]), f"{int((maps[0] != maps[1]).sum())} entries flipped"
    torch.testing.assert_close(scores[0], scores[1], rtol=1e-6, atol=0)


def test_float64_compute_restores_the_model_bit_for_bit(tiny, tiny_ids):
    from fi_toolkit.model.precision import compute_dtype, float64_compute

    before = {name: t.clone() for name, t in [*tiny.model.named_parameters(), *tiny.model.named_buffers()]}
    with torch.no_grad():
        plain = tiny.model(input_ids=tiny_ids[None, :32]).logits.double()
        with float64_compute(tiny.model):
            assert compute_dtype(tiny.model) == torch.float64
            wide = tiny.model(input_ids=tiny_ids[None, :32]).logits
    assert wide.dtype == torch.float64
    torch.testing.assert_close(wide, plain, rtol=1e-4, atol=1e-5)  # the same model, computed wider
    for name, t in [*tiny.model.named_parameters(), *tiny.model.named_buffers()]:
        assert t.dtype == before[name].dtype and torch.equal(t, before[name]), name


def test_seed_and_precision_options(tiny, tiny_ids, trace):
    (sel,) = parse_selection("policy:fi-oracle@0.5:samples=2,seed=3,precision=model")
    assert sel.label == "policy:fi-oracle@keep=0.5:samples=2,seed=3,precision=model"
    policy = sel.make_policy(W)
    assert policy.seed == 3 and policy.precision == "model"
    auto = FIOracle(budget="keep=0.5", window=W)
    assert auto.precision == "auto" and auto.in_float64("cpu") and not auto.in_float64("cuda")  # the default
    assert FIOracle(budget="keep=0.5", window=W, precision="float64").in_float64("cuda") and not policy.in_float64(
        "cpu"
    )
    for bad, message in [("precision=float16", "unknown precision 'float16'"), ("seed=-1", "seed must be")]:
        with pytest.raises(FIError, match=message):
            parse_selection(f"policy:fi-oracle@0.5:{bad}")
    # the label seed is the estimate's: seed 3 draws what fisher_fi draws with seed=3 (here in the model's dtype)
    none = torch.zeros(trace.num_layers, trace.num_kv_heads, P, dtype=torch.bool)
    est = fisher_fi(tiny.model, trace, tiny_ids, [CHUNK], samples=2, seed=3).head_fi[..., 0]
    torch.testing.assert_close(oracle_scores(policy, tiny.model, trace, tiny_ids, CHUNK, none), est, rtol=0, atol=0)
    other = oracle_scores(
        FIOracle(budget="keep=0.5", window=W, samples=2, precision="model"), tiny.model, trace, tiny_ids, CHUNK, none
    )
    assert not torch.equal(other, est)  # seed 0 draws other labels


def test_headroom_carries_the_oracle_seed_noise():
    from fi_toolkit.probe.headroom import headroom_table, oracle_seed, seed_label, with_oracle_seeds
    from fi_toolkit.probe.selections import parse_selections

    oracle, far = "policy:fi-oracle@keep=0.25", "policy:fi-oracle@keep=0.25:chunk=9:10"
    assert oracle_seed(f"{oracle}:seed=1") == (oracle, 1) and oracle_seed(oracle) == (oracle, 0)
    assert oracle_seed(f"{oracle}:seed=2,chunk=9:10") == (far, 2) and seed_label(far, 1) == f"{far},seed=1"
    exact = "policy:fi-oracle@keep=0.25:estimator=exact"  # leave-one-out draws no labels: no second seed
    labels = [s.label for s in with_oracle_seeds(parse_selections([oracle, far, "policy:snapkv@0.25", exact]))]
    assert labels == [oracle, far, "policy:snapkv@keep=0.25", exact, f"{oracle}:seed=1", f"{far},seed=1"]
    values = {  # per document: random (two seeds), snapkv, the oracle at label seeds 0 and 1
        "d0": (1.0, 1.2, 0.6, 0.2, 0.25),
        "d1": (2.0, 2.0, 1.5, 1.0, 0.9),
        "d2": (0.5, 0.7, 0.5, 0.1, 0.12),
    }
    rows = []
    for doc, (r0, r1, s, o0, o1) in values.items():
        rows += [
            _row(doc, "random:keep=0.25@0", "random", "near", r0),
            _row(doc, "random:keep=0.25@1", "random", "near", r1),
            _row(doc, "policy:snapkv@keep=0.25", "policy:snapkv", "near", s),
            _row(doc, oracle, "oracle:fi-oracle", "near", o0),
            _row(doc, f"{oracle}:seed=1", "oracle:fi-oracle", "near", o1),
        ]
    hr = headroom_table(pd.DataFrame(rows))
    assert set(hr.oracle) == {oracle} and f"{oracle}:seed=1" not in set(hr.selection)  # no reference, no row
    row = hr[hr.selection == "policy:snapkv@keep=0.25"].iloc[0]
    r = sum((v[0] + v[1]) / 2 for v in values.values()) / 3
    s = sum(v[2] for v in values.values()) / 3
    o0, o1 = (sum(v[k] for v in values.values()) / 3 for k in (3, 4))
    assert row.headroom == pytest.approx((r - s) / (r - o0))  # the seed-0 oracle stays the reference
    assert row.oracle_seeds == 2
    assert row.fi_oracle_seed_sd == pytest.approx(abs(o0 - o1) / 2**0.5)
    assert row.headroom_seed_sd == pytest.approx(abs((r - s) / (r - o0) - (r - s) / (r - o1)) / 2**0.5)
    own = hr[hr.selection == oracle].iloc[0]  # the "1" moves by this much with the label draws
    assert own.headroom == 1.0 and own.headroom_seed_sd == pytest.approx(abs(1 - (r - o0) / (r - o1)) / 2**0.5)
    alone = headroom_table(pd.DataFrame([x for x in rows if not x["selection"].endswith("seed=1")]))
    assert (alone.oracle_seeds == 1).all() and alone.headroom_seed_sd.isna().all()
