"""The surrogate (:mod:`fi_toolkit.policies.surrogate`, ``fi fit-surrogate``): kvpress's KVzap file format read
without pickle or code and refused in one line when damaged or foreign, scores that see nothing after their
position, the policy's keep map recomputed by hand, training that is deterministic and whose closed form solves
the normal equations (checked against numpy's least squares)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from cases import random_surrogate

from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.policies import registry
from fi_toolkit.policies.surrogate import SurrogateModel, attention_inputs, read_surrogate, write_surrogate
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.surrogate import corpus
from fi_toolkit.surrogate.label_settings import LabelSettings
from fi_toolkit.surrogate.labels import read_unit, run_labels
from fi_toolkit.surrogate.train import run_fit_surrogate
from fi_toolkit.surrogate.train_settings import SurrogateFitSettings

W = 8
SIGNALS = SignalConfig(window=W)
LABELS = LabelSettings(points=(40, 64), near="0:16", far="24:32", samples=2, slices=2)


@pytest.fixture(scope="module")
def labels_run(tiny, tiny_ids, tmp_path_factory):
    out = tmp_path_factory.mktemp("labels") / "run"
    docs = corpus.slices(Document("random", "", tiny_ids, "test", sha256="x"), LABELS.slice_tokens(), 3)
    run_labels(tiny, docs, LABELS, out, signals=SIGNALS)
    return out


@pytest.mark.parametrize("hidden", [None, 5])
def test_a_written_model_reads_back_with_kvpress_tensor_names(tiny, tmp_path, hidden):
    m = random_surrogate(tiny, hidden)
    write_surrogate(tmp_path / "s", m)
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["model_type"] == "kvzap" and config["hidden_dim"] == hidden and config["n_modules"] == 4
    back = read_surrogate(tmp_path / "s")
    assert back.weights.keys() == m.weights.keys() and all(
        torch.equal(back.weights[k], m.weights[k]) for k in m.weights
    )
    x = torch.randn(7, m.input_dim)
    if hidden is None:  # the linear form is x W' + b, by hand
        want = x @ m.weights["layers.2.weight"].t() + m.weights["layers.2.bias"]
    else:  # Linear -> GELU -> Linear, by hand (GELU's exact erf form, as torch.nn.GELU())
        h = x @ m.weights["layers.2.0.weight"].t() + m.weights["layers.2.0.bias"]
        h = 0.5 * h * (1 + torch.erf(h / 2**0.5))
        want = h @ m.weights["layers.2.2.weight"].t() + m.weights["layers.2.2.bias"]
    torch.testing.assert_close(back.score(2, x), want, rtol=1e-5, atol=1e-5)


def _damage(folder, how):
    if how == "no config":
        (folder / "config.json").unlink()
    elif how == "pickle":  # a torch pickle where safetensors belongs: never unpickled
        torch.save({"layers.0.weight": torch.zeros(1)}, folder / "model.safetensors")
    elif how == "foreign config":
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    elif how == "wrong shape":
        config = json.loads((folder / "config.json").read_text())
        config["input_dim"] += 1
        (folder / "config.json").write_text(json.dumps(config))
    elif how == "not json":
        (folder / "config.json").write_text("{")


@pytest.mark.parametrize(
    "how, message",
    [
        ("no config", "holds no config.json"),
        ("pickle", "model.safetensors is not a safetensors file"),
        ("foreign config", "is not a KVzap model's"),
        ("wrong shape", "has shape"),
        ("not json", "is not readable JSON"),
    ],
)
def test_a_damaged_foreign_or_hostile_directory_is_refused_in_one_line(tiny, tmp_path, how, message):
    write_surrogate(tmp_path / "s", random_surrogate(tiny))
    _damage(tmp_path / "s", how)
    with pytest.raises(FIError, match=message) as e:
        read_surrogate(tmp_path / "s")
    assert "\n" not in str(e.value)


def test_scores_see_nothing_after_their_position(tiny, tiny_ids):
    """Attention inputs of a prefix equal the whole document's at the same positions, so do the scores."""
    m = random_surrogate(tiny, hidden=5)
    short, whole = attention_inputs(tiny.model, tiny_ids[:50]), attention_inputs(tiny.model, tiny_ids[:200])
    for layer in range(4):
        torch.testing.assert_close(short[layer], whole[layer][:50], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            m.score(layer, short[layer]), m.score(layer, whole[layer][:50]), rtol=1e-5, atol=1e-5
        )


