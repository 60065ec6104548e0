"""Compressed decoding of keep maps whose KV heads keep different counts (a padded dense cache plus a mask, as
kvpress's AdaKV holds them; compress/decoder.py).

Oracles, none of which reads the code under test: a full, never-evicted forward of the same tokens in which every
query sees, per layer and KV head, exactly the original positions that head still held when the query was fed
(the per-head mask applied by an attention function written here); decoding with no policy at all; each
compression's record of the positions it left (a kept position must have been held before); the tracker's
accumulator read where the decoder's cache holds pads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from fi_toolkit import SignalConfig
from fi_toolkit.compress.decoder import CompressedDecoder
from fi_toolkit.compress.sampling import GREEDY
from fi_toolkit.eviction import KeepMap
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.policies.base import Policy, as_signals, select, select_across_heads, select_live

P, W, N, INTERVAL = 64, 8, 200, 16
CONFIG = SignalConfig(window=W)


@dataclass
class SharedHeads(Policy):
    """A test policy that shares each layer's budget over its KV heads by a score whose scale differs per head
    (H2O's accumulator plus a head-dependent share of the key norm): an uneven keep map at every compression."""

    name: ClassVar[str] = "shared-heads"
    tracks_accumulated: ClassVar[bool] = True
    uneven_heads: ClassVar[bool] = True

    def scores(self, s, layer):
        keys = s.keys[layer][0].double()
        tilt = torch.arange(1, keys.shape[0] + 1, dtype=torch.float64, device=keys.device)[:, None]
        return s.accumulated[layer].double() + 0.02 * tilt * keys.norm(dim=-1)

    def keep_map(self, signals):
        s = as_signals(signals)
        budgets = self.layer_budgets(s, self.tokens(s.seen, max(s.protected)))
        return KeepMap.from_heads(f"policy:{self.label}", self.live_heads(s, budgets, across_heads=True))


# ---- the oracle's attention: per layer, visible [Hkv, q, K] (True: the query sees the key), set by the test ----
VISIBLE: dict[int, torch.Tensor] = {}


def per_head_attention(module, query, key, value, attention_mask, *args, **kwargs):
    # (the module's own scaling: kvpress's attention patch, once imported, passes dropout where scaling would be)
    groups = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = query @ k.transpose(-1, -2) * module.scaling
    seen = VISIBLE[module.layer_idx].repeat_interleave(groups, dim=0)[None]  # [1, Hq, q, K]
    weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
    return (weights @ v).transpose(1, 2).contiguous(), weights


AttentionInterface.register("test_per_head", per_head_attention)
AttentionMaskInterface.register("test_per_head", eager_mask)


def oracle_logits(model, ids: torch.Tensor, compressions, hkv: int) -> torch.Tensor:
    """Logits of one full forward of ``ids`` where a query fed at ``t >= c.seen`` sees a position ``j < c.seen``
    of layer ``l``, KV head ``h`` only if compression ``c`` left it in that head (every compression so far)."""
    n = ids.numel()
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for layer in range(model.config.num_hidden_layers):
        visible = causal.expand(hkv, n, n).clone()
        for c in compressions:
            counts = c.keep.head_counts[layer] if c.keep.uneven else [c.keep.keep[layer].shape[1]] * hkv
            for h in range(hkv):
                held = torch.zeros(n, dtype=torch.bool)
                held[c.positions[layer][h, : int(counts[h])].cpu()] = True
                held[c.seen :] = True
                visible[h, c.seen :] &= held
        VISIBLE[layer] = visible
    previous = model.config._attn_implementation
    model.set_attn_implementation("test_per_head")
    try:
        with torch.no_grad():
            hidden = model.base_model(input_ids=ids[None], position_ids=torch.arange(n)[None]).last_hidden_state[0]
            return model.lm_head(hidden).float()
    finally:
        model.set_attn_implementation(previous)
        VISIBLE.clear()


def run(model, ids, policy, max_block=None, check=None):
    """Prefill ``ids[:P]``, feed the rest teacher-forced -> (every row's logits, the decoder); ``check(decoder)``
    after every forward."""
    decoder = CompressedDecoder(model, policy, N, CONFIG, interval=INTERVAL, keep_maps=True)
    try:
        with ragged_attention(model):
            first, _ = decoder.prefill(ids[:P])
            rows = [first[None]]
            for block in decoder.feed_blocks(ids[P : N - 1], max_block):
                rows.append(block.logits)
                if check is not None:
                    check(decoder)
    finally:
        decoder.close()
    return torch.cat(rows), decoder


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (N,), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("max_block", [None, 1])
def test_masking_equals_deletion(attn, max_block, ids):
    model = tiny_model(seed=0, attn_implementation=attn).model
    logits, decoder = run(model, ids, SharedHeads(budget=40, window=W), max_block)
    assert len(decoder.compressions) >= 5 and sum(c.keep.uneven for c in decoder.compressions) >= 4
    want = oracle_logits(model, ids[: N - 1], decoder.compressions, 2)[P - 1 :]
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    full = oracle_logits(model, ids[: N - 1], [], 2)[P - 1 :]
    assert (logits - full).abs().max() > 1e-2  # the evictions matter


def test_dead_slots_are_never_kept_and_receive_no_attention(tiny, ids):
    seen_dead = []

    def check(decoder):
        dead, acc = decoder.row.dead, decoder.tracker.accumulated
        if dead is not None:
            seen_dead.append(int(sum(d.sum() for d in dead)))
            for d, a in zip(dead, acc):
                assert d.shape == a.shape and (a[d] == 0).all()
                assert (a[~d] > 0).all()  # every live slot was attended to

    _, decoder = run(tiny.model, ids, SharedHeads(budget=40, window=W), check=check)
    assert seen_dead and max(seen_dead) > 0
    held, last = None, 0  # per layer and head, the positions the last compression left; its seen
    for c in decoder.compressions:
        counts = c.keep.head_counts if c.keep.uneven else [torch.full((2,), k.shape[1]) for k in c.keep.keep]
        now = [[set(pos[h, : int(n[h])].tolist()) for h in range(2)] for pos, n in zip(c.positions, counts)]
        assert sum(len(h) for layer in now for h in layer) == 4 * 2 * 40  # the budget counts live entries
        if held is not None:
            for layer in range(4):
                for h in range(2):
                    fed_since = set(range(last, c.seen))
                    assert now[layer][h] <= held[layer][h] | fed_since  # nothing dead comes back
        held, last = now, c.seen


def test_full_budget_decodes_as_no_policy(tiny):
    prompt = torch.randint(0, 256, (P,), generator=torch.Generator().manual_seed(5))

    def tokens(policy):
        decoder = CompressedDecoder(tiny.model, policy, P + 40, CONFIG, interval=8)
        try:
            with ragged_attention(tiny.model):
                logits, _ = decoder.prefill(prompt)
                return decoder.decode(logits, GREEDY, 40).tokens, decoder
        finally:
            decoder.close()

    got, decoder = tokens(SharedHeads(budget="keep=1.0", window=W))
    assert got == tokens(None)[0] and decoder.compressions == []


def test_select_live_without_dead_slots_is_select():
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        scores = torch.randn(3, 40, generator=gen, dtype=torch.float64)
        none = torch.zeros(3, 40, dtype=torch.bool)
        for keep, protected, window in ((10, 0, 4), (17, 2, 5), (40, 0, 4)):
            uniform = select(scores, keep, protected, window)
            assert [g.tolist() for g in select_live(scores, keep, protected, window, none)] == uniform.tolist()
            across = select_across_heads(scores, keep, protected, window)
            got = select_live(scores, keep, protected, window, none, across_heads=True)
            assert [g.tolist() for g in got] == [a.tolist() for a in across]


def test_select_live_skips_dead_slots_by_hand():
    # head 0: slots 3, 4 dead (its pads); head 1: none. protected 1, window 2, keep 4
    scores = torch.tensor([[0.0, 5.0, 1.0, 9.0, 9.0, 2.0, 0.0, 0.0], [0.0, 3.0, 4.0, 0.5, 0.6, 0.7, 0.0, 0.0]])
    dead = torch.zeros(2, 8, dtype=torch.bool)
    dead[0, 3:5] = True
    got = [g.tolist() for g in select_live(scores, 4, 1, 2, dead)]
    assert got == [[0, 1, 6, 7], [0, 2, 6, 7]]  # head 0's 9.0s are dead: never kept
    scores[0, 3:5] = float("nan")  # a dead slot's score is never read
    got = [g.tolist() for g in select_live(scores, 4, 1, 2, dead, across_heads=True)]
    # 8 kept in all: 3 fixed per head, then the two best live candidates over both heads (5.0, 4.0)
    assert got == [[0, 1, 6, 7], [0, 2, 6, 7]]
    got = [g.tolist() for g in select_live(scores, 5, 1, 2, dead, across_heads=True)]
    assert got == [[0, 1, 5, 6, 7], [0, 1, 2, 6, 7]]  # then 3.0 (head 1) and 2.0 (head 0's slot 5)


@pytest.mark.smollm
def test_fi_eval_runs_learned_heads_global_on_smollm(tmp_path, capsys):
    """The committed layer-group model (analyses/learned_heads.py) in a short replay: the prompt compressed by a
    global top-k over each layer's heads, then decoded over the padded cache and compressed back every 32 tokens
    (its entropy_next feature read from the tracker's per-position entropies)."""
    import pandas as pd
    from cli_runner import run_cli

    from fi_toolkit.policies.learned.lambdarank import DEFAULT_MODEL

    model = DEFAULT_MODEL.parents[1] / "learned-heads" / "model.json"
    policy = f"learned:path={model},heads=global,learned:path={model}"
    args = ["eval", "alice", "--policy", policy, "--budget", "keep=0.25", "--prompt", "256", "--length", "320"]
    args += ["--interval", "32", "--free-tokens", "0", "--resamples", "0", "--out", str(tmp_path / "eval")]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    summary = pd.read_csv(tmp_path / "eval" / "replay_summary.csv").set_index("policy")
    shared, uniform = summary.loc[f"learned:path={model},heads=global"], summary.loc[f"learned:path={model}"]
    assert 0 < shared["mean_kl"] < 1 and shared["mean_kl"] != uniform["mean_kl"]
    assert shared["kept_share"] == pytest.approx(uniform["kept_share"])  # the same live entries per layer
    replays = pd.read_csv(tmp_path / "eval" / "replays.csv")
    assert (replays.loc[replays["policy"] != "full", "compressions"] == 2).all()  # the prompt, then at 32 tokens


def test_lmeval_batched_continuations_hide_the_pads(tiny):
    """lm-eval's batched scoring runs its own forward over the compressed context's cache: the pads are hidden
    there too, so every log-likelihood equals the one request at a time through the decoder."""
    from fi_toolkit.evaluation.lmeval.batching import score_pairs
    from fi_toolkit.evaluation.lmeval.requests import score_continuation

    gen = torch.Generator().manual_seed(7)
    context = torch.randint(0, 256, (P,), generator=gen).tolist()
    pairs = [(context, torch.randint(0, 256, (m,), generator=gen).tolist()) for m in (3, 9, 5)]
    policy = SharedHeads(budget=24, window=W)
    batched = score_pairs(tiny.model, pairs, policy, 64, batch_size=3)
    for (context, continuation), (logp, greedy, _) in zip(pairs, batched):
        alone, alone_greedy, _ = score_continuation(tiny.model, context, continuation, policy, 64, CONFIG)
        assert logp == pytest.approx(alone, rel=1e-5) and greedy == alone_greedy


def test_dead_slots_influence_no_signal_or_feature(tiny, ids):
    """Overwrite every dead slot's key and value with noise: no live slot's signal or learned feature moves (the
    window attention, the accumulator, KeyDiff's anchor, ExpectedAttention's and TOVA's softmax)."""
    from fi_toolkit.policies.learned.features import LEARNED_FEATURES, learned_matrix
    from fi_toolkit.signals.tracker import SignalTracker

    tracker = SignalTracker(CONFIG, N, accumulate=True, token_signals=True)
    decoder = CompressedDecoder(tiny.model, SharedHeads(budget=40, window=W), N, CONFIG, tracker=tracker, interval=16)
    names = [n for n in LEARNED_FEATURES if n != "entropy_next"]  # (the other entropy convention: test_fit.py)
    try:
        with ragged_attention(tiny.model):
            decoder.prefill(ids[:P])
            decoder.feed(ids[P : P + 16 + 5])  # compressed at the prompt and after 16 tokens, then 5 more fed
        dead = decoder.row.dead
        assert dead is not None and all(bool(d.any()) for d in dead)

        def features():
            s = decoder.signals()
            return [learned_matrix(s, layer, names, "produced", 1.0) for layer in range(4)]

        before = features()
        gen = torch.Generator().manual_seed(0)
        for layer, d in zip(decoder.cache.layers, dead):
            for cached in (layer.keys, layer.values):
                cached[0][d] = 10 * torch.randn(int(d.sum()), cached.shape[-1], generator=gen)
        after = features()
    finally:
        decoder.close()
    for b, a, d in zip(before, after, dead):
        assert torch.equal(b[:, ~d], a[:, ~d])
        moved = (b[:, d] != a[:, d]).any(dim=1)  # the noise reached the dead slots' own key-based features
        assert moved[names.index("key_norm")] and moved[names.index("keydiff")]


def test_window_attention_over_dead_slots_is_over_the_live_ones_alone():
    from fi_toolkit.signals.formulas import attention_received, window_attention

    gen = torch.Generator().manual_seed(1)
    queries, keys = torch.randn(4, 6, 8, generator=gen), torch.randn(2, 30, 8, generator=gen)
    dead = torch.zeros(2, 30, dtype=torch.bool)
    dead[0, 10:14], dead[1, 3:4], dead[1, 20:23] = True, True, True
    got = window_attention(queries, keys, 0.3, 5, dead)
    received = attention_received(queries, keys, 0.3, dead)
    for h in range(2):
        live = torch.nonzero(~dead[h]).flatten()
        alone = window_attention(queries[2 * h : 2 * h + 2], keys[h : h + 1, live], 0.3, 5)[0]
        torch.testing.assert_close(got[h, live], alone)
        assert (got[h, dead[h]] == 0).all() and (received[h, dead[h]] == 0).all()
        deleted = attention_received(queries[2 * h : 2 * h + 2], keys[h : h + 1, live], 0.3)[0]
        torch.testing.assert_close(received[h, live], deleted)


def test_batched_decoding_of_uneven_heads_equals_each_row_alone(tiny):
    """Uneven per-head keep maps in a batch (fi_toolkit.compress.batched): three prompts of different lengths, each
    row's own dead slots beside its left padding, teacher-forced through compressions every 4 tokens; every row's
    logits (1e-4), kept positions per head and dead slots equal its own decoder's alone."""
    from fi_toolkit.compress.batched import BatchedDecoder

    policy = SharedHeads(budget=24, window=W)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (30, 64, 45)]
    fed = [torch.randint(3, 256, (14,), generator=gen).tolist() for _ in prompts]
    alone = []
    with ragged_attention(tiny.model):
        for prompt, tokens in zip(prompts, fed):
            decoder = CompressedDecoder(tiny.model, policy, 80, CONFIG, interval=4, keep_maps=True)
            logits = [decoder.prefill(torch.tensor(prompt))[0]] + [decoder.step(t) for t in tokens]
            decoder.close()
            alone.append((torch.stack(logits), decoder))
        batch = BatchedDecoder(tiny.model, policy, [80] * 3, CONFIG, interval=4, keep_maps=True)
        logits = [batch.prefill(prompts)] + [batch.step([fed[r][s] for r in range(3)]) for s in range(14)]
        batch.close()
    for r, (want, decoder) in enumerate(alone):
        assert (torch.stack([step[r] for step in logits]) - want).abs().max() < 1e-4
        mine = batch.rows[r]
        assert mine.row.dead is not None and mine.compression_steps == decoder.compression_steps
        assert len(mine.compressions) >= 3 and any(c.keep.uneven for c in mine.compressions)
        for a, b in zip(mine.compressions, decoder.compressions):
            assert all(torch.equal(p, q) for p, q in zip(a.positions, b.positions))
        assert all(torch.equal(p, q) for p, q in zip(mine.row.dead, decoder.row.dead))
