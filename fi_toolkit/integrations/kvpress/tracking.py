"""Which prefix entries a kvpress press kept, read from the index kvpress used, never from comparing keys.

:class:`Positions` is a torch function mode: while a press runs, it follows the cached keys and values it
was given through every op that only moves entries (gathers, index selects, indexing, joins, copies) and
carries each entry's position along, so the positions of the cache the press leaves come from kvpress's
own indices. :func:`followed_slots` reads them and refuses what is not a set of the entries it was given.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from fi_toolkit.errors import FIError

REARRANGING = {"contiguous", "clone", "detach", "to", "gather", "index_select", "__getitem__", "unsqueeze", "squeeze"}
JOINING = {"cat", "concat", "concatenate", "stack"}
WRITING = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__", "__imatmul__"}


class Positions(TorchFunctionMode):
    """Follows the prefix's cached keys and values (``[B, Hkv, n, d]``, registered by :meth:`register`) through
    every op that only moves entries (gathers, index selects, indexing, joins, copies), carrying with each
    derived tensor the prefix position of each of its entries (``shadow [*shape[:-1]]``, -1 for an entry that is
    not one of the prefix's). An op that computes with the entries, or writes into a followed tensor, is not
    followed: its result has no positions."""

    def __init__(self):
        super().__init__()
        self.shadow: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def register(self, tensor: torch.Tensor) -> None:
        b, h, n, _ = tensor.shape
        self.shadow[id(tensor)] = (tensor, torch.arange(n, device=tensor.device).expand(b, h, n))

    def positions(self, tensor) -> torch.Tensor | None:
        entry = self.shadow.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name.endswith("_") and not name.startswith("__")) or name in WRITING:  # written in place: new entries
            target = args[0] if args else None
            if self.positions(target) is not None:
                del self.shadow[id(target)]
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.dim() >= 1 and (name in REARRANGING or name in JOINING):
            try:
                pos = self._follow(name, args, kwargs, out)
            except Exception:  # an indexing form not followed: the result has no positions
                pos = None
            if pos is not None and tuple(pos.shape) == tuple(out.shape[:-1]):
                self.shadow[id(out)] = (out, pos)
        return out

    def _follow(self, name: str, args, kwargs, out: torch.Tensor) -> torch.Tensor | None:
        if name in JOINING:
            tensors, dim = list(args[0]), args[1] if len(args) > 1 else kwargs.get("dim", 0)
            shadows = [self.positions(t) for t in tensors]
            if all(s is None for s in shadows) or (dim % out.dim()) == out.dim() - 1:
                return None
            shadows = [
                s if s is not None else torch.full(t.shape[:-1], -1, dtype=torch.long, device=t.device)
                for s, t in zip(shadows, tensors)
            ]
            return (torch.stack if name == "stack" else torch.cat)(shadows, dim % out.dim())
        src = args[0]
        pos = self.positions(src)
        if pos is None:
            return None
        last = src.dim() - 1
        if name in ("contiguous", "clone", "detach"):
            return pos
        if name == "to":
            return pos if out.dtype == src.dtype else None
        if name in ("gather", "index_select"):
            dim = (args[1] if len(args) > 1 else kwargs["dim"]) % src.dim()
            index = args[2] if len(args) > 2 else kwargs["index"]
            if dim == last:
                return None
            if name == "index_select":
                return pos.index_select(dim, index)
            return pos.gather(dim, index[..., 0]) if bool((index == index[..., :1]).all()) else None
        if name == "unsqueeze":
            dim = (args[1] if len(args) > 1 else kwargs["dim"]) % out.dim()
            return pos.unsqueeze(dim) if dim < out.dim() - 1 else None
        if name == "squeeze":
            return pos.squeeze(*args[1:]) if len(args) > 1 and (args[1] % src.dim()) < last else None
        return pos[_leading(args[1], src.dim())]


def _leading(key, ndim: int):
    """An index of a ``[..., d]`` tensor, without its part on the last axis (a full slice there), so it indexes
    the positions ``[...]``; an index that picks within the last axis is not followed (ValueError)."""
    key = list(key) if isinstance(key, tuple) else [key]
    full = slice(None)
    if any(k is Ellipsis for k in key):
        if not (isinstance(key[-1], slice) and key[-1] == full) and key[-1] is not Ellipsis:
            raise ValueError("indexes the last axis")
        return tuple(key[:-1] if key[-1] is not Ellipsis else key)
    used = sum(k.dim() if isinstance(k, torch.Tensor) and k.dtype == torch.bool else k is not None for k in key)
    if used >= ndim:
        if not (isinstance(key[-1], slice) and key[-1] == full):
            raise ValueError("indexes the last axis")
        key = key[:-1]
    return tuple(key)


def followed_slots(tracker: Positions, keys: torch.Tensor, values: torch.Tensor, label: str) -> torch.Tensor:
    """The positions held in each slot of ``keys``/``values [1, Hkv, m, d]`` (a press's output) -> ``[Hkv, m]``;
    refuses keys or values the press computed (merged, re-rotated, pruned by channel) and an entry kept twice."""
    slots, followed = tracker.positions(keys), tracker.positions(values)
    if slots is None or followed is None or not torch.equal(slots, followed) or bool((slots < 0).any()):
        raise FIError(
            f"{label}: the press changes the kept keys or values (it merges, re-rotates or rebuilds them), "
            "so what it keeps is not a set of prefix entries; it cannot be measured as an eviction"
        )
    if slots.shape[0] != 1:
        raise FIError(f"{label}: the bridge runs one sequence at a time")
    slots = slots[0].cpu()
    if any(bool((torch.sort(row).values.diff() == 0).any()) for row in slots):
        raise FIError(f"{label}: the press keeps some entry twice, so what it keeps is not a set of prefix entries")
    return slots
