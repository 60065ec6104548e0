"""A kvpress press at a compression point of the decode loop: the press's own ``compress`` (its ``score()``
and its selection), given what kvpress's ``DecodingPress`` gives it.

At each compression kvpress's ``DecodingPress`` calls its scorer's ``compress`` once per layer with

* ``hidden_states [1, m, d]``: the attention module's inputs of the rows decoded since the last compression
  (at most ``hidden_states_buffer_size``, 256 by default);
* ``keys``, ``values [1, Hkv, n, hd]``: the layer's whole cache;
* ``compression_ratio``: the one that leaves ``target_size`` entries (``DecodingPress._find_target_compression_ratio``).

:func:`decoding_keep_map` does the same with the decode loop's :class:`~fi_toolkit.signals.policy_view.Signals`
(``inputs``, ``keys``, ``values``), the budget's count in place of ``target_size``, and reads what the press kept
with :class:`~fi_toolkit.integrations.kvpress.tracking.Positions`. One convention differs: ``DecodingPress``
passes the scorer the keyword arguments of the current forward, whose ``position_embeddings`` are the current
token's only, so a press that rotates recomputed queries (SnapKV's window, TOVA's last query) rotates every one
of them at the current position; here each buffered row keeps its own position embedding, as at the prefill.
For a press that reads no position embedding or only the last row's (TOVA, Knorm, ExpectedAttention,
StreamingLLM) the two keep the same entries (tests/test_kvpress_pipeline.py).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from fi_toolkit.errors import FIError
from fi_toolkit.eviction import KeepMap
from fi_toolkit.integrations.kvpress.failures import failure_reason
from fi_toolkit.integrations.kvpress.tracking import Positions, followed_slots


def target_ratio(kvpress, n: int, k: int) -> float:
    """The compression_ratio that leaves ``k`` of ``n`` entries under kvpress's ``int()`` count (kvpress's own
    search, ``DecodingPress._find_target_compression_ratio``, which reads nothing of the press)."""
    return kvpress.DecodingPress._find_target_compression_ratio(None, n, k)


@contextmanager
def rotary_on_modules(model):
    """kvpress's presses read ``module.rotary_emb`` (kvpress attaches it while a press is applied); attached
    for the block, removed after (the project's architecture check refuses unknown parts)."""
    base = model.base_model
    attention = [layer.self_attn for layer in base.layers]
    added = [m for m in attention if "rotary_emb" not in m._modules]
    for m in added:
        m.rotary_emb = base.rotary_emb
    try:
        yield attention
    finally:
        for m in added:
            del m._modules["rotary_emb"]


@torch.no_grad()
def decoding_keep_map(kvpress, press, s, k: int, label: str) -> KeepMap:
    """Slots to keep per layer and KV head at a decoding compression to ``k`` entries, chosen by ``press``'s own
    ``compress`` on the signals ``s`` (``inputs``, ``rope``, ``keys``, ``values``, ``model``) -> a keep map in
    slot space (sorted)."""
    if s.inputs is None or any(h is None for h in s.inputs) or s.values is None:
        raise FIError(f"{label}: a press compresses while decoding with the rows decoded since the last compression")
    keep = []
    with rotary_on_modules(s.model) as attention:
        for layer, module in enumerate(attention):
            keys, values = s.keys[layer], s.values[layer]
            n = keys.shape[2]
            if n <= k:
                keep.append(torch.arange(n, device=keys.device).expand(keys.shape[1], n))
                continue
            press.compression_ratio = target_ratio(kvpress, n, k)
            tracker = Positions()
            try:
                with tracker:
                    tracker.register(keys)
                    tracker.register(values)
                    new_keys, new_values = press.compress(
                        module, s.inputs[layer], keys, values, None, {"position_embeddings": s.rope}
                    )
            except FIError:
                raise
            except Exception as exc:  # e.g. SnapKV's window needs more rows than an interval decodes
                reason = failure_reason(exc).replace("kvpress failed on the prefix", "kvpress failed")
                raise FIError(
                    f"{label}: at a compression while decoding ({s.inputs[layer].shape[1]} rows): {reason}"
                ) from None
            if new_keys is keys:
                raise FIError(f"{label}: the press removed nothing at a compression to {k} of {n} entries")
            slots = followed_slots(tracker, new_keys, new_values, label)
            keep.append(torch.sort(slots, dim=-1).values.to(keys.device))
    return KeepMap(label, keep, {"selector": label.split("@")[0]})
