"""Shared test cases (not oracles): the tiny model's probe prefix, chunks and token sets."""

from __future__ import annotations

import torch

from fi_toolkit.eviction import TokenSet
from fi_toolkit.probe.chunks import Chunk

P = 200  # the probe tests' compression point on the tiny model's 400 random tokens
CHUNKS = [Chunk(200, 260), Chunk(330, 400)]


def probe_sets():
    gen = torch.Generator().manual_seed(3)
    return [
        TokenSet("scattered", torch.randperm(P, generator=gen)[:30]),
        TokenSet("block", torch.arange(40, 90)),
        TokenSet("sinks", torch.arange(0, 4)),
        TokenSet("window", torch.arange(P - 16, P)),
        TokenSet("one", [123]),
    ]


def single_tokens(n: int = 8, seed: int = 0, prefix: int = 192) -> list[TokenSet]:
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randperm(prefix - 20, generator=gen)[:n] + 4
    return [TokenSet(f"positions:{int(j)}", [int(j)], {"selector": "positions"}) for j in picks]


def random_surrogate(lm, hidden: int | None = None, seed: int = 0):
    """A surrogate of random weights for ``lm``'s shape (linear, or an MLP of ``hidden`` units): mechanics only."""
    from fi_toolkit.policies.surrogate import SurrogateModel

    cfg = lm.config
    m = SurrogateModel(cfg.hidden_size, cfg.num_key_value_heads, cfg.num_hidden_layers, hidden, {})
    g = torch.Generator().manual_seed(seed)
    m.weights = {k: torch.randn(s, generator=g) for k, s in m.expected_shapes().items()}
    return m
