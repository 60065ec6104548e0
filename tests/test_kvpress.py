"""The bridge to kvpress, checked against kvpress itself: run by `make test-kvpress` in
.venv-kvpress (kvpress 0.5.5 pins transformers<5.3); skipped where kvpress is not installed.

The oracles are kvpress's own results, never the bridge's code: the compressed cache kvpress leaves
(keys compared bitwise with the original keys at the bridge's positions), the entries kvpress's
AdaKV attention patch overwrote, and the logits of kvpress's own masked decoding.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from transformers import DynamicCache  # noqa: E402

from fi_toolkit.eviction import KeepMap, shared_cache  # noqa: E402
from fi_toolkit.integrations.kvpress.bridge import make_press, parse_press_spec, restore, run_press  # noqa: E402
from fi_toolkit.model.attention import head_masked_attention  # noqa: E402
from fi_toolkit.probe.forward_influence import _continuation_hidden  # noqa: E402
from fi_toolkit.probe.selections import parse_selection  # noqa: E402
from fi_toolkit.signals.trace import SignalConfig, trace_prefix  # noqa: E402

pytestmark = [pytest.mark.kvpress, pytest.mark.smollm]

P = 1024  # the setting: SmolLM2, 1,024 tokens, keep 25 %


@pytest.fixture(scope="module")
def trace(smollm, alice):
    return trace_prefix(smollm.model, alice.ids, P, SignalConfig())


def bridge(spec, smollm, alice):
    return run_press(make_press(parse_press_spec(spec, spec)), smollm.model, alice.ids, P, spec)


def per_head_equal(a: KeepMap, b: KeepMap) -> tuple[int, int]:
    """(layer x KV-head sets that are equal, all sets)."""
    same = sum(bool(torch.equal(x[h], y[h])) for x, y in zip(a.keep, b.keep) for h in range(x.shape[0]))
    return same, sum(x.shape[0] for x in a.keep)


@pytest.mark.parametrize("window, kernel", [(32, 7), (64, 5)])  # the project's defaults; kvpress's
def test_snapkv_press_keeps_exactly_the_project_snapkv_entries(window, kernel, smollm, alice, trace):
    if (window, kernel) != (32, 7):
        trace = trace_prefix(smollm.model, alice.ids, P, SignalConfig(window=window, pool_kernel=kernel))
    ours = parse_selection("policy:snapkv@keep=0.25")[0].resolve(trace)
    theirs = parse_selection(f"kvpress:SnapKVPress@keep=0.25:window_size={window},kernel_size={kernel}")[0].resolve(
        trace, model=smollm.model, ids=alice.ids
    )
    assert per_head_equal(ours, theirs) == (90, 90)  # 30 layers x 3 KV heads
    assert theirs.n_kept(P) == ours.n_kept(P) == 256


def test_a_press_budget_is_the_press_the_old_bare_ratio_was_bit_for_bit(smollm, alice):
    """keep=0.25 and remove=0.75 build the press the bare @0.75 built (kvpress's compression_ratio 0.75, the share
    removed) and keep the same entries, bit for bit; keep=0.7 gives the float 0.3 exactly, not 1 - 0.7."""
    old = kvpress.SnapKVPress(compression_ratio=0.75)  # what kvpress:SnapKVPress@0.75 made
    new = [make_press(parse_press_spec(s, s)) for s in ("SnapKVPress@keep=0.25", "SnapKVPress@remove=0.75")]
    assert new == [old, old] and all(p.compression_ratio == 0.75 for p in new)
    assert make_press(parse_press_spec("SnapKVPress@keep=0.7", "t")).compression_ratio == 0.3
    theirs = run_press(old, smollm.model, alice.ids, P, "old").keep_map
    for press in new:
        ours = run_press(press, smollm.model, alice.ids, P, "new").keep_map
        assert all(torch.equal(a, b) for a, b in zip(ours.keep, theirs.keep)) and ours.counts() == [256] * 30


PER_LAYER = "[" + ",".join(["0.6", "0.9"] * 15) + "]"  # 30 layers, alternating


@pytest.mark.parametrize(
    "spec",
    [
        "TOVAPress@keep=0.25",
        "StreamingLLMPress@keep=0.25",
        "ExpectedAttentionPress@keep=0.25",
        "CriticalKVPress/SnapKVPress@keep=0.25",
        "ChunkKVPress/SnapKVPress@keep=0.25",
        "BlockPress/SnapKVPress@keep=0.25",
        "ChunkPress/SnapKVPress@keep=0.25",
        f"PerLayerCompressionPress/SnapKVPress@keep=0.25:compression_ratios={PER_LAYER}",
    ],
)
def test_keep_map_is_what_kvpress_left_in_the_compressed_cache(spec, smollm, alice, trace):
    """The original keys and values gathered at the bridge's positions equal, bitwise, what kvpress left in its
    cache, layer by layer: every ScorerPress, and wrappers that choose for it (two stages, chunks, blocks,
    per-layer ratios)."""
    run = bridge(spec, smollm, alice)
    assert not run.keep_map.uneven
    for layer, (k, v) in enumerate(zip(trace.keys, trace.values)):  # the project's own, uncompressed prefill
        order = run.order[layer]
        index = order[None, :, :, None].expand(1, -1, -1, k.shape[-1])
        assert torch.equal(k.gather(2, index), run.cache.layers[layer].keys)  # bitwise
        assert torch.equal(v.gather(2, index), run.cache.layers[layer].values)
        assert torch.equal(torch.sort(order, dim=-1).values, run.keep_map.keep[layer])
    if spec.startswith("PerLayer"):  # kvpress's count per layer, from the layer's own ratio
        assert run.keep_map.counts() == [int(P * 0.4), int(P * 0.1)] * 15
    elif spec.startswith("ChunkKV"):  # whole chunks: int(52 * 0.25) = 13 of 51 chunks of 20 and a last one of 4
        assert set(run.keep_map.counts()) <= {260, 244}
    else:
        assert run.keep_map.counts() == [256] * 30
    if spec.startswith("StreamingLLM"):  # what StreamingLLM means, written out: 4 sinks and the last 252
        expected = torch.cat([torch.arange(4), torch.arange(P - 252, P)])
        assert all(torch.equal(k, expected.expand(3, -1)) for k in run.keep_map.keep)


def test_a_press_that_merges_values_or_prunes_channels_is_refused(smollm, alice):
    from fi_toolkit.errors import FIError

    for spec in ("MergingPress/SnapKVPress@keep=0.25", "ThinKPress:key_channel_compression_ratio=0.5"):
        with pytest.raises(FIError, match="changes the kept keys or values"):
            bridge(spec, smollm, alice)


def kvpress_masked_decoding(spec: str, model, ids) -> tuple[torch.Tensor, DynamicCache]:
    """kvpress's own: its prefill of ``ids[:P]`` under the press, then the 64-token continuation ``ids[P:P + 64]``
    in one forward, its AdaKV attention patch masking the evicted entries -> (float logits ``[64, V]``, its cache)."""
    cont = ids[P : P + 64][None]
    positions = torch.arange(P, P + 64)[None]
    cache = DynamicCache(config=model.config)
    press = make_press(parse_press_spec(spec, spec))
    with torch.no_grad():
        with press(model):  # kvpress's prefill: its hook records the masked entries on each layer
            model.model(input_ids=ids[:P][None], past_key_values=cache, use_cache=True)
        try:  # kvpress's decoding: the patched attention overwrites the masked keys in the cache
            theirs = model(input_ids=cont, position_ids=positions, past_key_values=cache).logits[0]
        finally:
            restore(model, [layer.self_attn for layer in model.model.layers])
    return theirs.float(), cache


@pytest.mark.parametrize("spec", ["AdaKVPress/SnapKVPress@keep=0.25", "CriticalAdaKVPress/SnapKVPress@keep=0.25"])
def test_adakv_keep_map_is_what_kvpress_masks_and_the_probe_masks_it_exactly(spec, smollm, alice, trace):
    """AdaKV keeps the whole cache and, while decoding, overwrites every evicted key with a fake key
    (kvpress's attention patch). The oracle runs kvpress's own prefill and a 64-token continuation:
    the keys it left intact are exactly the bridge's kept entries, and its logits equal the probe's
    per-head masked forward with the bridge's (uneven) keep map."""
    keep_map = bridge(spec, smollm, alice).keep_map
    assert keep_map.uneven and abs(keep_map.n_kept(P) - 256) < 1e-9
    counts = torch.stack(keep_map.head_counts)
    assert int(counts.min()) < int(counts.max())  # heads really keep different counts

    model, ids = smollm.model, alice.ids
    cont = ids[P : P + 64][None]
    theirs, cache = kvpress_masked_decoding(spec, model, ids)
    visible = keep_map.visible(P)
    for layer, original in enumerate(trace.keys):
        left = cache.layers[layer].keys[0, :, :P]
        intact = (left == original[0]).all(dim=-1)  # [Hkv, P]: keys kvpress did not overwrite
        assert torch.equal(intact, visible[layer])

    with torch.no_grad(), head_masked_attention(model, visible):
        hidden = _continuation_hidden(
            model,
            shared_cache(trace.keys, trace.values, 1, model.config),
            cont,
            P,
            torch.ones(1, P, dtype=torch.bool),
            torch.arange(64),
            64,
        )
        ours = model.lm_head(hidden)[0]
    assert (ours - theirs).abs().max() < 1e-4


def test_probe_measures_presses_beside_policies(smollm, alice, trace):
    from fi_toolkit.probe.chunks import Chunk
    from fi_toolkit.probe.experiment import probe_document

    table = probe_document(
        smollm,
        alice,
        [Chunk(P, P + 128)],
        [
            "policy:snapkv@keep=0.25",
            "kvpress:SnapKVPress@keep=0.25:window_size=32,kernel_size=7",
            "kvpress:TOVAPress@keep=0.25",
            "kvpress:AdaKVPress/SnapKVPress@keep=0.25",
        ],
        trace=trace,
    )
    fi = table.set_index("selection")["fi"]
    # the same entries through two paths (policy gather / press gather): the same FI, bit for bit
    assert fi["policy:snapkv@keep=0.25"] == fi["kvpress:SnapKVPress@keep=0.25:window_size=32,kernel_size=7"]
    assert (fi.drop(["control:null", "control:reorder"]) > 0).all()
    assert table.set_index("selection").loc["kvpress:AdaKVPress/SnapKVPress@keep=0.25", "n_kept"] == 256


def test_a_press_that_rewrites_keys_is_refused_in_one_line(smollm, alice):
    from fi_toolkit.errors import FIError

    with pytest.raises(FIError, match="changes the kept keys"):
        bridge("KeyRerotationPress/StreamingLLMPress@keep=0.5", smollm, alice)


# --- InfoKV as a kvpress press -------------------------------------------------------------------


def prefill(model, press, ids):
    """kvpress's own prefill under ``press`` (as its pipeline runs it) -> the cache it leaves."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), press(model):
        model.model(input_ids=ids[:P][None], past_key_values=cache)
    restore(model, [layer.self_attn for layer in model.model.layers])
    return cache


def cache_holds(cache, trace, keep_map: KeepMap) -> bool:
    """The cache holds, bitwise, the original keys and values at ``keep_map``'s positions (sorted)."""
    for layer, (k, v) in enumerate(zip(trace.keys, trace.values)):
        index = keep_map.keep[layer][None, :, :, None].expand(1, -1, -1, k.shape[-1])
        if not (
            torch.equal(k.gather(2, index), cache.layers[layer].keys)
            and torch.equal(v.gather(2, index), cache.layers[layer].values)
        ):
            return False
    return True


def test_infokv_press_keeps_exactly_the_project_infokv_keep_map(smollm, alice, trace):
    from fi_toolkit.integrations.kvpress.press import InfoKVPress

    press = InfoKVPress(compression_ratio=0.75, alpha=0.9, tau=1.0, top_k=256)
    cache = prefill(smollm.model, press, alice.ids)
    ours = parse_selection("policy:infokv@keep=256")[0].resolve(trace)  # the project's trace and policy
    assert per_head_equal(press.keep_map, ours) == (90, 90)
    assert cache_holds(cache, trace, ours)  # what kvpress's cache holds, against the trace's keys
    # and the entropy term matters here: alpha=0.9 differs from SnapKV on some heads
    snap = parse_selection("policy:snapkv@keep=256")[0].resolve(trace)
    assert per_head_equal(ours, snap)[0] < 90


def test_infokv_press_with_alpha_1_keeps_exactly_snapkv_press(smollm, alice, trace):
    from fi_toolkit.integrations.kvpress.press import InfoKVPress

    press = InfoKVPress(compression_ratio=0.75, alpha=1.0)
    cache = prefill(smollm.model, press, alice.ids)
    snap = bridge("SnapKVPress@keep=0.25:window_size=32,kernel_size=7", smollm, alice)
    assert per_head_equal(press.keep_map, snap.keep_map) == (90, 90)
    for layer in range(30):  # kvpress's SnapKV cache, put in position order, equals InfoKVPress's cache
        order = torch.argsort(snap.order[layer], dim=-1)[None, :, :, None].expand(1, -1, -1, 64)
        assert torch.equal(snap.cache.layers[layer].keys.gather(2, order), cache.layers[layer].keys)


@pytest.mark.parametrize(
    "spec, selection",
    [
        ("h2o", "policy:h2o@keep=256"),
        (
            "learned:path=analyses/results/learned/model.json",
            "policy:learned@keep=256:path=analyses/results/learned/model.json",
        ),
    ],
)
def test_policy_press_keeps_exactly_the_project_policy_keep_map(spec, selection, smollm, alice, trace):
    """Any project policy as a press (the learned one included): kvpress's prefill under it leaves, bitwise, the
    trace's keys and values at the keep map the probe's selection of the same policy resolves on the trace."""
    from fi_toolkit.integrations.kvpress.press import PolicyPress

    press = PolicyPress(compression_ratio=0.75, policy_spec=spec)
    cache = prefill(smollm.model, press, alice.ids)
    ours = parse_selection(selection)[0].resolve(trace)
    assert per_head_equal(press.keep_map, ours) == (90, 90)
    assert cache_holds(cache, trace, ours)


def test_policy_press_masks_a_budget_shared_over_heads_as_adakv_does(smollm, alice, trace):
    """``heads=global`` keeps different counts per KV head: the press leaves the cache whole and lists, per layer,
    exactly the (batch, head, position) entries the probe's keep map drops, in kvpress's ``masked_key_indices``."""
    from fi_toolkit.integrations.kvpress.press import PolicyPress

    model = "analyses/results/learned-heads/model.json"
    press = PolicyPress(compression_ratio=0.75, policy_spec=f"learned:path={model},heads=global")
    cache = DynamicCache(config=smollm.model.config)
    with torch.no_grad(), press(smollm.model):
        smollm.model.model(input_ids=alice.ids[:P][None], past_key_values=cache)
    ours = parse_selection(f"policy:learned@keep=256:path={model},heads=global")[0].resolve(trace)
    assert ours.uneven and press.keep_map.uneven
    for layer, attention in enumerate(smollm.model.model.layers):
        assert cache.layers[layer].keys.shape[2] == P  # nothing gathered
        batch, heads, positions = attention.self_attn.masked_key_indices
        dropped = {(int(h), int(p)) for h, p in zip(heads, positions)}
        counts = ours.head_counts[layer]
        expected = {
            (h, p) for h in range(3) for p in range(P) if p not in set(ours.keep[layer][h, : counts[h]].tolist())
        }
        assert dropped == expected and not batch.any()
    restore(smollm.model, [layer.self_attn for layer in smollm.model.model.layers])


@pytest.mark.parametrize("spec", ["kvpress:TOVAPress", "fi-oracle", "no-such-policy", "h2o:nope=1"])
def test_policy_press_refuses_what_is_not_a_project_policy_in_one_line(spec):
    from fi_toolkit.errors import FIError
    from fi_toolkit.integrations.kvpress.press import PolicyPress

    with pytest.raises(FIError) as info:
        PolicyPress(compression_ratio=0.5, policy_spec=spec)
    assert "\n" not in str(info.value)


def readme_snippet() -> str:
    """The kvpress guide's InfoKVPress snippet (docs/guides/kvpress.md), verbatim: the ```python block that
    builds ``InfoKVPress``."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "kvpress.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    found = [b for b in blocks if "InfoKVPress(compression_ratio" in b]
    assert len(found) == 1, "the kvpress guide holds one InfoKVPress snippet"
    return found[0]


def test_infokv_press_pipeline_answer_equals_the_project_compressor():
    """kvpress's pipeline with InfoKVPress (the kvpress guide's snippet, run as written) against fi_toolkit's
    CompressedDecoder with InfoKV at the same budget, question-agnostic (the context is compressed before
    the question is seen), greedy, kvpress's default 50 new tokens."""
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.compress.sampling import GREEDY
    from fi_toolkit.documents import bundled_path
    from fi_toolkit.model.attention import ragged_attention

    context = bundled_path("alice").read_text()[2000:6000]
    question = "Who is the story about, and what does she do?"
    scope = {"context": context, "question": question}
    exec(readme_snippet(), scope)  # context and question given, as the guide says
    press, pipe, lm = scope["press"], scope["pipe"], scope["lm"]
    model = lm.model
    new = 50

    inputs = pipe.preprocess(context, questions=[question], answer_prefix="", max_context_length=10**6)
    ctx, q = inputs["context_ids"][0], inputs["questions_ids"][0][0]
    n = ctx.numel()
    decoder = CompressedDecoder(model, press.policy(n), capacity=n + q.numel() + new)
    try:
        _, keep = decoder.prefill(ctx)
        assert per_head_equal(keep, press.keep_map) == (90, 90)
        eos = model.generation_config.eos_token_id
        eos = set(eos) if isinstance(eos, list) else {eos}  # kvpress stops on these, the token included
        with ragged_attention(model):
            tokens = decoder.decode(decoder.feed(q, prompt=q.numel())[-1], GREEDY, new, eos).tokens
    finally:
        decoder.close()
    ours = lm.tokenizer.decode(tokens, skip_special_tokens=True)
    print(f"{n} context tokens, answer: {ours!r}")
    assert len(scope["answer"]) > 0 and scope["answer"] == ours