def test_the_policy_keeps_each_heads_top_scored_tokens(tiny, tiny_ids, tmp_path):
    """The probe's keep map of surrogate:path=DIR@keep=0.5 recomputed by hand: per layer and KV head, the window
    and the top-scored candidates of the model's own scores of each position's attention input."""
    from fi_toolkit.probe.selections import parse_selections
    from fi_toolkit.signals.trace import trace_prefix

    m = random_surrogate(tiny)
    write_surrogate(tmp_path / "s", m)
    p = 64
    trace = trace_prefix(tiny.model, tiny_ids, p, SIGNALS)
    (sel,) = parse_selections([f"policy:surrogate@keep=0.5:path={tmp_path / 's'}"])
    keep_map = sel.resolve(trace, model=tiny.model, ids=tiny_ids)
    inputs = attention_inputs(tiny.model, tiny_ids[:p])
    for layer in range(4):
        scores = inputs[layer] @ m.weights[f"layers.{layer}.weight"].t() + m.weights[f"layers.{layer}.bias"]
        for h in range(2):
            top = torch.argsort(scores[: p - W, h], descending=True)[: 32 - W]
            want = sorted(top.tolist() + list(range(p - W, p)))
            assert keep_map.keep[layer][h].tolist() == want
    with pytest.raises(FIError, match="needs the model and the document's tokens"):
        sel.resolve(trace)


def test_the_policy_refuses_a_model_of_another_size(tiny, tiny_ids, tmp_path, monkeypatch):
    from fi_toolkit.probe.selections import parse_selections
    from fi_toolkit.signals.trace import trace_prefix

    cfg = tiny.config
    other = SurrogateModel(cfg.hidden_size, 3, cfg.num_hidden_layers, None, {})
    other.weights = {k: torch.zeros(s) for k, s in other.expected_shapes().items()}
    write_surrogate(tmp_path / "s", other)
    (sel,) = parse_selections([f"policy:surrogate@keep=0.5:path={tmp_path / 's'}"])
    with pytest.raises(FIError, match="scores 4 layers x 3 KV heads; this model has 4 x 2"):
        sel.resolve(trace_prefix(tiny.model, tiny_ids, 64, SIGNALS), model=tiny.model, ids=tiny_ids)
    monkeypatch.setattr("fi_toolkit.policies.surrogate.DEFAULT_MODEL", tmp_path / "absent")  # an installed package
    with pytest.raises(FIError, match="surrogate needs its directory"):
        registry.resolve("surrogate")


