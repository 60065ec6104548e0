"""The decoding oracle: ``fi-oracle`` in replays of text looks ahead to the next
``interval`` tokens at each compression. Checked against the full cache (full budget), against an
independent autograd computation of the sampled Fisher estimate on the decoder's compressed cache (own
bias hooks, own label draws, continuation at its true absolute positions; no project code), for never
reading past ``t + interval``, and for its refusals where no continuation is known."""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import DynamicCache

import fi_toolkit.compress.lookahead as lookahead
from fi_toolkit.compress.decoder import CompressedDecoder, generate
from fi_toolkit.compress.replay import SharedPrompt, replay
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation import TextSetting, evaluate_text, summarise_replays
from fi_toolkit.policies import FIOracle, parse_policy
from fi_toolkit.signals.config import SignalConfig

P, W, INTERVAL, N = 64, 8, 32, 200
CONFIG = SignalConfig(window=W)


def oracle(budget="keep=0.5", **options) -> FIOracle:
    return parse_policy(
        "fi-oracle" + (":" + ",".join(f"{k}={v}" for k, v in options.items()) if options else ""),
        budget,
        W,
        future=True,
    )


@pytest.fixture(scope="module")
def ids(tiny_ids):
    return tiny_ids[:N].clone()


def record_lookahead(monkeypatch) -> list[dict]:
    """Every call of the oracle's scorer, with its inputs (cloned) and its scores."""
    calls, original = [], lookahead.lookahead_scores

    def spy(policy, model, keys, values, cont, seen, kept, protected, window, block=512):
        scores = original(policy, model, keys, values, cont, seen, kept, protected, window, block)
        calls.append(
            {
                "keys": [k.clone() for k in keys],
                "values": [v.clone() for v in values],
                "cont": cont.clone(),
                "seen": seen,
                "scores": scores.clone(),
                "samples": policy.samples,
            }
        )
        return scores

    monkeypatch.setattr(lookahead, "lookahead_scores", spy)
    return calls


def test_full_budget_replays_exactly_the_full_cache(tiny, ids):
    full = replay(tiny.model, ids, P, None, INTERVAL, CONFIG, keep_logits=True)
    mine = replay(tiny.model, ids, P, oracle("keep=1.0"), INTERVAL, CONFIG, keep_logits=True)
    assert mine.compressions == []
    assert torch.equal(mine.logits_compressed, full.logits_compressed)
    assert torch.equal(mine.kl, full.kl)


