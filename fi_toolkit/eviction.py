"""What is gone from the cache: a token set (same positions in every layer and head) or a keep map.

Both describe an eviction of the prefix ``[0, p)`` behind one protocol (:class:`Eviction`): a
label, metadata for result tables, a range check, and the removed and kept counts. The probe
measures either kind; policies produce keep maps; the compressor applies keep maps to a live cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from fi_toolkit.errors import FIError


class Eviction:
    """The protocol every eviction follows (``label`` and ``meta`` are dataclass fields of each kind)."""

    label: str
    meta: dict

    def check(self, prefix_len: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def n_removed(self, prefix_len: int) -> float:
        """Entries removed per layer and KV head (the mean over layers where budgets differ)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def n_kept(self, prefix_len: int) -> float:
        return prefix_len - self.n_removed(prefix_len)

    def removed_positions(self) -> torch.Tensor | None:
        """The positions removed from every layer and head, or None where layers or heads differ."""
        return None


@dataclass
class TokenSet(Eviction):
    """Positions removed from every layer and KV head. ``meta`` carries labels for result tables."""

    label: str
    removed: torch.Tensor  # sorted 1-D LongTensor of prefix positions
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.removed = torch.unique(torch.as_tensor(self.removed, dtype=torch.long))

    def check(self, prefix_len: int) -> None:
        if self.removed.numel() and (self.removed.min() < 0 or self.removed.max() >= prefix_len):
            raise FIError(f"selection '{self.label}' removes positions outside the prefix [0, {prefix_len})")

    def visible(self, prefix_len: int) -> torch.Tensor:
        """Bool ``[p]``: True where the entry stays visible."""
        keep = torch.ones(prefix_len, dtype=torch.bool)
        keep[self.removed] = False
        return keep

    def keep_map(self, prefix_len: int, num_layers: int, num_kv_heads: int) -> KeepMap:
        kept = torch.nonzero(self.visible(prefix_len)).flatten()
        per_layer = [kept.unsqueeze(0).expand(num_kv_heads, -1).clone() for _ in range(num_layers)]
        return KeepMap(self.label, per_layer, dict(self.meta))

    @property
    def size(self) -> int:
        return int(self.removed.numel())

    def n_removed(self, prefix_len: int) -> float:
        return self.size

    def removed_positions(self) -> torch.Tensor:
        return self.removed


@dataclass
class KeepMap(Eviction):
    """Per layer, the prefix positions each KV head keeps: ``keep[l]`` is ``[Hkv, k_l]``, sorted (a
    gathered cache holds them in the order given; only the probe's ``control:reorder`` uses another).

    Layers may keep different counts (adaptive budgets, PyramidKV). Heads of one layer may too
    (AdaKV-style presses): then ``head_counts[l]`` (``[Hkv]``) says how many of each row of
    ``keep[l]`` are kept, and each row is padded to ``k_l`` (the layer's largest count) by repeating
    its last kept position, so ``visible()`` is exact as it stands. Such a map is *uneven*: the probe
    measures it by masking per head; :func:`gather_cache` gathers the padded rows, whose pad slots
    compressed decoding then hides per head (its dead slots, as kvpress's AdaKV masks a padded cache).
    """

    label: str
    keep: list[torch.Tensor]
    meta: dict = field(default_factory=dict)
    head_counts: list[torch.Tensor] | None = None  # per layer [Hkv]; None: every head keeps k_l

    @classmethod
    def from_heads(cls, label: str, heads: list[list[torch.Tensor]], meta: dict | None = None) -> KeepMap:
        """Per layer, one sorted 1-D tensor of kept positions per KV head (counts may differ per head)."""
        keep, counts = [], []
        for rows in heads:
            n = torch.tensor([int(r.numel()) for r in rows])
            if int(n.min()) < 1:
                raise FIError(f"keep map '{label}': a KV head keeps no entry at all")
            width = int(n.max())
            keep.append(torch.stack([torch.cat([r, r[-1:].expand(width - r.numel())]) for r in rows]))
            counts.append(n)
        even = all(bool((n == n[0]).all()) for n in counts)
        return cls(label, keep, dict(meta or {}), None if even else counts)

    @property
    def uneven(self) -> bool:
        """True where the heads of a layer keep different counts (see the class docstring)."""
        return self.head_counts is not None

    def counts(self) -> list[int]:
        """Entries per head of each layer (for an uneven map, the largest count of the layer)."""
        return [int(k.shape[-1]) for k in self.keep]

    def visible(self, prefix_len: int) -> torch.Tensor:
        """Bool ``[L, Hkv, p]``."""
        out = torch.zeros(len(self.keep), self.keep[0].shape[0], prefix_len, dtype=torch.bool)
        for layer, idx in enumerate(self.keep):
            out[layer].scatter_(1, idx.cpu(), True)
        return out

    def check(self, prefix_len: int) -> None:
        for layer, idx in enumerate(self.keep):
            if idx.numel() and (idx.min() < 0 or idx.max() >= prefix_len):
                raise FIError(f"keep map '{self.label}' layer {layer} keeps positions outside [0, {prefix_len})")

    def n_removed(self, prefix_len: int) -> float:
        """Entries evicted per layer and head, averaged over layers (and heads, where heads differ)."""
        if self.uneven:
            return prefix_len - float(torch.stack(self.head_counts).float().mean())
        return prefix_len - sum(self.counts()) / len(self.keep)


def gather_cache(keys: list[torch.Tensor], values: list[torch.Tensor], keep_map: KeepMap, config) -> DynamicCache:
    """Physically keep only ``keep_map``'s entries, per layer and head (a new cache; inputs untouched).

    Cached keys are already RoPE-rotated at their original positions, so kept entries keep their
    positions; later tokens must be fed with explicit original ``position_ids``. An uneven map is gathered
    row by row as padded: slots ``>= head_counts[l][h]`` of head ``h`` repeat its last kept entry, and whoever
    attends to the cache must hide them (:func:`fi_toolkit.model.attention.hidden_slots`).
    """
    data = [gather_layer(k, v, idx) for k, v, idx in zip(keys, values, keep_map.keep)]
    return DynamicCache(ddp_cache_data=data, config=config)


def gather_layer(keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's ``keys``/``values`` ``[B, Hkv, n, d]`` at the slots ``keep [Hkv, k]`` of each head."""
    index = keep.to(keys.device)[None, :, :, None].expand(keys.shape[0], -1, -1, keys.shape[-1])
    return torch.gather(keys, 2, index), torch.gather(values, 2, index)


def shared_cache(keys: list[torch.Tensor], values: list[torch.Tensor], batch: int, config) -> DynamicCache:
    """A cache holding the same prefix for ``batch`` rows: expanded views, not copies (the cache
    concatenates each row's new entries onto them, which allocates the rows' own tensors)."""
    data = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in zip(keys, values)]
    return DynamicCache(ddp_cache_data=data, config=config)