def test_the_closed_form_is_the_ridge_regression_of_log_fi(tiny, labels_run, tmp_path):
    """The linear surrogate's weights equal numpy's least squares on the stacked rows (ridge 0: ordinary least
    squares, every unit's every position), layer by layer."""
    m = run_fit_surrogate(tiny, [labels_run], SurrogateFitSettings(ridge=0.0))
    units = sorted(p.parent.name for p in (labels_run / "per_document").glob("*/done.json"))
    xs, ys = {layer: [] for layer in range(4)}, {layer: [] for layer in range(4)}
    for unit in units:
        rows = read_unit(labels_run, unit)
        tokens = torch.tensor(read_unit(labels_run, unit, "tokens").token.to_numpy())
        inputs = attention_inputs(tiny.model, tokens[: int(rows.point.iloc[0])])
        for layer in range(4):
            for h in range(2):
                part = rows[(rows.layer == layer) & (rows["head"] == h)]
                if h == 0:
                    xs[layer].append(inputs[layer][torch.tensor(part.position.to_numpy())].double().numpy())
                    ys[layer].append(np.zeros((len(part), 2)))
                ys[layer][-1][:, h] = np.log(part.fi.to_numpy())
    for layer in range(4):
        x, y = np.concatenate(xs[layer]), np.concatenate(ys[layer])
        coef, *_ = np.linalg.lstsq(np.c_[x, np.ones(len(x))], y, rcond=None)
        np.testing.assert_allclose(m.weights[f"layers.{layer}.weight"].numpy(), coef[:-1].T, rtol=2e-3, atol=2e-4)
        pred = (
            x @ m.weights[f"layers.{layer}.weight"].numpy().T.astype(np.float64)
            + m.weights[f"layers.{layer}.bias"].numpy()
        )
        np.testing.assert_allclose(pred, np.c_[x, np.ones(len(x))] @ coef, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("form, loss", [("linear", "log"), ("linear", "weighted"), ("mlp", "listwise")])
def test_training_twice_writes_identical_files(tiny, labels_run, tmp_path, form, loss):
    settings = SurrogateFitSettings(form=form, loss=loss, epochs=5, positions=16, hidden=6)
    for name in ("a", "b"):
        run_fit_surrogate(tiny, [labels_run], settings, tmp_path / name)
    for f in ("config.json", "model.safetensors"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    shutil.rmtree(tmp_path / "b")
    changed = SurrogateFitSettings(form=form, loss=loss, epochs=5, positions=16, hidden=6, seed=1)
    if not changed.closed_form:  # the seed moves the sample and the initial weights, and so the result
        run_fit_surrogate(tiny, [labels_run], changed, tmp_path / "b")
        assert (tmp_path / "a" / "model.safetensors").read_bytes() != (
            tmp_path / "b" / "model.safetensors"
        ).read_bytes()


def test_minibatches_hold_whole_units_and_cover_every_row_once_per_epoch():
    from fi_toolkit.surrogate.train import _batches

    groups = torch.tensor([0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 4])
    for units in (1, 2, 3, 5, 9):
        batches = list(_batches(groups, units, torch.Generator().manual_seed(0)))
        assert sorted(torch.cat(batches).tolist()) == list(range(len(groups)))  # each row once
        for b in batches:  # whole units, at most `units` of them
            held = set(groups[b].tolist())
            assert len(held) <= units and sum(int((groups == u).sum()) for u in held) == len(b)
    orders = [[groups[b][0].item() for b in _batches(groups, 1, torch.Generator().manual_seed(s))] for s in (0, 0, 1)]
    assert orders[0] == orders[1] != orders[2]  # seeded
    assert list(_batches(groups, 0, torch.Generator())) == [None]  # 0: the full batch


def test_adam_reaches_the_least_squares_fit_by_minibatches_and_full_batch(tiny, labels_run):
    """The linear form trained by Adam on layer 0's rows (squared error of log FI), its bias started at the mean
    log FI: one unit per step and the full batch, 60 epochs each, come within 10 % of numpy's least-squares error
    (the minimum). Started at 0 (log FI is near -20 here), 60 epochs ended 30-80 times above it."""
    from fi_toolkit.surrogate.train import _train_adam

    xs, fis, groups = [], [], []
    units = sorted(p.parent.name for p in (labels_run / "per_document").glob("*/done.json"))
    for g, unit in enumerate(units):
        rows = read_unit(labels_run, unit)
        tokens = torch.tensor(read_unit(labels_run, unit, "tokens").token.to_numpy())
        x = attention_inputs(tiny.model, tokens[: int(rows.point.iloc[0])])[0]
        part = rows[rows.layer == 0]
        positions = part[part["head"] == 0].position.to_numpy()
        xs.append(x[torch.tensor(positions)])
        fis.append(torch.tensor(np.stack([part[part["head"] == h].fi.to_numpy() for h in (0, 1)], axis=1)))
        groups.append(torch.full((len(positions),), g))
    x, fi, group = torch.cat(xs).float(), torch.cat(fis).double(), torch.cat(groups)
    design, y = np.c_[x.double().numpy(), np.ones(len(x))], np.log(fi.numpy())
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    best = float(((design @ coef - y) ** 2).mean())
    error = {}
    for units_per_step in (1, 0):
        settings = SurrogateFitSettings(form="linear", loss="log", epochs=60, lr=1e-2, batch_units=units_per_step)
        w = _train_adam(x, fi, group, settings, 2, torch.Generator().manual_seed(0))
        pred = x.double().numpy() @ w["weight"].double().numpy().T + w["bias"].double().numpy()
        error[units_per_step] = float(((pred - y) ** 2).mean())
    assert error[1] <= 1.1 * best and error[0] <= 1.1 * best, (best, error)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"form": "tree"}, "form must be one of linear, mlp"),
        ({"loss": "mse"}, "loss must be one of log, weighted, listwise"),
        ({"ridge": -1.0}, "ridge must be >= 0"),
        ({"lr": 0.0}, r"lr must lie in \(0, 1\]"),
        ({"positions": 1}, "positions must be >= 2"),
    ],
)
def test_fit_settings_refuse_in_one_line(change, message):
    with pytest.raises(FIError, match=message):
        SurrogateFitSettings(**change).check()