# --- presses in fi eval ----------------------------------------------------------------------------


def test_a_press_in_fi_eval_compresses_the_prompt_as_the_bridge_does_then_at_every_interval(smollm, alice):
    from fi_toolkit.compress.replay import replay
    from fi_toolkit.policies.registry import resolve

    policy = resolve("kvpress:TOVAPress", budget="keep=0.25")
    assert policy.name == "kvpress:TOVAPress" and not policy.prefill_only
    result = replay(smollm.model, alice.ids[:320], 256, policy, interval=16)
    assert [c.step for c in result.compressions] == [0, 16, 32, 48]  # the prompt, then every interval
    run = run_press(make_press(parse_press_spec("TOVAPress@keep=0.25", "t")), smollm.model, alice.ids, 256, "t")
    assert per_head_equal(result.compressions[0].keep, run.keep_map) == (90, 90)
    assert run.keep_map.counts() == [64] * 30
    assert [c.keep.counts()[0] for c in result.compressions[1:]] == [68, 72, 76]  # a quarter of 272, 288, 304
    assert float(result.kl.mean()) > 0
    masking = resolve("kvpress:AdaKVPress/SnapKVPress", budget="keep=0.25")
    assert masking.prefill_only  # kvpress applies it at the prefill only


def test_an_adakv_press_decodes_as_kvpress_masked_decoding(smollm, alice):
    """The decode loop holds the press's uneven prompt map padded and hides the pads per head: the continuation's
    logits are kvpress's own masked decoding's (which overwrites the evicted keys in its full cache)."""
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.model.attention import ragged_attention
    from fi_toolkit.policies.registry import resolve

    model, ids = smollm.model, alice.ids
    theirs, _ = kvpress_masked_decoding("AdaKVPress/SnapKVPress@keep=0.25", model, ids)
    policy = resolve("kvpress:AdaKVPress/SnapKVPress", budget="keep=0.25")  # compression_ratio 0.75 of 1,024
    decoder = CompressedDecoder(model, policy, P + 64, interval=16)
    try:
        with ragged_attention(model):
            _, keep = decoder.prefill(ids[:P])
            ours = decoder.feed(ids[P : P + 64])
    finally:
        decoder.close()
    assert keep.uneven and decoder.row.dead is not None and decoder.compression_steps == [0]  # the prompt only
    assert (ours - theirs).abs().max() < 1e-4


