"""Forward Influence (docs/method.md, "Forward Influence"): how much removing cache entries shifts
future predictions.

``FI(e; C) = mean_{t in C} KL(P_full(. | x_<=t) || P_e(. | x_<=t))`` in nats, full vocabulary, float32.

The path from the CLI to the KL (the map is in :mod:`fi_toolkit.probe`):
:func:`fi_toolkit.probe.experiment.probe_document` -> :func:`forward_influence` ->
:func:`_continuation_hidden` (one forward over ``[p, max r_c)`` per batch of evictions, masked) ->
:meth:`Reference.kl` -> :func:`fi_toolkit.probe.kl.kl_from_reference`. Chunks live in
:mod:`fi_toolkit.probe.chunks`, the noise controls and their floor in :mod:`fi_toolkit.probe.noise_floor`.

Token-set evictions are evaluated many at a time: the prefix cache is shared by a batch, each row
hides its own entries with a float additive mask (``finfo.min``, which gives exactly-zero weight),
and one forward over ``[p, max r_c)`` serves every chunk. Keep maps that differ per layer or head
are applied by physically gathering the cache (exact by construction); keep maps whose heads keep
different counts (AdaKV-style) by masking each head's entries in every layer's attention. All agree
with deleting the entries and recomputing (:func:`forward_influence_by_deletion`), the exactness oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from fi_toolkit.eviction import KeepMap, TokenSet, gather_cache, shared_cache
from fi_toolkit.model.architectures import context_limit
from fi_toolkit.model.attention import head_masked_attention, ragged_attention
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.model.precision import compute_dtype
from fi_toolkit.probe.chunks import Chunk, check_chunks
from fi_toolkit.probe.kl import kl_from_reference, reference_terms
from fi_toolkit.probe.noise_floor import below_margin, control_floor, is_control, noise_controls
from fi_toolkit.signals.trace import Trace, decoder_parts


def _continuation_mask(visible: torch.Tensor, past_new: int, q_len: int, dtype) -> torch.Tensor:
    """Additive mask ``[B, 1, q, P + past_new + q]``: prefix entries per ``visible [B, P]``, causal after."""
    batch, prefix = visible.shape
    minimum = torch.finfo(dtype).min
    prefix_part = torch.zeros(batch, 1, q_len, prefix, dtype=dtype, device=visible.device)
    prefix_part.masked_fill_(~visible[:, None, None, :], minimum)
    key_idx = torch.arange(past_new + q_len, device=visible.device)
    query_idx = torch.arange(past_new, past_new + q_len, device=visible.device)
    causal = torch.zeros(q_len, past_new + q_len, dtype=dtype, device=visible.device)
    causal.masked_fill_(key_idx[None, :] > query_idx[:, None], minimum)
    return torch.cat([prefix_part, causal.expand(batch, 1, -1, -1)], dim=-1)


def _continuation_hidden(
    model, cache, ids: torch.Tensor, start_pos: int, visible: torch.Tensor, capture: torch.Tensor, block: int
) -> torch.Tensor:
    """Feed ``ids [B, n]`` at original positions ``start_pos..`` after ``cache``; return final-normed
    hidden states at relative positions ``capture`` -> ``[B, len(capture), d]``.

    Gradient mode is the caller's: the probe runs it under ``torch.no_grad``, the gradient estimator
    (:mod:`fi_toolkit.probe.estimator`) with gradients flowing to an attention bias.

    ``visible [B, P]`` says which of the cache's ``P`` prefix entries each row may attend to. The
    continuation runs in query blocks of ``block`` tokens, so the mask never exceeds ``B x block x keys``.
    """
    device = ids.device
    dtype = compute_dtype(model)
    n = ids.shape[1]
    out = []
    for a in range(0, n, block):
        b = min(n, a + block)
        rows = capture[(capture >= a) & (capture < b)]
        positions = torch.arange(start_pos + a, start_pos + b, device=device).unsqueeze(0).expand(ids.shape[0], -1)
        mask = _continuation_mask(visible, a, b - a, dtype)
        hidden = model.base_model(
            input_ids=ids[:, a:b],
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            **cache_kwargs(model.base_model, cache),
        ).last_hidden_state
        if rows.numel():
            out.append(hidden[:, rows - a])
    return torch.cat(out, dim=1)


class Reference:
    """The full-cache run: final hidden states at every chunk position, its distributions served in blocks.

    Reference probabilities and logits (``2 x n x V`` float64, what :func:`kl_from_reference` reads) are
    kept when they fit ``keep_bytes``; otherwise they are recomputed per block, so memory stays bounded
    for long chunks and large vocabularies.
    """

    @torch.no_grad()
    def __init__(
        self, model, trace: Trace, ids: torch.Tensor, capture: torch.Tensor, block: int, keep_bytes: float = 2**31
    ):
        self.model, self.block, self.ids, self.capture = model, block, ids, capture
        self.positions = capture.cpu() + trace.prefix_len  # absolute positions of the captured rows
        self.lm_head = decoder_parts(model)[2]
        p = trace.prefix_len
        cache = shared_cache(trace.keys, trace.values, 1, model.config)
        visible = torch.ones(1, p, dtype=torch.bool, device=ids.device)
        self.hidden = _continuation_hidden(model, cache, ids[None], p, visible, capture, block)[0]
        vocab = self.lm_head.weight.shape[0]
        self._keep = self.hidden.shape[0] * vocab * 16 <= keep_bytes
        self._terms: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def terms(self, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reference probabilities, logits ``[n, V]`` (float64) and normalisers ``[n]`` of the block at ``start``."""
        if start in self._terms:
            return self._terms[start]
        terms = reference_terms(self.lm_head(self.hidden[start : start + self.block]))
        if self._keep:
            self._terms[start] = terms
        return terms

    def kl(self, hidden: torch.Tensor) -> torch.Tensor:
        """Per-position KL of rows ``hidden [B, n, d]`` against the reference -> ``[B, n]`` float32."""
        out = []
        for start in range(0, hidden.shape[1], self.block):
            logits = self.lm_head(hidden[:, start : start + self.block])
            out.append(kl_from_reference(*self.terms(start), logits))
        return torch.cat(out, dim=1)