def test_while_decoding_each_row_is_scored_once_as_it_is_fed(tiny, tiny_ids, tmp_path):
    """The decoder's tracker scores the prompt as the model's own forward of it does, and each decoded row when
    it is fed; compressions gather those scores and never recompute them (the prompt's stay what they were)."""
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.compress.sampling import GREEDY
    from fi_toolkit.model.attention import ragged_attention
    from fi_toolkit.policies import make_policy

    m = random_surrogate(tiny, hidden=5)
    write_surrogate(tmp_path / "s", m)
    policy = make_policy(f"surrogate:path={tmp_path / 's'}", budget=24, window=4)
    decoder = CompressedDecoder(tiny.model, policy, 400, interval=7)
    try:
        with ragged_attention(tiny.model):
            logits, keep = decoder.prefill(tiny_ids[:40])
            prompt_scores = [t[:, :40].clone() for t in decoder.tracker.input_scores]
            inputs = attention_inputs(tiny.model, tiny_ids[:40])
            for layer in range(4):
                torch.testing.assert_close(
                    prompt_scores[layer], m.score(layer, inputs[layer]).t(), rtol=1e-4, atol=1e-5
                )
            assert keep is not None  # the prompt was compressed by those scores
            decoded = decoder.decode(logits, GREEDY, 20)
    finally:
        decoder.close()
    assert len(decoded.tokens) == 20 and len(decoder.compression_steps) >= 3
    for layer in range(4):
        held = decoder.tracker.input_scores[layer]
        assert torch.equal(held[:, :40], prompt_scores[layer])  # never rescored
        assert held[:, 40:59].abs().sum() > 0  # the decoded rows were scored as they came
        signals = decoder.signals()
        positions = decoder.row.positions[layer]
        assert torch.equal(signals.input_scores[layer], held.gather(1, positions.long()))


def test_heads_global_keeps_each_layers_top_scores_over_all_its_heads(tiny, tiny_ids, tmp_path):
    """``heads=global``: per layer, every head's window, then the ``Hkv * (k - w)`` top-scored candidates over all
    the heads together (recomputed by hand from the model's scores): heads keep different counts summing to
    ``Hkv * k`` (an uneven map pads each head's row by repeating its last kept slot)."""
    from fi_toolkit.probe.selections import parse_selections
    from fi_toolkit.signals.trace import trace_prefix

    m = random_surrogate(tiny, seed=3)
    write_surrogate(tmp_path / "s", m)
    p, k = 64, 32
    (sel,) = parse_selections([f"policy:surrogate@keep=0.5:path={tmp_path / 's'},heads=global"])
    keep_map = sel.resolve(trace_prefix(tiny.model, tiny_ids, p, SIGNALS), model=tiny.model, ids=tiny_ids)
    inputs = attention_inputs(tiny.model, tiny_ids[:p])
    counts = set()
    for layer in range(4):
        scores = (inputs[layer] @ m.weights[f"layers.{layer}.weight"].t() + m.weights[f"layers.{layer}.bias"]).t()
        flat = scores[:, : p - W].reshape(-1)
        top = set(torch.argsort(flat, descending=True)[: 2 * (k - W)].tolist())
        for h in range(2):
            want = sorted([j for j in range(p - W) if h * (p - W) + j in top] + list(range(p - W, p)))
            assert sorted(set(keep_map.keep[layer][h].tolist())) == want
            counts.add(len(want))
        assert sum(len(set(keep_map.keep[layer][h].tolist())) for h in range(2)) == 2 * k
    assert len(counts) > 1  # uneven: the heads share the layer's budget


