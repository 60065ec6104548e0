"""Compressed generation (docs/method.md, "Decoding compression"): prefill compression, then periodic
compression while decoding, with signals tracked online.

Flow of :func:`generate`: encode the prompt (chat template for instruct models) ->
:meth:`CompressedDecoder.prefill` (one chunked forward; hooks record H, D^(l) and the last ``w``
queries of every layer) -> the policy's keep map -> a physical gather of the cache (per layer and
KV head; RoPE positions kept, later tokens fed with explicit position ids) -> one token at a time
(:meth:`CompressedDecoder.step`), compressing back to the budget every ``interval`` generated tokens.

Budget: a ratio ``r`` keeps ``round(r * n)`` entries per layer and head at a compression point that
has seen ``n`` tokens (the prompt at prefill, prompt + generated later); a count keeps that many.
A ratio whose prompt share does not exceed the window leaves the prompt as it is (too short to
compress) and only decoding compresses.

Memory: logits are computed for one row at a time while decoding (top-k entropy of the prompt is
streamed in blocks of ``SignalConfig.lm_head_block`` rows); hidden states are held for one prefill
chunk (``prefill_chunk`` tokens x L layers x d) and never for more; per-token signals cost
``(L + 1) x (prompt + max_new)`` float32; window attention reads ``w`` queries per layer, never an
``N x N`` matrix. Uneven per-layer budgets (adaptive InfoKV, PyramidKV) run through
:func:`fi_toolkit.model.attention.ragged_attention`.
"""

from __future__ import annotations

import math
import resource
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
from transformers import DynamicCache

from fi_toolkit.compress.lookahead import Lookahead, set_estimates
from fi_toolkit.errors import FIError
from fi_toolkit.eviction import KeepMap, gather_cache
from fi_toolkit.model.architectures import check_model, context_limit, context_phrase, decoder_parts
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.policies import Policy, Signals
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.signals.tracker import SignalTracker


def hidden_buffer(policy: Policy | None) -> int:
    """Rows of attention inputs the policy scores with at a compression (a kvpress press's ``score()``); 0: none."""
    return int(getattr(policy, "hidden_buffer", 0) or 0)


def signal_config_for(policy: Policy | None, **overrides) -> SignalConfig:
    """The signal options a policy implies (its window, top-k and tau), with explicit overrides."""
    base = {"window": getattr(policy, "window", 32)}
    for name in ("top_k", "tau", "alpha"):
        if hasattr(policy, name):
            base[name] = getattr(policy, name)
    config = SignalConfig(**{**base, **{k: v for k, v in overrides.items() if v is not None}})
    config.validate()
    return config


