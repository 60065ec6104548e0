"""Correlations equal scipy on the same arrays; per-token FI equals a one-token probe; near/far mechanics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from fi_toolkit import Document, SignalConfig
from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import probe_document
from fi_toolkit.signals.trace import trace_prefix
from fi_toolkit.studies import (
    add_relative_columns,
    candidate_positions,
    correlation,
    nearfar_document,
    paired_tests,
    per_token_fi,
    summarize_nearfar,
    token_class,
)
from fi_toolkit.studies.correlation import correlate_signals, signal_columns
from fi_toolkit.studies.nearfar import count_sets

CFG = SignalConfig(window=8)
P = 128


@pytest.fixture(scope="module")
def doc(tiny_ids):
    return Document("synthetic", "synthetic ids", tiny_ids, "test")


@pytest.fixture(scope="module")
def trace(tiny, doc):
    return trace_prefix(tiny.model, doc.ids, P, CFG)


SCIPY = {
    "spearman": lambda x, y: stats.spearmanr(x, y).statistic,
    "pearson": lambda x, y: stats.pearsonr(x, y).statistic,
    "kendall": lambda x, y: stats.kendalltau(x, y).statistic,
}


@pytest.mark.parametrize("method", ["spearman", "pearson", "kendall"])
def test_correlation_equals_scipy_on_same_arrays(method):
    rng = np.random.default_rng(11)
    x = rng.normal(size=80)
    y = 0.4 * x + rng.normal(size=80)
    ours = correlation(x, y, method, n_resamples=400, seed=5)
    point = {"spearman": stats.spearmanr, "pearson": stats.pearsonr, "kendall": stats.kendalltau}[method](x, y)
    boot = stats.bootstrap(
        (x, y),
        SCIPY[method],
        paired=True,
        vectorized=False,
        n_resamples=400,
        method="percentile",
        rng=np.random.default_rng(5),
    )
    assert ours["rho"] == pytest.approx(point.statistic, abs=1e-12)
    assert ours["p_value"] == pytest.approx(point.pvalue, rel=1e-9)
    assert ours["ci_low"] == pytest.approx(boot.confidence_interval.low, abs=1e-12)
    assert ours["ci_high"] == pytest.approx(boot.confidence_interval.high, abs=1e-12)
    assert ours["n"] == 80


def test_monotone_relation_gives_rho_one():
    x = np.linspace(0.1, 5, 50)
    y = np.exp(3 * x) + x  # monotone, far from linear
    for method in ("spearman", "kendall"):
        r = correlation(x, y, method, n_resamples=200)
        assert r["rho"] == pytest.approx(1.0)
        assert r["ci_low"] == pytest.approx(1.0) and r["ci_high"] == pytest.approx(1.0)
    assert correlation(x, y, "pearson", n_resamples=0)["rho"] < 0.9  # Pearson sees the non-linearity


def test_independent_relation_interval_contains_zero():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=300), rng.normal(size=300)
    for method in ("spearman", "pearson", "kendall"):
        r = correlation(x, y, method, n_resamples=500, seed=1)
        assert r["ci_low"] < 0 < r["ci_high"], (method, r)


def test_degenerate_input_is_nan_not_an_error():
    assert np.isnan(correlation(np.ones(10), np.arange(10.0))["rho"])
    assert np.isnan(correlation([1.0, 2.0], [2.0, 1.0])["rho"])
    r = correlation([1, 2, np.nan, 4, 5], [2, 3, 5, np.inf, 6], "spearman", n_resamples=50)
    assert r["n"] == 3
    with pytest.raises(FIError):
        correlation([1, 2, 3], [1, 2, 3], "bogus")


def test_candidates_default_to_a_uniform_sample(trace):
    sinks = 4
    pool = torch.arange(sinks, trace.scored)
    everything, w_all = candidate_positions(trace, "all", sinks)
    assert torch.equal(everything, pool) and np.all(w_all == 1)
    picked, weights = candidate_positions(trace, "sample:10", sinks, seed=3)
    assert picked.numel() == 10 and torch.equal(picked, torch.sort(torch.unique(picked)).values)
    assert picked.min() >= sinks and picked.max() < trace.scored and np.all(weights == 1)
    assert torch.equal(picked, candidate_positions(trace, "sample:10", sinks, seed=3)[0])
    # uniform: over many seeds every position is drawn about equally often (10 of 116 per draw)
    counts = np.zeros(trace.scored)
    for seed in range(600):
        counts[candidate_positions(trace, "sample:10", sinks, seed=seed)[0].numpy()] += 1
    expected = 600 * 10 / pool.numel()
    assert stats.chisquare(counts[sinks:]).pvalue > 1e-3 and abs(counts[sinks:].mean() - expected) < 1e-9
    for bad in ("sample:0", "half", "stratified:x"):
        with pytest.raises(FIError):
            candidate_positions(trace, bad)
    with pytest.raises(FIError, match="seed must be >= 0"):
        candidate_positions(trace, "sample:3", seed=-1)
    with pytest.raises(FIError, match="sinks 200 leaves no candidates"):
        candidate_positions(trace, "sample:3", sinks=200)


def test_stratified_candidates_carry_inverse_inclusion_weights(trace):
    sinks, n = 4, 10
    pool = torch.arange(sinks, trace.scored)
    picked, weights = candidate_positions(trace, f"stratified:{n}", sinks, seed=3)
    order = np.argsort(trace.entropy[pool].numpy(), kind="stable")
    strata = np.array_split(order, n)
    sizes = []
    for p in picked.tolist():  # exactly one from each entropy stratum, weighted by its size
        (stratum,) = [s for s in strata if p - sinks in set(s.tolist())]
        sizes.append(len(stratum))
    assert sorted(len(s) for s in strata) == sorted(sizes)
    np.testing.assert_allclose(weights, np.array(sizes) / np.mean(sizes))


def test_weighted_coefficients(trace):
    rng = np.random.default_rng(3)
    x = rng.normal(size=40)
    y = 0.5 * x + rng.normal(size=40)
    x[:5] = x[0]  # ties
    ones = correlation(x, y, "kendall", n_resamples=0, weights=np.ones(40))
    assert not ones["weighted"] and ones["rho"] == pytest.approx(stats.kendalltau(x, y).statistic)
    # integer weights = repeating each pair that many times (scipy on the repeated arrays)
    w = rng.integers(1, 4, size=40).astype(float)
    xr, yr = np.repeat(x, w.astype(int)), np.repeat(y, w.astype(int))
    for method, ref in (("spearman", stats.spearmanr), ("pearson", stats.pearsonr)):
        r = correlation(x, y, method, n_resamples=50, weights=w)
        assert r["weighted"] and np.isnan(r["p_value"]) and r["ci_low"] <= r["rho"] <= r["ci_high"]
        assert r["rho"] == pytest.approx(ref(xr, yr).statistic, abs=1e-12)
    # Kendall with pair weights w_i w_j: equals tau-b on the repeated arrays up to the pairs within a repeat
    tau = correlation(x, y, "kendall", n_resamples=0, weights=w)["rho"]
    assert abs(tau - stats.kendalltau(xr, yr).statistic) < 0.05 and tau > 0


def test_per_token_fi_equals_one_token_probe(tiny, doc, trace):
    chunks = [Chunk(P, P + 24), Chunk(P + 40, P + 64)]
    positions, _ = candidate_positions(trace, "sample:6", 4, seed=0)
    result = per_token_fi(tiny.model, trace, doc.ids, positions, chunks, batch_size=4)
    assert [e.label for e in result.evictions[:2]] == ["control:null", "control:reorder"]
    fi = result.fi()[2:].numpy()
    assert fi.shape == (6, 2) and np.all(fi >= 0)
    for row, j in enumerate(positions.tolist()[:3]):
        single = probe_document(tiny, doc, chunks, [f"positions:{j}"], prefix=P, config=CFG, batch_size=1)
        single = single[single.selector == "positions"]
        np.testing.assert_allclose(single["fi"].to_numpy(), fi[row], rtol=1e-5, atol=1e-9)


def test_correlate_signals_rows_match_direct_scipy(trace):
    positions = torch.arange(4, 60)
    signals = signal_columns(trace, positions)
    fi = np.stack([signals["entropy"].to_numpy() ** 2, -signals["attention"].to_numpy()], axis=1)
    table = correlate_signals(fi, signals, [Chunk(P, P + 8), Chunk(P + 8, P + 16)], P, n_resamples=100, seed=2)
    h = table[(table.signal == "H") & (table.method == "spearman") & (table.chunk == f"{P}:{P + 8}")].iloc[0]
    assert h["rho"] == pytest.approx(1.0)  # FI = H^2 is monotone in H
    a = table[
        (table.signal == "A")
        & (table.method == "spearman")
        & (table.scope == "mean")
        & (table.chunk == f"{P + 8}:{P + 16}")
    ].iloc[0]
    assert a["rho"] == pytest.approx(-1.0)
    d3 = table[(table.signal == "D") & (table.scope == "layer") & (table.layer == 3)].iloc[0]
    expect = correlation(trace.distance[3, positions].numpy(), fi[:, 0], "spearman", 100, seed=2)
    assert d3["rho"] == pytest.approx(expect["rho"]) and d3["ci_low"] == pytest.approx(expect["ci_low"])
    assert set(table[table.scope == "layer"]["method"]) == {"spearman"}
    # seven mean signals (H, A, D, E, S, H_produced, H_next) x 3 methods, 4 per-layer signals, A per (layer, KV head)
    assert len(table) == 2 * (7 * 3 + 4 * trace.num_layers + trace.num_layers * trace.num_kv_heads)


def test_per_head_attention_rows_equal_scipy_spearmanr(trace):
    """Each (layer, KV head) row is scipy's Spearman of that head's window attention (read from the trace's
    [L, Hkv, p] tensor here) with FI; a hand-built FI monotone in one head's attention gives rho = 1 there."""
    positions = torch.arange(4, P - CFG.window)
    signals = signal_columns(trace, positions)
    att = trace.attention[:, :, positions].numpy()  # [L, Hkv, n]
    fi = np.stack([np.exp(att[2, 1] * 50.0), np.linspace(0.0, 1.0, positions.numel())], axis=1)
    chunks = [Chunk(P, P + 8), Chunk(P + 8, P + 16)]
    table = correlate_signals(fi, signals, chunks, P, n_resamples=50, seed=1)
    heads = table[table.scope == "head"]
    assert set(heads.signal) == {"A"} and set(heads.method) == {"spearman"}
    assert len(heads) == 2 * trace.num_layers * trace.num_kv_heads
    assert heads["head"].notna().all() and table[table.scope != "head"]["head"].isna().all()
    for r in heads.itertuples():
        k = [c.label for c in chunks].index(r.chunk)
        assert r.rho == pytest.approx(stats.spearmanr(att[r.layer, r.head], fi[:, k]).statistic, abs=1e-12)
    best = heads[heads.chunk == chunks[0].label].sort_values("rho").iloc[-1]
    assert (best["layer"], best["head"], best["rho"]) == (2, 1, pytest.approx(1.0))
    assert trace.num_kv_heads == 2 and not np.allclose(att[2, 0], att[2, 1])  # the heads really differ


