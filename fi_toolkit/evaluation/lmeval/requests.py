"""One lm-eval request on a compressed cache, without lm-eval: teacher-forced scoring of a
continuation (``loglikelihood``, rolling windows) and generation with stop strings (``generate_until``).

Both follow the paper's regime (InfoKV, "Decoding compression"): the context is prefilled and compressed
by the policy's rule (:meth:`~fi_toolkit.compress.decoder.CompressedDecoder.prefill`), then the cache is
compressed back to the budget every ``interval`` tokens fed after it, generated or teacher-forced, at the
points :func:`fi_toolkit.compress.replay.replay` and :func:`fi_toolkit.compress.decoder.generate` use.
``policy=None`` is the full cache. A budget that does not reach below a request's length (or leaves no
room beyond the window) evicts nothing for that request, as :meth:`CompressedDecoder.compress` decides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch

from fi_toolkit.compress.decoder import CompressedDecoder
from fi_toolkit.compress.sampling import GREEDY, Sampling
from fi_toolkit.errors import FIError
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.policies import Policy
from fi_toolkit.signals.trace import SignalConfig


@dataclass
class CacheRecord:
    """What the cache held for one request (lm-eval's per-sample log, key ``fi_toolkit``).
    ``cache_entries``: entries the last fed token attended to, the longest layer's (itself included);
    ``full_entries``: the tokens fed, what a full cache holds; ``compressions``: compressions that evicted
    something (the prefill's included); ``compression_steps``: tokens fed after the context when they
    fired (0: the context)."""

    request: str
    context_tokens: int
    new_tokens: int
    cache_entries: int
    full_entries: int
    compressions: int
    compression_steps: list[int]
    policy: str

    def as_dict(self) -> dict:
        return asdict(self)


def _record(kind: str, decoder: CompressedDecoder, context: int, new: int) -> CacheRecord:
    label = "none" if decoder.policy is None else decoder.policy.label
    steps = decoder.compression_steps
    return CacheRecord(kind, context, new, max(decoder.lengths()), decoder.seen, len(steps), steps, label)


@torch.no_grad()
def score_continuation(
    model,
    context: list[int],
    continuation: list[int],
    policy: Policy | None,
    interval: int,
    config: SignalConfig | None = None,
    prefill_chunk: int = 2048,
) -> tuple[float, bool, CacheRecord]:
    """``log P(continuation | context)`` on the compressed cache, teacher-forced, and whether every
    continuation token is the argmax (lm-eval's ``is_greedy``).

    ``context`` ``[p >= 1]`` and ``continuation`` ``[m >= 1]`` token ids. The context's last logits score
    ``continuation[0]``; ``continuation[:-1]`` is fed through the decoder's schedule (forwards that end at
    its compression points, each followed by a compression, none after the last token: nothing reads it).
    Log-probabilities are float32 log-softmax of float32 logits, summed in float64 per forward."""
    if not context or not continuation:
        raise FIError("a log-likelihood request needs a non-empty context and continuation")
    ids = torch.tensor(list(context) + list(continuation), dtype=torch.long)
    p, m = len(context), len(continuation)
    device = next(model.parameters()).device
    targets = ids[p:].to(device)
    decoder = CompressedDecoder(model, policy, p + m, config, prefill_chunk=prefill_chunk, interval=interval)
    total, greedy = 0.0, True

    def add(rows: torch.Tensor, scored: torch.Tensor) -> None:
        nonlocal total, greedy
        logp = torch.log_softmax(rows.float(), dim=-1)
        total += float(logp.gather(1, scored[:, None]).double().sum())
        greedy = greedy and bool((rows.argmax(-1) == scored).all())

    try:
        with ragged_attention(model):
            logits, _ = decoder.prefill(ids[:p].to(device))
            add(logits[None], targets[:1])
            for block in decoder.feed_blocks(ids[p : p + m - 1].to(device), compress_at_end=False):
                add(block.logits, targets[block.start + 1 : block.start + 1 + block.logits.shape[0]])
    finally:
        decoder.close()
    return total, greedy, _record("loglikelihood", decoder, p, m)


def stop_checker(tokenizer, until: list[str]) -> Callable[[list[int]], bool]:
    """True once the decoded tokens hold a stop string. Decodes only the tail that can hold a new one
    (a token is at least one character, so a stop string that ends in the last token lies within its
    last ``len(stop) + 1`` tokens): the check costs O(longest stop string) per token, not O(generated)."""
    stops = [s for s in until if s]
    if not stops:
        return lambda tokens: False
    tail = max(len(s) for s in stops) + 1

    def check(tokens: list[int]) -> bool:
        text = tokenizer.decode(tokens[-tail:], skip_special_tokens=False)
        return any(s in text for s in stops)

    return check


@torch.no_grad()
def generate_tokens(
    model,
    prompt: list[int],
    policy: Policy | None,
    interval: int,
    max_new: int,
    eos: set[int],
    stop: Callable[[list[int]], bool],
    do_sample: bool = False,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    config: SignalConfig | None = None,
    prefill_chunk: int = 2048,
) -> tuple[list[int], CacheRecord]:
    """Generated token ids after ``prompt`` ``[p]`` (an EOS token not included) and the cache record.

    The decoder's loop (:meth:`~fi_toolkit.compress.decoder.CompressedDecoder.decode`: prefill compression,
    a compression back to the budget every ``interval`` generated tokens) with lm-eval's stops: at most
    ``max_new`` tokens, an EOS id, or ``stop(tokens)`` (a stop string; the text is cut at it afterwards).
    Greedy unless ``do_sample`` (then ``temperature`` and ``top_p`` from ``seed``)."""
    if not prompt:
        raise FIError("a generation request needs a non-empty prompt")
    sampling = Sampling(temperature, top_p, seed)
    if not do_sample:
        sampling = GREEDY
    device = next(model.parameters()).device
    decoder = CompressedDecoder(
        model, policy, len(prompt) + max_new, config, prefill_chunk=prefill_chunk, interval=interval
    )
    try:
        with ragged_attention(model):
            logits, _ = decoder.prefill(torch.tensor(prompt, dtype=torch.long, device=device))
            decoded = decoder.decode(logits, sampling, max_new, eos, stop)
    finally:
        decoder.close()
    tokens = decoded.tokens[:-1] if decoded.stop_reason == "eos" else decoded.tokens
    return tokens, _record("generate_until", decoder, len(prompt), len(tokens))
