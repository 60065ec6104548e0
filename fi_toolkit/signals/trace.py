"""One forward over the prefix ``[0, p)`` that collects the KV cache and every per-token signal.

Like TransformerLens' cache object, a :class:`Trace` is the single place signals come from. The
prefix runs in chunks (``prefill_chunk`` tokens) so that hidden-state memory stays bounded: the
representation distance of a position only needs that position's hidden states, which all come
from the same chunk. The forward hooks live in :class:`SignalTracker`, which compressed generation
reuses token by token: they capture (a) each decoder layer's input ``h^(l)``, (b) the residual
stream before the final norm ``h^(L)``, and (c) each attention module's input, from which the last
``w`` queries are recomputed (never the full attention matrix); the final-normed output feeds the
streamed LM head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd
import torch
from transformers import DynamicCache

from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import apply_rope, context_limit, context_phrase, decoder_parts, queries
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.signals import formulas as signals
from fi_toolkit.signals.config import ENTROPY_OF, SignalConfig  # noqa: F401  (re-exported: their home before issue 18)


def entropy_of_tokens(at_position: torch.Tensor, entropy_of: str) -> torch.Tensor:
    """Per-token ``H`` from the entropies of the distributions computed *at* each position.

    ``"next"``: ``H_i`` is the entropy at ``i`` (predicting ``x_{i+1}``), returned as is.
    ``"produced"`` (the default): ``H_i`` is the entropy of the distribution that produced ``x_i``,
    i.e. the one computed at ``i - 1``; nothing predicted ``x_0``, so ``H_0 = 0``.
    """
    if entropy_of == "next":
        return at_position
    return torch.cat([at_position.new_zeros(1), at_position[:-1]])


@dataclass
class Trace:
    """The prefix cache and signals. Signals are float32 on the CPU; keys/values stay on the model's device.

    ``keys[l]``/``values[l]``: ``[1, Hkv, p, head_dim]`` (keys RoPE-rotated, as the model caches them).
    ``entropy [p]``, ``distance [L, p]`` (distance of layer input l to the final state),
    ``attention [L, Hkv, p]`` (window attention, pooled), ``accumulated [L, Hkv, p]`` (attention
    received from the window queries, summed and unpooled: H2O's prefill accumulator).
    """

    prefix_len: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    entropy: torch.Tensor
    distance: torch.Tensor
    attention: torch.Tensor
    accumulated: torch.Tensor
    config: SignalConfig

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_kv_heads(self) -> int:
        return self.keys[0].shape[1]

    @property
    def scored(self) -> int:
        """Number of scored positions ``[0, p - w)``: everything before the observation window."""
        return self.prefix_len - self.config.window

    def layer_entropy(self, tau: float | None = None) -> torch.Tensor:
        """``E^(l)`` -> ``[L, p]``."""
        return signals.layer_entropy_score(self.distance, self.entropy[None], self.config.tau if tau is None else tau)

    def infokv(self, alpha: float | None = None, tau: float | None = None) -> torch.Tensor:
        """``S^(l)_{h,i}`` over the scored positions -> ``[L, Hkv, p - w]``."""
        alpha = self.config.alpha if alpha is None else alpha
        scored = self.scored
        return signals.infokv_score(self.attention[..., :scored], self.layer_entropy(tau)[:, None, :scored], alpha)

    def token_table(self, tokens: list[str] | None = None) -> pd.DataFrame:
        """One row per prefix position: H, mean A, mean D, mean E, mean S, and per-layer D, E, A."""
        p, scored = self.prefix_len, self.scored
        s_mean = torch.full((p,), float("nan"))
        s_mean[:scored] = self.infokv().mean(dim=(0, 1))
        layer_e = self.layer_entropy()
        columns = {
            "position": range(p),
            "entropy": self.entropy.numpy(),
            "attention": self.attention.mean(dim=(0, 1)).numpy(),
            "distance": self.distance.mean(dim=0).numpy(),
            "layer_entropy": layer_e.mean(dim=0).numpy(),
            "infokv": s_mean.numpy(),
            "in_window": [i >= scored for i in range(p)],
        }
        if tokens is not None:
            columns["token"] = tokens[:p]
        for name, values in (("D", self.distance), ("E", layer_e), ("A", self.attention.mean(dim=1))):
            for layer in range(values.shape[0]):
                columns[f"{name}_{layer}"] = values[layer].numpy()
        return pd.DataFrame(columns)

    def manifest(self) -> dict:
        return {"prefix_len": self.prefix_len, **asdict(self.config)}


def window_queries(attn_module, hidden_states, position_embeddings, window: int) -> torch.Tensor:
    """Recompute the rotated queries of the last ``window`` positions of an attention input -> ``[Hq, w, hd]``:
    the module's own query path (:func:`architectures.queries`), then its own ``apply_rotary_pos_emb``."""
    q = queries(attn_module, hidden_states[:, -window:])
    cos, sin = position_embeddings
    q, _ = apply_rope(attn_module)(q, q, cos[:, -window:], sin[:, -window:])
    return q[0]


class SignalTracker:
    """Forward hooks that keep the last ``w`` rotated queries of every layer, record (when
    ``token_signals``) every fed token's top-k entropy ``H`` and ``D^(l)`` into preallocated
    ``[capacity]`` / ``[L, capacity]`` float32 buffers, and (for H2O) add the attention of every row
    fed after the prefill (one step, or each row of a replay block) to a per-slot accumulator."""

    def __init__(self, model, config: SignalConfig, capacity: int, accumulate: bool, token_signals: bool = True):
        self.layers, self.norm, self.lm_head = decoder_parts(model)
        device = next(model.parameters()).device
        n_layers = len(self.layers)
        self.config = config
        self.token_signals = token_signals
        self.entropy = torch.zeros(capacity if token_signals else 0, device=device)
        self.distance = torch.zeros(n_layers, capacity if token_signals else 0, device=device)
        self.queries: list[torch.Tensor | None] = [None] * n_layers
        self.accumulated: list[torch.Tensor] | None = [None] * n_layers if accumulate else None
        self.cache: DynamicCache | None = None
        self._inputs: dict = {}
        self._handles = [self.norm.register_forward_pre_hook(self._norm_hook)] if token_signals else []
        for i, layer in enumerate(self.layers):
            if token_signals:
                self._handles.append(layer.register_forward_pre_hook(self._input_hook(i), with_kwargs=True))
            self._handles.append(layer.self_attn.register_forward_hook(self._attention_hook, with_kwargs=True))

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _input_hook(self, layer_idx: int):
        def hook(_module, args, kwargs):
            self._inputs[layer_idx] = args[0] if args else kwargs["hidden_states"]
        return hook

    def _norm_hook(self, _module, args):
        self._inputs["pre_norm"] = args[0]

    def _attention_hook(self, module, args, kwargs, _output):
        hs = args[0] if args else kwargs["hidden_states"]
        w = self.config.window
        i = module.layer_idx
        # decoding (the accumulator exists once the prefill is done): every fed row's attention counts,
        # whether the rows come one step at a time or as one block (CompressedDecoder.block)
        accumulate = self.accumulated is not None and self.accumulated[i] is not None
        q = window_queries(module, hs, kwargs["position_embeddings"], hs.shape[1] if accumulate else min(w, hs.shape[1]))
        prev = self.queries[i]
        self.queries[i] = (q if prev is None else torch.cat([prev, q[:, -w:]], dim=1))[:, -w:]
        if accumulate:
            keys = self.cache.layers[i].keys[0]  # already holds the keys of this forward's rows (the last slots)
            acc = self.accumulated[i]
            acc = torch.cat([acc, acc.new_zeros(keys.shape[0], keys.shape[1] - acc.shape[1])], dim=1)
            self.accumulated[i] = acc + signals.attention_received(q, keys, module.scaling)

    def record(self, start: int, hidden: torch.Tensor, last_logits: torch.Tensor | None) -> None:
        """After a forward of tokens at ``[start, start + q)``: store their H and D^(l)."""
        if not self.token_signals:
            return
        q = hidden.shape[0]
        final = hidden if self.config.final_norm else self._inputs["pre_norm"][0]
        # with --device-map each layer's input sits on its layer's device: bring it to the final hidden
        # state's, and every signal to the buffers' device (no-ops on one device)
        for i in range(len(self.layers)):  # layer by layer: no [L, q, d] copy of the hidden states
            layer_input = self._inputs[i][0][None].to(final.device)
            self.distance[i, start : start + q] = signals.representation_distance(layer_input, final)[0].to(self.distance.device)
        if q == 1 and last_logits is not None:
            self.entropy[start] = signals.topk_entropy(last_logits, self.config.top_k).to(self.entropy.device)
        else:
            self.entropy[start : start + q] = signals.streamed_topk_entropy(
                hidden, self.lm_head, self.config.top_k, self.config.lm_head_block
            ).to(self.entropy.device)
        self._inputs.clear()

    def window_attention(self, layer: int, keys: torch.Tensor) -> torch.Tensor:
        """Pooled window attention of ``layer`` over ``keys [1, Hkv, n, hd]`` -> ``[Hkv, n]``."""
        scaling = self.layers[layer].self_attn.scaling
        return signals.window_attention(self.queries[layer], keys[0], scaling, self.config.pool_kernel)

    def received(self, layer: int, keys: torch.Tensor) -> torch.Tensor:
        """Attention the kept window queries gave each of ``keys``, summed, unpooled -> ``[Hkv, n]``."""
        return signals.attention_received(self.queries[layer], keys[0], self.layers[layer].self_attn.scaling)

    def gather(self, keep: list[torch.Tensor]) -> None:
        if self.accumulated is not None:
            self.accumulated = [a.gather(1, idx) for a, idx in zip(self.accumulated, keep)]



@torch.no_grad()
def trace_prefix(model: torch.nn.Module, ids: torch.Tensor, prefix_len: int, config: SignalConfig = SignalConfig()) -> Trace:
    """Run ``ids[:prefix_len]`` through ``model`` once and collect cache + signals (docs/method.md, "Signals")."""
    config.validate()
    p = prefix_len
    if p <= config.window:
        raise FIError(f"prefix of {p} tokens leaves nothing to score with a window of {config.window}")
    if p > ids.numel():
        raise FIError(f"prefix of {p:,} tokens is longer than the {ids.numel():,}-token document")
    limit = context_limit(model.config)
    if limit is not None and p > limit:
        raise FIError(f"prefix of {p:,} tokens is past the model's {context_phrase(model.config)}")
    device = next(model.parameters()).device
    tracker = SignalTracker(model, config, capacity=p, accumulate=False)
    tracker.cache = cache = DynamicCache(config=model.config)
    try:
        for a in range(0, p, config.prefill_chunk):  # the tracker carries the last w queries across chunks
            b = min(p, a + config.prefill_chunk)
            positions = torch.arange(a, b, device=device).unsqueeze(0)
            hidden = model.base_model(
                input_ids=ids[a:b].to(device).unsqueeze(0), position_ids=positions, use_cache=True,
                **cache_kwargs(model.base_model, cache),
            ).last_hidden_state[0]
            tracker.record(a, hidden, None)
    finally:
        tracker.close()
    return tracker_trace(tracker, cache, p)


def tracker_trace(tracker: SignalTracker, cache: DynamicCache, prefix_len: int) -> Trace:
    """The :class:`Trace` of a prefill that ``tracker`` recorded into ``cache`` (positions ``[0, p)``):
    ``trace_prefix`` and kvpress's ``InfoKVPress`` (the same signals inside kvpress's prefill) both end here."""
    p, config = prefix_len, tracker.config
    entropy = entropy_of_tokens(tracker.entropy[:p].cpu(), config.entropy_of)
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    attention = torch.stack([tracker.window_attention(i, k).cpu() for i, k in enumerate(keys)])
    accumulated = torch.stack([tracker.received(i, k).cpu() for i, k in enumerate(keys)])
    return Trace(p, keys, values, entropy, tracker.distance[:, :p].cpu(), attention, accumulated, config)