@dataclass
class ProbeResult:
    """Per-eviction, per-position KL at the chunk positions, and FI per chunk."""

    evictions: list
    chunks: list[Chunk]
    positions: torch.Tensor  # absolute positions t whose KL was measured (union of the chunks)
    kl: torch.Tensor  # [E, len(positions)] float32

    def fi(self) -> torch.Tensor:
        """``[E, len(chunks)]``: mean KL over each chunk."""
        cols = []
        for c in self.chunks:
            sel = (self.positions >= c.start) & (self.positions < c.end)
            cols.append(self.kl[:, sel].mean(dim=1))
        return torch.stack(cols, dim=1)

    def rows(self, index: Sequence[int]) -> ProbeResult:
        """The result of the evictions at ``index`` (in that order; repeats allowed)."""
        return ProbeResult([self.evictions[i] for i in index], self.chunks, self.positions, self.kl[list(index)])

    def control_rows(self) -> list[int]:
        return [i for i, e in enumerate(self.evictions) if is_control(e)]

    def noise_floor(self) -> torch.Tensor | None:
        """``[len(chunks)]``: the largest ``|FI|`` of the controls per chunk, or None without controls
        (:func:`~fi_toolkit.probe.noise_floor.control_floor`)."""
        return control_floor(self.fi(), self.control_rows())

    def below_noise_floor(self) -> torch.Tensor | None:
        """Bool ``[E, len(chunks)]``: FI below ``NOISE_MARGIN`` x the chunk's noise floor
        (:func:`~fi_toolkit.probe.noise_floor.below_margin`)."""
        floor = self.noise_floor()
        return None if floor is None else below_margin(self.fi(), floor)


def default_batch_size(device: torch.device) -> int:
    """Evictions per forward: 1 on the CPU, 8 on a GPU.

    Measured on SmolLM2 (``benchmarks/bench_probe.py``, 2 CPU cores): batch 1 costs 1.03x a plain
    forward per eviction, batch 4 1.12x (bigger matrices do not pay on a CPU that is already busy;
    ``benchmarks/bench_correlate.py`` finds the same); a GPU needs the batch to fill its cores.
    """
    return 8 if torch.device(device).type == "cuda" else 1


def chunk_reference(model, trace: Trace, ids: torch.Tensor, chunks: Sequence[Chunk], block: int = 512) -> Reference:
    """The full-cache run of document ``ids`` (1-D) over ``[p, max r_c)``, capturing the chunks' positions."""
    p = trace.prefix_len
    device = trace.keys[0].device
    check_chunks(chunks, p, ids.numel(), context_limit(model.config))
    capture = (_capture_positions(chunks) - p).to(device)
    return Reference(model, trace, ids[p : max(c.end for c in chunks)].to(device), capture, block)


def _capture_positions(chunks: Sequence[Chunk]) -> torch.Tensor:
    return torch.unique(torch.cat([torch.arange(c.start, c.end) for c in chunks]))


