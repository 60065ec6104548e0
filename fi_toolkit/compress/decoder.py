"""Compressed decoding (docs/method.md, "Decoding compression"): one loop that feeds tokens to a cache kept
to a policy's budget, compressing it where its :class:`Schedule` says, with signals tracked online.

Everything that decodes drives this loop; none of it decides when to compress:

* :meth:`CompressedDecoder.prefill` runs the prompt (one chunked forward; hooks record H, D^(l) and the
  last ``w`` queries of every layer), then compresses it when the schedule compresses prompts;
* :meth:`CompressedDecoder.feed_blocks` / :meth:`~CompressedDecoder.feed` feed known tokens (a replay, lm-eval's
  continuations, a task's question and answer) in forwards that end at the schedule's points, compressing
  there; :meth:`~CompressedDecoder.step` feeds one token;
* :meth:`CompressedDecoder.decode` samples (:mod:`fi_toolkit.compress.sampling`), feeds and stops (EOS, a
  stop rule, ``max_new``): :func:`generate`, free generation, tasks and lm-eval's ``generate_until``;
* :class:`~fi_toolkit.compress.batched.BatchedDecoder` runs one decoder per row of a padded batch (lm-eval's
  batches under a policy): each row's compressions are still decided here (:meth:`~CompressedDecoder.compress_if_due`).

Compressing is a physical gather of the cache per layer and KV head (RoPE positions kept, later tokens fed
with explicit position ids). Budget: a ratio ``r`` keeps ``round(r * n)`` entries per layer and head at a
compression point that has seen ``n`` tokens (the prompt at prefill, prompt + fed later); a count keeps
that many. A ratio whose prompt share does not exceed the window leaves the prompt as it is (too short to
compress) and only decoding compresses.

Memory: logits are computed for the fed rows of one forward (one row while generating; top-k entropy of
the prompt is streamed in blocks of ``SignalConfig.lm_head_block`` rows); hidden states are held for one
prefill chunk (``prefill_chunk`` tokens x L layers x d) and never for more; per-token signals cost
``(L + 1) x (prompt + max_new)`` float32; window attention reads ``w`` queries per layer, never an
``N x N`` matrix. Uneven per-layer budgets (adaptive InfoKV, PyramidKV) run through
:func:`fi_toolkit.model.attention.ragged_attention`.

Keep maps whose KV heads keep different counts (``learned:heads=global``, kvpress's AdaKV-style masked presses
at the prompt) are held as kvpress's AdaKV holds them: a padded dense cache plus a mask. Each head's row is
gathered padded (its pad slots repeat its last kept slot) and the pads are *dead* (``RowState.dead``): every
forward hides them per KV head in every layer (:func:`fi_toolkit.model.attention.hidden_slots`, exactly zero
weight), the tracker gives them no attention, and no later compression keeps one (``Signals.dead``). Masking
equals deletion (tests/test_uneven_decode.py). While every head is even nothing of this runs.
"""

from __future__ import annotations

import resource
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator

import torch
from transformers import DynamicCache

from fi_toolkit.compress.budget_check import check_budget
from fi_toolkit.compress.lookahead import Lookahead, lookahead_estimates
from fi_toolkit.compress.sampling import Sampling
from fi_toolkit.errors import FIError
from fi_toolkit.eviction import KeepMap, gather_cache
from fi_toolkit.model.architectures import check_model, context_limit, context_phrase, decoder_parts
from fi_toolkit.model.attention import hidden_slots, ragged_attention
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.policies import Policy, Signals
from fi_toolkit.signals.config import SignalConfig, signal_config_for  # noqa: F401  (re-exported: its old home)
from fi_toolkit.signals.tracker import SignalTracker


def input_scorer(policy: Policy | None):
    """What scores each fed row from its attention input for the policy (the surrogate's model), or None."""
    return getattr(policy, "input_scorer", None)


def hidden_buffer(policy: Policy | None) -> int:
    """Rows of attention inputs the policy scores with at a compression (a kvpress press's ``score()``); 0: none."""
    return int(getattr(policy, "hidden_buffer", 0) or 0)


