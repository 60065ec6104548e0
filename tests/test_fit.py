"""Fitted policies: ``fi fit-data``/``fi fit`` and ``fitted:path=FILE``.

Oracles: a single positive window-attention weight keeps exactly SnapKV's entries (SnapKV's own
keep map); a fit to synthetic FI that is an exact log-linear function of the features recovers the
coefficients (numpy's least squares on the same rows); the keep map never changes when the tokens after
the compression point are shuffled; two fits of the same runs give the same bytes.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from cli_runner import run_cli

from fi_toolkit import Document, SignalConfig
from fi_toolkit.compress.decoder import generate
from fi_toolkit.errors import FIError
from fi_toolkit.fit.ridge import fit_policy, policy_json
from fi_toolkit.fit.rows import fit_rows
from fi_toolkit.fit.settings import DECODING_FEATURES
from fi_toolkit.policies import Fitted, SnapKV, parse_policy
from fi_toolkit.policies.learned.fitted import FEATURES, FORMAT
from fi_toolkit.probe.chunks import parse_chunk
from fi_toolkit.runs import results
from fi_toolkit.signals.trace import trace_prefix

P, W = 96, 8
CONFIG = SignalConfig(window=W)
TINY = {"name": "tiny-llama", "layers": 4, "kv_heads": 2, "head_dim": 16, "vocab": 256}
SIGNALS = {"window": W, "top_k": 256, "pool_kernel": 7, "tau": 1.0, "entropy_of": "produced", "final_norm": False}


def doc(k: int) -> Document:
    return Document(
        f"doc{k}", "text", torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(k)), "test"
    )


def policy_file(path, features, coefficients, model=TINY, **extra):
    record = {
        "format": FORMAT,
        "model": model,
        "signals": SIGNALS,
        "features": features,
        "mean": [0.0] * len(features),
        "scale": [1.0] * len(features),
        "coefficients": coefficients,
        **extra,
    }
    path.write_text(json.dumps(record))
    return str(path)


@pytest.fixture(scope="module")
def rows(tiny):
    """Training rows of three random documents (tiny model, Fisher FI with 4 samples)."""
    return [
        fit_rows(tiny.model, d, trace_prefix(tiny.model, d.ids, P, CONFIG), [parse_chunk("96:128")], samples=4)
        for d in map(doc, range(3))
    ]


@pytest.fixture(scope="module")
def runs(rows, tmp_path_factory):
    """The rows as three ``fi fit-data`` run directories, one document each."""
    root = tmp_path_factory.mktemp("fit_runs")
    dirs = []
    for table in rows:
        out = root / table["document"][0]
        out.mkdir()
        results.write_table(out / "fit_rows.parquet", table)
        results.write_json(
            out / "manifest.json",
            {
                "command": "fit-data",
                "model": TINY,
                "signals": dict(CONFIG.__dict__),
                "prefix": P,
                "chunks": ["96:128"],
                "sinks": 0,
                "samples": 4,
                "documents": [{"name": table["document"][0], "source": "test", "sha256": "-"}],
            },
        )
        dirs.append(out)
    return dirs


def test_rows_hold_every_layer_head_and_candidate(rows, tiny):
    table = rows[0]
    assert len(table) == 4 * 2 * (P - W)
    assert set(FEATURES) <= set(table.columns) and (table["fi"] >= 0).all()
    assert np.isfinite(table[list(FEATURES)].to_numpy()).all()


def test_single_positive_attention_weight_keeps_snapkv_entries(tiny, tiny_ids, tmp_path):
    trace = trace_prefix(tiny.model, tiny_ids, P, CONFIG)
    path = policy_file(tmp_path / "a.json", ["attention"], [0.37], **{"mean": [0.5], "scale": [3.0]})
    for budget in ("keep=0.25", "keep=0.5", 40):
        fitted = Fitted(budget=budget, window=W, path=path).keep_map(trace)
        snap = SnapKV(budget=budget, window=W).keep_map(trace)
        assert all(torch.equal(a, b) for a, b in zip(fitted.keep, snap.keep))


def test_keep_map_ignores_tokens_after_the_compression_point(tiny, tiny_ids, tmp_path):
    features = list(FEATURES)
    coef = [float(c) for c in np.linspace(-1, 1, len(features))]
    policy = Fitted(budget="keep=0.3", window=W, path=policy_file(tmp_path / "all.json", features, coef))
    shuffled = tiny_ids.clone()
    shuffled[P:] = tiny_ids[P:][torch.randperm(len(tiny_ids) - P, generator=torch.Generator().manual_seed(0))]
    assert not torch.equal(shuffled, tiny_ids)
    a = policy.keep_map(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    b = policy.keep_map(trace_prefix(tiny.model, shuffled, P, CONFIG))
    assert all(torch.equal(x, y) for x, y in zip(a.keep, b.keep))


def test_fit_recovers_an_exact_log_linear_fi(rows):
    table = pd.concat(rows, ignore_index=True)
    features = ["log_attention", "distance", "log_position"]
    truth = np.array([1.5, -2.0, 0.25])
    table["fi"] = np.exp(table[features].to_numpy() @ truth + table["layer"] * 0.3)  # + a per-layer constant
    record = fit_policy(table, features, target="log", penalty=0.0)
    # independent: numpy least squares on features and target centred per (document, layer, head)
    key = table[["document", "layer", "head"]].astype(str).agg("/".join, axis=1)
    x = table[features] - table[features].groupby(key).transform("mean")
    y = np.log(table["fi"]) - np.log(table["fi"]).groupby(key).transform("mean")
    expected = np.linalg.lstsq(x.to_numpy(), y.to_numpy(), rcond=None)[0]
    np.testing.assert_allclose(np.array(record["coefficients"]) / np.array(record["scale"]), expected, rtol=1e-6)
    np.testing.assert_allclose(expected, truth, rtol=1e-6)
    assert record["cross_validation"]["mean"]["spearman_fitted"] > 0.999


def test_fi_fit_is_byte_identical_and_its_policy_runs(runs, tiny, tiny_ids, tmp_path, capsys):
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        code, stdout, err = run_cli(["fit", *map(str, runs), "--out", str(out)], capsys)
        assert code == 0, err
    assert outs[0].read_bytes() == outs[1].read_bytes()
    record = json.loads(outs[0].read_text())
    assert record["model"] == TINY and record["signals"]["window"] == W and record["features"] == list(FEATURES)
    assert [f["held_out"] for f in record["cross_validation"]["folds"]] == ["doc0", "doc1", "doc2"]
    assert "leave-one-document-out" in stdout
    policy = parse_policy(f"fitted:path={outs[0]}", budget="keep=0.25", window=W)
    assert policy.label == f"fitted:path={outs[0]}@keep=0.25"
    keep = policy.keep_map(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    assert [k.shape for k in keep.keep] == [(2, 24)] * 4


def test_policy_json_is_the_record_sorted(rows):
    record = fit_policy(pd.concat(rows, ignore_index=True), ["log_attention", "key_norm"])
    text = policy_json(record)
    assert json.loads(text) == json.loads(json.dumps(record)) and text == policy_json(json.loads(text))


def test_decoding_with_a_fitted_policy(tiny, tiny_ids, tmp_path):
    features = list(DECODING_FEATURES)
    policy = Fitted(budget=48, window=W, path=policy_file(tmp_path / "d.json", features, [1.0] * len(features)))
    assert policy.needs_token_signals and policy.tracks_accumulated
    result = generate(tiny.model, None, tiny_ids[:P], policy, max_new_tokens=30, interval=10, eos_token_id=[])
    assert result.stats.prefill_compressed and result.stats.compression_steps == [10, 20]
    assert max(result.stats.cache_lengths) == 48 + 10
    other = Fitted(budget=48, window=W, path=policy_file(tmp_path / "n.json", ["entropy_next"], [1.0]))
    result = generate(tiny.model, None, tiny_ids[:P], other, max_new_tokens=30, interval=10, eos_token_id=[])
    assert result.stats.compression_steps == [10, 20]  # entropy under the other convention, while decoding too


def test_entropy_next_while_decoding_is_the_entropy_computed_at_each_slot_position(tiny, tiny_ids, tmp_path):
    """After compressions (slots no longer positions) ``entropy_next`` of a slot is the entropy of the distribution
    computed at its position, known once that position is fed. Oracle: the full entropy (top-k = the tiny vocab)
    of the logits of each position, computed here: the prompt's from one plain forward, the decoded ones from
    the logits each step returned."""
    from fi_toolkit.compress.decoder import CompressedDecoder

    policy = Fitted(budget=48, window=W, path=policy_file(tmp_path / "n.json", ["entropy_next"], [1.0]))
    decoder = CompressedDecoder(tiny.model, policy, capacity=P + 32, interval=10)
    try:
        with torch.no_grad():
            at = list(tiny.model(tiny_ids[:P][None]).logits[0].float())
            logits, _ = decoder.prefill(tiny_ids[:P])
            for _ in range(25):  # the logits computed at each position fed
                logits = decoder.step(int(logits.argmax()))
                at.append(logits)
        assert len(decoder.compressions) == 3  # the prompt, then at 10 and 20 tokens
        entropy = torch.stack([-(x.log_softmax(-1).exp() * x.log_softmax(-1)).sum() for x in at]).double()
        s = decoder.signals()
        for layer in range(len(s.keys)):
            positions = s.positions[layer]
            assert not torch.equal(positions, torch.arange(positions.shape[1]).expand_as(positions))
            got = FEATURES["entropy_next"][1](s, layer, "produced", 1.0)
            assert torch.allclose(got, entropy[positions], atol=1e-5)
    finally:
        decoder.close()


def test_fitted_on_another_architecture_is_refused(tiny, tiny_ids, tmp_path):
    smollm = {"name": "smollm2-135m", "layers": 30, "kv_heads": 3, "head_dim": 64, "vocab": 49152}
    policy = Fitted(budget="keep=0.5", window=W, path=policy_file(tmp_path / "s.json", ["attention"], [1.0], smollm))
    with pytest.raises(FIError, match=r"fitted on smollm2-135m \(layers 30\), this model has layers 4"):
        policy.keep_map(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    with pytest.raises(FIError, match="fitted with window 8, not 16"):
        Fitted(budget="keep=0.5", window=16, path=policy_file(tmp_path / "w.json", ["attention"], [1.0]))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"coefficients": [float("nan")]}, "non-finite value"),
        ({"features": ["attention", "no_such_feature"]}, "unknown feature 'no_such_feature'"),
        ({"features": []}, "no features listed"),
        ({"scale": [0.0]}, "'scale' must be positive"),
        ({"mean": [1.0, 2.0]}, "'mean' must list 1 numbers"),
        ({"model": {"name": "x"}}, "architecture (layers, kv_heads, head_dim) is missing"),
        ({"format": "other"}, "not a fitted-policy JSON"),
    ],
)
def test_damaged_fitted_files_are_refused(change, message, tmp_path):
    record = {
        "format": FORMAT,
        "model": TINY,
        "signals": SIGNALS,
        "features": ["attention"],
        "mean": [0.0],
        "scale": [1.0],
        "coefficients": [1.0],
        **change,
    }
    (tmp_path / "p.json").write_text(json.dumps(record))
    with pytest.raises(FIError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_policy(f"fitted:path={tmp_path / 'p.json'}")
