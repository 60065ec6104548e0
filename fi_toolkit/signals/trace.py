"""One forward over the prefix ``[0, p)`` that collects the KV cache and every per-token signal.

Like TransformerLens' cache object, a :class:`Trace` is the single place signals come from. The
prefix runs in chunks (``prefill_chunk`` tokens) so that hidden-state memory stays bounded: the
representation distance of a position only needs that position's hidden states, which all come
from the same chunk. The hooks and the per-token state live in
:class:`~fi_toolkit.signals.tracker.SignalTracker`, which compressed generation and kvpress's
``InfoKVPress`` drive through the same public steps; a trace is the tracker's view of every prefix
position once the prefill is done (:func:`tracker_trace`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd
import torch
from transformers import DynamicCache

from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import context_limit, context_phrase, decoder_parts  # noqa: F401 (re-exported)
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.signals import formulas as signals
from fi_toolkit.signals.config import ENTROPY_OF, SignalConfig  # noqa: F401  (re-exported: their earlier home)
from fi_toolkit.signals.formulas import entropy_of_tokens  # noqa: F401  (re-exported)
from fi_toolkit.signals.tracker import SignalTracker


@dataclass
class Trace:
    """The prefix cache and signals. Signals are float32 on the CPU; keys/values stay on the model's device.

    ``keys[l]``/``values[l]``: ``[1, Hkv, p, head_dim]`` (keys RoPE-rotated, as the model caches them).
    ``entropy [p]``, ``distance [L, p]`` (distance of layer input l to the final state),
    ``attention [L, Hkv, p]`` (window attention, pooled), ``accumulated [L, Hkv, p]`` (attention
    received from the window queries, summed and unpooled: H2O's prefill accumulator). ``out_proj``: per
    layer, the attention's ``o_proj`` weight ``[hidden, Hq * head_dim]`` (the model's parameter, not a copy;
    None for a model whose attention has none): the learned policy's value-side features read it.
    ``query_moments``, ``last_query``, ``rotary``: the tracker's query statistics of the prefill rows, the
    rotated query of the last one and the model's rotary embedding (:class:`Signals`; ExpectedAttention's and
    TOVA's features read them).
    """

    prefix_len: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    entropy: torch.Tensor
    distance: torch.Tensor
    attention: torch.Tensor
    accumulated: torch.Tensor
    config: SignalConfig
    out_proj: list[torch.Tensor] | None = None  # per layer, o_proj's weight [hidden, Hq * head_dim] (the model's)
    query_moments: list[tuple | None] | None = None  # per layer (count, sum, outer sum) of the prefill's queries
    last_query: list[torch.Tensor] | None = None  # per layer [Hq, hd], the last prefill row's rotated query
    rotary: object = None  # the model's rotary embedding module
    # per layer [Hkv, p]: each position's score by the scorer the prefix was traced with (a surrogate's, computed
    # from the attention inputs of this very forward, so a surrogate needs no forward of its own); None without one
    input_scores: list[torch.Tensor] | None = None
    scored_by: object = None  # that scorer

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
        """One row per prefix position: H, mean A, mean D, mean E, mean S, and per-layer D, E, A.

        ``entropy`` is ``H`` under the trace's ``entropy_of``; ``entropy_produced`` and ``entropy_next``
        are ``H`` under each convention (:func:`~fi_toolkit.signals.formulas.entropy_of_tokens`), both
        from the one set of entropies: ``next[i] = produced[i + 1]``, so a ``produced`` trace has no
        ``next`` at ``p - 1`` (NaN: the logits at ``p - 1`` are never kept), and ``produced[0] = 0``.
        """
        p, scored = self.prefix_len, self.scored
        if self.config.entropy_of == "next":
            entropy_next, entropy_produced = self.entropy, entropy_of_tokens(self.entropy, "produced")
        else:
            entropy_produced = self.entropy
            entropy_next = torch.cat([self.entropy[1:], self.entropy.new_full((1,), float("nan"))])
        s_mean = torch.full((p,), float("nan"))
        s_mean[:scored] = self.infokv().mean(dim=(0, 1))
        layer_e = self.layer_entropy()
        columns = {
            "position": range(p),
            "entropy": self.entropy.numpy(),
            "entropy_produced": entropy_produced.numpy(),
            "entropy_next": entropy_next.numpy(),
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


@torch.no_grad()
def trace_prefix(
    model: torch.nn.Module, ids: torch.Tensor, prefix_len: int, config: SignalConfig = SignalConfig(), scorer=None
) -> Trace:
    """Run ``ids[:prefix_len]`` through ``model`` once and collect cache + signals (docs/method.md, "Signals").

    One chunked forward (``config.prefill_chunk`` tokens at a time); the LM head is streamed
    (``config.lm_head_block`` rows), so ``[p, V]`` logits are never held.

    Args:
        model: a causal LM of a supported family (Llama, Qwen2/3, Mistral, Phi-3, SmolLM2).
        ids: token ids, ``[N]`` (1-D, ``N >= prefix_len``).
        prefix_len: the compression point ``p`` (``config.window < p``).
        config: the signal options; validated first.
        scorer: scores each position from its attention input as it is fed (``scorer.score(layer, x [q, d])
            -> [q, Hkv]``, a surrogate's model); the trace keeps them as ``input_scores``. None: no scores.

    Returns:
        :class:`Trace`: ``keys[l]``/``values[l]`` ``[1, Hkv, p, head_dim]`` on the model's device, and float32
        CPU signals ``entropy [p]``, ``distance [L, p]``, ``attention [L, Hkv, p]``, ``accumulated [L, Hkv, p]``.
    """
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
    # the accumulator at the prefill's end: Trace.accumulated
    tracker = SignalTracker(config, capacity=p, accumulate=True, scorer=scorer)
    cache = DynamicCache(config=model.config)
    with tracker(model):
        for a in range(0, p, config.prefill_chunk):  # the tracker carries the last w queries across chunks
            b = min(p, a + config.prefill_chunk)
            positions = torch.arange(a, b, device=device).unsqueeze(0)
            hidden = model.base_model(
                input_ids=ids[a:b].to(device).unsqueeze(0),
                position_ids=positions,
                use_cache=True,
                **cache_kwargs(model.base_model, cache),
            ).last_hidden_state[0]
            tracker.record(hidden)
    return tracker_trace(tracker, cache)


def tracker_trace(tracker: SignalTracker, cache: DynamicCache) -> Trace:
    """The :class:`Trace` of the prefill that ``tracker`` (created with ``accumulate=True``) recorded into
    ``cache``: the prefill is done (:meth:`~SignalTracker.start_decoding`), and the trace is the tracker's
    :meth:`~SignalTracker.view` of every position ``[0, p)``, ``p = tracker.seen``, moved to the CPU.
    ``trace_prefix`` and kvpress's ``InfoKVPress`` (the same signals inside kvpress's prefill) both end here."""
    tracker.start_decoding(cache)
    p, config = tracker.seen, tracker.config
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    positions = [torch.arange(p, device=k.device).expand(k.shape[1], p) for k in keys]
    view = tracker.view(positions)
    if view.entropy is None or view.accumulated is None:
        raise FIError("a Trace needs a tracker that records token signals and accumulates attention")
    entropy = view.entropy[0][0].cpu()  # per-token signals are the same in every head's row
    distance = torch.stack([d[0].cpu() for d in view.distance])
    attention = torch.stack([a.cpu() for a in view.attention])
    accumulated = torch.stack([a.cpu() for a in view.accumulated])
    return Trace(
        p,
        keys,
        values,
        entropy,
        distance,
        attention,
        accumulated,
        config,
        view.out_proj,
        view.query_moments,
        view.last_query,
        view.rotary,
        view.input_scores,
        view.scored_by,
    )