@torch.no_grad()
def forward_influence(
    model,
    trace: Trace,
    ids: torch.Tensor,
    evictions: Sequence[TokenSet | KeepMap],
    chunks: Sequence[Chunk],
    batch_size: int | None = None,
    block: int = 512,
    on_progress: Callable[[int], None] | None = None,
    controls: bool = False,
    reference: Reference | None = None,
) -> ProbeResult:
    """FI of every eviction on every chunk (docs/method.md, "Forward Influence").

    One forward over ``[p, max r_c)`` per batch of ``batch_size`` token sets serves all chunks. An empty
    token set runs through the same masked path as any other (no shortcut).

    Args:
        model: the causal LM the trace was made with.
        trace: :func:`~fi_toolkit.signals.trace.trace_prefix` of ``ids[:p]``: the prefix cache
            (``keys[l]``: ``[1, Hkv, p, head_dim]``).
        ids: the whole document, ``[N]`` token ids (``N >= max r_c``).
        evictions: :class:`~fi_toolkit.eviction.TokenSet` (positions removed in every layer and head) or
            :class:`~fi_toolkit.eviction.KeepMap` (``keep[l]``: ``[Hkv, k_l]`` positions kept) objects.
        chunks: future chunks ``[l_c, r_c)``, ``p <= l_c``.
        batch_size: token sets per batched forward (default: :func:`default_batch_size`).
        block: query positions per block of the continuation forward.
        on_progress: called with the number of evictions finished after each batch.
        controls: put the two :func:`~fi_toolkit.probe.noise_floor.noise_controls` first, so the result
            carries its own noise floor (:meth:`ProbeResult.noise_floor`); every CLI command asks for them.
        reference: :func:`chunk_reference` of the same trace, chunks and block, so several calls on one
            document share the full-cache run (as the parts of a split document do).

    Returns:
        :class:`ProbeResult`: ``kl [E, T]`` float32 per eviction at the ``T`` measured positions, and
        ``fi()`` ``[E, C]``, the mean KL (nats) per eviction and chunk; with ``controls``, ``E`` counts them.
    """
    p = trace.prefix_len
    device = trace.keys[0].device
    batch_size = batch_size or default_batch_size(device)
    if controls:
        evictions = noise_controls(p, trace.num_layers, trace.num_kv_heads) + list(evictions)
    for e in evictions:
        e.check(p)
    if reference is None:
        reference = chunk_reference(model, trace, ids, chunks, block)
    elif not torch.equal(reference.positions, _capture_positions(chunks)) or reference.block != block:
        raise ValueError("the reference was built for other chunks or another block size")
    positions, capture, cont = reference.positions, reference.capture, reference.ids
    kl = torch.zeros(len(evictions), positions.numel())

    sets = [i for i, e in enumerate(evictions) if isinstance(e, TokenSet)]
    for start in range(0, len(sets), batch_size):
        idx = sets[start : start + batch_size]
        visible = torch.stack([evictions[i].visible(p) for i in idx]).to(device)
        cache = shared_cache(trace.keys, trace.values, len(idx), model.config)
        hidden = _continuation_hidden(model, cache, cont.expand(len(idx), -1), p, visible, capture, block)
        kl[idx] = reference.kl(hidden).cpu()
        if on_progress:
            on_progress(len(idx))
    for i, e in enumerate(evictions):
        if not isinstance(e, KeepMap):
            continue
        if e.uneven:  # heads keep different counts: the whole prefix, each head's entries masked (exact)
            cache = shared_cache(trace.keys, trace.values, 1, model.config)
            visible = torch.ones(1, p, dtype=torch.bool, device=device)
            attention = head_masked_attention(model, e.visible(p).to(device))
        else:
            cache = gather_cache(trace.keys, trace.values, e, model.config)
            visible = torch.ones(1, cache.get_seq_length(), dtype=torch.bool, device=device)
            attention = ragged_attention(model)  # layers may hold different counts (adaptive, PyramidKV)
        with attention:
            hidden = _continuation_hidden(model, cache, cont[None], p, visible, capture, block)
        kl[i] = reference.kl(hidden)[0].cpu()
        if on_progress:
            on_progress(1)
    return ProbeResult(list(evictions), list(chunks), positions, kl)


@torch.no_grad()
def forward_influence_by_deletion(
    model, trace: Trace, ids: torch.Tensor, removed: torch.Tensor, chunks: Sequence[Chunk]
) -> torch.Tensor:
    """The exactness oracle: delete ``removed`` from a copy of the cache, re-run ``[p, max r_c)`` in one
    forward with original position ids, and compare full-vocabulary distributions.

    Independent of the masked path: no shared cache, no prefix mask, its own reference run.

    Args:
        model: the causal LM the trace was made with.
        trace: the prefix trace (its cache is copied, never changed).
        ids: the whole document, ``[N]`` token ids.
        removed: positions to delete, ``[k]`` int64 in ``[0, p)``.
        chunks: future chunks ``[l_c, r_c)``, ``p <= l_c``.

    Returns:
        ``[C]`` float64: FI (nats) per chunk.
    """
    p = trace.prefix_len
    device = trace.keys[0].device
    end = max(c.end for c in chunks)
    keep = torch.ones(p, dtype=torch.bool)
    keep[removed] = False
    kept = torch.nonzero(keep).flatten().to(device)

    def run(k_list, v_list):
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=list(zip(k_list, v_list)), config=model.config)
        out = model(
            input_ids=ids[p:end].to(device)[None],
            position_ids=torch.arange(p, end, device=device)[None],
            attention_mask=_continuation_mask(
                torch.ones(1, cache.get_seq_length(), dtype=torch.bool, device=device),
                0,
                end - p,
                compute_dtype(model),
            ),
            **cache_kwargs(model, cache),
        )
        return torch.log_softmax(out.logits[0].double(), dim=-1)

    full = run([k.clone() for k in trace.keys], [v.clone() for v in trace.values])
    pruned = run([k[:, :, kept].clone() for k in trace.keys], [v[:, :, kept].clone() for v in trace.values])
    kl = (full.exp() * (full - pruned)).sum(-1)
    return torch.stack([kl[c.start - p : c.end - p].mean() for c in chunks]).cpu()