@dataclass
class GenerationStats:
    """What one generation cost. Bytes are of keys + values; ``cache_bytes_full`` is what an
    uncompressed cache of every fed token would take. ``peak_memory_bytes`` is
    ``torch.cuda.max_memory_allocated`` on CUDA; on the CPU the process's peak RSS during the call
    (Linux ``VmHWM`` after resetting it; elsewhere ``ru_maxrss``, which includes everything before).
    Both include the model's weights."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_seconds: float = 0.0  # forward + signals + prefill compression
    decode_seconds: float = 0.0
    compression_seconds: float = 0.0  # scoring + gather, prefill and decoding
    prefill_compressed: bool = False
    compressions: int = 0  # decoding compressions that evicted entries
    compression_steps: list[int] = field(default_factory=list)  # generated-token counts when they fired
    cache_lengths: list[int] = field(default_factory=list)  # longest layer after each fed token, before compression
    cache_bytes_full: int = 0
    cache_bytes_kept: int = 0
    peak_cache_bytes: int = 0
    peak_memory_bytes: int = 0
    peak_memory_kind: str = ""
    stop_reason: str = ""
    note: str = ""

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.decode_seconds if self.decode_seconds > 0 else float("nan")

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("cache_lengths")
        out["tokens_per_second"] = self.tokens_per_second
        return out


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]  # generated token ids (the EOS token included when it stopped there)
    prompt_ids: torch.Tensor
    stats: GenerationStats
    prefill_keep: KeepMap | None  # the prefill keep map (prompt positions), if the prompt was compressed


def cache_bytes(cache: DynamicCache) -> int:
    return sum(
        l.keys.numel() * l.keys.element_size() + l.values.numel() * l.values.element_size() for l in cache.layers
    )


def _reset_cpu_peak() -> bool:
    """Reset the process's peak RSS (Linux: ``5 > /proc/self/clear_refs``); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _cpu_peak(reset: bool) -> tuple[int, str]:
    if reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "peak RSS during generation"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class CompressedDecoder:
    """A model plus a cache that a policy keeps within its budget.

    ``positions[l]`` ``[Hkv, n_l]``: the original position of every cache slot. ``protected[l]``:
    leading slots never evicted (the prompt, when it is not compressible). ``tracker``: the
    :class:`~fi_toolkit.signals.tracker.SignalTracker` of the signals the policy reads (None when it
    reads none); the decoder drives it through its public steps only, and its hooks stay on the model
    from construction to :meth:`close`. The ``tracker`` argument is :meth:`shared`'s and :meth:`fork`'s:
    by default the policy's needs decide what is tracked. ``cache`` stays one object for the decoder's
    life (compactions gather it in place): the tracker reads keys from it."""

    def __init__(
        self,
        model,
        policy: Policy | None,
        capacity: int,
        config: SignalConfig | None = None,
        compress_prompt: bool | None = None,
        prefill_chunk: int = 2048,
        tracker: SignalTracker | None = None,
    ):
        self.model, self.policy = model, policy
        self.device = next(model.parameters()).device
        self.config = config or signal_config_for(policy)
        self.compress_prompt = policy.compress_prompt if compress_prompt is None and policy else bool(compress_prompt)
        self.prefill_chunk = prefill_chunk
        self.lm_head = decoder_parts(model)[2]
        self.cache = DynamicCache(config=model.config)
        self.seen = 0
        self.tokens = torch.zeros(capacity, dtype=torch.long)  # fed token ids by position (for kvpress presses)
        self.positions: list[torch.Tensor] = []
        self.protected: list[int] = []
        self.compression_seconds = 0.0
        self.sharing = False  # CompressedDecoder.shared: prefilled once, then forked per policy
        self.lookahead: Lookahead | None = None  # the known future of a replay: what an oracle policy looks ahead to
        if tracker is None and policy is not None and policy.needs_signals:
            tracker = SignalTracker(
                self.config, capacity, policy.tracks_accumulated, policy.needs_token_signals, hidden_buffer(policy)
            )
        self.tracker = tracker
        self._hooks = ExitStack()  # the tracker's hooks, held until close()
        if tracker is not None:
            self._hooks.enter_context(tracker(model))

    def close(self) -> None:
        """Remove the tracker's hooks from the model (idempotent)."""
        self._hooks.close()

    @classmethod
    def shared(
        cls, model, capacity: int, config: SignalConfig | None = None, prefill_chunk: int = 2048
    ) -> CompressedDecoder:
        """A decoder without a policy that tracks every signal any policy reads (H, D^(l), the window
        queries, H2O's accumulator): prefill it once, then :meth:`fork` it per policy (``fi eval``
        compares policies on one prefill forward instead of one each)."""
        config = config or signal_config_for(None)
        tracker = SignalTracker(config, capacity, accumulate=True, token_signals=True)
        decoder = cls(
            model, None, capacity, config, compress_prompt=False, prefill_chunk=prefill_chunk, tracker=tracker
        )
        decoder.capacity, decoder.sharing = capacity, True
        return decoder

    @torch.no_grad()
    def fork(
        self, policy: Policy | None, compress_prompt: bool | None = None, lookahead: Lookahead | None = None
    ) -> tuple[CompressedDecoder, KeepMap | None]:
        """A decoder for ``policy`` in the state :meth:`prefill` would have left it in on the same prompt:
        the cache and the tracked signals copied from this prefilled :meth:`shared` decoder, then the
        prompt compressed by the policy's rule. Returns it with the prefill keep map (None: not compressed).
        ``lookahead``: the known future of a replay, for an oracle policy (:mod:`fi_toolkit.compress.lookahead`).

        The shared decoder's hooks were removed at the end of its prefill (they would record other
        decoders' forwards), so it stays a source for further forks. The fork must be closed by the caller."""
        if not self.sharing:
            raise FIError("only a CompressedDecoder.shared(...) decoder can be forked")
        if self.seen == 0 or any(l.keys.shape[2] != self.seen for l in self.cache.layers):
            raise FIError("fork a shared decoder right after its prefill, before it feeds anything else")
        for name in (
            "window",
            "top_k",
        ):  # what the shared signals were computed with (tau, alpha: the policy's scoring)
            if policy is not None and hasattr(policy, name) and getattr(policy, name) != getattr(self.config, name):
                raise FIError(
                    f"the policy's {name} ({getattr(policy, name)}) differs from the shared prefill's "
                    f"({getattr(self.config, name)})"
                )
        tracker = None
        if policy is not None and policy.needs_signals:  # only what the policy reads
            tracker = self.tracker.fork(
                token_signals=policy.needs_token_signals,
                accumulate=policy.tracks_accumulated,
                hidden_buffer=hidden_buffer(policy),
            )
        child = CompressedDecoder(
            self.model, policy, self.capacity, self.config, compress_prompt, self.prefill_chunk, tracker=tracker
        )
        for i, layer in enumerate(self.cache.layers):
            child.cache.update(layer.keys.clone(), layer.values.clone(), i)
        p = child.seen = self.seen
        child.tokens[:p] = self.tokens[:p]
        child.lookahead = lookahead
        return child, child._end_prompt()

    def _forward(self, ids: torch.Tensor, every_row: bool = False) -> torch.Tensor:
        """Feed ``ids [q]`` at the next positions; returns float32 logits of the last one ``[V]``
        (``every_row``: of every one, ``[q, V]``)."""
        q = ids.numel()
        positions = torch.arange(self.seen, self.seen + q, device=self.device)[None]
        if self.seen + q > self.tokens.numel():  # past the capacity the caller gave: grow the record
            self.tokens = torch.cat([self.tokens, self.tokens.new_zeros(self.seen + q - self.tokens.numel())])
        self.tokens[self.seen : self.seen + q] = ids.cpu()
        hidden = self.model.base_model(
            input_ids=ids[None].to(self.device),
            position_ids=positions,
            use_cache=True,
            **cache_kwargs(self.model.base_model, self.cache),
        ).last_hidden_state[0]
        logits = self.lm_head(hidden if every_row else hidden[-1:]).float()
        if self.tracker:
            self.tracker.record(hidden, logits[-1] if q == 1 else None)
        self.seen += q
        return logits if every_row else logits[0]

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, KeepMap | None]:
        """Run the prompt (in chunks), then compress it if the policy and budget say so."""
        for a in range(0, ids.numel(), self.prefill_chunk):
            logits = self._forward(ids[a : a + self.prefill_chunk])
        keep = self._end_prompt()
        if self.sharing:
            self.close()  # its state is final: forks copy it (and its hooks would record theirs)
        return logits, keep

    def _end_prompt(self) -> KeepMap | None:
        """After the prompt's forwards (or a fork's copy of them): every slot is its position, the
        prompt is protected unless compressible, H2O's accumulator starts from the window queries'
        attention (the tracker's :meth:`~SignalTracker.start_decoding`), then the prompt is compressed by the
        policy's rule (its keep map, or None)."""
        hkv = self.cache.layers[0].keys.shape[1]
        p = self.seen
        self.positions = [torch.arange(p, device=self.device).expand(hkv, p) for _ in self.cache.layers]
        self.protected = [0 if self.compress_prompt else p] * len(self.cache.layers)
        if self.tracker:
            self.tracker.start_decoding(self.cache)
        return self.compress(prompt=True) if self.policy and self.compress_prompt else None

    def _append_slots(self, q: int) -> None:
        new = torch.arange(self.seen, self.seen + q, device=self.device).expand(self.positions[0].shape[0], q)
        self.positions = [torch.cat([pos, new], dim=1) for pos in self.positions]

    @torch.no_grad()
    def step(self, token: int) -> torch.Tensor:
        """Feed one generated token; its slot is appended to every head of every layer."""
        self._append_slots(1)
        return self._forward(torch.tensor([token], device=self.device))

    @torch.no_grad()
    def block(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ``ids [q]`` (tokens that decoding would feed one at a time) as one forward -> float32
        logits of every row ``[q, V]``. Equal to ``q`` calls of :meth:`step` on the same tokens, the
        tracked signals included (H, D^(l), the last ``w`` queries, H2O's accumulator, which adds the
        attention of every row of the block); it never compresses (the caller does, between blocks)."""
        ids = ids.flatten()
        if ids.numel() == 0:
            return torch.empty(0, self.lm_head.weight.shape[0], device=self.device)
        self._append_slots(ids.numel())
        return self._forward(ids, every_row=True)

    @torch.no_grad()
    def greedy(
        self, logits: torch.Tensor, max_new: int, interval: int, stop: Callable[[list[int]], bool] | None = None
    ) -> list[int]:
        """Greedy tokens from the next-token ``logits`` on, as :func:`generate` decodes them: at most
        ``max_new`` (EOS does not stop it; ``stop(tokens)`` may), compressing every ``interval``
        generated tokens. Run it inside :func:`~fi_toolkit.model.attention.ragged_attention`."""
        if max_new < 1:
            raise FIError(f"max_new must be >= 1 tokens, got {max_new}")
        tokens: list[int] = []
        while True:
            tokens.append(int(torch.argmax(logits)))
            if len(tokens) == max_new or (stop is not None and stop(tokens)):
                return tokens
            logits = self.step(tokens[-1])
            if self.policy is not None and len(tokens) % interval == 0:
                self.compress()

    def lengths(self) -> list[int]:
        return [int(l.keys.shape[2]) for l in self.cache.layers]

    def signals(self) -> Signals:
        """The policy's view of the current cache, in slot space: the tracker's view (none without one),
        with the decoder's protected slots, token ids and model."""
        mine = {"protected": list(self.protected), "tokens": self.tokens[: self.seen], "model": self.model}
        if self.tracker:
            return replace(self.tracker.view(self.positions), **mine)
        return Signals(
            window=self.config.window,
            seen=self.seen,
            keys=[l.keys for l in self.cache.layers],
            positions=self.positions,
            values=[l.values for l in self.cache.layers],
            **mine,
        )

    @torch.no_grad()
    def compress(self, prompt: bool = False) -> KeepMap | None:
        """Back to the budget with the policy; None when nothing had to go (or only the window would fit,
        or the policy compresses the prompt only and this is not the ``prompt``'s compression)."""
        if self.policy.prefill_only and not prompt:
            return None
        protected = max(self.protected)
        k = self.policy.kept_total(self.seen, protected)
        if k - protected <= self.config.window or max(self.lengths()) <= k:
            return None
        _sync(self.device)
        t0 = time.perf_counter()
        if getattr(self.policy, "sees_future", False) and not set_estimates(self, k, protected):
            return None  # an oracle with nothing left to look ahead to (fi_toolkit.compress.lookahead)
        keep_map = self.policy.keep_map(self.signals())
        kept = gather_cache(
            [l.keys for l in self.cache.layers], [l.values for l in self.cache.layers], keep_map, self.model.config
        )
        for layer, gathered in zip(self.cache.layers, kept.layers):  # in place: the tracker reads this cache
            layer.keys, layer.values = gathered.keys, gathered.values
        self.positions = [pos.gather(1, idx) for pos, idx in zip(self.positions, keep_map.keep)]
        if self.tracker:
            self.tracker.compact(keep_map.keep)
        _sync(self.device)
        self.compression_seconds += time.perf_counter() - t0
        return keep_map


def encode_prompt(tokenizer, prompt: str, chat: bool | None = None) -> torch.Tensor:
    """Token ids of ``prompt``; wrapped in the tokenizer's chat template when it has one (``chat=None``)."""
    if tokenizer is None:
        raise FIError("a text prompt needs a tokenizer; pass token ids instead")
    if chat is None:
        chat = bool(getattr(tokenizer, "chat_template", None))
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return torch.tensor(tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.long)
    return torch.tensor(tokenizer(prompt).input_ids, dtype=torch.long)


def _eos_ids(model, tokenizer, eos_token_id) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
    if eos_token_id is None:
        return set()
    return {int(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id])}


