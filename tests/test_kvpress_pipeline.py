"""kvpress's presses run as kvpress runs them, checked against kvpress itself (`make test-kvpress`, .venv-kvpress;
skipped where kvpress is not installed): the presses that score after the prefill against kvpress's pipeline, the
survey of every press kvpress exports, and presses in the decode loop against kvpress's decoding press. The bridge's
keep maps, fi eval and the command line: tests/test_kvpress.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from transformers import DynamicCache  # noqa: E402

from fi_toolkit.integrations.kvpress.bridge import make_press, parse_press_spec, restore, run_press  # noqa: E402
from fi_toolkit.signals.trace import SignalConfig, trace_prefix  # noqa: E402

pytestmark = [pytest.mark.kvpress, pytest.mark.smollm]


# --- presses that score after the prefill, and every press of kvpress ----------------------------


def pipeline_cache(model, tokenizer, press, context: str):
    """kvpress's own pipeline on ``context`` (a short question, 2 new tokens) -> (the context's token ids, the cache
    it leaves, and the context's keys from a plain prefill of the same ids, per layer)."""
    from kvpress import KVPressTextGenerationPipeline

    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    ids = pipe.preprocess(context, questions=["Who?"], answer_prefix="", max_context_length=10**6)["context_ids"][0]
    cache = DynamicCache(config=model.config)
    pipe(context, question="Who?", press=press, cache=cache, max_new_tokens=2)
    plain = DynamicCache(config=model.config)
    with torch.no_grad():
        model.model(input_ids=ids[None], past_key_values=plain)
    restore(model, [layer.self_attn for layer in model.model.layers])
    return ids, cache, [layer.keys for layer in plain.layers]


@pytest.mark.parametrize("name", ["KVzipPress", "KVgradPress"])
@pytest.mark.parametrize("model_kind", ["tiny", "smollm"])
def test_a_press_that_scores_after_the_prefill_keeps_what_kvpress_pipeline_leaves(name, model_kind, smollm):
    """KVzip and KVgrad replay the context through the model after the prefill, then mask entries per layer and
    head. kvpress's pipeline overwrites the masked keys with fake ones while it decodes the question: the keys it
    left intact are exactly the bridge's kept entries (a tiny random Llama with SmolLM2's vocabulary and
    tokenizer, and SmolLM2 itself)."""
    from fi_toolkit.documents import bundled_path
    from fi_toolkit.model.loading import tiny_model

    model = smollm.model
    if model_kind == "tiny":
        model = tiny_model(seed=5, vocab=smollm.model.config.vocab_size).model
        model.config.name_or_path = smollm.model.config.name_or_path  # KVzip loads the tokenizer from it
    context = bundled_path("alice").read_text()[3000:4200]
    ids, cache, plain = pipeline_cache(
        model, smollm.tokenizer, make_press(parse_press_spec(f"{name}@keep=0.25", name)), context
    )
    n = ids.numel()
    run = run_press(make_press(parse_press_spec(f"{name}@keep=0.25", name)), model, ids, n, name)
    visible = run.keep_map.visible(n)
    assert run.keep_map.uneven and abs(run.keep_map.n_kept(n) - int(n * 0.25)) <= 1
    for layer, original in enumerate(plain):
        intact = (cache.layers[layer].keys[0, :, :n] == original[0]).all(dim=-1)  # [Hkv, n]
        assert torch.equal(intact, visible[layer]), layer


