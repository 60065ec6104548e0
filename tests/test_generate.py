"""Compressed generation (docs/method.md, "Decoding compression"): exactness against plain generation and an
independently masked full model, budgets while decoding, cache bytes, sampling, and the CLI."""

from __future__ import annotations

import sys

import pytest
import torch
from oracles import (
    assert_full_budget_greedy_equals_plain_generate,
    assert_prefill_compression_equals_masked_model,
    eager_twin,
    pooled_window_attention,
)

from fi_toolkit.cli import app as cli
from fi_toolkit.compress.decoder import CompressedDecoder, cache_bytes, generate, signal_config_for
from fi_toolkit.errors import FIError
from fi_toolkit.policies import RPC, Adaptive, InfoKV, PyramidKV, SnapKV, StreamingLLM, make_policy
from fi_toolkit.signals.trace import trace_prefix

P, W = 120, 16


@pytest.mark.parametrize(
    "policy",
    [
        InfoKV(budget=48, window=W),
        Adaptive(InfoKV(budget=0.4, window=W)),
        PyramidKV(budget=48, window=W),
        StreamingLLM(budget=40, window=W),
    ],
    ids=["infokv", "infokv-adaptive", "pyramidkv", "streaming"],
)
def test_prefill_compression_equals_the_masked_full_model(tiny, tiny_ids, policy):
    assert_prefill_compression_equals_masked_model(tiny.model, tiny_ids, policy)


def test_prefill_keep_map_equals_the_trace_policy(tiny, tiny_ids):
    """Signals tracked online in generation = the Trace the probe uses: same keep map."""
    policy = InfoKV(budget=48, window=W)
    decoder = CompressedDecoder(model := tiny.model, policy, 200)
    _, keep = decoder.prefill(tiny_ids[:P])
    decoder.close()
    expected = policy.keep_map(trace_prefix(model, tiny_ids, P, signal_config_for(policy)))
    assert all(torch.equal(a, b) for a, b in zip(keep.keep, expected.keep))


@pytest.mark.parametrize("budget", [P + 30, 1.0])
def test_full_budget_greedy_is_token_identical_to_plain_generate(tiny, tiny_ids, budget):
    assert_full_budget_greedy_equals_plain_generate(tiny.model, tiny_ids, budget)


@pytest.mark.smollm
def test_full_budget_on_smollm2_is_token_identical_and_streams(smollm):
    model, tok = smollm.model, smollm.tokenizer
    prompt = "Explain how a KV cache works."
    streamed: list[str] = []
    result = generate(model, tok, prompt, SnapKV(budget=1.0), max_new_tokens=12, interval=4, on_text=streamed.append)
    ids = result.prompt_ids
    assert tok.decode(ids).startswith("<|im_start|>system")  # the chat template was applied
    plain = model.generate(ids[None], max_new_tokens=12, do_sample=False)[0, ids.numel() :].tolist()
    assert result.tokens == plain
    assert "".join(streamed) == result.text and result.text.strip()


def test_decoding_compression_fires_at_each_interval(tiny, tiny_ids):
    budget, interval, new = 48, 10, 60
    result = generate(
        tiny.model,
        None,
        tiny_ids[:P],
        InfoKV(budget=budget, window=W),
        max_new_tokens=new,
        interval=interval,
        eos_token_id=[],
    )
    s = result.stats
    assert s.prefill_compressed
    assert s.compression_steps == list(range(interval, new, interval))  # 10, 20, ..., 50
    assert max(s.cache_lengths) == budget + interval  # never more
    assert all(n <= budget + interval for n in s.cache_lengths)
    # 59 tokens fed after the prompt; the last compression (at 50) left 48, then 9 more
    assert s.cache_bytes_kept * (P + new - 1) == s.cache_bytes_full * (budget + 9)


def test_ratio_budget_follows_the_sequence_while_decoding(tiny, tiny_ids):
    r, interval = 0.4, 20
    result = generate(
        tiny.model,
        None,
        tiny_ids[:P],
        SnapKV(budget=r, window=W),
        max_new_tokens=61,
        interval=interval,
        eos_token_id=[],
    )
    s = result.stats
    assert s.compression_steps == [20, 40, 60]
    # right after the compression at 60 the cache holds round(0.4 * (120 + 60)) = 72 per layer
    assert s.cache_bytes_kept * (P + 60) == s.cache_bytes_full * 72