def test_attention_inputs_are_each_layers_normed_residual_stream(tiny, tiny_ids):
    """An oracle sharing no hook with the policy: the model's own ``output_hidden_states`` (each layer's input, the
    residual stream) through that layer's ``input_layernorm`` is what the attention reads."""
    with torch.no_grad():
        hidden = tiny.model(tiny_ids[None, :64], output_hidden_states=True).hidden_states
    inputs = attention_inputs(tiny.model, tiny_ids[:64])
    for layer, block in enumerate(tiny.model.model.layers):
        torch.testing.assert_close(inputs[layer], block.input_layernorm(hidden[layer])[0], rtol=1e-5, atol=1e-6)


def test_the_prefix_trace_scores_positions_so_the_probe_runs_no_extra_forward(tiny, tiny_ids, tmp_path, monkeypatch):
    """The probe traces the prefix with the first surrogate selection's scorer (in chunks, here 3 forwards): that
    surrogate's keep map is then the one of its own forward of the prompt, without running it; a second, different
    surrogate does not take those scores but runs its own forward."""
    import fi_toolkit.policies.surrogate as surrogate_module
    from fi_toolkit.probe.selections import parse_selections, trace_scorer
    from fi_toolkit.signals.trace import trace_prefix

    write_surrogate(tmp_path / "s", random_surrogate(tiny))
    write_surrogate(tmp_path / "o", random_surrogate(tiny, seed=5))
    p = 64
    first, second = parse_selections(
        [f"policy:surrogate@keep=0.5:path={tmp_path / 's'}", f"policy:surrogate@keep=0.5:path={tmp_path / 'o'}"]
    )
    scorer = trace_scorer([*parse_selections(["policy:snapkv@keep=0.5"]), first, second])
    assert scorer.digest == read_surrogate(tmp_path / "s").digest
    untraced = trace_prefix(tiny.model, tiny_ids, p, SIGNALS)
    traced = trace_prefix(tiny.model, tiny_ids, p, SignalConfig(window=W, prefill_chunk=24), scorer)
    inputs = attention_inputs(tiny.model, tiny_ids[:p])
    for layer in range(4):  # the traced scores are the scorer's of each position's attention input
        torch.testing.assert_close(
            traced.input_scores[layer], scorer.score(layer, inputs[layer]).t(), atol=1e-5, rtol=1e-4
        )
    want = [s.resolve(untraced, model=tiny.model, ids=tiny_ids) for s in (first, second)]
    forwards = []
    real = surrogate_module.attention_inputs
    monkeypatch.setattr(surrogate_module, "attention_inputs", lambda *a, **k: forwards.append(1) or real(*a, **k))
    got = first.resolve(traced, model=tiny.model, ids=tiny_ids)
    assert forwards == []
    got_second = second.resolve(traced, model=tiny.model, ids=tiny_ids)
    assert forwards == [1]
    for layer in range(4):
        for h in range(2):
            assert got.keep[layer][h].tolist() == want[0].keep[layer][h].tolist()
            assert got_second.keep[layer][h].tolist() == want[1].keep[layer][h].tolist()
    assert trace_scorer(parse_selections(["policy:snapkv@keep=0.5", "attention:remove=0.25"])) is None
