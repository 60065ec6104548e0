"""One decode loop (docs/method.md, "Decoding compression"): only the decoder decides when to compress,
and where it compresses is the arithmetic of its schedule, whoever drives it.

The package's source is read (ast): no module but ``compress/decoder.py`` calls a ``compress`` method or
takes a token count modulo (or floor-divided by) an interval. The schedule's points are checked against
arithmetic written here, and against what real runs of every caller record (tiny model)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from fi_toolkit.compress.decoder import CompressedDecoder, Schedule, generate
from fi_toolkit.compress.replay import replay
from fi_toolkit.compress.sampling import GREEDY, Sampling
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.lmeval.requests import generate_tokens, score_continuation
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.policies import StreamingLLM, make_policy

PACKAGE = Path(__file__).resolve().parents[1] / "fi_toolkit"
OWNER = PACKAGE / "compress" / "decoder.py"


def schedule_decisions(source: str) -> list[str]:
    """Where ``source`` decides when to compress: a call of a ``compress`` method, or a ``%`` / ``//``
    with a name that holds ``interval`` on either side (``line: code``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compress":
            # a kvpress press's own ``press.compress(...)`` is its score-and-select, which a press policy calls
            # when the decoder asks it for a keep map: what to keep, not when
            if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "press"):
                found.append(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.FloorDiv)):
            names = [
                n.id if isinstance(n, ast.Name) else n.attr
                for n in ast.walk(node)
                if isinstance(n, (ast.Name, ast.Attribute))
            ]
            if any("interval" in name.lower() for name in names):
                found.append(node)
    return [f"{node.lineno}: {ast.unparse(node)}" for node in found]


def test_no_module_but_the_decoder_decides_when_to_compress():
    offenders = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != OWNER and (hits := schedule_decisions(path.read_text()))
    }
    assert offenders == {}
    assert schedule_decisions(OWNER.read_text())  # the check sees the decisions where they are made


@pytest.mark.parametrize(
    "source",
    [
        # the loops the decoder replaced: lm-eval's generation, the replay's blocks
        "if policy is not None and len(tokens) % interval == 0 and decoder.compress() is not None:\n    pass",
        "stop = min(new - 1, (fed // interval + 1) * interval)",
        "if fed % self.args.interval == 0:\n    log(keep)",
        "d.compress()",
    ],
)
def test_the_source_check_catches_a_loop_that_counts(source):
    assert schedule_decisions(source)


def test_the_source_check_lets_feeding_and_prose_pass():
    source = (
        '"""compress back to the budget every % interval tokens"""\nrows = decoder.feed(ids)\nn = total % width\n'
        "keys, values = press.compress(module, hidden, keys, values, None, {})\n"
    )
    assert schedule_decisions(source) == []


# --- the schedule's arithmetic ----------------------------------------------------------------------

P, W = 96, 16


def test_points_of_a_count_budget_fall_on_every_interval():
    """Keep 48 of a 96-token prompt: the prompt is compressed, then each interval of 32 new tokens grows the
    cache to 80 > 48, so every multiple of 32 below 160 (the last token is sampled, never fed) evicts."""
    schedule = Schedule.of(make_policy("snapkv", budget=48, window=W), 32)
    assert schedule.points(P, 160) == [0, 32, 64, 96, 128]
    assert schedule.points(P, 161) == [0, 32, 64, 96, 128, 160]


def test_points_of_a_protected_prompt_start_when_the_budget_passes_the_window():
    """RPC keeps the prompt and round(0.4 g) of g generated tokens: at g = 32 that is 13 <= the window of 16
    (skipped); at 64, 26 of the 64 held; at 96, 38 of 26 + 32 = 58; at 128, 51 of 38 + 32 = 70."""
    schedule = Schedule.of(make_policy("rpc", budget=0.4, window=W), 32)
    assert not schedule.compress_prompt
    assert schedule.points(P, 160) == [64, 96, 128]


def test_no_interval_and_prompt_only_policies_compress_the_prompt_alone():
    class PromptOnly(StreamingLLM):
        prefill_only = True

    assert Schedule.of(PromptOnly(budget=48, window=W), 32).points(P, 160) == [0]
    assert Schedule.of(make_policy("snapkv", budget=48, window=W), None).points(P, 160) == [0]
    assert Schedule.of(None, 32).points(P, 160) == []
    with pytest.raises(FIError, match="interval must be >= 1"):
        Schedule.of(None, 0)


@pytest.mark.parametrize("fed, point", [(0, 8), (7, 8), (8, 16), (9, 16), (-5, 8), (-20, 8)])
def test_next_point_is_the_next_multiple_after_the_prompt(fed, point):
    assert Schedule.of(None, 8).next_point(fed) == point
    assert Schedule.of(None, 8).reaches_point(fed) == (fed >= 8)  # a task's answer feeding fed tokens
    assert Schedule.of(None, None).next_point(fed) is None and not Schedule.of(None, None).reaches_point(fed)


# --- what real runs record ---------------------------------------------------------------------------

PROMPT, INTERVAL, BUDGET = 40, 7, 24  # keep 24 (window 4): the prompt and every interval evict


def _policy():
    return StreamingLLM(budget=BUDGET, window=4)