def test_uneven_layers_decode_and_keep_the_total(tiny, tiny_ids):
    policy = PyramidKV(budget=48, window=W)
    decoder = CompressedDecoder(tiny.model, policy, 300)
    from fi_toolkit.model.attention import ragged_attention

    with ragged_attention(tiny.model):
        decoder.prefill(tiny_ids[:P])
        for t in tiny_ids[P : P + 25]:
            decoder.step(int(t))
        keep = decoder.compress()
    decoder.close()
    assert sum(keep.counts()) == 4 * 48 and len(set(keep.counts())) > 1
    assert decoder.lengths() == keep.counts()
    for pos in decoder.positions:  # the window (the 16 most recent tokens) kept by every head
        assert (pos[:, -W:] == torch.arange(P + 25 - W, P + 25)).all()


def test_rpc_keeps_the_prompt_and_its_share_of_the_generated_tokens(tiny, tiny_ids):
    """A ratio for a policy that keeps the prompt is a share of what it may compress: the generated
    tokens. Which ones: the window plus the top pooled window attention of the generated part."""
    prompt, fed = 60, 100
    policy = RPC(budget=0.8, window=W)
    decoder = CompressedDecoder(tiny.model, policy, 300)
    _, keep = decoder.prefill(tiny_ids[:prompt])
    assert keep is None
    for t in tiny_ids[prompt : prompt + fed]:
        decoder.step(int(t))
    keep = decoder.compress()
    decoder.close()
    assert keep.counts() == [prompt + round(0.8 * fed)] * 4
    scores = pooled_window_attention(tiny.model, tiny_ids[: prompt + fed], W)
    n = prompt + fed
    for layer, pos in enumerate(decoder.positions):
        for head in range(pos.shape[0]):
            kept = pos[head].tolist()
            assert kept[:prompt] == list(range(prompt))  # the prompt, untouched
            candidates = scores[layer][head][prompt : n - W]
            order = sorted(range(candidates.numel()), key=lambda i: (-float(candidates[i]), i))
            expected = {prompt + i for i in order[: round(0.8 * fed) - W]} | set(range(n - W, n))
            assert set(kept[prompt:]) == expected, (layer, head)


def test_a_budget_that_never_evicts_is_refused_or_said(tiny, tiny_ids):
    # RPC keeping 25 % of 60 generated tokens can never hold more than the window of 16: refused
    with pytest.raises(FIError, match="keeps at most 15 of the 60 tokens it may compress"):
        generate(tiny.model, None, tiny_ids[:P], RPC(budget=0.25, window=W), max_new_tokens=60, interval=10)
    # an interval longer than the generation: nothing is evicted, and the stats say so
    result = generate(
        tiny.model, None, tiny_ids[:P], RPC(budget=0.5, window=W), max_new_tokens=60, interval=100, eos_token_id=[]
    )
    assert result.stats.compressions == 0 and result.stats.note.startswith("nothing evicted")
    result = generate(
        tiny.model, None, tiny_ids[:P], RPC(budget=0.5, window=W), max_new_tokens=81, interval=40, eos_token_id=[]
    )
    assert result.stats.compression_steps == [40, 80] and not result.stats.note
    assert max(result.stats.cache_lengths) == P + 60  # P + 40 -> P + 20 at 40, then 40 more: P + 60 -> P + 40


def test_h2o_decoding_accumulator_equals_summed_eager_attention(tiny, tiny_ids):
    """H2O accumulates one quantity: the attention each entry received, summed over the window
    queries of the prompt and every generated query, unpooled, GQA-group mean."""
    from fi_toolkit.policies import H2O

    steps = 10
    decoder = CompressedDecoder(tiny.model, H2O(budget=1.0, window=W), 300)
    decoder.prefill(tiny_ids[:P])
    for t in tiny_ids[P : P + steps]:
        decoder.step(int(t))
    accumulated = decoder.tracker.accumulated
    decoder.close()
    eager = eager_twin(tiny.model)
    n = P + steps
    with torch.no_grad():
        att = eager(tiny_ids[:n][None], output_attentions=True).attentions
    rows = list(range(P - W, P)) + list(range(P, n))  # window queries, then every generated query
    hkv = tiny.model.config.num_key_value_heads
    for layer, a in enumerate(att):
        expected = a[0][:, rows, :].double().sum(dim=1).view(hkv, -1, n).mean(dim=1)
        torch.testing.assert_close(accumulated[layer].double(), expected, rtol=1e-4, atol=1e-6)