def survey_module():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "docs" / "gen_kvpress_presses.py"
    spec = importlib.util.spec_from_file_location("gen_kvpress_presses", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_press_of_kvpress_is_measured_or_refused_and_the_docs_page_is_current(smollm):
    gen = survey_module()
    outcomes = {o.name: o for o in gen.survey(smollm)}
    assert set(outcomes) == set(n for n in kvpress.__all__ if n.endswith("Press"))  # every press class
    scorers = {n for n, o in outcomes.items() if o.kind == "scorer" and n != "ScorerPress"}
    downloads = {"KVzapPress", "QFilterPress", "ExpectedAttentionStatsPress"}  # weights or statistics per model
    must = (scorers - downloads) | {
        "KVzipPress",
        "KVgradPress",
        "AdaKVPress",
        "CriticalKVPress",
        "CriticalAdaKVPress",
        "ChunkKVPress",
        "BlockPress",
        "PerLayerCompressionPress",
        "KVComposePress",
        "SimLayerKVPress",
        "DMSPress",
    }
    assert {n for n in must if not outcomes[n].measured} == set()
    for name in ("KVzapPress", "QFilterPress"):
        assert "needs a download" in outcomes[name].reason
    for name in ("MergingPress", "KeyRerotationPress", "ThinKPress"):
        assert "changes the kept keys or values" in outcomes[name].reason
    for name in ("DecodingPress", "CompressionRatioDecodingPress"):
        assert "while decoding only" in outcomes[name].reason
    assert all(o.reason for o in outcomes.values() if not o.measured)  # every refusal says why
    assert gen.survey_page(list(outcomes.values())) == gen.OUT.read_text(), "run docs/gen_kvpress_presses.py"


def test_a_study_over_many_presses_skips_those_that_cannot_run_and_says_why(smollm, alice):
    from fi_toolkit.integrations.kvpress.catalog import resolve_presses

    specs = [
        "kvpress:SnapKVPress@keep=0.25",
        "kvpress:QFilterPress@keep=0.25",
        "MergingPress/SnapKVPress@keep=0.25",
        "TOVAPress@keep=0.25",
    ]
    kept, refused = resolve_presses(specs, smollm.model, alice.ids, 256)
    assert set(kept) == {"kvpress:SnapKVPress@keep=0.25", "TOVAPress@keep=0.25"}
    assert refused["kvpress:QFilterPress@keep=0.25"].startswith("needs a download")
    assert refused["MergingPress/SnapKVPress@keep=0.25"].startswith("the press changes the kept keys or values")


def test_nearfar_measures_a_press_beside_its_sets(smollm, alice):
    from fi_toolkit.probe.chunks import Chunk
    from fi_toolkit.probe.experiment import probe_document
    from fi_toolkit.studies import nearfar_document

    p, spec = 256, "kvpress:KVzipPress@keep=0.25"
    trace = trace_prefix(smollm.model, alice.ids, p, SignalConfig())
    chunks = [Chunk(p, p + 32), Chunk(p + 64, p + 96)]
    nf = nearfar_document(smollm.model, alice, trace, chunks, "remove=0.1", 1, (4,), selections=[spec])["nearfar"]
    probe = probe_document(smollm, alice, chunks, [spec], trace=trace).set_index(["selection", "chunk"])["fi"]
    rows = nf[nf.selection == spec].set_index("chunk")["fi"]
    assert len(rows) == 2 and (rows > 0).all()
    for chunk, fi in rows.items():
        assert fi == pytest.approx(probe[(spec, chunk)], rel=1e-6)


# --- presses in decoding -------------------------------------------------------------------------


def kvpress_decoding(model, ids, prompt: int, steps: int, press) -> list[torch.Tensor]:
    """kvpress's own loop: prefill ``ids[:prompt]`` and feed the next ``steps`` tokens one at a time, all under
    ``press`` (kvpress compresses inside its hooks) -> per layer the positions its cache holds at the end
    ``[Hkv, k]`` (sorted), followed with the bridge's tracker (a decoded token's slot gets its position)."""
    from fi_toolkit.integrations.kvpress.tracking import Positions

    cache = DynamicCache(config=model.config)
    tracker = Positions()

    def positions(module, _args, kwargs, output):  # before the press's hook: the slots this forward appended
        layer = cache.layers[module.layer_idx]
        keys, values = layer.keys, layer.values
        known = tracker.positions(keys)
        if known is None:  # the prefill
            tracker.register(keys)
            tracker.register(values)
        else:  # a decoded token: its slot is the last
            pos = known.clone()
            pos[..., -1] = int(kwargs["position_ids"][0, -1])
            tracker.shadow[id(keys)], tracker.shadow[id(values)] = (keys, pos), (values, pos.clone())
        return output

    attention = [layer.self_attn for layer in model.model.layers]
    hooks = [m.register_forward_hook(positions, with_kwargs=True) for m in attention]
    try:
        with torch.no_grad(), tracker, press(model):
            model.model(input_ids=ids[:prompt][None], position_ids=torch.arange(prompt)[None], past_key_values=cache)
            for t in range(prompt, prompt + steps):
                model.model(input_ids=ids[t : t + 1][None], position_ids=torch.tensor([[t]]), past_key_values=cache)
    finally:
        for h in hooks:
            h.remove()
        restore(model, attention)
    return [torch.sort(tracker.positions(layer.keys)[0], dim=-1).values for layer in cache.layers]


@pytest.mark.parametrize("name", ["TOVAPress", "KnormPress"])
def test_a_press_in_the_decode_loop_keeps_what_kvpress_decoding_press_keeps(name, smollm, alice):
    """keep 25 %, compressing every 32 tokens: the decode loop with the press's own ``compress`` at each interval
    against kvpress's PrefillDecodingPress (the press at the prefill, CompressionRatioDecodingPress around it
    while decoding): the same entries in every layer and KV head after the prompt and three intervals."""
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.integrations.kvpress.bridge import press_policy

    model, ids, prompt, steps, interval = smollm.model, alice.ids, 128, 96, 32
    cls = getattr(kvpress, name)
    theirs = kvpress_decoding(
        model,
        ids,
        prompt,
        steps,
        kvpress.PrefillDecodingPress(
            prefilling_press=cls(compression_ratio=0.75),
            decoding_press=kvpress.CompressionRatioDecodingPress(
                base_press=cls(), target_compression_ratio=0.75, compression_interval=interval
            ),
        ),
    )
    policy = press_policy(f"kvpress:{name}", "keep=0.25", window=8)
    assert policy.decodes and not policy.prefill_only
    decoder = CompressedDecoder(model, policy, capacity=prompt + steps)
    try:
        decoder.prefill(ids[:prompt])
        compressions = [decoder.lengths()[0]]
        for i, t in enumerate(ids[prompt : prompt + steps].tolist()):
            decoder.step(t)
            if (i + 1) % interval == 0:
                assert decoder.compress() is not None
                compressions.append(decoder.lengths()[0])
        ours = decoder.positions
    finally:
        decoder.close()
    assert compressions == [32, 40, 48, 56]  # a quarter of 128, 160, 192, 224
    differing = []
    for layer, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for head, (x, y) in enumerate(zip(a.cpu().tolist(), b.cpu().tolist(), strict=True)):
            differing += [(layer, head, len(set(x) - set(y)))] if set(x) != set(y) else []
    if name == "TOVAPress":
        assert differing == []
    else:  # KnormPress ranks by ||k|| alone: on some CPUs two norms at the cut round to a tie that the two paths'
        # float32 keys break either way (3 of 90 heads, one slot each, on one x86 machine; none on another). A wrong
        # score, cache or schedule moves many slots in every head.
        assert all(n == 1 for _, _, n in differing) and len(differing) <= 3, differing


def test_a_press_in_decoding_at_full_budget_decodes_as_the_model_does(smollm, alice):
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.compress.sampling import GREEDY
    from fi_toolkit.integrations.kvpress.bridge import press_policy
    from fi_toolkit.model.attention import ragged_attention

    model, prompt = smollm.model, alice.ids[:96]
    policy = press_policy("kvpress:SnapKVPress", "keep=1.0", window=8)
    decoder = CompressedDecoder(model, policy, capacity=140, interval=8)
    try:
        logits, keep = decoder.prefill(prompt)
        with ragged_attention(model):
            ours = decoder.decode(logits, GREEDY, 40).tokens
    finally:
        decoder.close()
    with torch.no_grad():
        want = model.generate(prompt[None], max_new_tokens=40, do_sample=False, min_new_tokens=40)[0, 96:].tolist()
    assert keep is None and ours == want and decoder.lengths() == [96 + 39] * 30


@pytest.mark.parametrize("name", ["ExpectedAttentionPress", "SnapKVPress"])
def test_presses_that_read_many_rows_compress_at_every_interval(name, smollm, alice):
    """SnapKV's window (64 rows) and ExpectedAttention's query statistics read the rows decoded since the last
    compression: at an interval of 96 both compress back to the budget; at 32, SnapKV's window cannot fit the
    rows an interval decodes and the replay stops with one line (kvpress's DecodingPress asserts the same)."""
    from fi_toolkit.compress.replay import replay
    from fi_toolkit.errors import FIError
    from fi_toolkit.policies.registry import resolve

    policy = resolve(f"kvpress:{name}", budget="keep=0.25")
    result = replay(smollm.model, alice.ids[:448], 256, policy, interval=96)
    assert [c.step for c in result.compressions] == [0, 96] and result.compressions[1].keep.counts() == [88] * 30
    assert bool(torch.isfinite(result.kl).all())
    if name == "SnapKVPress":
        with pytest.raises(FIError, match="at a compression while decoding .32 rows.*window size 64"):
            replay(smollm.model, alice.ids[:320], 256, policy, interval=32)


@pytest.mark.parametrize("press", ["KeyDiffPress", "TOVAPress", "ExpectedAttentionPress", "SnapKVPress:window_size=2"])
def test_press_in_a_batch_equals_each_row_alone(tiny, press):
    """A press as a policy in a batch of three prompts of different lengths (fi_toolkit.compress.batched): at the
    prompt the press runs its own prefill of that row, which no other row's tracker may record, and while decoding
    it scores each row's own buffered rows (SnapKV's window and ExpectedAttention's statistics read them: they
    fail when another row's prefill reaches a row's buffer). Every row's logits (1e-4) and kept positions equal
    its decoder's alone."""
    from fi_toolkit.compress.batched import BatchedDecoder
    from fi_toolkit.compress.decoder import CompressedDecoder
    from fi_toolkit.evaluation.lmeval.arguments import policy_from_spec
    from fi_toolkit.model.attention import ragged_attention

    policy = policy_from_spec(f"kvpress:{press}", "keep=0.25", 8, {})
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (40, 64, 52)]
    fed = [torch.randint(3, 256, (13,), generator=gen).tolist() for _ in prompts]
    alone = []
    with ragged_attention(tiny.model):
        for prompt, tokens in zip(prompts, fed):
            decoder = CompressedDecoder(tiny.model, policy, 80, interval=4, keep_maps=True)
            logits = [decoder.prefill(torch.tensor(prompt))[0]] + [decoder.step(t) for t in tokens]
            decoder.close()
            alone.append((torch.stack(logits), decoder))
        batch = BatchedDecoder(tiny.model, policy, [80] * 3, interval=4, keep_maps=True)
        logits = [batch.prefill(prompts)] + [batch.step([fed[r][s] for r in range(3)]) for s in range(13)]
        batch.close()
    for r, (want, decoder) in enumerate(alone):
        assert (torch.stack([step[r] for step in logits]) - want).abs().max() < 1e-4
        mine = batch.rows[r]
        assert mine.compression_steps == decoder.compression_steps == [0, 4, 8, 12]
        for a, b in zip(mine.compressions, decoder.compressions):
            assert all(torch.equal(p, q) for p, q in zip(a.positions, b.positions))
