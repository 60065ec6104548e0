"""Budgets across heads: ``learned:heads=global`` and ``fi fit --learner lambdarank --group layer``.

Oracles: a plain numpy top-k over the concatenated candidates of a layer's heads (hand-made scores, distinct, so the
top-k is unique), the per-head floor and the uniform total counted by hand; constant scores (by hand, and a model
trained on equal labels) keep what the uniform policy keeps, the earliest candidates of every head; the grades of a
per-layer group from scipy's rankdata over the layer.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from cli_runner import run_cli
from scipy import stats

from fi_toolkit import SignalConfig
from fi_toolkit.compress.decoder import generate
from fi_toolkit.errors import FIError
from fi_toolkit.fit.lambdarank import LEVELS, grades, learn_policy
from fi_toolkit.fit.ridge import policy_json
from fi_toolkit.fit.settings import FitSettings
from fi_toolkit.policies import Learned, parse_policy
from fi_toolkit.policies.base import select, select_across_heads
from fi_toolkit.signals.trace import trace_prefix

pytest.importorskip("lightgbm")

P, W = 96, 8
CONFIG = SignalConfig(window=W)
TINY = {"name": "tiny-llama", "layers": 4, "kv_heads": 2, "head_dim": 16, "vocab": 256}
SIGNALS = {"window": W, "top_k": 256, "pool_kernel": 7, "tau": 1.0, "entropy_of": "produced", "final_norm": False}
META = {"model": TINY, "signals": SIGNALS}


def numpy_top_k(scores: np.ndarray, keep: int, protected: int, window: int) -> list[list[int]]:
    """The oracle: concatenate every head's candidates, take the top Hkv * (keep - protected - window) by
    np.argsort, add each head's protected slots and window."""
    hkv, n = scores.shape
    cand = scores[:, protected : n - window]
    flat = np.concatenate(list(cand))  # head 0's candidates, then head 1's, ...
    top = np.argsort(-flat)[: hkv * (keep - protected - window)]
    m = cand.shape[1]
    out = []
    for h in range(hkv):
        mine = [int(i - h * m) + protected for i in top if h * m <= i < (h + 1) * m]
        out.append(sorted(list(range(protected)) + mine + list(range(n - window, n))))
    return out


def test_global_top_k_is_a_top_k_over_the_concatenated_heads():
    # 3 heads, 12 slots, protected 1, window 2, keep 5: 2 picks per head, 6 over the layer
    scores = np.array(
        [
            [0.0, 9.0, 8.5, 8.0, 7.5, 7.0, 0.1, 0.2, 0.3, 0.0, 0.0, 0.0],  # head 0 holds the five best candidates
            [0.0, 1.0, 0.5, 0.4, 6.9, 0.3, 0.2, 0.6, 0.7, 0.0, 0.0, 0.0],  # head 1 one
            [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.0, 0.0, 0.0],  # head 2 none: its floor only
        ]
    )
    got = select_across_heads(torch.from_numpy(scores), 5, 1, 2)
    want = numpy_top_k(scores, 5, 1, 2)
    assert [g.tolist() for g in got] == want
    assert want == [[0, 1, 2, 3, 4, 5, 10, 11], [0, 4, 10, 11], [0, 10, 11]]  # by hand
    counts = [len(g) for g in got]
    assert sum(counts) == 3 * 5 == sum(r.numel() for r in select(torch.from_numpy(scores), 5, 1, 2))  # the total
    assert min(counts) >= 1 + 2  # the floor: protected + window


@pytest.mark.parametrize("seed", range(5))
def test_random_scores_match_the_oracle(seed):
    gen = np.random.default_rng(seed)
    scores = gen.standard_normal((3, 40))  # distinct with probability one: the top-k is unique
    for keep, protected, window in ((10, 0, 4), (17, 2, 5), (6, 0, 6), (40, 0, 4)):
        got = [g.tolist() for g in select_across_heads(torch.from_numpy(scores), keep, protected, window)]
        want = numpy_top_k(scores, keep, protected, window) if keep < 40 else [list(range(40))] * 3
        assert got == want
        assert sum(map(len, got)) == 3 * keep and min(map(len, got)) >= protected + window


