"""Several sequences decoded together under a compressing policy, each exactly as it decodes alone.

:class:`BatchedDecoder` holds one :class:`~fi_toolkit.compress.decoder.CompressedDecoder` per sequence (its
``RowState``, its tracker, its schedule, its record) and one dense cache ``[B, Hkv, n_l, hd]`` per layer that
every forward reads. Design (docs/guides/lm-eval.md, "Batching"):

* **Ragged rows, padded on the left.** Row ``r`` of layer ``l`` holds its own slots right-aligned, after
  ``lead[r][l]`` pad slots. The pads are *dead* (:func:`~fi_toolkit.model.attention.hidden_slots`, per batch
  row and KV head: exactly zero attention weight), as are the row's own dead slots (an uneven keep map's pads).
  The prompts are prefilled together, padded on the left with an attention mask and per-row positions (each
  row's first real token at position 0), as lm-eval's ``hf`` backend does.
* **Each row sees only itself.** A row's decoder reads the batch's cache through a view that strips its leading
  pads (:class:`_RowCache`), and its tracker reads only its own batch row and columns of every forward
  (``SignalTracker.row``): its signals, its policy's scores, its keep maps and its positions are those of the
  same sequence decoded alone (up to the rounding of a batched kernel), and nothing of another row reaches them.
* **Each row compresses at its own points** (its own fed count, its own budget); a compression gathers that
  row's slots only; the batch then re-pads every layer to its longest row (:meth:`BatchedDecoder._rebuild`).
  In generation every row is fed one token per step, so the rows' points coincide and the cache is re-padded
  once per compression step.
* Rows that stop leave the batch (:meth:`BatchedDecoder.leave`): their slots are dropped from the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from fi_toolkit.compress.decoder import CompressedDecoder, Decoded, slot_bytes
from fi_toolkit.compress.sampling import Sampling
from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import decoder_parts
from fi_toolkit.model.attention import hidden_slots, ragged_attention
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.policies import Policy
from fi_toolkit.signals.config import SignalConfig


class _RowLayer:
    """One layer of one row's cache: the batch's layer without the row's leading pads, ``[1, Hkv, n, hd]``.
    A compression assigns the row's gathered tensors; they are held here until the batch re-pads its cache."""

    def __init__(self, batch: BatchedDecoder, row: int, layer: int):
        self.batch, self.row, self.layer = batch, row, layer
        self.pending: dict[str, torch.Tensor] = {}

    def _view(self, name: str) -> torch.Tensor:
        if name in self.pending:
            return self.pending[name]
        i = self.batch.index[self.row]
        full = getattr(self.batch.cache.layers[self.layer], name)
        return full[i : i + 1, :, self.batch.lead[self.row][self.layer] :]

    keys = property(lambda self: self._view("keys"), lambda self, t: self.pending.__setitem__("keys", t))
    values = property(lambda self: self._view("values"), lambda self, t: self.pending.__setitem__("values", t))


class _RowCache:
    """What a row's decoder and tracker read as their cache: a view of the batch's (``layers``)."""

    def __init__(self, batch: BatchedDecoder, row: int, n_layers: int):
        self.layers = [_RowLayer(batch, row, layer) for layer in range(n_layers)]


