"""Sharded runs under ``torchrun``: which rank computes which work unit, and the few
collectives a run needs (a broadcast of the plan, a barrier before rank 0 merges).

The toolkit launches nothing itself. ``torchrun`` (one node or many, elastic restarts) sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``; :func:`current` reads them and,
when the world has more than one rank, joins the process group once: gloo on the CPU, nccl for CUDA
(with a gloo group beside it for the coordination, which only moves small Python objects). Without
torchrun the world is one rank and nothing is initialised: every command runs as it always did.

Work units (documents, task samples) are assigned by :func:`assign`: longest processing time first
(LPT) on estimated costs (token counts), ties broken by unit order and rank, so every rank computes
the same plan without talking, and no rank gets all the long documents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Sequence

# A rank waits at the merge barrier while the others finish their units: hours for a real study.
BARRIER_TIMEOUT = timedelta(hours=float(os.environ.get("FI_BARRIER_TIMEOUT_HOURS", "72")))


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass
class World:
    """This process's place among the ranks of a torchrun launch (size 1: a plain process)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    restart: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT: > 0 after an elastic restart
    _group: object = field(default=None, repr=False, compare=False)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.size > 1

    def barrier(self) -> None:
        if self.sharded:
            import torch.distributed as dist

            dist.barrier(group=self._group)

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if not self.sharded:
            return obj
        import torch.distributed as dist

        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def gather(self, obj) -> list | None:
        """Every rank's ``obj`` on rank 0, in rank order (None on the other ranks)."""
        if not self.sharded:
            return [obj]
        import torch.distributed as dist

        box = [None] * self.size if self.main else None
        dist.gather_object(obj, box, dst=0, group=self._group)
        return box

    def describe(self) -> dict:
        import torch

        return {
            "world_size": self.size,
            "rank": self.rank,
            "local_world_size": self.local_size,
            "restart": self.restart,
            "torch_threads": torch.get_num_threads(),
        }


def from_env() -> World:
    """The world torchrun describes in the environment (nothing is initialised)."""
    size = max(1, _env_int("WORLD_SIZE", 1))
    rank = min(max(0, _env_int("RANK", 0)), size - 1)
    return World(
        rank=rank,
        size=size,
        local_rank=max(0, _env_int("LOCAL_RANK", 0)),
        local_size=max(1, _env_int("LOCAL_WORLD_SIZE", 1)),
        restart=max(0, _env_int("TORCHELASTIC_RESTART_COUNT", 0)),
    )


_WORLD: World | None = None


def current() -> World:
    """The world of this process, joining the process group on first use when there is more than one rank."""
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    world = from_env()
    if world.sharded:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available() and os.environ.get("FI_DIST_BACKEND", "") != "gloo"
        if not dist.is_initialized():
            if cuda:
                torch.cuda.set_device(world.local_rank % torch.cuda.device_count())
            dist.init_process_group("nccl" if cuda else "gloo", timeout=BARRIER_TIMEOUT)
        # the coordination moves Python objects only: gloo, also beside nccl (no CUDA stream waits hours)
        world._group = dist.new_group(backend="gloo", timeout=BARRIER_TIMEOUT) if dist.get_backend() != "gloo" else None
        divide_threads(world)
    _WORLD = world
    return world


def divide_threads(world: World, cores: int | None = None) -> int:
    """On the CPU, share the cores among the ranks of this node: ``cores // local ranks`` torch threads
    each (at least 1, never more than already set), so 2 ranks on 2 cores do not oversubscribe."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    import torch

    threads = max(1, min(torch.get_num_threads(), cores // max(1, world.local_size)))
    torch.set_num_threads(threads)
    return threads


def rank_device(device: str, world: World | None = None) -> str:
    """``cuda`` (or ``auto`` on a CUDA machine) means ``cuda:LOCAL_RANK`` on a rank of a sharded run."""
    import torch

    world = world or from_env()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and world.sharded:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return f"cuda:{world.local_rank % count if count else world.local_rank}"
    return device


def assign(costs: Sequence[float], ranks: int, groups: Sequence | None = None) -> list[int]:
    """Rank of each unit: longest processing time first onto the least-loaded rank.

    Deterministic (ties: earlier unit first, then lower rank), so every rank computes the same plan.
    Balanced by cost, not by count: with costs 8, 1, 1, 1, 1, 1, 1, 1, 1 on two ranks the long unit
    gets a rank to itself.

    ``groups`` (one key per unit) marks units that share set-up work, the parts of one document that
    share its trace. When some group has several units, the units are laid out longest group first
    (a group's units together, in order) and cut into ``ranks`` consecutive runs at equal shares of
    the total cost (:func:`_consecutive`): a group is split only at the ``ranks - 1`` cuts, so at most
    ``ranks - 1`` documents are traced twice.
    """
    if groups is not None and len(set(groups)) < len(groups):
        return _consecutive(costs, ranks, groups)
    load = [0.0] * ranks
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-float(costs[i]), i)):
        r = min(range(ranks), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += float(costs[i])
    return owner


def _consecutive(costs: Sequence[float], ranks: int, groups: Sequence) -> list[int]:
    """:func:`assign` for grouped units: consecutive runs, groups kept together and in order.

    Rank ``r`` takes units while its load plus half the next unit stays within its share of what is
    left (``left / (ranks - r)``), so no rank idles while another holds several units.
    """
    group_cost: dict = {}
    first: dict = {}
    for i, g in enumerate(groups):
        group_cost[g] = group_cost.get(g, 0.0) + float(costs[i])
        first.setdefault(g, i)
    order = sorted(range(len(costs)), key=lambda i: (-group_cost[groups[i]], first[groups[i]], i))
    owner = [0] * len(costs)
    left = sum(float(c) for c in costs)
    rank, load, share = 0, 0.0, left / ranks
    for i in order:
        c = float(costs[i])
        if load > 0 and load + c / 2 > share and rank < ranks - 1:
            rank, load, share = rank + 1, 0.0, left / (ranks - rank - 1)
        owner[i] = rank
        load += c
        left -= c
    return owner
