"""The KVzip+ teacher (``fi_toolkit/surrogate/kvzip_plus.py``) against its definition written out here: the eager
model's own ``output_attentions`` and ``output_hidden_states`` (no hook, no reduction of the code under test),
each layer's values recomputed from its input norm, and the maxima taken in Python loops; and the surrogate
trained on it as the ridge regression of its log."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fi_toolkit.documents import Document
from fi_toolkit.policies.surrogate import attention_inputs
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.surrogate import corpus
from fi_toolkit.surrogate.kvzip_plus import RepeatPrompt, kvzip_plus_scores, repeat_prompt
from fi_toolkit.surrogate.label_settings import LabelSettings
from fi_toolkit.surrogate.labels import read_unit, run_labels
from fi_toolkit.surrogate.train import run_fit_surrogate
from fi_toolkit.surrogate.train_settings import SurrogateFitSettings

LABELS = LabelSettings(points=(40, 64), near="0:16", far="24:32", samples=1, slices=2)


def _oracle(model, prompt: RepeatPrompt) -> torch.Tensor:
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(prompt.ids[None], output_attentions=True, output_hidden_states=True, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
    cfg = model.config
    n_q, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = cfg.hidden_size // n_q
    ctx, rep = range(*prompt.context.indices(len(prompt.ids))), range(*prompt.repeat.indices(len(prompt.ids)))
    layers = []
    for layer, block in enumerate(model.model.layers):
        with torch.no_grad():
            x = block.input_layernorm(out.hidden_states[layer])[0].double()
            v = block.self_attn.v_proj(x.float()).double().view(-1, n_kv, dh)
        wo = block.self_attn.o_proj.weight.double()
        a = out.attentions[layer][0].double()
        per_kv = torch.zeros(n_kv, len(ctx), dtype=torch.float64)
        for h in range(n_q):
            g = h // (n_q // n_kv)
            for k, i in enumerate(ctx):
                passed = torch.linalg.vector_norm(wo[:, h * dh : (h + 1) * dh] @ v[i, g])
                best = max(float(a[h, t, i] / torch.linalg.vector_norm(x[t])) for t in rep)
                per_kv[g, k] = max(per_kv[g, k], best * passed)
        layers.append(per_kv)
    return torch.stack(layers)


def test_scores_are_the_definition_written_out(tiny, tiny_ids):
    ids = tiny_ids[:40]
    context = ids[3:15]
    prompt = RepeatPrompt(torch.cat([ids[:3], context, ids[20:24], context, ids[30:32]]), slice(3, 15), slice(19, 31))
    got = kvzip_plus_scores(tiny.model, prompt)
    want = _oracle(tiny.model, prompt)
    assert got.shape == (4, 2, 12)
    torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=1e-7)
    assert tiny.model.config._attn_implementation == "sdpa"  # restored


def _plain_repeat(_tokenizer, context):
    """The tiny model has no tokenizer: the context, two marker ids, the context again."""
    n = len(context)
    return RepeatPrompt(torch.cat([context, torch.tensor([1, 2]), context]), slice(0, n), slice(n + 2, 2 * n + 2))


def test_the_kvzip_plus_surrogate_is_the_ridge_regression_of_the_teachers_log_scores(
    tiny, tiny_ids, tmp_path, monkeypatch
):
    """``fi fit-surrogate --target kvzip_plus``: the closed form (ridge 0) equals numpy's least squares of the log
    teacher scores, computed here for each unit's prefix, at the unit's label positions, on the same hidden
    states; the FI columns are not read."""
    monkeypatch.setattr("fi_toolkit.surrogate.kvzip_plus.repeat_prompt", _plain_repeat)
    run = tmp_path / "labels"
    docs = corpus.slices(Document("random", "", tiny_ids, "test", sha256="x"), LABELS.slice_tokens(), 2)
    run_labels(tiny, docs, LABELS, run, signals=SignalConfig(window=8))
    m = run_fit_surrogate(tiny, [run], SurrogateFitSettings(ridge=0.0, target="kvzip_plus"))
    assert m.about["trained_on"].startswith("KVzip+")
    xs, ys = {layer: [] for layer in range(4)}, {layer: [] for layer in range(4)}
    for unit in sorted(p.parent.name for p in (run / "per_document").glob("*/done.json")):
        rows = read_unit(run, unit)
        p = int(rows.point.iloc[0])
        tokens = torch.tensor(read_unit(run, unit, "tokens").token.to_numpy())[:p]
        teacher = kvzip_plus_scores(tiny.model, _plain_repeat(None, tokens)).double().log()
        inputs = attention_inputs(tiny.model, tokens)
        positions = torch.tensor(sorted(set(rows.position)))
        for layer in range(4):
            xs[layer].append(inputs[layer][positions].double().numpy())
            ys[layer].append(teacher[layer][:, positions].t().numpy())
    for layer in range(4):
        x, y = np.concatenate(xs[layer]), np.concatenate(ys[layer])
        coef, *_ = np.linalg.lstsq(np.c_[x, np.ones(len(x))], y, rcond=None)
        np.testing.assert_allclose(m.weights[f"layers.{layer}.weight"].numpy(), coef[:-1].T, rtol=2e-3, atol=2e-4)


@pytest.mark.smollm
def test_the_repeat_prompt_holds_the_documents_own_ids_twice_in_the_chat_turn(smollm, alice):
    context = alice.ids[:100]
    prompt = repeat_prompt(smollm.tokenizer, context)
    assert torch.equal(prompt.ids[prompt.context], context) and torch.equal(prompt.ids[prompt.repeat], context)
    between = smollm.tokenizer.decode(prompt.ids[prompt.context.stop : prompt.repeat.start])
    assert "Repeat the previous context exactly." in between and "assistant" in between
    assert "user" in smollm.tokenizer.decode(prompt.ids[: prompt.context.start])