class BatchedDecoder:
    """``len(capacities)`` sequences decoded together under ``policy``, each with its own
    :class:`CompressedDecoder` (``rows[r]``: its ``row`` record, ``compression_steps``, ``seen``; ``keep_maps``:
    each compression's keep map and positions kept, as a decoder's) and all of them in one padded cache
    (``cache``, ``lead``, ``dead``). :meth:`prefill` the prompts, then :meth:`step` one token
    per row still in the batch (``active``), :meth:`leave` the rows that stop, :meth:`close` at the end. Run it
    inside :func:`~fi_toolkit.model.attention.ragged_attention`."""

    def __init__(
        self,
        model,
        policy: Policy | None,
        capacities: Sequence[int],
        config: SignalConfig | None = None,
        prefill_chunk: int = 2048,
        *,
        interval: int | None = None,
        keep_maps: bool = False,
    ):
        if not capacities:
            raise FIError("a batch needs at least one sequence")
        self.model, self.policy, self.prefill_chunk = model, policy, prefill_chunk
        self.device = next(model.parameters()).device
        layers, _, self.lm_head = decoder_parts(model)
        n_layers = len(layers)
        self.rows = [
            CompressedDecoder(
                model, policy, c, config, prefill_chunk=prefill_chunk, interval=interval, keep_maps=keep_maps
            )
            for c in capacities
        ]
        for r, decoder in enumerate(self.rows):
            decoder.cache = _RowCache(self, r, n_layers)
        self.cache = DynamicCache(config=model.config)
        self.index: list[int | None] = list(range(len(self.rows)))  # each row's batch row (None: it left)
        self.lead: list[list[int]] = [[0] * n_layers for _ in self.rows]  # each row's pad slots, per layer
        self.dead: list[torch.Tensor] | None = None  # per layer [B, Hkv, n_l]: the slots no query of a row sees
        self.final_lengths: list[list[int] | None] = [None] * len(self.rows)  # each row's layers when it left

    @property
    def active(self) -> list[int]:
        """The rows still in the batch, in the order of the cache's batch rows."""
        return [r for r in range(len(self.rows)) if self.index[r] is not None]

    def lengths(self, r: int) -> list[int]:
        """Row ``r``'s slots per layer (its dead ones included), as its decoder alone would hold them."""
        if self.index[r] is None:
            return list(self.final_lengths[r])
        return [int(l.keys.shape[2]) - lead for l, lead in zip(self.cache.layers, self.lead[r])]

    def close(self) -> None:
        """Remove every row's tracker hooks (idempotent)."""
        for decoder in self.rows:
            decoder.close()

    # --- forwards ----------------------------------------------------------------------------------
    def _select(self, starts: dict[int, int]) -> None:
        """Point each active row's tracker at its batch row and first real column of the next forward."""
        for r in self.active:
            tracker = self.rows[r].tracker
            if tracker is not None:
                tracker.row, tracker.paused = (self.index[r], starts.get(r, 0)), False

    @contextmanager
    def _alone(self, r: int | None):
        """Only row ``r``'s tracker records forwards run inside the block, as a batch of one (a press's own
        prefill at its compression); ``None``: none records. Every tracker is paused after the block, until the
        next batched forward selects them."""
        for i, decoder in enumerate(self.rows):
            if decoder.tracker is not None:
                decoder.tracker.row, decoder.tracker.paused = None, i != r
        try:
            yield
        finally:
            for decoder in self.rows:
                if decoder.tracker is not None:
                    decoder.tracker.paused = True

    def _record(self, r: int, ids: list[int], hidden: torch.Tensor, logits: torch.Tensor) -> None:
        """Row ``r`` was fed ``ids`` (its ``hidden [q, d]``, the last one's ``logits [V]``): recorded as its
        decoder records its own forwards (ids by position, its tracker, its ``seen``)."""
        decoder = self.rows[r]
        decoder._note_tokens(torch.tensor(ids, dtype=torch.long))
        decoder._fed(hidden, logits)

    @torch.no_grad()
    def prefill(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Run the prompts (one per row, padded on the left, in chunks of ``prefill_chunk`` columns), then end
        each row's prompt as its decoder would (positions, protected slots, its compression by the policy's
        rule) -> each row's float32 logits after its prompt ``[B, V]`` (before any compression)."""
        if len(prompts) != len(self.rows) or any(not p for p in prompts):
            raise FIError("prefill needs one non-empty prompt per row")
        width = max(len(p) for p in prompts)
        pads = [width - len(p) for p in prompts]
        ids = torch.tensor([[p[0]] * n + list(p) for p, n in zip(prompts, pads)], dtype=torch.long, device=self.device)
        mask = torch.tensor([[0] * n + [1] * len(p) for p, n in zip(prompts, pads)], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        base = self.model.base_model
        for a in range(0, width, self.prefill_chunk):
            e = min(width, a + self.prefill_chunk)
            starts = {r: max(0, pads[r] - a) for r in range(len(self.rows))}
            self._select(starts)
            hidden = base(
                input_ids=ids[:, a:e],
                attention_mask=mask[:, :e],
                position_ids=positions[:, a:e],
                use_cache=True,
                **cache_kwargs(base, self.cache),
            ).last_hidden_state
            logits = self.lm_head(hidden[:, -1]).float()
            for r, prompt in enumerate(prompts):
                first = starts[r]
                if first < e - a:
                    self._record(r, list(prompt[a + first - pads[r] : e - pads[r]]), hidden[r, first:], logits[r])
        self.lead = [[n] * len(self.cache.layers) for n in pads]
        for r, decoder in enumerate(self.rows):
            with self._alone(r):
                decoder._end_prompt()
        self._rebuild()
        return logits

    @torch.no_grad()
    def step(self, tokens: Sequence[int]) -> torch.Tensor:
        """Feed one token to each active row (in :attr:`active` order), then compress each row whose schedule
        says so (its own fed count and budget) -> float32 logits ``[B, V]`` (before those compressions)."""
        return self.feed([[int(t)] for t in tokens])[1]

    @torch.no_grad()
    def feed(
        self, ids: Sequence[Sequence[int]], compress_after: Sequence[bool] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``q`` known tokens to each active row (the same ``q`` for all, in :attr:`active` order) in one
        forward, then compress each row whose schedule says so, unless ``compress_after[slot]`` is False (nothing
        will read that row's cache again) -> the final hidden states ``[B, q, d]`` and the float32 logits of the
        last column ``[B, V]`` (before those compressions). A block must not cross a row's compression point:
        :meth:`block_end` says where the next one ends."""
        active = self.active
        q = len(ids[0]) if ids else 0
        if len(ids) != len(active) or q < 1 or any(len(row) != q for row in ids):
            raise FIError(f"feed needs the same number (>= 1) of tokens for each of the {len(active)} active rows")
        self._select({})
        for r in active:
            self.rows[r]._append_slots(q)
        base = self.model.base_model
        start = torch.tensor([[self.rows[r].row.seen] for r in active], device=self.device)
        with hidden_slots(self.model, self.dead):
            hidden = base(
                input_ids=torch.tensor([list(row) for row in ids], dtype=torch.long, device=self.device),
                position_ids=start + torch.arange(q, device=self.device)[None],
                use_cache=True,
                **cache_kwargs(base, self.cache),
            ).last_hidden_state
        logits = self.lm_head(hidden[:, -1]).float()
        if self.dead is not None:  # the new slots are live
            self.dead = [torch.nn.functional.pad(d, (0, q)) for d in self.dead]
        compressed = False
        for slot, (r, row_ids) in enumerate(zip(active, ids)):
            self._record(r, [int(t) for t in row_ids], hidden[slot], logits[slot])
            self._note_growth(r, q)
            if compress_after is None or compress_after[slot]:
                with self._alone(r):
                    compressed = self.rows[r].compress_if_due() is not None or compressed
        if compressed:
            self._rebuild()
        return hidden, logits

    def block_end(self, remaining: int) -> int:
        """How many tokens the next :meth:`feed` may take: up to the active rows' next compression point (their
        fed counts are equal when they were fed together since the prefill) and at most ``remaining``."""
        points = [self.rows[r].schedule.next_point(self.rows[r].row.fed) for r in self.active]
        ends = [p - self.rows[r].row.fed for p, r in zip(points, self.active) if p is not None]
        return min([remaining, *ends])

    def _note_growth(self, r: int, q: int) -> None:
        """Row ``r``'s record after ``q`` tokens fed: its longest layer and its cache's bytes (as its decoder
        alone records them), from the slot counts."""
        row, lengths = self.rows[r].row, self.lengths(r)
        row.cache_lengths.extend(range(max(lengths) - q + 1, max(lengths) + 1))
        per_slot = slot_bytes(self.cache)
        row.peak_cache_bytes = max(row.peak_cache_bytes, sum(n * b for n, b in zip(lengths, per_slot)))

    def leave(self, rows: Sequence[int]) -> None:
        """Rows that stopped leave the batch: their slots are dropped from the cache, their hooks removed."""
        if not rows:
            return
        for r in rows:
            if self.index[r] is None:
                continue
            self.final_lengths[r] = self.lengths(r)
            for layer in self.rows[r].cache.layers:  # a left row keeps no view of the batch's cache
                layer.pending = {}
            self.index[r] = None
            self.rows[r].close()
            if self.rows[r].tracker is not None:
                self.rows[r].tracker.row = None
        self._rebuild()

    def _rebuild(self) -> None:
        """Every layer of the cache re-padded: each active row's slots (a compression's gathered ones, or as
        they were) right-aligned after as many dead pad slots as its layer is shorter than the longest row;
        ``index``, ``lead`` and ``dead`` follow."""
        active = self.active
        if not active:
            self.cache = DynamicCache(config=self.model.config)
            self.dead = None
            return
        parts = {r: [(l.keys, l.values) for l in self.rows[r].cache.layers] for r in active}
        dead: list[torch.Tensor] = []
        any_dead = False
        for layer, cached in enumerate(self.cache.layers):
            rows = [parts[r][layer] for r in active]
            n = max(k.shape[2] for k, _ in rows)
            k0 = rows[0][0]
            keys = k0.new_zeros(len(active), k0.shape[1], n, k0.shape[3])
            values = rows[0][1].new_zeros(len(active), rows[0][1].shape[1], n, rows[0][1].shape[3])
            hidden = torch.zeros(len(active), k0.shape[1], n, dtype=torch.bool, device=k0.device)
            for slot, (r, (k, v)) in enumerate(zip(active, rows)):
                lead = n - k.shape[2]
                keys[slot, :, lead:], values[slot, :, lead:] = k[0], v[0]
                self.lead[r][layer] = lead
                hidden[slot, :, :lead] = True
                own = self.rows[r].row.dead
                if own is not None:
                    hidden[slot, :, lead:] = own[layer].to(hidden.device)
            cached.keys, cached.values = keys, values
            dead.append(hidden)
            any_dead = any_dead or bool(hidden.any())
        for slot, r in enumerate(active):
            self.index[r] = slot
            for layer in self.rows[r].cache.layers:
                layer.pending = {}
        self.dead = dead if any_dead else None


@torch.no_grad()
def decode_batch(
    model,
    prompts: Sequence[Sequence[int]],
    policy: Policy | None,
    interval: int | None,
    max_new: Sequence[int],
    samplings: Sequence[Sampling],
    eos: set[int] | frozenset[int] = frozenset(),
    stops: Sequence[Callable[[list[int]], bool] | None] | None = None,
    config: SignalConfig | None = None,
    prefill_chunk: int = 2048,
) -> tuple[list[Decoded], BatchedDecoder]:
    """Each prompt decoded as :meth:`CompressedDecoder.decode` decodes it alone (prefill, its compression, a
    token sampled, checked against ``eos``, ``max_new`` and ``stop`` in that order, fed, compressed where its
    schedule says), all of them in one batch (:class:`BatchedDecoder`); a row leaves the batch when it stops.
    Returns the decoded tokens per prompt and the (closed) batch, whose ``rows`` hold each row's record."""
    stops = stops or [None] * len(prompts)
    if any(m < 1 for m in max_new):
        raise FIError(f"max_new must be >= 1 tokens, got {min(max_new)}")
    batch = BatchedDecoder(
        model, policy, [len(p) + m for p, m in zip(prompts, max_new)], config, prefill_chunk, interval=interval
    )
    device = batch.device
    samplers = [s.sampler(device) for s in samplings]
    tokens: list[list[int]] = [[] for _ in prompts]
    reasons: list[str] = [""] * len(prompts)
    try:
        with ragged_attention(model):
            logits = batch.prefill(prompts)
            while True:
                fed, done = [], []
                for slot, r in enumerate(batch.active):
                    row = batch.rows[r].row
                    tokens[r].append(samplers[r](logits[slot], row.tokens[: row.seen]))
                    if tokens[r][-1] in eos:
                        reasons[r] = "eos"
                    elif len(tokens[r]) == max_new[r]:
                        reasons[r] = "max_new_tokens"
                    elif stops[r] is not None and stops[r](tokens[r]):
                        reasons[r] = "stop"
                    else:
                        fed.append(tokens[r][-1])
                        continue
                    done.append(r)
                if done:
                    batch.leave(done)
                if not fed:
                    break
                logits = batch.step(fed)
    finally:
        batch.close()
    return [Decoded(t, why) for t, why in zip(tokens, reasons)], batch
