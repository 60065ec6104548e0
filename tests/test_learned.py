"""The learned policy: ``fi fit --learner lambdarank`` and ``learned:path=FILE``.

Oracles: the within-head Spearman of the model's score with an FI that is a monotone function of one feature
(scipy on the raw feature, no model code); the keep map of a constant-score model, built by hand from
the tie rule (earlier slot first); the keep map of a document truncated at the compression point; two
trainings compared byte for byte; damaged and hostile files refused in one line.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from cli_runner import run_cli
from scipy import stats

from fi_toolkit import Document, SignalConfig
from fi_toolkit.compress.decoder import generate
from fi_toolkit.errors import FIError
from fi_toolkit.fit.lambdarank import learn_policy
from fi_toolkit.fit.ridge import policy_json
from fi_toolkit.fit.rows import fit_rows
from fi_toolkit.fit.settings import DECODING_FEATURES
from fi_toolkit.policies import Learned, parse_policy
from fi_toolkit.policies.learned.features import EXTRA
from fi_toolkit.policies.learned.lambdarank import FORMAT
from fi_toolkit.probe.chunks import parse_chunk
from fi_toolkit.runs import results
from fi_toolkit.signals.trace import trace_prefix

pytest.importorskip("lightgbm")

P, W = 96, 8
CONFIG = SignalConfig(window=W)
TINY = {"name": "tiny-llama", "layers": 4, "kv_heads": 2, "head_dim": 16, "vocab": 256}
SIGNALS = {"window": W, "top_k": 256, "pool_kernel": 7, "tau": 1.0, "entropy_of": "produced", "final_norm": False}
META = {"model": TINY, "signals": SIGNALS}


def doc(k: int) -> Document:
    return Document(
        f"doc{k}", "text", torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(k)), "test"
    )


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
    root = tmp_path_factory.mktemp("learned_runs")
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


def write(record: dict, path) -> str:
    path.write_text(policy_json(record))
    return str(path)


def test_two_trainings_give_identical_files_and_the_policy_runs(runs, tiny, tiny_ids, tmp_path, capsys):
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        code, stdout, err = run_cli(["fit", *map(str, runs), "--learner", "lambdarank", "--out", str(out)], capsys)
        assert code == 0, err
    assert outs[0].read_bytes() == outs[1].read_bytes()
    record = json.loads(outs[0].read_text())
    assert record["format"] == FORMAT and record["model"] == TINY and record["features"][-len(EXTRA) :] == list(EXTRA)
    assert record["params"]["deterministic"] and record["params"]["num_threads"] == 1
    assert [f["held_out"] for f in record["cross_validation"]["folds"]] == ["doc0", "doc1", "doc2"]
    assert "lightgbm" in record["versions"] and "leave-one-document-out" in stdout
    policy = parse_policy(f"learned:path={outs[0]}", budget="keep=0.25", window=W)
    assert policy.label == f"learned:path={outs[0]}@keep=0.25"
    keep = policy.keep_map(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    assert [k.shape for k in keep.keep] == [(2, 24)] * 4


def test_learns_a_monotone_function_of_one_feature(rows):
    """FI := exp(key_norm) per row: the learned score must rank each head as key_norm does."""
    table = pd.concat(rows, ignore_index=True)
    table["fi"] = np.exp(table["key_norm"])
    train, test = table[table["document"] != "doc2"], table[table["document"] == "doc2"]
    record = learn_policy(train, ["key_norm", "log_attention", "log_position"], META)
    import lightgbm as lgb

    model = lgb.Booster(model_str=record["model_string"])
    score = model.predict(test[["key_norm", "log_attention", "log_position"]].to_numpy(), num_threads=1)
    rhos = [
        stats.spearmanr(score[idx], test["key_norm"].to_numpy()[idx]).statistic
        for idx in test.groupby(["layer", "head"]).indices.values()
    ]
    assert min(rhos) > 0.9, rhos


def test_constant_model_keeps_the_earliest_candidates(rows, tiny, tiny_ids, tmp_path):
    table = pd.concat(rows, ignore_index=True).assign(fi=1.0)  # every grade equal: no split to learn
    record = learn_policy(table, ["key_norm"], META)
    policy = Learned(budget=40, window=W, path=write(record, tmp_path / "c.json"))
    s = trace_prefix(tiny.model, tiny_ids, P, CONFIG)
    keep = policy.keep_map(s)
    expected = list(range(40 - W)) + list(range(P - W, P))  # ties go to the earlier slot; the window is kept
    for layer in keep.keep:
        for head in layer.tolist():
            assert head == expected


def test_keep_map_at_p_ignores_whether_the_document_continues(rows, tiny, tiny_ids, tmp_path):
    record = learn_policy(pd.concat(rows, ignore_index=True), list(DECODING_FEATURES) + list(EXTRA), META)
    policy = Learned(budget="keep=0.25", window=W, path=write(record, tmp_path / "t.json"))
    full = policy.keep_map(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    cut = policy.keep_map(trace_prefix(tiny.model, tiny_ids[:P].clone(), P, CONFIG))
    assert all(torch.equal(a, b) for a, b in zip(full.keep, cut.keep))


def test_decoding_with_a_learned_policy(rows, tiny, tiny_ids, tmp_path):
    record = learn_policy(pd.concat(rows, ignore_index=True), list(DECODING_FEATURES) + list(EXTRA), META)
    policy = Learned(budget=48, window=W, path=write(record, tmp_path / "d.json"))
    result = generate(tiny.model, None, tiny_ids[:P], policy, max_new_tokens=30, interval=10, eos_token_id=[])
    assert result.stats.prefill_compressed and result.stats.compression_steps == [10, 20]
    assert max(result.stats.cache_lengths) == 48 + 10


def test_trained_on_another_model_is_refused(rows, tiny, tiny_ids, tmp_path):
    smollm = {"name": "smollm2-135m", "layers": 30, "kv_heads": 3, "head_dim": 64, "vocab": 49152}
    record = learn_policy(pd.concat(rows, ignore_index=True), ["key_norm"], {**META, "model": smollm})
    policy = Learned(budget="keep=0.5", window=W, path=write(record, tmp_path / "s.json"))
    with pytest.raises(FIError, match=r"fitted on smollm2-135m \(layers 30\), this model has layers 4"):
        policy.keep_map(trace_prefix(tiny.model, tiny_ids, P, CONFIG))


@pytest.fixture(scope="module")
def good(rows):
    return learn_policy(pd.concat(rows, ignore_index=True), ["key_norm", "depth"], META, rounds=5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"features": ["key_norm", "no_such_feature"]}, "unknown feature 'no_such_feature'"),
        ({"features": ["key_norm", "key_norm"]}, "the feature 'key_norm' is listed twice"),
        ({"features": ["key_norm", 1]}, "unknown feature 1"),
        ({"features": ["key_norm"]}, "the model takes 2 features, the file lists 1"),
        ({"model_dump": None}, "not a LightGBM dump_model() record"),
        ({"model_dump": "import os; os.system('x')"}, "not a LightGBM dump_model() record"),
        ({"format": "fi_toolkit.fitted/1"}, "not a learned-model JSON"),
        ({"model": {"name": "x"}}, "architecture (layers, kv_heads, head_dim) is missing"),
        ({"signals": {}}, "signal settings"),
    ],
)
def test_damaged_files_are_refused(good, change, message, tmp_path):
    path = write({**good, **change}, tmp_path / "bad.json")
    with pytest.raises(FIError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_policy(f"learned:path={path}")


def test_a_directory_or_a_device_is_named_as_such(tmp_path):
    with pytest.raises(FIError, match=r"learned policy '.*': is a directory; name the JSON file fi fit"):
        parse_policy(f"learned:path={tmp_path}")
    with pytest.raises(FIError, match=r"learned policy '/dev/null': not a regular file \(a device or a pipe\)"):
        parse_policy("learned:path=/dev/null")


def _mutated(good, change):
    dump = json.loads(json.dumps(good["model_dump"]))
    change(dump["tree_info"][0]["tree_structure"])
    return {**good, "model_dump": dump}


def _deep(node):
    while "left_child" in node:
        node = node["left_child"]
    return node


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda n: n.update(split_feature=7), "feature index is out of range"),
        (lambda n: n.update(split_feature=-1), "feature index is out of range"),
        (lambda n: n.update(decision_type="=="), "only numerical '<=' splits"),
        (lambda n: n.update(threshold="nan"), "threshold is not a finite number"),
        (lambda n: n.pop("right_child"), "malformed"),
        (lambda n: _deep(n).update(leaf_index=10**9), "leaf index is out of range"),
        (lambda n: _deep(n).update(leaf_value=float("inf")), "leaf value is not a finite number"),
    ],
)
def test_hostile_trees_are_refused(good, change, message, tmp_path):
    record = _mutated(good, change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(record, allow_nan=True))
    with pytest.raises(FIError, match=message):
        parse_policy(f"learned:path={path}")


def test_in_house_trees_predict_as_lightgbm(rows):
    """The numpy evaluation of the dumped trees equals LightGBM's own prediction from the model string."""
    import lightgbm as lgb

    from fi_toolkit.fit.lambdarank import feature_frame
    from fi_toolkit.policies.learned.lambdarank import compile_trees, predict

    table = pd.concat(rows, ignore_index=True)
    names = list(DECODING_FEATURES) + list(EXTRA)
    record = learn_policy(table, names, META)
    x = feature_frame(table, names, TINY["layers"])
    x[::7, names.index("kv_head")] = 0.0  # exact zeros, where a Zero-missing split goes the default way
    ours = predict(compile_trees(record["model_dump"], len(names), "test"), x)
    theirs = lgb.Booster(model_str=record["model_string"]).predict(x, num_threads=1)
    assert np.ptp(theirs) > 0
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


def test_hostile_files_exit_2_in_one_line(good, tmp_path, capsys):
    cut = tmp_path / "cut.json"
    cut.write_text(policy_json(good)[: len(policy_json(good)) // 2])
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x80\x04\x95pickle")
    for path in (cut, nested, binary, tmp_path / "missing.json"):
        code, _, err = run_cli(["eval", "--policy", f"learned:path={path}"], capsys)
        assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err and "learned policy" in err


def test_default_model_is_the_committed_one(tiny, tiny_ids):
    from fi_toolkit.policies.learned.lambdarank import DEFAULT_MODEL

    if not DEFAULT_MODEL.is_file():
        pytest.skip("no committed default model in this checkout")
    policy = parse_policy("learned", budget="keep=0.25")
    assert policy.path == str(DEFAULT_MODEL) and policy.fit["model"]["layers"] == 30
    with pytest.raises(FIError, match="fitted on smollm2-135m"):  # the tiny model is another architecture
        policy.keep_map(trace_prefix(tiny.model, tiny_ids, P, SignalConfig()))