def compression_points(
    policy: Policy, prompt_len: int, max_new_tokens: int, interval: int, compress_prompt: bool
) -> list[int]:
    """Generated-token counts at which :func:`generate` evicts something (0: the prompt at prefill),
    unless an EOS stops it first; the arithmetic of :meth:`CompressedDecoder.compress`, without a model."""
    protected = 0 if compress_prompt else prompt_len
    held, last, points = prompt_len, 0, []
    for generated in ([0] if compress_prompt else []) + list(range(interval, max_new_tokens, interval)):
        held, last = held + generated - last, generated
        k = policy.kept_total(prompt_len + generated, protected)
        if k - protected > policy.window and held > k:
            points.append(generated)
            held = k
    return points


def check_budget(policy: Policy, prompt_len: int, max_new_tokens: int, compress_prompt: bool) -> None:
    """Budgets that can never work are errors before any model work."""
    w, budget = policy.window, policy.budget
    protected = 0 if compress_prompt else prompt_len
    compressible = prompt_len + max_new_tokens - protected
    if budget.exceeds(compressible):
        raise FIError(
            f"budget {budget.label} is above the {compressible} tokens it may compress "
            f"({prompt_len} prompt{' (kept)' if protected else ''} + {max_new_tokens} new): "
            "nothing would ever be evicted"
        )
    if budget.kept(compressible) <= w:
        raise FIError(
            f"budget {budget.label} keeps at most {budget.kept(compressible)} of the {compressible} "
            f"tokens it may compress, not above the window of {w}"
        )