@dataclass(frozen=True)
class Schedule:
    """When a decoder compresses its cache back to the policy's budget: the prompt once, after its
    prefill, when ``compress_prompt``; then after every ``interval`` tokens fed after the prompt
    (generated or teacher-forced; ``None``: never), unless the policy compresses prompts only (kvpress
    presses). Feeds are cut at these points whether or not anything is evicted there, so that a replay's
    forwards are the same under every policy and the full cache. ``policy=None``: the full cache."""

    policy: Policy | None = None
    interval: int | None = None
    compress_prompt: bool = False

    @classmethod
    def of(cls, policy: Policy | None, interval: int | None = None, compress_prompt: bool | None = None) -> Schedule:
        """``compress_prompt=None``: the policy's own (RPC: False)."""
        if interval is not None and interval < 1:
            raise FIError(f"interval must be >= 1 fed tokens, got {interval}")
        if compress_prompt is None:
            compress_prompt = policy is not None and policy.compress_prompt
        return cls(policy, interval, bool(compress_prompt))

    @property
    def compresses_prompt(self) -> bool:
        return self.policy is not None and self.compress_prompt

    def next_point(self, fed: int) -> int | None:
        """The first point after ``fed`` tokens fed after the prompt (None: there is none)."""
        if self.interval is None:
            return None
        return max(self.interval, (fed // self.interval + 1) * self.interval)

    def reaches_point(self, fed: int) -> bool:
        """Whether feeding ``fed`` tokens after the prompt reaches a point (evicting there or not)."""
        return self.interval is not None and fed >= self.interval

    def compresses_at(self, fed: int) -> bool:
        """Whether the cache is compressed after the ``fed``-th token fed after the prompt."""
        if self.policy is None or self.policy.prefill_only or self.interval is None:
            return False
        return fed > 0 and fed % self.interval == 0

    def kept(self, seen: int, protected: int, window: int) -> int | None:
        """The budget rule: entries per layer and head kept at a compression that has seen ``seen`` tokens
        of which the first ``protected`` stay; None when only the window (or less) would fit."""
        k = self.policy.kept_total(seen, protected)
        return None if k - protected <= window else k

    def points(self, prompt_len: int, max_new_tokens: int) -> list[int]:
        """Tokens fed after the prompt at which a generation of ``max_new_tokens`` evicts something (0: the
        prompt at prefill), unless an EOS stops it first: :meth:`CompressedDecoder.compress`'s arithmetic,
        without a model (the last token is sampled, never fed)."""
        protected = 0 if self.compress_prompt else prompt_len
        held, last, points = prompt_len, 0, []
        candidates = [0] if self.compresses_prompt else []
        fed = self.next_point(0)
        while fed is not None and fed < max_new_tokens:
            candidates += [fed] if self.compresses_at(fed) else []
            fed = self.next_point(fed)
        for fed in candidates:
            held, last = held + fed - last, fed
            k = self.kept(prompt_len + fed, protected, self.policy.window)
            if k is not None and held > k:
                points.append(fed)
                held = k
        return points


@dataclass
class Compression:
    """One compression that evicted something. ``step``: tokens fed after the prompt when it fired (0: the
    prompt, at prefill), as in ``GenerationStats.compression_steps``; ``seen``: tokens in the sequence so far:
    queries at positions ``>= seen`` no longer see what it evicted. Kept only by a decoder that keeps maps
    (a replay's log): ``keep``, the policy's keep map in *slot* space (the cache before it), and
    ``positions[l]`` ``[Hkv, k_l]``, the original positions each head holds after it (of an uneven map, the first
    ``keep.head_counts[l][h]`` of head ``h``: the rest are its pads, which repeat its last)."""

    step: int
    seen: int
    keep: KeepMap | None = None
    positions: list[torch.Tensor] | None = None

    def counts(self) -> list[int]:
        return self.keep.counts()


@dataclass
class RowState:
    """One sequence's decoding state, all of it in one place (a batched decoder holds one per row).

    ``seen``: tokens fed; ``prompt_len``: the prompt's tokens (prefilled, or fed after the prefill as its
    tail), from which the schedule counts; ``positions[l]`` ``[Hkv, n_l]``: the original position of every
    cache slot; ``dead[l]`` ``[Hkv, n_l]`` bool: the slots no query may see (the pads of an uneven keep map;
    None while every head is even; a dead slot never comes back alive); ``protected[l]``: leading slots never
    evicted (the prompt, when it is not compressible);
    ``tokens`` ``[capacity]``: fed ids by position (kvpress presses read them); ``lookahead``: the known
    future of a replay (what an oracle policy looks ahead to). The record: ``compressions`` (those that
    evicted), ``cache_lengths`` (the longest layer after each token fed after the prefill, before any
    compression), ``peak_cache_bytes`` (keys + values, from the prompt's compression on) and
    ``compression_seconds`` (scoring + gather, prefill and decoding)."""

    schedule: Schedule
    tokens: torch.Tensor
    lookahead: Lookahead | None = None
    keep_maps: bool = False  # whether compressions keep their keep maps and positions
    seen: int = 0
    prompt_len: int = 0
    positions: list[torch.Tensor] = field(default_factory=list)
    dead: list[torch.Tensor] | None = None
    protected: list[int] = field(default_factory=list)
    compressions: list[Compression] = field(default_factory=list)
    cache_lengths: list[int] = field(default_factory=list)
    peak_cache_bytes: int = 0
    compression_seconds: float = 0.0

    @property
    def fed(self) -> int:
        """Tokens fed after the prompt: what the schedule counts."""
        return self.seen - self.prompt_len


@dataclass(frozen=True)
class FedBlock:
    """One forward of :meth:`CompressedDecoder.feed_blocks`: float32 ``logits [q, V]`` of its rows (row ``i``
    predicts the token after ``ids[start + i]``), ``start``: its first id's index in the fed ids, ``lengths``:
    every layer's cache length before it."""

    logits: torch.Tensor
    start: int
    lengths: list[int]


@dataclass(frozen=True)
class Decoded:
    """What :meth:`CompressedDecoder.decode` sampled (an EOS id included when it stopped there) and why it
    stopped: ``"eos"``, ``"stop"`` (the stop rule) or ``"max_new_tokens"``."""

    tokens: list[int]
    stop_reason: str


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


def slot_bytes(cache) -> list[int]:
    """Per layer, the bytes of one cached slot of every KV head (its key and its value)."""
    return [2 * l.keys.shape[1] * l.keys.shape[3] * l.keys.element_size() for l in cache.layers]


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
    """A model plus a cache that a policy keeps within its budget, compressed where ``schedule`` says.

    ``row``: the sequence's :class:`RowState` (positions, protected slots, the schedule, the record);
    ``seen``, ``positions``, ``protected``, ``lookahead`` read it. ``tracker``: the
    :class:`~fi_toolkit.signals.tracker.SignalTracker` of the signals the policy reads (None when it
    reads none); the decoder drives it through its public steps only, and its hooks stay on the model
    from construction to :meth:`close`. The ``tracker`` argument is :meth:`shared`'s and :meth:`fork`'s:
    by default the policy's needs decide what is tracked. ``cache`` stays one object for the decoder's
    life (compactions gather it in place): the tracker reads keys from it. ``interval=None`` never
    compresses while decoding (only the prompt, by the policy's rule); ``keep_maps``: the record keeps
    every compression's keep map and positions (a replay's log)."""

    def __init__(
        self,
        model,
        policy: Policy | None,
        capacity: int,
        config: SignalConfig | None = None,
        compress_prompt: bool | None = None,
        prefill_chunk: int = 2048,
        tracker: SignalTracker | None = None,
        *,
        interval: int | None = None,
        lookahead: Lookahead | None = None,
        keep_maps: bool = False,
    ):
        self.model, self.policy = model, policy
        self.device = next(model.parameters()).device
        self.config = config or signal_config_for(policy)
        self.schedule = Schedule.of(policy, interval, compress_prompt)
        self.prefill_chunk = prefill_chunk
        self.lm_head = decoder_parts(model)[2]
        self.cache = DynamicCache(config=model.config)
        self.row = RowState(self.schedule, torch.zeros(capacity, dtype=torch.long), lookahead, keep_maps)
        self.sharing = False  # CompressedDecoder.shared: prefilled once, then forked per policy
        if tracker is None and policy is not None and policy.needs_signals:
            tracker = SignalTracker(
                self.config,
                capacity,
                policy.tracks_accumulated,
                policy.needs_token_signals,
                hidden_buffer(policy),
                input_scorer(policy),
            )
        self.tracker = tracker
        self._hooks = ExitStack()  # the tracker's hooks, held until close()
        if tracker is not None:
            self._hooks.enter_context(tracker(model))

    # what the row holds, under the names policies, the look-ahead and tests read
    seen = property(lambda self: self.row.seen)
    positions = property(lambda self: self.row.positions)
    protected = property(lambda self: self.row.protected)
    lookahead = property(lambda self: self.row.lookahead)
    compressions = property(lambda self: self.row.compressions)
    compression_seconds = property(lambda self: self.row.compression_seconds)

    @property
    def compression_steps(self) -> list[int]:
        """Tokens fed after the prompt at each compression that evicted something (0: the prompt)."""
        return [c.step for c in self.row.compressions]

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
        self,
        policy: Policy | None,
        compress_prompt: bool | None = None,
        lookahead: Lookahead | None = None,
        *,
        interval: int | None = None,
        keep_maps: bool = False,
    ) -> tuple[CompressedDecoder, KeepMap | None]:
        """A decoder for ``policy`` in the state :meth:`prefill` would have left it in on the same prompt:
        the cache and the tracked signals copied from this prefilled :meth:`shared` decoder, then the
        prompt compressed by the policy's rule. Returns it with the prefill keep map (None: not compressed).
        ``lookahead``: the known future of a replay, for an oracle policy (:mod:`fi_toolkit.compress.lookahead`);
        ``interval``, ``keep_maps``: the fork's schedule and record (as in the constructor).

        The shared decoder's hooks were removed at the end of its prefill (they would record other
        decoders' forwards), so it stays a source for further forks. The fork must be closed by the caller."""
        if not self.sharing:
            raise FIError("only a CompressedDecoder.shared(...) decoder can be forked")
        if self.seen == 0 or any(l.keys.shape[2] != self.seen for l in self.cache.layers):
            raise FIError("fork a shared decoder right after its prefill, before it feeds anything else")
        for name in ("window", "top_k"):  # what the shared signals were computed with (tau, alpha: the policy's)
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
                scorer=input_scorer(policy),
            )
        child = CompressedDecoder(
            self.model,
            policy,
            self.capacity,
            self.config,
            compress_prompt,
            self.prefill_chunk,
            tracker=tracker,
            interval=interval,
            lookahead=lookahead,
            keep_maps=keep_maps,
        )
        for i, layer in enumerate(self.cache.layers):
            child.cache.update(layer.keys.clone(), layer.values.clone(), i)
        p = child.row.seen = self.seen
        child.row.tokens[:p] = self.row.tokens[:p]
        return child, child._end_prompt()

    def _forward(self, ids: torch.Tensor, every_row: bool = False) -> torch.Tensor:
        """Feed ``ids [q]`` at the next positions; returns float32 logits of the last one ``[V]``
        (``every_row``: of every one, ``[q, V]``)."""
        row, q = self.row, ids.numel()
        positions = torch.arange(row.seen, row.seen + q, device=self.device)[None]
        self._note_tokens(ids)
        with hidden_slots(self.model, row.dead):  # an uneven cache's dead slots hidden per head (None: none)
            hidden = self.model.base_model(
                input_ids=ids[None].to(self.device),
                position_ids=positions,
                use_cache=True,
                **cache_kwargs(self.model.base_model, self.cache),
            ).last_hidden_state[0]
        logits = self.lm_head(hidden if every_row else hidden[-1:]).float()
        self._fed(hidden, logits[-1])
        return logits if every_row else logits[0]

    def _note_tokens(self, ids: torch.Tensor) -> None:
        """``ids [q]``, about to be fed, into the record of ids by position (grown past the capacity the caller
        gave)."""
        row, q = self.row, ids.numel()
        if row.seen + q > row.tokens.numel():
            row.tokens = torch.cat([row.tokens, row.tokens.new_zeros(row.seen + q - row.tokens.numel())])
        row.tokens[row.seen : row.seen + q] = ids.cpu()

    def _fed(self, hidden: torch.Tensor, last_logits: torch.Tensor) -> None:
        """After the forward of the ids just noted (their final hidden states ``[q, d]``, the last one's float32
        logits ``[V]``): the tracker records them (the logits only for a single step) and ``seen`` moves on."""
        q = hidden.shape[0]
        if self.tracker:
            self.tracker.record(hidden, last_logits if q == 1 else None)
        self.row.seen += q

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, KeepMap | None]:
        """Run the prompt (in chunks), then compress it if the schedule says so -> the last row's float32
        logits ``[V]`` (before the compression) and the prompt's keep map (None: not compressed)."""
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
        row, hkv = self.row, self.cache.layers[0].keys.shape[1]
        p = row.prompt_len = row.seen
        row.positions = [torch.arange(p, device=self.device).expand(hkv, p) for _ in self.cache.layers]
        row.protected = [0 if self.schedule.compress_prompt else p] * len(self.cache.layers)
        if self.tracker:
            self.tracker.start_decoding(self.cache)
        keep = self.compress(prompt=True) if self.schedule.compresses_prompt else None
        row.peak_cache_bytes = cache_bytes(self.cache)
        return keep

    @torch.no_grad()
    def feed_blocks(
        self, ids: torch.Tensor, max_block: int | None = None, prompt: int = 0, compress_at_end: bool = True
    ) -> Iterator[FedBlock]:
        """Feed ``ids [q]`` (tokens that decoding would feed one at a time) in forwards that end at the
        schedule's points, compressing there -> one :class:`FedBlock` per forward, yielded before the
        compression that follows it (iterate to the end: the last one's compression runs then).

        Each forward equals single steps on the same tokens, the tracked signals included (H, D^(l), the
        last ``w`` queries, H2O's accumulator, which adds the attention of every row of the block).
        ``max_block``: forwards of at most that many tokens (the same result, less memory). ``prompt``: the
        first ``prompt`` ids end the prompt (a question fed after the prefill's compression): the schedule
        counts from after them. ``compress_at_end=False``: no compression after the last id (nothing fed
        after it will read the cache)."""
        ids, row = ids.flatten(), self.row
        if max_block is not None and max_block < 1:
            raise FIError(f"max_block must be >= 1, got {max_block}")
        if prompt:
            if row.fed or not 0 < prompt <= ids.numel():
                raise FIError(f"only the first ids fed after the prefill can end the prompt, got {prompt}")
            row.prompt_len += prompt
        start = 0
        while start < ids.numel():
            end = ids.numel()
            point = self.schedule.next_point(row.fed)
            if point is not None:
                end = min(end, start + point - row.fed)
            if max_block is not None:
                end = min(end, start + max_block)
            lengths = self.entries()
            yield FedBlock(self._feed(ids[start:end]), start, lengths)
            start = end
            if start < ids.numel() or compress_at_end:
                self.compress_if_due()

    def feed(self, ids: torch.Tensor, max_block: int | None = None, prompt: int = 0) -> torch.Tensor:
        """:meth:`feed_blocks`, every row's float32 logits in one tensor ``[q, V]``."""
        rows = [block.logits for block in self.feed_blocks(ids, max_block, prompt)]
        if len(rows) == 1:
            return rows[0]
        return torch.cat(rows) if rows else torch.empty(0, self.lm_head.weight.shape[0], device=self.device)

    block = feed  # the earlier name

    def step(self, token: int) -> torch.Tensor:
        """Feed one token (compressing after it where the schedule says) -> float32 logits ``[V]``."""
        return self.feed(torch.tensor([token], device=self.device))[0]

    def _feed(self, ids: torch.Tensor) -> torch.Tensor:
        """One forward of ``ids [q]`` after the prompt: their slots appended to every head of every layer,
        the cache's growth recorded -> float32 logits ``[q, V]``."""
        row, q = self.row, ids.numel()
        self._append_slots(q)
        logits = self._forward(ids, every_row=True)
        longest = max(self.lengths())
        row.cache_lengths.extend(range(longest - q + 1, longest + 1))
        row.peak_cache_bytes = max(row.peak_cache_bytes, cache_bytes(self.cache))
        return logits

    def _append_slots(self, q: int) -> None:
        """The next ``q`` positions appended to every head's slots (live), before the forward that feeds them."""
        row = self.row
        new = torch.arange(row.seen, row.seen + q, device=self.device).expand(row.positions[0].shape[0], q)
        row.positions = [torch.cat([pos, new], dim=1) for pos in row.positions]
        if row.dead is not None:  # the new slots are live
            row.dead = [torch.nn.functional.pad(d, (0, q)) for d in row.dead]

    @torch.no_grad()
    def decode(
        self,
        logits: torch.Tensor,
        sampling: Sampling,
        max_new: int,
        eos: set[int] | frozenset[int] = frozenset(),
        stop: Callable[[list[int]], bool] | None = None,
        on_token: Callable[[int], None] | None = None,
    ) -> Decoded:
        """Tokens sampled from the next-token ``logits [V]`` on, each fed (and the cache compressed where the
        schedule says) until one stops it: an ``eos`` id (kept in the tokens), ``max_new`` tokens, or
        ``stop(tokens)`` (checked in that order after each token, before it is fed; the last token is never
        fed). ``on_token(token)``: called with each as it is sampled (streaming). Run it inside
        :func:`~fi_toolkit.model.attention.ragged_attention`."""
        if max_new < 1:
            raise FIError(f"max_new must be >= 1 tokens, got {max_new}")
        sample = sampling.sampler(self.device)
        tokens: list[int] = []
        while True:
            tokens.append(sample(logits, self.row.tokens[: self.row.seen]))
            if on_token is not None:
                on_token(tokens[-1])
            if tokens[-1] in eos:
                return Decoded(tokens, "eos")
            if len(tokens) == max_new:
                return Decoded(tokens, "max_new_tokens")
            if stop is not None and stop(tokens):
                return Decoded(tokens, "stop")
            logits = self.step(tokens[-1])

    def lengths(self) -> list[int]:
        """Every layer's slots (dead ones included: what the cache holds)."""
        return [int(l.keys.shape[2]) for l in self.cache.layers]

    def live(self) -> list[torch.Tensor]:
        """Per layer, the live slots of each KV head ``[Hkv]`` (every slot while no head has a dead one)."""
        if self.row.dead is None:
            return [torch.full((l.keys.shape[1],), int(l.keys.shape[2])) for l in self.cache.layers]
        return [(~d).sum(dim=1).cpu() for d in self.row.dead]

    def entries(self) -> list[int] | list[float]:
        """Per layer, the entries a query attends to in the cache: :meth:`lengths` while every head is even,
        else the mean over its KV heads of their live slots."""
        if self.row.dead is None:
            return self.lengths()
        return [float(n.double().mean()) for n in self.live()]

    def signals(self) -> Signals:
        """The policy's view of the current cache, in slot space: the tracker's view (none without one),
        with the decoder's protected slots, token ids and model."""
        row = self.row
        mine = {
            "protected": list(row.protected),
            "tokens": row.tokens[: row.seen],
            "model": self.model,
            "dead": row.dead,
        }
        if self.tracker:
            return replace(self.tracker.view(row.positions), **mine)
        return Signals(
            window=self.config.window,
            seen=row.seen,
            keys=[l.keys for l in self.cache.layers],
            positions=row.positions,
            values=[l.values for l in self.cache.layers],
            **mine,
        )

    @torch.no_grad()
    def compress(self, prompt: bool = False) -> KeepMap | None:
        """Back to the budget with the policy now (the schedule calls it; tests may too): the keep map, or
        None when nothing had to go (or only the window would fit, or the policy compresses the prompt
        only and this is not the ``prompt``'s compression, or an oracle has nothing left to look ahead to).
        A compression that evicted is added to the record."""
        row = self.row
        if self.policy is None or (self.policy.prefill_only and not prompt):
            return None
        protected = max(row.protected)
        k = self.schedule.kept(row.seen, protected, self.config.window)
        held = self.lengths() if row.dead is None else [int(n.max()) for n in self.live()]
        if k is None or max(held) <= k:
            return None
        _sync(self.device)
        t0 = time.perf_counter()
        estimates = None
        if getattr(self.policy, "sees_future", False):  # an oracle: its scores are the look-ahead's estimates
            estimates = lookahead_estimates(self, k, protected)
            if estimates is None:
                return None  # nothing left to look ahead to (fi_toolkit.compress.lookahead)
        keep_map = self.policy.keep_map(replace(self.signals(), fi_estimates=estimates))
        dead = self._dead_after(keep_map)
        if row.dead is not None:  # a layer budget shared over heads may leave every live slot in place
            pads = [0] * len(keep_map.keep) if dead is None else [int(d.sum()) for d in dead]
            after = [idx.numel() - n for idx, n in zip(keep_map.keep, pads)]
            if after == [int((~d).sum()) for d in row.dead]:
                return None
        kept = gather_cache(
            [l.keys for l in self.cache.layers], [l.values for l in self.cache.layers], keep_map, self.model.config
        )
        for layer, gathered in zip(self.cache.layers, kept.layers):  # in place: the tracker reads this cache
            layer.keys, layer.values = gathered.keys, gathered.values
        row.positions = [pos.gather(1, idx) for pos, idx in zip(row.positions, keep_map.keep)]
        row.dead = dead
        if self.tracker:
            self.tracker.compact(keep_map.keep, dead)
        _sync(self.device)
        row.compression_seconds += time.perf_counter() - t0
        maps = (keep_map, row.positions) if row.keep_maps else ()
        row.compressions.append(Compression(row.fed, row.seen, *maps))
        return keep_map

    def compress_if_due(self) -> KeepMap | None:
        """After a forward: :meth:`compress` when the schedule compresses after the tokens fed so far (the
        keep map, or None). :meth:`feed_blocks` calls it after each of its forwards, a batch of decoders
        (:mod:`fi_toolkit.compress.batched`) after each of the batch's."""
        return self.compress() if self.schedule.compresses_at(self.row.fed) else None

    def _dead_after(self, keep_map: KeepMap) -> list[torch.Tensor] | None:
        """Per layer, the dead slots of the cache gathered to ``keep_map`` ``[Hkv, k_l]``: an uneven map's pads
        (slots ``>= head_counts[l][h]``) and any slot that was dead already (a dead slot never comes back alive);
        None when there are none."""
        row = self.row
        if not keep_map.uneven and row.dead is None:
            return None
        dead = []
        for layer, idx in enumerate(keep_map.keep):
            idx = idx.to(self.device)
            d = torch.zeros(idx.shape, dtype=torch.bool, device=self.device)
            if keep_map.uneven:
                counts = keep_map.head_counts[layer].to(self.device)
                d |= torch.arange(idx.shape[1], device=self.device)[None, :] >= counts[:, None]
            if row.dead is not None:
                d |= row.dead[layer].gather(1, idx)
            dead.append(d)
        return dead if any(bool(d.any()) for d in dead) else None


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
    unless an EOS stops it first (:meth:`Schedule.points`)."""
    return Schedule.of(policy, interval, compress_prompt).points(prompt_len, max_new_tokens)


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


def _check_generation(model, ids: torch.Tensor, policy, max_new_tokens: int, schedule: Schedule) -> str:
    """Refuse what can never run (one FIError line) -> the note for a budget that never evicts ("": none)."""
    if ids.numel() == 0:
        raise FIError("the prompt is empty")
    p = ids.numel()
    check_model(model)
    limit = context_limit(model.config)
    if limit is not None and p + max_new_tokens > limit:
        raise FIError(f"prompt ({p}) + max-new ({max_new_tokens}) exceeds the model's {context_phrase(model.config)}")
    if policy is None:
        return ""
    check_budget(policy, p, max_new_tokens, schedule.compress_prompt)
    if schedule.points(p, max_new_tokens):
        return ""
    return (
        f"nothing evicted: with budget {policy.budget.label}, --interval {schedule.interval} and "
        f"{max_new_tokens} new tokens the cache never exceeds its budget"
    )


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
    schedule = Schedule.of(policy, interval, compress_prompt)
    sampling = Sampling(temperature, top_p, seed)
    ids = prompt.flatten().long() if isinstance(prompt, torch.Tensor) else encode_prompt(tokenizer, prompt, chat)
    note = _check_generation(model, ids, policy, max_new_tokens, schedule)
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cpu_reset = device.type == "cpu" and _reset_cpu_peak()
    stats = GenerationStats(prompt_tokens=ids.numel(), note=note)
    decoder = CompressedDecoder(
        model, policy, ids.numel() + max_new_tokens, config, compress_prompt, prefill_chunk, interval=interval
    )
    streamer, eos = _Streamer(tokenizer, on_text), _eos_ids(model, tokenizer, eos_token_id)
    try:
        with ragged_attention(model):
            _sync(device)
            t0 = time.perf_counter()
            logits, keep = decoder.prefill(ids)
            _sync(device)
            stats.prefill_seconds = time.perf_counter() - t0
            if not note and policy is not None and schedule.compress_prompt and keep is None:
                stats.note = "prompt not compressed: its budget share is not between the window and its length"
            t0 = time.perf_counter()
            decoded = decoder.decode(logits, sampling, max_new_tokens, eos, on_token=streamer.put)
            _sync(device)
            stats.decode_seconds = time.perf_counter() - t0
    finally:
        decoder.close()
        streamer.end()
    _fill_stats(stats, decoder, decoded, keep, cpu_reset)
    text = tokenizer.decode(decoded.tokens, skip_special_tokens=True) if tokenizer is not None else ""
    return GenerationResult(text, decoded.tokens, ids, stats, keep)


def _fill_stats(stats: GenerationStats, decoder: CompressedDecoder, decoded: Decoded, keep, cpu_reset: bool) -> None:
    """What the decoder's record and the device say about a finished generation."""
    row, device = decoder.row, decoder.device
    stats.new_tokens, stats.stop_reason = len(decoded.tokens), decoded.stop_reason
    stats.prefill_compressed = keep is not None
    stats.compression_steps = [c.step for c in row.compressions if c.step > 0]  # decoding's (0: the prompt)
    stats.compressions = len(stats.compression_steps)
    stats.cache_lengths, stats.peak_cache_bytes = row.cache_lengths, row.peak_cache_bytes
    stats.compression_seconds = row.compression_seconds
    per_token = sum(slot_bytes(decoder.cache))
    stats.cache_bytes_full = per_token * row.seen
    stats.cache_bytes_kept = cache_bytes(decoder.cache)
    if device.type == "cuda":
        stats.peak_memory_bytes, stats.peak_memory_kind = torch.cuda.max_memory_allocated(device), "cuda max allocated"
    else:
        stats.peak_memory_bytes, stats.peak_memory_kind = _cpu_peak(cpu_reset)