def _entropy_oracle(model, ids, top_k: int) -> np.ndarray:
    """Entropy (nats) of the softmax over the ``top_k`` largest logits at every position, from one plain
    forward and scipy (no code of the toolkit's signals)."""
    from scipy.special import softmax

    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].double().numpy()
    top = np.sort(logits, axis=-1)[:, -top_k:]
    return stats.entropy(softmax(top, axis=-1), axis=-1)


@pytest.mark.parametrize("top_k", [256, 16])
def test_both_entropy_conventions_in_one_table(tiny, doc, top_k):
    """H_next[i] is the entropy of the logits at i, H_produced[i] the one at i - 1 (0 at i = 0), whichever
    convention the trace was made with; ``entropy`` stays the trace's own (top_k = 256 = vocab: full entropy)."""
    at = _entropy_oracle(tiny.model, doc.ids[:P], top_k)
    for entropy_of in ("produced", "next"):
        tr = trace_prefix(tiny.model, doc.ids, P, SignalConfig(window=8, top_k=top_k, entropy_of=entropy_of))
        table = tr.token_table()
        np.testing.assert_allclose(table["entropy_next"].to_numpy()[: P - 1], at[: P - 1], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(table["entropy_produced"].to_numpy()[1:], at[: P - 1], rtol=1e-4, atol=1e-5)
        assert table["entropy_produced"].iloc[0] == 0.0
        own = "entropy_next" if entropy_of == "next" else "entropy_produced"
        np.testing.assert_array_equal(table["entropy"].to_numpy(), table[own].to_numpy())
        if entropy_of == "produced":
            assert np.isnan(table["entropy_next"].iloc[-1])  # the logits at p - 1 are not part of the trace
        else:
            assert table["entropy_next"].iloc[-1] == pytest.approx(at[-1], rel=1e-4)
        positions = torch.arange(4, P - 8)
        fi = np.stack([at[positions.numpy()], -at[positions.numpy() - 1]], axis=1)  # FI monotone in H_next / H_produced
        corr = correlate_signals(
            fi, signal_columns(tr, positions), [Chunk(P, P + 8), Chunk(P + 8, P + 16)], P, n_resamples=0
        )
        mean = corr[(corr.method == "spearman") & (corr.scope == "mean")]
        rho = {(r.chunk, r.signal): r.rho for r in mean.itertuples()}  # plain dict: one value per key on any pandas
        assert len(rho) == len(mean)
        assert rho[(f"{P}:{P + 8}", "H_next")] == pytest.approx(1.0)
        assert rho[(f"{P + 8}:{P + 16}", "H_produced")] == pytest.approx(-1.0)
        assert rho[(f"{P}:{P + 8}", "H")] == rho[(f"{P}:{P + 8}", "H_next" if entropy_of == "next" else "H_produced")]


def test_nearfar_sets_and_relative_columns(tiny, doc, trace):
    chunks = [Chunk(P, P + 16), Chunk(P + 32, P + 48), Chunk(P + 64, P + 80)]
    tables = nearfar_document(
        tiny.model, doc, trace, chunks, budget="remove=0.1", seeds=2, sink_options=(4, 0), batch_size=8
    )
    nf = tables["nearfar"]
    assert list(nf.selection[: 2 * len(chunks) : len(chunks)]) == ["control:null", "control:reorder"]
    assert (nf[nf.selection == "control:null"]["fi"] == 0).all()  # float32 on the CPU: exactly 0
    assert (nf[nf.selection == "control:reorder"]["fi"].abs() < 1e-8).all()
    summary = summarize_nearfar(add_relative_columns(nf))
    assert "control" not in set(summary.selector) and not summary.sinks.isna().any()
    nf = nf[nf.selector != "control"]
    assert set(nf["sinks"]) == {4, 0}
    assert set(nf["n_removed"]) == {round(0.1 * P)} and set(nf["n_kept"]) == {P - round(0.1 * P)}  # equal sizes
    prot = probe_document(tiny, doc, chunks, ["attention:remove=0.1"], prefix=P, sinks=4, config=CFG)
    got = nf[(nf.sinks == 4) & (nf.selector == "attention")]["fi"].to_numpy()
    np.testing.assert_allclose(got, prot[prot.selector == "attention"]["fi"].to_numpy(), rtol=1e-5, atol=1e-9)
    rel = add_relative_columns(nf)
    rand = rel[rel.selector == "random"].groupby(["sinks", "chunk"])["fi_rel_random"].mean()
    np.testing.assert_allclose(rand.to_numpy(), 1.0)
    assert np.allclose(rel[rel.distance_from_p == 0]["fi_share_near"], 1.0)
    classes = tables["token_classes"]
    assert len(classes) == nf[["sinks", "selection"]].drop_duplicates().shape[0]
    assert np.allclose(classes[["share_content", "share_function", "share_other"]].sum(axis=1), 1.0)


def test_nearfar_measures_extra_selections_once_under_every_sink_option(tiny, doc, trace, monkeypatch):
    """A keep map beside the study's sets (a policy here; a kvpress press the same way): measured once, listed
    under each sink option, with the FI the probe gives it; its token classes are those of the positions
    every layer and head removed."""
    import fi_toolkit.studies.nearfar as nearfar

    seen = []
    real = nearfar.forward_influence

    def spy(model, trace, ids, evictions, chunks, **kwargs):
        seen.extend(evictions)
        return real(model, trace, ids, evictions, chunks, **kwargs)

    monkeypatch.setattr(nearfar, "forward_influence", spy)
    chunks = [Chunk(P, P + 16), Chunk(P + 32, P + 48)]
    spec = "policy:snapkv@keep=0.5"
    tables = nearfar_document(tiny.model, doc, trace, chunks, "remove=0.1", 1, (4, 0), batch_size=8, selections=[spec])
    assert sum(e.label == "policy:snapkv@keep=0.5" for e in seen) == 1  # measured once
    assert count_sets("remove=0.1", 1, (4, 0), [spec]) == 2 * 6
    nf = tables["nearfar"]
    rows = nf[nf.selection == "policy:snapkv@keep=0.5"]
    assert sorted(rows.sinks.tolist()) == [0, 0, 4, 4]
    probe = probe_document(tiny, doc, chunks, [spec], prefix=P, config=CFG)
    want = probe[probe.selection == spec].set_index("chunk")["fi"]
    for sinks in (4, 0):
        got = rows[rows.sinks == sinks].set_index("chunk")["fi"]
        np.testing.assert_allclose(got.loc[want.index].to_numpy(), want.to_numpy(), rtol=1e-5, atol=1e-9)
    classes = tables["token_classes"].set_index(["sinks", "selection"])
    assert classes.loc[(4, spec), ["share_content", "share_function", "share_other"]].sum() == pytest.approx(1.0)


def test_protected_nearfar_sets_never_contain_a_sink(tiny, doc, trace, monkeypatch):
    """Capture the sets the study really measures, and check them position by position."""
    import fi_toolkit.studies.nearfar as nearfar

    seen = []
    real = nearfar.forward_influence

    def spy(model, trace, ids, evictions, chunks, **kwargs):
        seen.extend(evictions)
        return real(model, trace, ids, evictions, chunks, **kwargs)

    monkeypatch.setattr(nearfar, "forward_influence", spy)
    tables = nearfar_document(
        tiny.model, doc, trace, [Chunk(P, P + 8)], budget="remove=0.2", seeds=3, sink_options=(4, 0), batch_size=8
    )
    protected = [e for e in seen if e.meta["sinks"] == 4]
    assert len(protected) == 7  # four score-based sets and three random ones
    for e in protected:
        assert e.removed.min() >= 4 and e.removed.max() < trace.scored, e.label
    # without protection the attention set does take the sink at position 0 here
    unprotected = {e.label for e in seen if e.meta["sinks"] == 0 and 0 in e.removed.tolist()}
    nf = tables["nearfar"]
    assert unprotected and nf[nf.selector != "control"]["sinks"].isin([4, 0]).all()


def test_paired_test_is_one_sided_wilcoxon():
    docs = [f"d{i}" for i in range(6)]
    ent = np.array([3.0, 2.5, 4.0, 1.0, 2.0, 5.0])
    att = np.array([1.0, 2.0, 3.0, 1.5, 0.5, 2.0])
    rows = []
    for d, e, a in zip(docs, ent, att):
        for sel, v in (("entropy", e), ("attention", a), ("random", 1.0)):
            rows.append(
                {
                    "document": d,
                    "sinks": 4,
                    "selection": sel,
                    "selector": sel,
                    "chunk": "1:2",
                    "distance_from_p": 0,
                    "fi": v,
                }
            )
    tests = paired_tests(add_relative_columns(pd.DataFrame(rows)))
    row = tests[tests.metric == "fi"].iloc[0]
    expect = stats.wilcoxon(ent, att, alternative="greater")
    assert row["wilcoxon_p"] == pytest.approx(expect.pvalue) and row["a_wins"] == 5 and row["n_documents"] == 6


def test_token_classes():
    assert token_class(" the") == "function" and token_class("The") == "function"
    assert token_class(" Alice") == "content" and token_class("ing") == "content"
    assert token_class(",") == "other" and token_class("\n\n") == "other" and token_class(" 1865") == "other"
