"""What is gone from the cache: a token set (same positions in every layer and head) or a keep map.

Both describe an eviction of the prefix ``[0, p)`` behind one protocol (:class:`Eviction`): a
label, metadata for result tables, a range check, and the removed and kept counts. The probe
measures either kind; policies produce keep maps; the compressor applies keep maps to a live cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .errors import FIError


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

    def keep_map(self, prefix_len: int, num_layers: int, num_kv_heads: int) -> "KeepMap":
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

    Within a layer every head keeps the same count (so the cache stays a dense tensor); layers may
    differ (adaptive budgets, PyramidKV).
    """

    label: str
    keep: list[torch.Tensor]
    meta: dict = field(default_factory=dict)

    def counts(self) -> list[int]:
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
        """Entries evicted per layer and head, averaged over layers (uneven budgets differ per layer)."""
        return prefix_len - sum(self.counts()) / len(self.keep)


def gather_cache(keys: list[torch.Tensor], values: list[torch.Tensor], keep_map: KeepMap, config) -> DynamicCache:
    """Physically keep only ``keep_map``'s entries, per layer and head (a new cache; inputs untouched).

    Cached keys are already RoPE-rotated at their original positions, so kept entries keep their
    positions; later tokens must be fed with explicit original ``position_ids``.
    """
    data = []
    for k, v, idx in zip(keys, values, keep_map.keep):
        index = idx.to(k.device)[None, :, :, None].expand(k.shape[0], -1, -1, k.shape[-1])
        data.append((torch.gather(k, 2, index), torch.gather(v, 2, index)))
    return DynamicCache(ddp_cache_data=data, config=config)


def shared_cache(keys: list[torch.Tensor], values: list[torch.Tensor], batch: int, config) -> DynamicCache:
    """A cache holding the same prefix for ``batch`` rows: expanded views, not copies (the cache
    concatenates each row's new entries onto them, which allocates the rows' own tensors)."""
    data = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in zip(keys, values)]
    return DynamicCache(ddp_cache_data=data, config=config)