def test_constant_scores_keep_what_the_uniform_policy_keeps():
    scores = torch.zeros(3, 30)
    got = select_across_heads(scores, 12, 1, 4)
    uniform = select(scores, 12, 1, 4)
    assert all(torch.equal(g, u) for g, u in zip(got, uniform))
    assert got[0].tolist() == list(range(8)) + list(range(26, 30))  # ties: earlier slot, then lower head


def test_non_finite_and_too_small_budgets_are_refused():
    with pytest.raises(FIError, match="non-finite scores"):
        select_across_heads(torch.tensor([[0.0, float("nan"), 0.0, 0.0]]), 3, 0, 1)
    with pytest.raises(FIError, match="cannot hold the 2 protected entries and the window of 4"):
        select_across_heads(torch.zeros(2, 20), 5, 2, 4)


def test_grades_of_a_layer_group_rank_over_every_head_of_the_layer():
    gen = np.random.default_rng(0)
    rows = pd.DataFrame(
        {
            "document": ["a"] * 12 + ["b"] * 12,
            "layer": ([0] * 6 + [1] * 6) * 2,
            "head": ([0, 0, 0, 1, 1, 1]) * 4,
            "fi": gen.random(24),
        }
    )
    got = grades(rows, "layer")
    want = np.concatenate(
        [np.ceil(stats.rankdata(g["fi"]) / len(g) * LEVELS) - 1 for _, g in rows.groupby(["document", "layer"])]
    )
    assert got.tolist() == want.astype(int).tolist()
    assert not np.array_equal(got, grades(rows, "head"))  # per head: ranks of three, not six


@pytest.fixture(scope="module")
def rows(tiny):
    from fi_toolkit import Document
    from fi_toolkit.fit.rows import fit_rows
    from fi_toolkit.probe.chunks import parse_chunk

    out = []
    for k in range(3):
        d = Document(
            f"doc{k}", "text", torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(k)), "test"
        )
        out.append(
            fit_rows(tiny.model, d, trace_prefix(tiny.model, d.ids, P, CONFIG), [parse_chunk("96:128")], samples=4)
        )
    return pd.concat(out, ignore_index=True)


def write(record: dict, path) -> str:
    path.write_text(policy_json(record))
    return str(path)


@pytest.fixture(scope="module")
def layer_model(rows, tmp_path_factory):
    record = learn_policy(
        rows, ["key_norm", "log_accumulated", "log_recency", "kv_head"], META, rounds=20, group="layer"
    )
    return write(record, tmp_path_factory.mktemp("heads") / "layer.json"), record


def test_a_layer_model_records_its_group_and_ranks_across_heads(layer_model):
    _, record = layer_model
    assert record["group"] == "layer" and "layer" in record["labels"]["target"]
    assert record["params"]["lambdarank_truncation_level"] == 2 * (P - W)  # one group = both heads of a layer
    fold = record["cross_validation"]["folds"][0]
    assert {"layer_spearman_learned", "layer_spearman_h2o"} <= set(fold)


def test_global_keep_map_is_the_oracle_over_the_model_scores(layer_model, tiny, tiny_ids):
    path, _ = layer_model
    trace = trace_prefix(tiny.model, tiny_ids, P, CONFIG)
    policy = parse_policy(f"learned:path={path},heads=global", budget="keep=0.25", window=W)
    uniform = parse_policy(f"learned:path={path}", budget="keep=0.25", window=W)
    assert policy.label == f"learned:path={path},heads=global@keep=0.25" and policy.uneven_heads
    keep, even = policy.keep_map(trace), uniform.keep_map(trace)
    k = even.counts()[0]
    assert k == 24 and keep.n_removed(P) == even.n_removed(P) == P - k  # the same budget meaning
    for layer in range(4):
        scores = policy.linear_score(policy_signals(trace), layer).cpu().numpy()
        want = numpy_top_k(scores, k, 0, W)
        counts = keep.head_counts[layer].tolist() if keep.uneven else [k, k]
        got = [keep.keep[layer][h, : counts[h]].tolist() for h in range(2)]
        assert got == want
        assert sum(counts) == 2 * k and min(counts) >= W
    assert keep.uneven  # the two heads do not split the budget evenly everywhere