def test_prefill_bytes_are_the_budget_share(tiny, tiny_ids):
    for policy in (SnapKV(budget=0.3, window=W), make_policy("knorm", budget=50, window=W)):
        decoder = CompressedDecoder(tiny.model, policy, 200)
        decoder.prefill(tiny_ids[:P])
        decoder.close()
        k = round(0.3 * P) if policy.budget.is_share else 50
        full = 4 * 2 * 2 * P * 16 * 4  # layers x (K, V) x Hkv x P x head_dim x float32
        assert cache_bytes(decoder.cache) * P == full * k


def test_sampling_is_seeded_and_top_p_tiny_is_greedy(tiny, tiny_ids):
    model, ids = tiny.model, tiny_ids[:P]
    policy = InfoKV(budget=0.5, window=W)
    a = generate(model, None, ids, policy, max_new_tokens=15, temperature=1.0, seed=3, eos_token_id=[]).tokens
    b = generate(model, None, ids, policy, max_new_tokens=15, temperature=1.0, seed=3, eos_token_id=[]).tokens
    c = generate(model, None, ids, policy, max_new_tokens=15, temperature=1.0, seed=4, eos_token_id=[]).tokens
    greedy = generate(model, None, ids, policy, max_new_tokens=15, eos_token_id=[]).tokens
    nucleus = generate(
        model, None, ids, policy, max_new_tokens=15, temperature=1.0, top_p=1e-6, seed=5, eos_token_id=[]
    ).tokens
    assert a == b and a != c and nucleus == greedy


def test_stops_at_eos(tiny, tiny_ids):
    first = generate(tiny.model, None, tiny_ids[:P], None, max_new_tokens=3, eos_token_id=[]).tokens
    result = generate(tiny.model, None, tiny_ids[:P], None, max_new_tokens=20, eos_token_id=first[1])
    assert result.tokens == first[:2] and result.stats.stop_reason == "eos"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"policy": SnapKV(budget=W, window=W)}, "not above the window"),
        ({"policy": SnapKV(budget=1000, window=W)}, "above the 130 tokens it may compress"),
        ({"policy": SnapKV(budget="remove=0.95", window=W)}, "not above the window"),
        ({"policy": SnapKV(budget=0.1, window=W)}, "not above the window"),
        ({"policy": RPC(budget=100, window=W)}, "above the 10 tokens it may compress"),
        ({"policy": RPC(budget=0.9, window=W)}, "not above the window"),
        ({"interval": 0}, "interval"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_generation_arguments(tiny, tiny_ids, kwargs, message):
    with pytest.raises(FIError, match=message):
        generate(tiny.model, None, tiny_ids[:P], **{"max_new_tokens": 10, **kwargs})


def _run_cli(args, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["fi", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompt") / "prompt.txt"
    path.write_text("The cache holds keys and values for every token seen so far. " * 8)
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "16", "--window", "16"], "not above the window"),
        (["--budget", "100000"], "tokens it may compress"),
        (["--budget", "1.5"], "a share must lie in [0, 1]"),
        (["--budget", "keep=nan"], "is not a number"),
        (["--budget", "hold=0.2"], "write keep=X or remove=X"),
        (["--policy", "magic"], "unknown policy 'magic'"),
        (["--interval", "0"], "--interval must be >= 1"),
        (["--max-new", "0"], "--max-new must be >= 1"),
        (["--max-new", "-5"], "--max-new must be >= 1"),
    ],
)
@pytest.mark.smollm
def test_cli_bad_input_is_one_line(args, message, prompt_file, monkeypatch, capsys):
    code, out, err = _run_cli(["generate", "--file", str(prompt_file), "--max-new", "4", *args], monkeypatch, capsys)
    assert code == 2 and err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_missing_file(monkeypatch, capsys):
    code, _, err = _run_cli(["generate", "--file", "/nonexistent/prompt.txt"], monkeypatch, capsys)
    assert code == 2 and err.strip() == "error: prompt file not found: /nonexistent/prompt.txt"


@pytest.mark.smollm
def test_cli_generate_streams_text_and_prints_stats(prompt_file, monkeypatch, capsys):
    code, out, err = _run_cli(
        [
            "generate",
            "--file",
            str(prompt_file),
            "--policy",
            "snapkv",
            "--budget",
            "48",
            "--interval",
            "3",
            "--max-new",
            "8",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0 and out.strip()
    assert "compressed" in err and "compressions while decoding" in err and "snapkv@keep=48" in err
