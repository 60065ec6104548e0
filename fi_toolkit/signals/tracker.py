"""The signals tracked while a model runs (docs/method.md, "Signals"): :class:`SignalTracker` owns its
forward hooks and its state, as a kvpress press owns its hooks.

Lifecycle, shared by the prefix trace (:func:`~fi_toolkit.signals.trace.trace_prefix`), compressed
decoding (:class:`~fi_toolkit.compress.decoder.CompressedDecoder`) and kvpress's ``InfoKVPress``::

    tracker = SignalTracker(config, capacity, accumulate=True)
    with tracker(model):                      # hooks on enter, removed in `finally`
        hidden = model.base_model(...)        # the prefill, in chunks
        tracker.record(hidden[0])             # H and D^(l) of the rows just fed
    tracker.start_decoding(cache)             # prefill done: bind the cache, start H2O's accumulator
    with tracker(model):
        ...                                   # decoding forwards on `cache`, each followed by record()
    signals = tracker.view(positions)         # what a policy scores at a compression
    tracker.compact(keep)                     # after the caller gathered `cache` to `keep`
    child = tracker.fork()                    # an independent copy for a forked decoder

The hooks capture (a) each decoder layer's input ``h^(l)``, (b) the residual stream before the final
norm ``h^(L)``, and (c) each attention module's input, from which the last ``w`` queries are
recomputed (never the full attention matrix); :meth:`SignalTracker.record` turns them into ``D^(l)``
and, through the streamed LM head, the top-k entropy ``H``.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import apply_rope, decoder_parts, queries
from fi_toolkit.signals import formulas as signals
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.signals.formulas import entropy_of_tokens
from fi_toolkit.signals.policy_view import Signals


def window_queries(attn_module, hidden_states, position_embeddings, window: int) -> torch.Tensor:
    """Recompute the rotated queries of the last ``window`` positions of an attention input -> ``[Hq, w, hd]``:
    the module's own query path (:func:`architectures.queries`), then its own ``apply_rotary_pos_emb``."""
    q = queries(attn_module, hidden_states[:, -window:])
    cos, sin = position_embeddings
    q, _ = apply_rope(attn_module)(q, q, cos[:, -window:], sin[:, -window:])
    return q[0]