def policy_signals(trace):
    from fi_toolkit.policies.base import as_signals

    return as_signals(trace)


def test_a_constant_layer_model_keeps_the_earliest_candidates(rows, tiny, tiny_ids, tmp_path):
    record = learn_policy(rows.assign(fi=1.0), ["key_norm"], META, rounds=5, group="layer")
    policy = Learned(budget=40, window=W, path=write(record, tmp_path / "c.json"), heads="global")
    keep = policy.keep_map(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    assert not keep.uneven
    expected = list(range(40 - W)) + list(range(P - W, P))
    assert all(head == expected for layer in keep.keep for head in layer.tolist())


def test_refusals(rows, layer_model, tiny, tiny_ids, tmp_path):
    head_model = write(learn_policy(rows, ["key_norm"], META, rounds=5), tmp_path / "h.json")
    with pytest.raises(FIError, match="ranks within each KV head .* needs a model trained with group layer"):
        Learned(budget="keep=0.25", window=W, path=head_model, heads="global")
    with pytest.raises(FIError, match="heads must be uniform or global, got 'each'"):
        Learned(budget="keep=0.25", window=W, path=head_model, heads="each")
    Learned(budget="keep=0.25", window=W, path=layer_model[0])  # a layer model ranks within heads too
    bad = json.loads(open(layer_model[0]).read()) | {"group": "document"}
    with pytest.raises(FIError, match="'group' must be head or layer"):
        Learned(budget="keep=0.25", window=W, path=write(bad, tmp_path / "g.json"))
    policy = Learned(budget=48, window=W, path=layer_model[0], heads="global")
    # compressed decoding holds the uneven map padded, its pads masked per head (tests/test_uneven_decode.py)
    result = generate(tiny.model, None, tiny_ids[:P], policy, max_new_tokens=3, eos_token_id=[])
    assert result.prefill_keep is not None and len(result.tokens) == 3


def test_group_settings():
    assert FitSettings(learner="lambdarank").group == "head"
    assert FitSettings(learner="lambdarank", group="layer").group == "layer"
    assert FitSettings().group is None
    with pytest.raises(FIError, match="group goes with learner 'lambdarank'"):
        FitSettings(group="layer")
    with pytest.raises(FIError, match="group must be head or layer, got 'token'") as exc:
        FitSettings(learner="lambdarank", group="token")
    assert exc.value.parameter == "group"


def test_fi_fit_group_layer(rows, tmp_path, capsys):
    from fi_toolkit.runs import results

    runs = []
    for name, table in rows.groupby("document", sort=False):
        out = tmp_path / name
        out.mkdir()
        results.write_table(out / "fit_rows.parquet", table.reset_index(drop=True))
        manifest = {"command": "fit-data", "model": TINY, "signals": dict(CONFIG.__dict__), "prefix": P}
        manifest |= {"chunks": ["96:128"], "sinks": 0, "samples": 4, "documents": [{"name": name, "source": "t"}]}
        results.write_json(out / "manifest.json", manifest)
        runs.append(str(out))
    args = ["fit", *runs, "--learner", "lambdarank", "--features", "key_norm,log_accumulated", "--group", "layer"]
    code, stdout, err = run_cli([*args, "--out", str(tmp_path / "m.json")], capsys)
    assert code == 0, err
    assert "one query group per layer" in stdout and "within-layer Spearman" in stdout
    assert json.loads((tmp_path / "m.json").read_text())["group"] == "layer"
    code, _, err = run_cli(["fit", *runs, "--group", "layer", "--out", str(tmp_path / "r.json")], capsys)
    assert code == 2 and err.startswith("error: --group goes with --learner 'lambdarank'"), err