def test_every_caller_compresses_at_the_multiples_of_the_interval(tiny, tiny_ids):
    ids = tiny_ids[:PROMPT]
    result = generate(tiny.model, None, ids, _policy(), max_new_tokens=50, interval=INTERVAL, eos_token_id=[])
    assert result.stats.prefill_compressed and result.stats.compression_steps == [7, 14, 21, 28, 35, 42, 49]
    assert result.stats.cache_lengths[:8] == [25, 26, 27, 28, 29, 30, 31, 25]  # 24 + each token, back to 24 + 1

    replayed = replay(tiny.model, tiny_ids[: PROMPT + 30], PROMPT, _policy(), INTERVAL)  # feeds 29
    assert replayed.compression_steps == [0, 7, 14, 21, 28]
    assert [c.seen for c in replayed.compressions] == [40, 47, 54, 61, 68]

    # lm-eval's scoring feeds continuation[:-1] (28 tokens): no compression after the last, nothing reads it
    _, _, record = score_continuation(tiny.model, ids.tolist(), tiny_ids[PROMPT : PROMPT + 29].tolist(), _policy(), 7)
    assert record.compression_steps == [0, 7, 14, 21]
    tokens, record = generate_tokens(tiny.model, ids.tolist(), _policy(), INTERVAL, 22, set(), lambda t: False)
    assert len(tokens) == 22 and record.compression_steps == [0, 7, 14, 21]  # 21 of the 22 were fed


def _decoder(tiny, policy, interval):
    decoder = CompressedDecoder(tiny.model, policy, 400, interval=interval)
    decoder.prefill(torch.arange(PROMPT))
    return decoder


@pytest.mark.parametrize(
    "max_block, prompt, ends",
    [
        (None, 0, [8, 16, 20]),
        (3, 0, [3, 6, 8, 11, 14, 16, 19, 20]),
        (None, 5, [13, 20]),  # the first 5 end the prompt: the schedule counts 8 after them
    ],
)
def test_feeding_cuts_forwards_at_the_points(tiny, max_block, prompt, ends):
    decoder = _decoder(tiny, _policy(), 8)
    try:
        with ragged_attention(tiny.model):
            blocks = list(decoder.feed_blocks(torch.arange(20), max_block, prompt))
    finally:
        decoder.close()
    assert [b.start + b.logits.shape[0] for b in blocks] == ends
    assert [b.start for b in blocks] == [0, *ends[:-1]]
    assert decoder.compression_steps == [0] + [s for s in (8, 16) if s <= 20 - prompt]


def test_full_cache_is_cut_at_the_same_points_and_never_compressed(tiny):
    decoder = _decoder(tiny, None, 8)
    try:
        blocks = list(decoder.feed_blocks(torch.arange(20)))
    finally:
        decoder.close()
    assert [b.logits.shape[0] for b in blocks] == [8, 8, 4] and decoder.compressions == []
    assert decoder.lengths() == [PROMPT + 20] * len(decoder.lengths())


def test_decode_stops_at_eos_a_rule_or_max_new(tiny, tiny_ids):
    """Greedy decoding = transformers' greedy ``model.generate``, cut where each stop rule says."""
    ids = tiny_ids[:PROMPT]
    mask = torch.ones(1, PROMPT, dtype=torch.long)  # no id is padding (pad_token_id alone would mask id 0)
    plain = tiny.model.generate(ids[None], attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    free = plain[0, PROMPT:].tolist()
    at_eos = free[: free.index(free[3]) + 1]
    for eos, stop, tokens, reason in [
        ({free[3]}, None, at_eos, "eos"),  # the EOS id is kept
        (set(), lambda t: len(t) == 5, free[:5], "stop"),
        (set(), None, free, "max_new_tokens"),
    ]:
        decoder = CompressedDecoder(tiny.model, None, 400)
        try:
            logits, _ = decoder.prefill(ids)
            decoded = decoder.decode(logits, GREEDY, 12, eos, stop)
        finally:
            decoder.close()
        assert (decoded.tokens, decoded.stop_reason) == (tokens, reason)
        assert decoder.seen == PROMPT + len(tokens) - 1  # the last token is never fed
    with pytest.raises(FIError, match="max_new must be >= 1"):
        decoder.decode(logits, GREEDY, 0)


def test_feeding_nothing_gives_no_rows(tiny):
    decoder = _decoder(tiny, _policy(), 8)
    try:
        assert decoder.feed(torch.arange(0)).shape == (0, tiny.model.config.vocab_size)
        assert decoder.step(3).shape == (tiny.model.config.vocab_size,) and decoder.seen == PROMPT + 1
    finally:
        decoder.close()


def test_sampling_draws_what_an_independent_multinomial_draws():
    logits = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 3
    assert GREEDY.sampler("cpu")(logits, torch.zeros(0)) == int(logits.argmax())
    sample = Sampling(temperature=0.7, seed=5).sampler("cpu")
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(logits / 0.7, dim=-1)
    want = [int(torch.multinomial(probs, 1, generator=gen)) for _ in range(20)]
    assert [sample(logits, torch.zeros(0)) for _ in range(20)] == want
    with pytest.raises(FIError, match="finite temperature"):
        Sampling(temperature=float("nan"))
    with pytest.raises(FIError, match="top_p"):
        Sampling(top_p=0)