class _Streamer:
    """Text deltas to a callback, decoded at word boundaries (transformers' TextStreamer logic)."""

    def __init__(self, tokenizer, callback):
        from transformers import TextStreamer

        class _CB(TextStreamer):
            def on_finalized_text(self, text, stream_end=False):
                callback(text)

        self.streamer = _CB(tokenizer, skip_special_tokens=True) if tokenizer is not None and callback else None

    def put(self, token: int):
        if self.streamer:
            self.streamer.put(torch.tensor([token]))

    def end(self):
        if self.streamer:
            self.streamer.end()


def _sampler(temperature: float, top_p: float, seed: int, device):
    if temperature == 0:
        return lambda logits, _ids: int(torch.argmax(logits))
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList(
        [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
    )
    gen = torch.Generator(device=device).manual_seed(seed)

    def sample(logits, ids):
        scores = warpers(ids[None], logits[None])
        return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=gen))

    return sample


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompt: str | torch.Tensor,
    policy: Policy | None = None,
    max_new_tokens: int = 256,
    interval: int = 1024,
    compress_prompt: bool | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    chat: bool | None = None,
    on_text: Callable[[str], None] | None = None,
    eos_token_id: int | list[int] | None = None,
    config: SignalConfig | None = None,
    prefill_chunk: int = 2048,
) -> GenerationResult:
    """Generate from ``prompt`` (text, or 1-D token ids) with the cache kept to ``policy``'s budget.

    ``policy=None`` is the full cache. ``compress_prompt`` defaults to the policy's own (RPC: False).
    Greedy when ``temperature == 0``; otherwise temperature + top-p sampling from ``seed``.
    Stops at ``max_new_tokens`` or an EOS token (the model's generation config by default).
    """
    if max_new_tokens < 1:
        raise FIError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if interval < 1:
        raise FIError(f"interval must be >= 1 generated tokens, got {interval}")
    if not (math.isfinite(temperature) and temperature >= 0) or not 0 < top_p <= 1:
        raise FIError(f"need a finite temperature >= 0 and 0 < top_p <= 1, got {temperature} and {top_p}")
    ids = prompt.flatten().long() if isinstance(prompt, torch.Tensor) else encode_prompt(tokenizer, prompt, chat)
    if ids.numel() == 0:
        raise FIError("the prompt is empty")
    p = ids.numel()
    check_model(model)
    limit = context_limit(model.config)
    if limit is not None and p + max_new_tokens > limit:
        raise FIError(f"prompt ({p}) + max-new ({max_new_tokens}) exceeds the model's {context_phrase(model.config)}")
    if policy is not None:
        cp = policy.compress_prompt if compress_prompt is None else compress_prompt
        check_budget(policy, p, max_new_tokens, cp)
        planned = compression_points(policy, p, max_new_tokens, interval, cp)
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cpu_reset = device.type == "cpu" and _reset_cpu_peak()
    stats = GenerationStats(prompt_tokens=p)
    decoder = CompressedDecoder(model, policy, p + max_new_tokens, config, compress_prompt, prefill_chunk)
    streamer = _Streamer(tokenizer, on_text)
    sample = _sampler(temperature, top_p, seed, device)
    eos = _eos_ids(model, tokenizer, eos_token_id)
    all_ids = ids.to(device)
    tokens: list[int] = []
    try:
        with ragged_attention(model):
            _sync(device)
            t0 = time.perf_counter()
            logits, keep = decoder.prefill(ids)
            _sync(device)
            stats.prefill_seconds = time.perf_counter() - t0
            stats.prefill_compressed = keep is not None
            if policy is not None and not planned:
                stats.note = (
                    f"nothing evicted: with budget {policy.budget.label}, --interval {interval} and "
                    f"{max_new_tokens} new tokens the cache never exceeds its budget"
                )
            elif policy is not None and decoder.compress_prompt and keep is None:
                stats.note = "prompt not compressed: its budget share is not between the window and its length"
            stats.peak_cache_bytes = cache_bytes(decoder.cache)
            t0 = time.perf_counter()
            stats.stop_reason = "max_new_tokens"
            while True:
                token = sample(logits, all_ids)
                tokens.append(token)
                streamer.put(token)
                if token in eos:
                    stats.stop_reason = "eos"
                    break
                if len(tokens) == max_new_tokens:
                    break
                all_ids = torch.cat([all_ids, torch.tensor([token], device=device)])
                logits = decoder.step(token)
                stats.peak_cache_bytes = max(stats.peak_cache_bytes, cache_bytes(decoder.cache))
                stats.cache_lengths.append(max(decoder.lengths()))
                if policy is not None and len(tokens) % interval == 0 and decoder.compress() is not None:
                    stats.compressions += 1
                    stats.compression_steps.append(len(tokens))
            _sync(device)
            stats.decode_seconds = time.perf_counter() - t0
    finally:
        decoder.close()
        streamer.end()
    stats.new_tokens = len(tokens)
    stats.compression_seconds = decoder.compression_seconds
    per_token = sum(2 * l.keys.shape[1] * l.keys.shape[3] * l.keys.element_size() for l in decoder.cache.layers)
    stats.cache_bytes_full = per_token * decoder.seen
    stats.cache_bytes_kept = cache_bytes(decoder.cache)
    if device.type == "cuda":
        stats.peak_memory_bytes, stats.peak_memory_kind = torch.cuda.max_memory_allocated(device), "cuda max allocated"
    else:
        stats.peak_memory_bytes, stats.peak_memory_kind = _cpu_peak(cpu_reset)
    text = tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else ""
    return GenerationResult(text, tokens, ids, stats, keep)