class SignalTracker:
    """Per-token and per-slot signals of one sequence fed through one model.

    State (float32, on the model's device; read it, never write it from outside):

    - ``seen``: tokens recorded so far (positions ``[0, seen)``).
    - ``entropy [capacity]``: top-k entropy of the distribution computed *at* each position (the
      convention ``config.entropy_of`` is applied by :meth:`view`); ``distance [L, capacity]``:
      ``D^(l)`` of each position. Both empty unless ``token_signals`` (InfoKV needs them).
    - ``queries``: per layer, the last ``w`` RoPE-rotated queries ``[Hq, w, hd]``.
    - ``accumulated``: per layer, H2O's accumulator ``[Hkv, n_l]`` in slot space (attention each
      cache slot received from the window queries at the prefill and from every row fed after it),
      or None before :meth:`start_decoding` and when not ``accumulate``.
    - ``dead``: per layer, the bound cache's dead slots ``[Hkv, m_l]`` (True: a pad slot of an uneven keep map,
      which no query sees; slots past ``m_l``, fed since, are live), as the last :meth:`compact` set them; None
      while every head is even. Dead slots get zero attention in the accumulator and the window attention.
    - ``moments``: per layer, :func:`~fi_toolkit.signals.formulas.add_query_moments` of the pre-RoPE queries
      of the rows fed since the last :meth:`compact` (the prefill's included), past the first
      ``QUERY_SINKS`` of them (kvpress's ExpectedAttention leaves them out), or None before such a row.
    - ``inputs``, ``rope``: with ``hidden_buffer = B > 0``, per layer the attention module's inputs of the
      rows fed since :meth:`start_decoding` or the last :meth:`compact` (at most the last ``B``) ``[1, m, d]``,
      and the position
      embeddings ``(cos, sin)`` of those rows ``[1, m, hd]`` each: what a kvpress press scores with while
      decoding (kvpress's ``DecodingPress`` buffers the same rows and clears them at each compression).

    ``capacity`` is the number of positions the buffers hold at first; they grow past it if fed more.
    """

    def __init__(
        self,
        config: SignalConfig,
        capacity: int,
        accumulate: bool = False,
        token_signals: bool = True,
        hidden_buffer: int = 0,
        scorer=None,
    ):
        self.config = config
        # scorer.score(layer, x [q, d]) -> [q, Hkv]: each row's scores from its attention input, computed once as
        # it is fed (the surrogate's, KVzap's way), kept by position in input_scores[layer] [Hkv, positions]
        self.scorer = scorer
        self.input_scores: list[torch.Tensor | None] = []
        self.capacity = capacity
        self.accumulate = accumulate
        self.token_signals = token_signals
        self.hidden_buffer = hidden_buffer
        self.inputs: list[torch.Tensor | None] = []
        self.rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.seen = 0
        self.entropy: torch.Tensor | None = None  # allocated on the model's device at the first enter
        self.distance: torch.Tensor | None = None
        self.queries: list[torch.Tensor | None] = []
        self.accumulated: list[torch.Tensor] | None = None
        self.dead: list[torch.Tensor] | None = None
        self.moments: list[tuple | None] = []
        self.span: list[int] = []  # per layer, rows fed since the last compact (QUERY_SINKS of them are skipped)
        self._model = None
        self._parts = None  # (decoder layers, final norm, LM head)
        self._cache = None  # the cache decoding reads keys from (start_decoding)
        self._inputs: dict = {}
        # in a batched forward (fi_toolkit.compress.batched): the batch row this tracker follows and its first
        # real column (the left padding before it is another row's length, not this sequence); None: batch of one.
        # paused: the hooks record nothing (a forward of another sequence of the batch, e.g. a press's own prefill)
        self.row: tuple[int, int] | None = None
        self.paused = False

    def _mine(self, t: torch.Tensor) -> torch.Tensor:
        """This sequence's rows of a forward's ``[B, q, ...]`` tensor (all of it outside a batched forward)."""
        return t if self.row is None else t[self.row[0] : self.row[0] + 1, self.row[1] :]

    # ---- hooks -------------------------------------------------------------------------------------

    @contextmanager
    def __call__(self, model):
        """Track the forwards of ``model`` run inside the block: hooks registered on enter, removed on
        exit (also when the block raises). A tracker follows one model; call :meth:`record` after each
        forward, inside the block."""
        self._bind_model(model)
        layers, norm, _ = self._parts
        handles = []
        try:
            if self.token_signals:
                handles.append(norm.register_forward_pre_hook(self._norm_hook))
            for i, layer in enumerate(layers):
                if self.token_signals:
                    handles.append(layer.register_forward_pre_hook(self._input_hook(i), with_kwargs=True))
                handles.append(layer.self_attn.register_forward_hook(self._attention_hook, with_kwargs=True))
            yield self
        finally:
            for h in handles:
                h.remove()
            self._inputs.clear()  # hidden states of a forward that was not recorded

    def _bind_model(self, model) -> None:
        if self._model is not None:
            if model is not self._model:
                raise FIError("a SignalTracker follows the one model it first tracked")
            return
        self._parts = decoder_parts(model)
        self._model = model
        n_layers = len(self._parts[0])
        device = next(model.parameters()).device
        size = self.capacity if self.token_signals else 0
        self.entropy = torch.zeros(size, device=device)
        self.distance = torch.zeros(n_layers, size, device=device)
        self.queries = [None] * n_layers
        self.inputs = [None] * n_layers
        self.moments, self.span = [None] * n_layers, [0] * n_layers
        self.input_scores = [None] * n_layers

    def _input_hook(self, layer_idx: int):
        def hook(_module, args, kwargs):
            if self.paused:
                return
            self._inputs[layer_idx] = self._mine(args[0] if args else kwargs["hidden_states"])

        return hook

    def _norm_hook(self, _module, args):
        if not self.paused:
            self._inputs["pre_norm"] = self._mine(args[0])

    def _attention_hook(self, module, args, kwargs, _output):
        if self.paused:
            return
        hs = self._mine(args[0] if args else kwargs["hidden_states"])
        # a batched forward with nothing of this sequence (a prefill chunk of its padding)
        if hs.shape[0] == 0 or hs.shape[1] == 0:
            return
        rope = tuple(self._mine(t) for t in kwargs["position_embeddings"])
        w = self.config.window
        i = module.layer_idx
        # decoding (the accumulator exists once the prefill is done): every fed row's attention counts,
        # whether the rows come one step at a time or as one block (CompressedDecoder.block)
        accumulate = self.accumulated is not None
        q = window_queries(module, hs, rope, hs.shape[1] if accumulate else min(w, hs.shape[1]))
        prev = self.queries[i]
        self.queries[i] = (q if prev is None else torch.cat([prev, q[:, -w:]], dim=1))[:, -w:]
        if self.hidden_buffer:
            self._buffer(i, hs, rope)
        if self.scorer is not None:
            self._score_rows(i, hs[0])
        skip = max(0, signals.QUERY_SINKS - self.span[i])
        self.span[i] += hs.shape[1]
        if hs.shape[1] > skip:
            self.moments[i] = signals.add_query_moments(self.moments[i], queries(module, hs[:, skip:])[0])
        if accumulate:
            keys = self._cache.layers[i].keys[0]  # already holds the keys of this forward's rows (the last slots)
            acc = self.accumulated[i]
            acc = torch.cat([acc, acc.new_zeros(keys.shape[0], keys.shape[1] - acc.shape[1])], dim=1)
            self.accumulated[i] = acc + signals.attention_received(
                q, keys, module.scaling, self._dead(i, keys.shape[1])
            )

    def _score_rows(self, layer: int, x: torch.Tensor) -> None:
        """The scorer's scores of the rows just fed (positions ``[seen, seen + q)``: :meth:`record` advances
        ``seen`` after the forward), into ``layer``'s position-indexed buffer (grown as needed)."""
        start, q = self.seen, x.shape[0]
        rows = self.scorer.score(layer, x).t()  # [Hkv, q]
        held = self.input_scores[layer]
        if held is None:
            held = rows.new_zeros(rows.shape[0], max(self.capacity, start + q))
        elif held.shape[1] < start + q:
            held = torch.cat([held, held.new_zeros(held.shape[0], start + q - held.shape[1])], dim=1)
        held[:, start : start + q] = rows.to(held.dtype)
        self.input_scores[layer] = held

    def _buffer(self, layer: int, hidden_states: torch.Tensor, position_embeddings) -> None:
        """Append the rows just fed to ``layer``'s buffer of attention inputs (and, once per forward, their
        position embeddings), keeping the last ``hidden_buffer``."""
        b = self.hidden_buffer
        prev = self.inputs[layer]
        self.inputs[layer] = (hidden_states if prev is None else torch.cat([prev, hidden_states], dim=1))[:, -b:]
        if layer == 0:
            cos, sin = position_embeddings
            if self.rope is not None:
                cos, sin = torch.cat([self.rope[0], cos], dim=1), torch.cat([self.rope[1], sin], dim=1)
            self.rope = (cos[:, -b:], sin[:, -b:])

    # ---- the public steps --------------------------------------------------------------------------

    def record(self, hidden: torch.Tensor, last_logits: torch.Tensor | None = None) -> None:
        """After a forward of the next ``q`` tokens, inside ``with tracker(model)``: store the H and
        ``D^(l)`` of positions ``[seen, seen + q)`` and advance ``seen`` by ``q``.

        ``hidden [q, d]``: the forward's final hidden states (after the final norm).
        ``last_logits [V]``: the logits of the last row, when the caller computed them and ``q == 1``
        (saves the LM head); otherwise H comes from the streamed LM head over ``hidden``."""
        q, start = hidden.shape[0], self.seen
        self.seen += q
        if not self.token_signals:
            return
        if self.seen > self.entropy.numel():  # fed past the capacity: grow the buffers
            extra = self.seen - self.entropy.numel()
            self.entropy = torch.cat([self.entropy, self.entropy.new_zeros(extra)])
            self.distance = torch.cat([self.distance, self.distance.new_zeros(self.distance.shape[0], extra)], dim=1)
        layers, _, lm_head = self._parts
        final = hidden if self.config.final_norm else self._inputs["pre_norm"][0]
        # with --device-map each layer's input sits on its layer's device: bring it to the final hidden
        # state's, and every signal to the buffers' device (no-ops on one device)
        for i in range(len(layers)):  # layer by layer: no [L, q, d] copy of the hidden states
            layer_input = self._inputs[i][0][None].to(final.device)
            self.distance[i, start : start + q] = signals.representation_distance(layer_input, final)[0].to(
                self.distance.device
            )
        if q == 1 and last_logits is not None:
            self.entropy[start] = signals.topk_entropy(last_logits, self.config.top_k).to(self.entropy.device)
        else:
            self.entropy[start : start + q] = signals.streamed_topk_entropy(
                hidden, lm_head, self.config.top_k, self.config.lm_head_block
            ).to(self.entropy.device)
        self._inputs.clear()

    def start_decoding(self, cache) -> None:
        """The prefill is done: read keys from ``cache`` (a ``DynamicCache`` whose ``layers[l].keys`` are
        ``[1, Hkv, n_l, hd]``, slot ``j`` = position ``j``) from now on, and (when ``accumulate``) start
        H2O's accumulator as the attention the last ``w`` queries gave each slot, unpooled ``[Hkv, n_l]``.

        An accumulator copied by :meth:`fork` is kept: the fork only binds its own copy of the cache.
        Compaction must keep this cache object (gather its layers in place, then :meth:`compact`)."""
        self._cache = cache
        if self.hidden_buffer:  # the buffer holds decoded rows only (kvpress's DecodingPress skips the prefill)
            self.inputs, self.rope = [None] * len(self.inputs), None
        if self.accumulate and self.accumulated is None:
            self.accumulated = [self._received(i, layer.keys) for i, layer in enumerate(cache.layers)]

    def compact(self, keep: list[torch.Tensor], dead: list[torch.Tensor] | None = None) -> None:
        """The bound cache was compacted to ``keep``: gather the per-slot state (H2O's accumulator).

        ``keep``: per layer, the kept slots of each KV head, ``[Hkv, n_keep_l]`` long tensors (a
        :class:`~fi_toolkit.eviction.KeepMap`'s ``keep``). ``dead``: per layer, the compacted cache's dead
        slots ``[Hkv, n_keep_l]`` (an uneven map's pads; None: none), whose accumulated attention is zero.
        Per-position signals (H, D) and the window queries do not depend on slots and stay as they are."""
        if self._cache is None:
            raise FIError("compact() needs start_decoding(cache) first")
        for layer, (idx, cached) in enumerate(zip(keep, self._cache.layers, strict=True)):
            if idx.shape[1] != cached.keys.shape[2]:
                raise FIError(
                    f"layer {layer}: the cache holds {cached.keys.shape[2]} slots, the keep map "
                    f"{idx.shape[1]}: compact the cache first (in place), then the tracker"
                )
        if self.accumulated is not None:
            self.accumulated = [a.gather(1, idx.to(a.device)) for a, idx in zip(self.accumulated, keep)]
            if dead is not None:  # a pad slot repeats its head's last kept slot: it received nothing
                self.accumulated = [a.masked_fill(d.to(a.device), 0.0) for a, d in zip(self.accumulated, dead)]
        self.dead = dead
        if self.hidden_buffer:  # a compression empties the buffer, as kvpress's DecodingPress does
            self.inputs, self.rope = [None] * len(self.inputs), None
        self.moments, self.span = [None] * len(self.moments), [0] * len(self.span)  # so do its query statistics

    def view(self, positions: list[torch.Tensor]) -> Signals:
        """The :class:`~fi_toolkit.signals.policy_view.Signals` a policy scores now, in slot space.

        ``positions``: per layer, the original position of every slot of the bound cache, ``[Hkv, n_l]``
        long tensors. Returns ``window``, ``seen``, ``keys`` (the bound cache's ``[1, Hkv, n_l, hd]``),
        ``positions``; ``entropy`` and ``distance`` ``[Hkv, n_l]`` (H under ``config.entropy_of`` and
        ``D^(l)`` of each slot's token; None unless ``token_signals``); ``attention [Hkv, n_l]`` (pooled
        window attention of the last ``w`` queries over the slots); ``accumulated [Hkv, n_l]`` (None
        unless accumulating); ``values`` (the bound cache's); ``out_proj`` (per layer, the weight of the
        attention's ``o_proj``, None if one lacks it); ``inputs`` and ``rope`` (the buffered attention
        inputs and their position embeddings; None without ``hidden_buffer``); ``query_moments`` (``moments``),
        ``last_query`` (the rotated query of the last row fed, per layer ``[Hq, hd]``) and ``rotary`` (the
        model's rotary embedding module). ``protected``, ``tokens`` and
        ``model`` are the caller's to fill in."""
        if self._cache is None:
            raise FIError("view() needs start_decoding(cache) first")
        keys = [layer.keys for layer in self._cache.layers]
        s = Signals(window=self.config.window, seen=self.seen, keys=keys, positions=positions)
        if self.token_signals:
            entropy = entropy_of_tokens(self.entropy[: self.seen], self.config.entropy_of)
            s.entropy = [entropy[pos] for pos in positions]
            s.token_entropy = self.entropy[: self.seen]
            s.distance = [self.distance[i][pos] for i, pos in enumerate(positions)]
        s.attention = [self._window_attention(i, k) for i, k in enumerate(keys)]
        if self.dead is not None:
            s.dead = [self._dead(i, k.shape[2]) for i, k in enumerate(keys)]
        s.accumulated = self.accumulated
        s.values = [layer.values for layer in self._cache.layers]
        s.out_proj = self._out_proj()
        if self.hidden_buffer:
            s.inputs, s.rope = list(self.inputs), self.rope
        if self.scorer is not None and all(t is not None for t in self.input_scores):
            s.input_scores = [t.gather(1, pos.to(t.device).long()) for t, pos in zip(self.input_scores, positions)]
            s.scored_by = self.scorer
        s.query_moments = list(self.moments)
        if all(q is not None for q in self.queries):
            s.last_query = [q[:, -1] for q in self.queries]
        s.rotary = getattr(self._model.base_model, "rotary_emb", None)
        return s

    def _out_proj(self) -> list[torch.Tensor] | None:
        """Per layer, the weight of the attention's output projection ``o_proj`` (the model's parameter, not a
        copy), or None when a layer's attention has none."""
        projections = [getattr(layer.self_attn, "o_proj", None) for layer in self._parts[0]]
        if any(getattr(p, "weight", None) is None for p in projections):
            return None
        return [p.weight for p in projections]

    def fork(
        self,
        token_signals: bool | None = None,
        accumulate: bool | None = None,
        hidden_buffer: int | None = None,
        scorer=None,
    ) -> SignalTracker:
        """An independent copy of this tracker's state (cloned tensors), for a decoder forked from this
        one; it keeps only what it will track (``token_signals``/``accumulate``: default, as this one;
        neither can be turned on where this tracker did not track it). It reads no cache until its own
        :meth:`start_decoding` binds the forked decoder's copy; its hooks are its own."""
        token_signals = self.token_signals if token_signals is None else token_signals
        accumulate = self.accumulate if accumulate is None else accumulate
        if (token_signals and not self.token_signals) or (accumulate and not self.accumulate):
            raise FIError("a fork can only track what the tracker it comes from tracked")
        buffer = self.hidden_buffer if hidden_buffer is None else hidden_buffer  # a larger one starts with fewer rows
        # a scorer continues only where this tracker scored every row with the same one (else the policy rescores)
        same = scorer is not None and scorer is self.scorer
        child = SignalTracker(self.config, self.capacity, accumulate, token_signals, buffer, scorer if same else None)
        child.seen = self.seen
        child._model, child._parts = self._model, self._parts
        if self._model is not None:
            if token_signals:
                child.entropy, child.distance = self.entropy.clone(), self.distance.clone()
            else:
                child.entropy, child.distance = self.entropy[:0].clone(), self.distance[:, :0].clone()
            child.queries = [None if q is None else q.clone() for q in self.queries]
            child.moments = [None if m is None else (m[0], m[1].clone(), m[2].clone()) for m in self.moments]
            child.span = list(self.span)
            child.input_scores = (
                [None if t is None else t.clone() for t in self.input_scores]
                if same
                else [None] * len(self.input_scores)
            )
            child.inputs = [None if h is None or not buffer else h[:, -buffer:].clone() for h in self.inputs]
            if self.rope is not None and buffer:
                child.rope = (self.rope[0][:, -buffer:].clone(), self.rope[1][:, -buffer:].clone())
        if accumulate and self.accumulated is not None:
            child.accumulated = [a.clone() for a in self.accumulated]
        child.dead = None if self.dead is None else [d.clone() for d in self.dead]
        return child

    # ---- scores over the queries -------------------------------------------------------------------

    def _scaling(self, layer: int) -> float:
        return self._parts[0][layer].self_attn.scaling

    def _window_attention(self, layer: int, keys: torch.Tensor) -> torch.Tensor:
        """Pooled window attention of ``layer`` over ``keys [1, Hkv, n, hd]`` -> ``[Hkv, n]``."""
        return signals.window_attention(
            self.queries[layer],
            keys[0],
            self._scaling(layer),
            self.config.pool_kernel,
            self._dead(layer, keys.shape[2]),
        )

    def _dead(self, layer: int, n: int) -> torch.Tensor | None:
        """``layer``'s dead slots among ``n`` (the slots fed after the last compaction are live) -> ``[Hkv, n]``
        bool, or None when it has none."""
        if self.dead is None:
            return None
        dead = self.dead[layer]
        return torch.nn.functional.pad(dead, (0, n - dead.shape[1])) if n > dead.shape[1] else dead[:, :n]

    def _received(self, layer: int, keys: torch.Tensor) -> torch.Tensor:
        """Attention the kept window queries gave each of ``keys``, summed, unpooled -> ``[Hkv, n]``."""
        return signals.attention_received(self.queries[layer], keys[0], self._scaling(layer))
