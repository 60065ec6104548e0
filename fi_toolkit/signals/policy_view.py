"""What a policy scores at a compression: :class:`Signals`, per layer and KV head in *slot space*
(docs/method.md, "Eviction policies").

Slot ``j`` of layer ``l``, KV head ``h`` is the ``j``-th entry of that head's cache, whose original
position is ``positions[l][h, j]``. Right after a prefill, slots are positions
(:meth:`Signals.from_trace`); during decoding, earlier compressions have made the positions of each
head different, and per-position signals (H, D) are gathered into slot space
(:meth:`~fi_toolkit.signals.tracker.SignalTracker.view`). Defined here, below the policies that read
it, so that the tracker that builds it needs nothing from them; :mod:`fi_toolkit.policies` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Signals:
    """Per layer ``l`` (lists of length L), tensors ``[Hkv, n_l]`` unless said otherwise."""

    window: int
    seen: int  # tokens seen so far: the compression point that budgets refer to
    keys: list[torch.Tensor]  # [1, Hkv, n_l, head_dim], RoPE-rotated
    positions: list[torch.Tensor]  # original position of each slot
    entropy: list[torch.Tensor] | None = None  # top-k entropy H of the slot's token
    distance: list[torch.Tensor] | None = None  # D^(l) of the slot's token
    attention: list[torch.Tensor] | None = None  # window attention of the last `window` queries (pooled)
    accumulated: list[torch.Tensor] | None = None  # attention received so far, summed, unpooled (H2O)
    protected: list[int] = field(default_factory=list)  # leading slots never evicted
    # estimated FI of removing each slot on the known future (the FI oracle's scores); only a probe (a future
    # chunk, fi_toolkit.probe.oracle) or a replay's look-ahead (fi_toolkit.compress.lookahead) can give them
    fi_estimates: list[torch.Tensor] | None = None
    tokens: torch.Tensor | None = None  # the token ids fed so far, by position (kvpress presses re-run on them)
    model: object = None  # the model whose cache this is (kvpress presses run their own prefill on it)
    values: list[torch.Tensor] | None = None  # [1, Hkv, n_l, head_dim], the cache's values
    inputs: list[torch.Tensor] | None = None  # [1, m, d]: attention inputs of the rows fed since the last compression
    rope: tuple | None = None  # (cos, sin) [1, m, head_dim]: the position embeddings of those rows
    # per layer, the attention's output projection weight o_proj [hidden, Hq * head_dim] (the model's own
    # parameter, not a copy): the value-side features read W_o^h from it
    out_proj: list[torch.Tensor] | None = None
    # per layer, (count, sum [Hq, hd], sum of outer products [Hq, hd, hd]) of the pre-RoPE queries of the rows fed
    # since the last compression, its first QUERY_SINKS rows left out (fi_toolkit.signals.formulas.add_query_moments)
    query_moments: list[tuple | None] | None = None
    last_query: list[torch.Tensor] | None = None  # per layer [Hq, hd]: the RoPE-rotated query of the last row fed
    rotary: object = None  # the model's rotary embedding module (cos, sin of any position)
    # per layer [Hkv, n_l] bool, True: a dead slot (the pad of an uneven keep map held in a dense cache, which no
    # query sees and no policy may keep); None while every head is even. Policies rank live slots only.
    dead: list[torch.Tensor] | None = None
    # [seen]: the top-k entropy of the distribution computed *at* each position fed so far (by position, not slot),
    # from which either convention of any slot's token follows while decoding; None at a prefill trace (its slots
    # are its positions) and without token signals
    token_entropy: torch.Tensor | None = None
    # per layer [Hkv, n_l]: each slot's score by a scorer of its token's attention input, computed when the token was
    # fed (the surrogate's; SignalTracker's scorer); None without one
    input_scores: list[torch.Tensor] | None = None
    scored_by: object = None  # the scorer that gave input_scores (a policy uses them only if they are its own)

    def __post_init__(self):
        if not self.protected:
            self.protected = [0] * len(self.keys)

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def slots(self, layer: int) -> int:
        return int(self.keys[layer].shape[2])

    def dead_in(self, layer: int) -> torch.Tensor | None:
        """``layer``'s dead slots ``[Hkv, n_l]``, or None when it has none (every slot live)."""
        if self.dead is None or self.dead[layer] is None or not bool(self.dead[layer].any()):
            return None
        return self.dead[layer]

    @classmethod
    def from_trace(cls, trace) -> Signals:
        """Prefill signals of a :class:`~fi_toolkit.signals.trace.Trace`: slots are prompt positions; the
        cache's values, the output projections, the query statistics, the last query and the rotary embedding
        are the trace's."""
        p, hkv, device = trace.prefix_len, trace.num_kv_heads, trace.keys[0].device
        positions = torch.arange(p, device=device).expand(hkv, p)
        entropy = trace.entropy.to(device).expand(hkv, p)
        return cls(
            window=trace.config.window,
            seen=p,
            keys=list(trace.keys),
            positions=[positions] * trace.num_layers,
            entropy=[entropy] * trace.num_layers,
            distance=[d.to(device).expand(hkv, p) for d in trace.distance],
            attention=[a.to(device) for a in trace.attention],
            accumulated=[a.to(device) for a in trace.accumulated],
            values=list(trace.values),
            out_proj=None if trace.out_proj is None else list(trace.out_proj),
            query_moments=None if trace.query_moments is None else list(trace.query_moments),
            last_query=None if trace.last_query is None else list(trace.last_query),
            rotary=trace.rotary,
            input_scores=None if trace.input_scores is None else list(trace.input_scores),
            scored_by=trace.scored_by,
        )
