"""The tracker's contract (fi_toolkit/signals/tracker.py): hooks that never outlive their block, forks that
share nothing, compaction that equals the signals of the kept slots, and decoding signals equal to a fresh
trace of the same tokens. Oracles: hook counts on the model's modules, eager attention weights, trace_prefix."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch
from scipy.ndimage import uniform_filter1d
from transformers import DynamicCache

from fi_toolkit.compress.decoder import CompressedDecoder, generate, signal_config_for
from fi_toolkit.errors import FIError
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.policies import H2O, InfoKV
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.signals.policy_view import Signals
from fi_toolkit.signals.trace import trace_prefix
from fi_toolkit.signals.tracker import SignalTracker

P, W = 100, 16
CONFIG = SignalConfig(window=W, top_k=40)


@pytest.fixture(scope="module")
def eager():
    """The tiny Llama (the same weights as the ``tiny`` fixture) with eager attention: its weights are the oracle."""
    return tiny_model(seed=0, attn_implementation="eager").model


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@torch.no_grad()
def _feed(model, tracker: SignalTracker, cache: DynamicCache, ids: torch.Tensor) -> None:
    """Feed ``ids`` after what ``tracker`` has seen, as one forward, and record it."""
    start = tracker.seen
    with tracker(model):
        hidden = model.base_model(
            input_ids=ids[None],
            position_ids=torch.arange(start, start + ids.numel())[None],
            use_cache=True,
            **cache_kwargs(model.base_model, cache),
        ).last_hidden_state[0]
        tracker.record(hidden)


def _copy(cache: DynamicCache, config) -> DynamicCache:
    copy = DynamicCache(config=config)
    for i, layer in enumerate(cache.layers):
        copy.update(layer.keys.clone(), layer.values.clone(), i)
    return copy


def _started(model, ids: torch.Tensor, steps: int, **kwargs) -> tuple[SignalTracker, DynamicCache]:
    """A tracker after a prefill of ``ids[:P]`` and ``steps`` single-token steps."""
    tracker = SignalTracker(CONFIG, 300, **{"accumulate": True, **kwargs})
    cache = DynamicCache(config=model.config)
    _feed(model, tracker, cache, ids[:P])
    tracker.start_decoding(cache)
    for t in ids[P : P + steps]:
        _feed(model, tracker, cache, t[None])
    return tracker, cache


def _all_slots(cache: DynamicCache) -> list[torch.Tensor]:
    return [torch.arange(l.keys.shape[2]).expand(l.keys.shape[1], -1) for l in cache.layers]


def _state(tracker: SignalTracker) -> list[torch.Tensor]:
    return [
        tracker.entropy.clone(),
        tracker.distance.clone(),
        *[q.clone() for q in tracker.queries],
        *[a.clone() for a in tracker.accumulated],
    ]


def _assert_views_equal(a: Signals, b: Signals) -> None:
    assert a.seen == b.seen and a.window == b.window
    for name in ("keys", "positions", "entropy", "distance", "attention", "accumulated"):
        for x, y in zip(getattr(a, name), getattr(b, name), strict=True):
            assert torch.equal(x, y), name


def _eager_window_attention(eager, ids: torch.Tensor, keep: list[torch.Tensor] | None = None) -> list[np.ndarray]:
    """Per layer ``[Hkv, k]``: the eager attention weights of the last W rows over ``ids`` restricted to the
    slots ``keep[l] [Hkv, k]`` (default: all) and renormalised (a softmax over a subset of its logits), the
    mean over the rows, zero-padded uniform pooling over the scored slots ``[0, k - W)``, the GQA-group mean."""
    n = ids.numel()
    with torch.no_grad():
        attentions = eager(ids[None], output_attentions=True).attentions
    n_q, hkv = eager.config.num_attention_heads, eager.config.num_key_value_heads
    out = []
    for layer, att in enumerate(attentions):
        idx = keep[layer] if keep is not None else torch.arange(n).expand(hkv, n)
        k = idx.shape[1]
        rows = att[0, :, n - W :, :].double().numpy()  # [Hq, W, n]
        weights = np.zeros((n_q, k))
        for hq in range(n_q):
            sub = rows[hq][:, idx[hq // (n_q // hkv)].numpy()]
            weights[hq] = (sub / sub.sum(-1, keepdims=True)).mean(0)
        weights[:, : k - W] = uniform_filter1d(weights[:, : k - W], size=CONFIG.pool_kernel, axis=-1, mode="constant")
        out.append(weights.reshape(hkv, n_q // hkv, k).mean(axis=1))
    return out


def test_hooks_are_removed_after_the_block_even_when_it_raises(tiny, tiny_ids):
    model = tiny.model
    before = _hooks(model)
    tracker = SignalTracker(CONFIG, 200, accumulate=True)
    with pytest.raises(RuntimeError, match="inside the block"):
        with tracker(model):
            inside = _hooks(model)
            raise RuntimeError("inside the block")
    # the norm's pre-hook, and per layer its input pre-hook and its attention's forward hook
    assert inside == before + 1 + 2 * model.config.num_hidden_layers
    assert _hooks(model) == before
    # a forward that fails half-way (an id past the vocabulary) leaves no hook and no recorded input
    with pytest.raises(IndexError):
        _feed(model, tracker, DynamicCache(config=model.config), torch.tensor([10_000]))
    assert _hooks(model) == before and tracker.seen == 0
    # without token signals only the attention hooks go on
    with SignalTracker(CONFIG, 200, token_signals=False)(model):
        assert _hooks(model) == before + model.config.num_hidden_layers
    assert _hooks(model) == before


def test_decoders_leave_no_hooks(tiny, tiny_ids):
    """generate(), a closed decoder, and a shared prefill with its closed forks: the model as it was."""
    model = tiny.model
    before = _hooks(model)
    generate(model, None, tiny_ids[:P], H2O(budget=48, window=W), max_new_tokens=12, interval=5, eos_token_id=[])
    assert _hooks(model) == before
    shared = CompressedDecoder.shared(model, 200, signal_config_for(InfoKV(budget=48, window=W)))
    assert _hooks(model) > before  # tracking while it prefills
    shared.prefill(tiny_ids[:P])
    assert _hooks(model) == before  # its state is final: its hooks are gone
    for policy in (InfoKV(budget=48, window=W), H2O(budget=48, window=W), None):
        child, _ = shared.fork(policy)
        child.step(int(tiny_ids[P]))
        child.close()
        child.close()  # idempotent
        assert _hooks(model) == before


def test_a_tracker_follows_one_model(tiny, tiny_ids):
    tracker, _ = _started(tiny.model, tiny_ids, 0)
    other = tiny_model(seed=1).model
    with pytest.raises(FIError, match="follows the one model"):
        with tracker(other):
            pass


def test_a_fork_equals_its_parent_at_the_fork_and_is_independent_after(tiny, tiny_ids):
    model = tiny.model
    parent, cache = _started(model, tiny_ids, 5)  # the accumulator holds decoding rows too
    child_cache = _copy(cache, model.config)
    child = parent.fork()
    child.start_decoding(child_cache)
    at_fork = parent.view(_all_slots(cache))
    _assert_views_equal(child.view(_all_slots(child_cache)), at_fork)
    state = _state(parent)

    _feed(model, child, child_cache, tiny_ids[P + 5 : P + 15])  # advance the child by 10 tokens
    _assert_views_equal(parent.view(_all_slots(cache)), at_fork)  # the parent's signals as they were
    assert all(torch.equal(a, b) for a, b in zip(_state(parent), state, strict=True))
    assert cache.layers[0].keys.shape[2] == P + 5
    # the child moved on: its window queries, its H and D of the new tokens, its accumulator's new slots
    assert child.seen == parent.seen + 10 and child.view(_all_slots(child_cache)).accumulated[0].shape[1] == P + 15
    assert not torch.equal(child.queries[0], parent.queries[0])
    assert child.entropy[P + 5 : P + 15].abs().sum() > 0 and parent.entropy[P + 5 : P + 15].abs().sum() == 0

    # the parent advanced instead: the child (forked again) stays as it was
    second = parent.fork(token_signals=False, accumulate=False)
    second.start_decoding(second_cache := _copy(cache, model.config))
    kept = second.view(_all_slots(second_cache))
    _feed(model, parent, cache, tiny_ids[P + 5 : P + 8])
    again = second.view(_all_slots(second_cache))
    assert again.entropy is None and again.distance is None and again.accumulated is None
    for a, b in zip(again.attention + again.keys, kept.attention + kept.keys, strict=True):
        assert torch.equal(a, b)
    assert second.seen == P + 5 and parent.seen == P + 8
    for a, b in zip(kept.attention, at_fork.attention, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(FIError, match="only track what"):
        second.fork(token_signals=True)


def test_compact_then_view_equals_the_view_of_the_kept_slots(eager, tiny_ids):
    """After compacting to a random keep map (the window kept): H, D and H2O's accumulator are the kept
    slots' values before; window attention is the eager attention weights of the window rows restricted
    to the kept keys and renormalised (softmax over a subset), pooled over the kept scored slots."""
    steps, keep_n = 6, 40
    tracker, cache = _started(eager, tiny_ids, steps)
    n = P + steps
    before = tracker.view(_all_slots(cache))
    gen = torch.Generator().manual_seed(3)
    hkv = eager.config.num_key_value_heads
    keep = []
    for _ in cache.layers:  # per head: keep_n - W random slots of the scored part, then the window
        picks = [torch.sort(torch.randperm(n - W, generator=gen)[: keep_n - W]).values for _ in range(hkv)]
        keep.append(torch.cat([torch.stack(picks), torch.arange(n - W, n).expand(hkv, W)], dim=1))
    for layer, idx in zip(cache.layers, keep):  # compact the cache by hand, in place
        heads = torch.arange(hkv)[:, None]
        layer.keys, layer.values = layer.keys[0][heads, idx][None], layer.values[0][heads, idx][None]
    tracker.compact(keep)
    after = tracker.view(keep)  # slots were positions, so the kept slots' positions are `keep`

    assert after.seen == n and [k.shape[2] for k in after.keys] == [keep_n] * len(keep)
    for layer, idx in enumerate(keep):
        for name in ("entropy", "distance", "accumulated"):
            expected = torch.stack([getattr(before, name)[layer][h, idx[h]] for h in range(hkv)])
            assert torch.equal(getattr(after, name)[layer], expected), (name, layer)

    for layer, expected in enumerate(_eager_window_attention(eager, tiny_ids[:n], keep)):
        np.testing.assert_allclose(after.attention[layer].numpy(), expected, atol=1e-6)

    with pytest.raises(FIError, match="compact the cache first"):
        tracker.compact([idx[:, :-1] for idx in keep])


@pytest.mark.parametrize("entropy_of", ["produced", "next"])
@pytest.mark.parametrize("feed", ["steps", "block", "fork"])
def test_decoding_signals_before_any_eviction_equal_a_fresh_trace(tiny, tiny_ids, eager, feed, entropy_of):
    """At a decoding compression that has evicted nothing yet (the prompt kept), every slot is its position:
    the decoder's D^(l) is trace_prefix's over the same tokens, its H the top-k entropy of the full model's
    logits (shifted by one for "produced"), its window attention the eager attention weights of the last W
    rows, whether the tokens came one step at a time, as one block, or after a fork of a shared prefill."""
    model, steps = tiny.model, 30
    policy = InfoKV(budget=48, window=W)
    config = SignalConfig(window=W, top_k=policy.top_k, tau=policy.tau, alpha=policy.alpha, entropy_of=entropy_of)
    if feed == "fork":
        shared = CompressedDecoder.shared(model, 200, config)
        shared.prefill(tiny_ids[:P])
        decoder, keep = shared.fork(policy, compress_prompt=False)
    else:
        decoder = CompressedDecoder(model, policy, 200, config, compress_prompt=False)
        _, keep = decoder.prefill(tiny_ids[:P])
    assert keep is None
    try:
        if feed == "block":
            decoder.block(tiny_ids[P : P + steps])
        else:
            for t in tiny_ids[P : P + steps]:
                decoder.step(int(t))
        s = decoder.signals()
    finally:
        decoder.close()
    n = P + steps
    assert s.seen == n and s.protected == [P] * len(s.keys) and torch.equal(s.tokens, tiny_ids[:n])
    expected = Signals.from_trace(trace_prefix(model, tiny_ids, n, config))
    for name in ("positions", "distance"):
        for layer, (a, b) in enumerate(zip(getattr(s, name), getattr(expected, name), strict=True)):
            torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=1e-5, msg=f"{name}, layer {layer}")
    with torch.no_grad():
        logits = model(tiny_ids[:n][None]).logits[0].double().numpy()
    at = scipy.stats.entropy(scipy.special.softmax(np.sort(logits, axis=-1)[:, -config.top_k :], axis=-1), axis=-1)
    entropy = at if entropy_of == "next" else np.concatenate([[0.0], at[:-1]])
    for layer, attention in enumerate(_eager_window_attention(eager, tiny_ids[:n])):
        np.testing.assert_allclose(s.attention[layer].numpy(), attention, atol=1e-5)
        for head in range(s.entropy[layer].shape[0]):
            np.testing.assert_allclose(s.entropy[layer][head].numpy(), entropy, rtol=1e-4, atol=1e-5)


def test_the_buffer_of_attention_inputs_holds_the_rows_fed_since_the_last_compaction(eager, tiny_ids):
    """With ``hidden_buffer = B``: per layer the attention module's inputs of the last B rows decoded, and their
    position embeddings; the oracle is a plain uncached forward (``output_hidden_states``, the layer's own
    input norm, the model's rotary embedding). Decoding and each compaction start it empty; a fork copies it."""
    b = 8
    tracker = SignalTracker(CONFIG, P + 12, token_signals=False, hidden_buffer=b)
    cache = DynamicCache(config=eager.config)
    _feed(eager, tracker, cache, tiny_ids[:P])
    assert tracker.inputs[0].shape[1] == b  # the prompt's last rows, until decoding starts
    tracker.start_decoding(cache)
    assert tracker.inputs == [None] * len(cache.layers) and tracker.rope is None
    for t in range(P, P + 10):  # ten decoding steps: the buffer holds the last eight
        _feed(eager, tracker, cache, tiny_ids[t : t + 1])
    n = P + 10
    with torch.no_grad():
        states = eager(tiny_ids[:n][None], output_hidden_states=True).hidden_states
        cos, sin = eager.model.rotary_emb(states[0], torch.arange(n - b, n)[None])
    view = tracker.view(_all_slots(cache))
    for layer, module in enumerate(eager.model.layers):
        with torch.no_grad():
            want = module.input_layernorm(states[layer])[:, -b:]
        np.testing.assert_allclose(view.inputs[layer].numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
        assert torch.equal(view.values[layer], cache.layers[layer].values)
    assert torch.equal(view.rope[0], cos) and torch.equal(view.rope[1], sin)
    child = tracker.fork(hidden_buffer=4)
    assert torch.equal(child.inputs[0], tracker.inputs[0][:, -4:]) and child.rope[0].shape[1] == 4
    tracker.compact([torch.arange(n).expand(cache.layers[0].keys.shape[1], n)] * len(cache.layers))
    assert tracker.inputs == [None] * len(cache.layers) and tracker.rope is None
    _feed(eager, tracker, cache, tiny_ids[n : n + 1])
    assert tracker.inputs[0].shape[1] == 1 and tracker.rope[0].shape[1] == 1  # the rows since the compaction
