"""Each served architecture (tiny random configs, models.TINY_ARCHITECTURES) passes the core oracles;
what the toolkit cannot serve is refused in one line before any forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from cases import CHUNKS, probe_sets
from cases import P as PROBE_P
from oracles import (
    assert_full_budget_greedy_equals_plain_generate,
    assert_prefill_compression_equals_masked_model,
    fi_by_masked_full_forward,
    pooled_window_attention,
)

from fi_toolkit.compress.decoder import generate
from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import check_model, context_limit
from fi_toolkit.model.loading import TINY_ARCHITECTURES, load_model, tiny_model
from fi_toolkit.policies import InfoKV, PyramidKV
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.forward_influence import forward_influence, forward_influence_by_deletion
from fi_toolkit.signals.trace import SignalConfig, trace_prefix

W = 16


@pytest.fixture(scope="module", params=list(TINY_ARCHITECTURES))
def arch(request):
    return tiny_model(seed=0, architecture=request.param)


def test_each_tiny_config_has_what_it_stands_for():
    """The oracles below can only catch a skipped bias, q_norm or rope scaling if the configs have them."""
    models = {a: tiny_model(architecture=a).model for a in TINY_ARCHITECTURES}
    attn = {a: m.model.layers[0].self_attn for a, m in models.items()}
    assert attn["qwen2"].q_proj.bias.abs().min() > 0  # random, non-zero query biases
    assert attn["qwen3"].q_norm.weight.std() > 0.1  # a per-head norm that is not the identity scale
    assert getattr(attn["phi3"], "q_proj", None) is None and attn["phi3"].qkv_proj.out_features == 4 * 16 + 2 * 2 * 16
    positions = torch.arange(300)[None]
    x = torch.zeros(1, 300, 64)
    cos_plain, _ = models["llama"].model.rotary_emb(x, positions)
    cos_llama3, _ = models["llama3"].model.rotary_emb(x, positions)
    assert (cos_llama3 - cos_plain).abs().max() > 0.5  # llama3 rope scaling changes the rotation
    cos_phi3, _ = models["phi3"].model.rotary_emb(x, positions)
    assert cos_phi3.shape[-1] == 8 and cos_phi3.abs().max() > 1.1  # partial rotary; longrope's attention factor
    assert models["mistral"].config.sliding_window == 512


def test_window_attention_equals_eager_output_attentions(arch, tiny_ids):
    """The trace (sdpa, queries recomputed from each attention input) = the eager twin's output_attentions,
    mean over the window rows, pooled over the scored positions, GQA-group mean."""
    p = 150
    trace = trace_prefix(arch.model, tiny_ids, p, SignalConfig(window=W, pool_kernel=7))
    expected = pooled_window_attention(arch.model, tiny_ids[:p], W, kernel=7)
    for layer, e in enumerate(expected):
        np.testing.assert_allclose(trace.attention[layer].double().numpy(), e.numpy(), atol=1e-6, err_msg=str(layer))


def test_masked_probe_equals_physical_deletion_and_a_masked_full_forward(arch, tiny_ids):
    model = arch.model
    trace = trace_prefix(model, tiny_ids, PROBE_P, SignalConfig(window=W))
    sets = probe_sets()
    masked = forward_influence(model, trace, tiny_ids, sets, CHUNKS, batch_size=3, block=64).fi()
    for i, s in enumerate(sets):
        deleted = forward_influence_by_deletion(model, trace, tiny_ids, s.removed, CHUNKS)
        full = fi_by_masked_full_forward(model, tiny_ids, s.removed, PROBE_P, CHUNKS)
        # relative: Qwen2's value biases keep some FI near 1e-6, where an absolute 1e-5 would prove nothing
        torch.testing.assert_close(masked[i], deleted, rtol=1e-4, atol=1e-8, check_dtype=False, msg=s.label)
        torch.testing.assert_close(masked[i], full, rtol=1e-4, atol=1e-8, check_dtype=False, msg=s.label)
        assert full.min() > 1e-6  # the comparison is not between two zeros


def test_full_budget_greedy_is_token_identical_to_plain_generate(arch, tiny_ids):
    assert_full_budget_greedy_equals_plain_generate(arch.model, tiny_ids, 1.0)


@pytest.mark.parametrize(
    "policy", [InfoKV(budget=48, window=W), PyramidKV(budget=48, window=W)], ids=["infokv", "pyramidkv"]
)
def test_prefill_compression_equals_the_masked_full_model(arch, tiny_ids, policy):
    assert_prefill_compression_equals_masked_model(arch.model, tiny_ids, policy)


@pytest.mark.parametrize("architecture", ["mistral", "phi3"])
def test_runs_past_a_sliding_window_or_longrope_original_context_are_refused(architecture, tiny_ids):
    """Mistral's sliding window (512) and Phi-3's longrope original context (512) bound the exact runs."""
    lm = tiny_model(architecture=architecture)
    assert context_limit(lm.config) == 512 and context_limit(tiny_model().config) == 4096
    why = "sliding attention window" if architecture == "mistral" else "longrope original context"
    with pytest.raises(FIError, match=f"exceeds the model's {why} of 512 tokens"):
        generate(lm.model, None, tiny_ids[:300], None, max_new_tokens=213)
    ids = torch.cat([tiny_ids, tiny_ids])
    with pytest.raises(FIError, match=f"prefix of 513 tokens is past the model's {why} of 512 tokens"):
        trace_prefix(lm.model, ids, 513, SignalConfig(window=W))
    trace = trace_prefix(lm.model, ids, 400, SignalConfig(window=W))
    with pytest.raises(FIError, match="chunk 400:513 ends past the model's context of 512 tokens"):
        forward_influence(lm.model, trace, ids, probe_sets()[:1], [Chunk(400, 513)])


SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
REFUSED = {
    "gpt2": (
        "GPT2Config",
        dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=512),
        "GPT2LMHeadModel is not supported by fi_toolkit: no decoder layers at base_model.layers "
        "(a Llama-style decoder: layers, final norm, LM head)",
    ),
    "deepseek-v3-mla": (
        "DeepseekV3Config",
        dict(
            SMALL,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_group=1,
            topk_group=1,
        ),
        "DeepseekV3ForCausalLM is not supported by fi_toolkit: its attention has no query projection "
        "(q_proj or qkv_proj)",
    ),
    "stablelm-qk-layernorm": (
        "StableLmConfig",
        dict(SMALL, qk_layernorm=True),
        "StableLmForCausalLM is not supported by fi_toolkit: its attention has parts the window queries do "
        "not reproduce (k_layernorm, q_layernorm)",
    ),
    "olmo2": (
        "Olmo2Config",
        SMALL,
        "Olmo2ForCausalLM is not supported by fi_toolkit: its q_norm normalises 64 features, not one head's 16",
    ),
    "gemma2": (
        "Gemma2Config",
        dict(SMALL, head_dim=16),
        "Gemma2ForCausalLM is not supported by fi_toolkit: attention logit soft-capping, which window "
        "attention does not reproduce",
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_an_architecture_it_cannot_serve_is_refused_in_one_line_before_any_forward(name, tiny_ids):
    config_class, kwargs, message = REFUSED[name]
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**kwargs)).eval()
    forwards = []
    model.register_forward_pre_hook(lambda *_: forwards.append(1))
    for entry in (
        lambda: check_model(model),
        lambda: trace_prefix(model, tiny_ids, 100, SignalConfig(window=W)),
        lambda: generate(model, None, tiny_ids[:50], None, max_new_tokens=5),
    ):
        with pytest.raises(FIError) as info:
            entry()
        assert str(info.value) == message
    assert not forwards


def _save_with_tokenizer(model, path) -> None:
    """``model`` and a two-word tokenizer in ``path``: a local model directory load_model accepts."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    model.save_pretrained(path)