# --- the command line ------------------------------------------------------------------------------


def test_fi_probe_with_presses_on_the_command_line(tmp_path, capsys):
    from cli_runner import run_cli

    out = tmp_path / "run"
    code, stdout, err = run_cli(
        [
            "probe",
            "alice",
            "--chunk",
            "256:320",
            "--select",
            "kvpress:TOVAPress@keep=0.25",
            "--select",
            "kvpress:AdaKVPress/SnapKVPress@keep=0.5:window_size=16",
            "--select",
            "policy:infokv@0.25",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code in (0, None), err
    import pandas as pd

    table = pd.read_csv(out / "fi.csv").set_index("selection")
    assert table.loc["kvpress:TOVAPress@keep=0.25", "n_kept"] == 64
    assert table.loc["kvpress:TOVAPress@keep=0.25", "budget"] == "keep=0.25"  # as policy:infokv@keep=0.25's
    assert table.loc["kvpress:AdaKVPress/SnapKVPress@keep=0.5:window_size=16", "n_kept"] == 128
    assert (table.loc[["kvpress:TOVAPress@keep=0.25", "policy:infokv@keep=0.25"], "fi"] > 0).all()


def test_a_press_kvpress_cannot_run_here_is_one_error_line(tmp_path, capsys):
    from cli_runner import run_cli

    code, _, err = run_cli(
        [
            "probe",
            "alice",
            "--chunk",
            "256:320",
            "--select",
            "kvpress:SnapKVPress@keep=0.5",
            "--select",
            "kvpress:QFilterPress@keep=0.5",
            "--out",
            str(tmp_path / "run"),
        ],
        capsys,
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "QFilterPress@keep=0.5: needs a download" in lines[0] and not (tmp_path / "run").exists()