def independent_fisher(model, keys, values, cont, start, samples, seed=0) -> torch.Tensor:
    """The sampled Fisher estimate per (layer, KV head, slot) written here: a leaf bias ``B [L, H_kv, n]``
    added by forward pre-hooks to every attention module's mask on the cache's ``n`` keys, the continuation
    fed at positions ``start ..``, labels drawn from the model's own distribution (a generator seeded
    ``seed``, one multinomial draw of ``samples`` per row, as the estimator documents), and
    ``1/2 mean_s (d sum_t log P_t(y_ts) / dB)^2 / m`` -> float64 ``[L, H_kv, n]``."""
    n_layers, hkv, n = len(keys), keys[0].shape[1], keys[0].shape[2]
    m = cont.numel()
    groups = model.config.num_attention_heads // hkv
    bias = torch.zeros(n_layers, hkv, n, requires_grad=True)
    minimum = torch.finfo(torch.float32).min
    causal = torch.zeros(m, m).masked_fill_(torch.ones(m, m, dtype=torch.bool).triu(1), minimum)
    base = torch.cat([torch.zeros(m, n), causal], dim=1)[None, None]  # [1, 1, m, n + m]
    hooks = []
    for layer, block in enumerate(model.model.layers):

        def pre(module, args, kwargs, layer=layer):
            extra = torch.nn.functional.pad(bias[layer].repeat_interleave(groups, dim=0), (0, m))  # [H_q, n + m]
            kwargs["attention_mask"] = kwargs["attention_mask"] + extra[None, :, None, :]
            return args, kwargs

        hooks.append(block.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    try:
        cache = DynamicCache(ddp_cache_data=[(k.clone(), v.clone()) for k, v in zip(keys, values)], config=model.config)
        with torch.enable_grad():
            logits = model(
                input_ids=cont[None],
                position_ids=torch.arange(start, start + m)[None],
                attention_mask=base,
                **{keyword: cache},
            ).logits[0]
            logp = torch.log_softmax(logits.float(), dim=-1)
            generator = torch.Generator().manual_seed(seed)
            labels = torch.multinomial(
                torch.softmax(logits.detach().float(), -1), samples, replacement=True, generator=generator
            )
            out = torch.zeros(n_layers, hkv, n, dtype=torch.float64)
            for s in range(samples):
                (g,) = torch.autograd.grad(logp.gather(1, labels[:, s : s + 1]).sum(), bias, retain_graph=True)
                out += 0.5 * g.double().square() / m
    finally:
        for h in hooks:
            h.remove()
    return out / samples


def test_fisher_scores_match_an_independent_autograd_computation(tiny, ids, monkeypatch):
    calls = record_lookahead(monkeypatch)
    result = replay(tiny.model, ids, P, oracle(samples=6), INTERVAL, CONFIG)
    assert [c.step for c in result.compressions] == [0, 32, 64, 96, 128]
    assert [c["seen"] for c in calls] == [P + c.step for c in result.compressions]
    call = calls[1]  # the first compression of a compressed cache: its slots are not its positions
    n = call["keys"][0].shape[2]
    assert n == 32 + INTERVAL and call["seen"] == P + INTERVAL  # 32 kept of the prompt, then 32 fed
    assert torch.equal(call["cont"], ids[P + INTERVAL : P + 2 * INTERVAL])
    expected = independent_fisher(tiny.model, call["keys"], call["values"], call["cont"], call["seen"], 6)
    torch.testing.assert_close(call["scores"], expected, rtol=2e-3, atol=1e-6 * float(expected.max()))
    # the same with the continuation at the cache's length (the rotary phase a slot count would give) differs
    wrong = independent_fisher(tiny.model, call["keys"], call["values"], call["cont"], n, 6)
    assert (wrong - expected).abs().max() > 0.05 * expected.max()
    # and the oracle kept, per layer and head, the window and the top of these scores
    keep = result.compressions[1].keep
    for layer in range(len(keep.keep)):
        for head in range(keep.keep[layer].shape[0]):
            cand = call["scores"][layer, head, : n - W]
            top = torch.sort(cand, descending=True, stable=True).indices[: keep.keep[layer].shape[1] - W]
            assert set(keep.keep[layer][head].tolist()) == set(top.tolist()) | set(range(n - W, n))


def test_never_reads_past_the_next_interval(tiny, ids):
    policy = oracle(samples=4)
    base = replay(tiny.model, ids, P, policy, INTERVAL, CONFIG)
    maps = [c.keep.keep for c in base.compressions]
    changed_later = 0
    for i, c in enumerate(base.compressions[:-1]):
        horizon = c.seen + INTERVAL
        shuffled = ids.clone()
        tail = shuffled[horizon:]
        shuffled[horizon:] = tail[torch.randperm(tail.numel(), generator=torch.Generator().manual_seed(i))]
        assert not torch.equal(shuffled, ids)
        other = replay(tiny.model, shuffled, P, policy, INTERVAL, CONFIG)
        for a, b in zip(maps[: i + 1], [o.keep.keep for o in other.compressions[: i + 1]]):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        changed_later += any(not torch.equal(x, y) for x, y in zip(maps[i + 1], other.compressions[i + 1].keep.keep))
    assert changed_later >= 1, "shuffling the future never changed a later keep map: the check could not fail"


def test_rounds_and_the_shared_prompt(tiny, ids):
    one = replay(tiny.model, ids, P, oracle(samples=4), INTERVAL, CONFIG)
    shared = SharedPrompt(tiny.model, ids, P, CONFIG)
    again = replay(tiny.model, ids, P, oracle(samples=4), INTERVAL, CONFIG, shared=shared)
    assert torch.equal(one.kl, again.kl)
    two = replay(tiny.model, ids, P, oracle(samples=4, rounds=3), INTERVAL, CONFIG)
    assert [c.counts() for c in two.compressions] == [c.counts() for c in one.compressions]
    assert two.compressions[0].keep.label == "policy:fi-oracle:samples=4,rounds=3@keep=0.5"


def test_refused_where_no_continuation_is_known(tiny, ids):
    with pytest.raises(FIError, match="oracle that sees the future text"):
        parse_policy("fi-oracle", "keep=0.5", W)  # fi generate and fi eval --task parse so
    with pytest.raises(FIError, match="oracle that sees the future text"):
        generate(
            tiny.model,
            None,
            ids[:P],
            FIOracle(budget="keep=0.5", window=W),
            max_new_tokens=40,
            interval=16,
            config=CONFIG,
        )
    decoder = CompressedDecoder(tiny.model, FIOracle(budget="keep=0.5", window=W), P + 40, CONFIG)
    with pytest.raises(FIError, match="cannot compress while generating"):
        decoder.prefill(ids[:P])
    decoder.close()
    for bad, message in [
        ("estimator=exact", "estimator=exact is the prefill oracle's"),
        ("chunk=64:96", "chunk=64:96 is the prefill oracle's"),
    ]:
        with pytest.raises(FIError, match=message):
            replay(tiny.model, ids, P, oracle(**dict([bad.split("=")])), INTERVAL, CONFIG)


def test_eval_marks_the_oracle_and_skips_its_free_generation(tiny, ids):
    policies = [parse_policy("snapkv", "keep=0.5", W), oracle(samples=2)]
    tables = evaluate_text(
        tiny.model, ids, "doc", policies, TextSetting(prompt=P, length=N, interval=INTERVAL, free_tokens=8), CONFIG
    )
    replays = tables["replays"].set_index("policy")
    assert list(replays.index) == ["full", "snapkv", "fi-oracle:samples=2"]
    assert np.isfinite(replays.loc["snapkv", "free_agreement"])
    assert np.isnan(replays.loc["fi-oracle:samples=2", "free_agreement"])
    summary = summarise_replays(tables["replays"], n_resamples=0)
    assert summary.set_index("policy")["oracle"].to_dict() == {
        "full": False,
        "snapkv": False,
        "fi-oracle:samples=2": True,
    }
    hand = pd.DataFrame(
        {
            "future": "document",
            "policy": ["fi-oracle", "random"],
            "budget": "keep=0.25",
            "retention": 0.25,
            "mean_kl": [0.1, 0.3],
            "top1_agreement": 1.0,
            "delta_nll": 0.0,
            "free_first_divergence": np.nan,
            "kept_share": 0.3,
            "document": "d",
        }
    )
    assert summarise_replays(hand, 0)["oracle"].tolist() == [True, False]


def test_replay_headroom_on_a_hand_made_table():
    from fi_toolkit.evaluation import replay_headroom

    rows = []
    kl = {
        "random": [0.5, 0.6, 0.7],
        "random:seed=1": [0.3, 0.4, 0.5],
        "snapkv": [0.3, 0.35, 0.4],
        "fi-oracle": [0.2, 0.2, 0.2],
        "full": [0.0, 0.0, 0.0],
    }
    for policy, values in kl.items():
        for doc, v in zip("abc", values):
            rows.append({"document": doc, "future": "document", "policy": policy, "budget": "keep=0.25", "mean_kl": v})
    table = replay_headroom(pd.DataFrame(rows), resamples=200).set_index("policy")
    assert sorted(table.index) == ["fi-oracle", "random", "snapkv"]
    # random per document: 0.4, 0.5, 0.6 (mean 0.5); snapkv 0.35; oracle 0.2: (0.5 - 0.35) / (0.5 - 0.2)
    assert table.loc["snapkv", "kl_random"] == pytest.approx(0.5)
    assert table.loc["snapkv", "headroom"] == pytest.approx(0.5)
    assert table.loc["fi-oracle", "headroom"] == pytest.approx(1.0)
    assert table.loc["random", "headroom"] == pytest.approx(0.0)
    assert table.loc[["snapkv"], ["ci_low", "ci_high"]].isna().all(axis=None)  # three documents: no interval
    assert (table["n_documents"] == 3).all()
    one_doc = replay_headroom(pd.DataFrame([r for r in rows if r["document"] == "a"]), resamples=200)
    assert one_doc["ci_low"].isna().all()
    assert replay_headroom(pd.DataFrame([r for r in rows if r["policy"] != "fi-oracle"])).empty


def test_replay_headroom_carries_the_oracles_seed_noise():
    """``fi-oracle:seed=1`` replayed beside ``fi-oracle`` is no reference or row of its own; beside each headroom the
    standard deviations over the two label seeds of the oracle's mean KL and of the headroom (recomputed here)."""
    from fi_toolkit.evaluation import replay_headroom

    kl = {
        "random": [0.5, 0.6, 0.7],
        "snapkv": [0.3, 0.35, 0.4],
        "fi-oracle": [0.2, 0.2, 0.2],
        "fi-oracle:seed=1": [0.25, 0.2, 0.3],
    }
    rows = [
        {"document": doc, "future": "document", "policy": policy, "budget": "keep=0.25", "mean_kl": v}
        for policy, values in kl.items()
        for doc, v in zip("abc", values)
    ]
    table = replay_headroom(pd.DataFrame(rows), resamples=200).set_index("policy")
    assert sorted(table.index) == ["fi-oracle", "random", "snapkv"] and set(table["oracle"]) == {"fi-oracle"}
    r, s, o0, o1 = (float(np.mean(kl[p])) for p in ("random", "snapkv", "fi-oracle", "fi-oracle:seed=1"))
    row = table.loc["snapkv"]
    assert row["headroom"] == pytest.approx((r - s) / (r - o0)) and row["oracle_seeds"] == 2
    assert row["kl_oracle_seed_sd"] == pytest.approx(abs(o0 - o1) / np.sqrt(2))
    assert row["headroom_seed_sd"] == pytest.approx(abs((r - s) / (r - o0) - (r - s) / (r - o1)) / np.sqrt(2))
    alone = replay_headroom(pd.DataFrame([x for x in rows if x["policy"] != "fi-oracle:seed=1"]), resamples=200)
    assert (alone["oracle_seeds"] == 1).all() and alone["headroom_seed_sd"].isna().all()