def test_load_model_refuses_what_it_cannot_serve_and_loads_what_it_can(tmp_path):
    config_class, kwargs, message = REFUSED["gpt2"]
    _save_with_tokenizer(transformers.GPT2LMHeadModel(getattr(transformers, config_class)(**kwargs)), tmp_path / "gpt2")
    with pytest.raises(FIError) as info:
        load_model(str(tmp_path / "gpt2"))
    assert str(info.value) == message
    phi3 = tiny_model(architecture="phi3").model
    _save_with_tokenizer(phi3, tmp_path / "phi3")
    loaded = load_model(str(tmp_path / "phi3"))
    assert type(loaded.model).__name__ == "Phi3ForCausalLM" and context_limit(loaded.config) == 512


def test_a_model_is_checked_once(monkeypatch):
    """check_model walks a model's layers once: later calls (one per forward entry point) return at once,
    while a model it has not accepted is still walked (and refused) every time."""
    from fi_toolkit.model import architectures
    from fi_toolkit.model.loading import tiny_model

    loaded = tiny_model().model  # load_model/tiny_model check the model they return
    fresh = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL))
    walks = []
    real = architectures._lacks
    monkeypatch.setattr(architectures, "_lacks", lambda m: walks.append(m) or real(m))
    for _ in range(3):
        check_model(loaded)
        check_model(fresh)
    assert walks == [fresh]
    refused = transformers.AutoModelForCausalLM.from_config(transformers.Gemma2Config(**dict(SMALL, head_dim=16)))
    for _ in range(2):
        with pytest.raises(FIError):
            check_model(refused)
    assert len(walks) == 3 and walks[1:] == [refused, refused]
