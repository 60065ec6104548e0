"""Per-layer gradient checkpointing of a cached forward: the gradient estimator's memory bound.

Inside :func:`checkpointed_layers` every decoder layer's forward runs under non-reentrant
``torch.utils.checkpoint``: the layer keeps only its inputs, and each backward pass recomputes the
layer's activations when it reaches them. The graph kept between backward passes is then the layer
inputs, the continuation's keys and values and the output (``O(L n d)``), not every layer's attention
weights and MLP activations (``O(L n (p + n))``).

The layers update the KV cache in place, so a plain recompute would append the continuation's keys a
second time. Each checkpointed call records the cache layer's keys and values *before* its update
(for an append-only ``DynamicLayer`` only their length: they are then the first entries of the
final cache, so no per-block copy is kept); its recompute returns those, concatenated with the
recomputed new keys, and leaves the cache alone: what ``DynamicLayer.update`` returned the first
time, with the same values (the recompute only supplies saved values; gradients flow through the
original graph). The recompute is the same
arithmetic on the same inputs, so gradients equal the unchecked ones (bitwise, measured on the tiny
Llama and SmolLM2). The graph is smaller, but the peak memory still grows with the continuation
(benchmarks/results/bench_estimator_memory.txt).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import DynamicLayer

from fi_toolkit.model.architectures import decoder_parts


@contextmanager
def checkpointed_layers(model: torch.nn.Module, cache):
    """Checkpoint every decoder layer of ``model`` inside the block; ``cache`` (a ``DynamicCache``) is
    the one the forward passes use. The backward passes must run inside the block too (their
    recomputes replay the cache); both are restored on exit."""
    layers = decoder_parts(model)[0]
    before: list = []  # per checkpointed call: the cache layer's (keys, values) before its update
    state = {"call": None, "replay": None}
    original_update = cache.update

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        if state["replay"] is not None:  # a recompute in backward: same result, cache untouched
            keys, values = before[state["replay"]]
            if isinstance(keys, int):  # a length: the first `keys` entries of the (append-only) cache now
                layer = cache.layers[layer_idx]
                keys, values = layer.keys[:, :, :keys], layer.values[:, :, :keys]
            if keys is None:
                return key_states, value_states
            return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)
        layer = cache.layers[layer_idx]
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if type(layer) is DynamicLayer and keys is not None:  # append-only: keep the length, not a copy
            keys = values = keys.shape[-2]
        before[state["call"]] = (keys, values)
        return original_update(key_states, value_states, layer_idx, *args, **kwargs)

    def contexts(call):
        return _Set(state, "call", call), _Set(state, "replay", call)  # the second is entered once per backward

    def wrap(forward):
        def checkpointed(*args, **kwargs):
            before.append(None)
            call = len(before) - 1
            return checkpoint(forward, *args, use_reentrant=False, context_fn=lambda: contexts(call), **kwargs)

        return checkpointed

    saved = [layer.__dict__.get("forward") for layer in layers]
    cache.update = update
    for layer in layers:
        layer.forward = wrap(layer.forward)
    try:
        yield model
    finally:
        del cache.update
        for layer, forward in zip(layers, saved):
            del layer.forward
            if forward is not None:
                layer.forward = forward


class _Set:
    """``state[key] = value`` inside the block; reusable (a recompute context is entered once per backward)."""

    def __init__(self, state: dict, key: str, value):
        self.state, self.key, self.value, self.old = state, key, value, []

    def __enter__(self):
        self.old.append(self.state[self.key])
        self.state[self.key] = self.value

    def __exit__(self, *exc):
        self.state[self.key] = self.old.pop()
