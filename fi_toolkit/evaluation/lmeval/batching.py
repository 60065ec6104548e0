"""lm-eval requests several rows per forward (``batch_size``), with the numbers one request at a time gives.

Two designs, by what the cache holds (docs/guides/lm-eval.md, "Batching"):

* ``policy=None`` (the full cache): requests are sorted longest first and cut into batches of ``batch_size``
  rows. A log-likelihood row is its whole sequence (context + continuation without its last token) **padded
  on the right**: under causal attention no real token attends to a later position, so the padding reaches no
  real row and no attention mask is needed. A generation row is its prompt **padded on the left**, with an
  attention mask and per-row position ids (each row's first real token at position 0), as lm-eval's ``hf``
  backend does: masked keys get zero attention weight, so a padded row differs from the same row alone only by
  the rounding of a batched kernel.
* a compressing policy: what a row's cache keeps depends on that row's own signals. Log-likelihood requests that
  share a context (the choices of a multiple-choice question) prefill and compress that context **once**, and
  every continuation is scored from the compressed cache, up to ``batch_size`` continuations in one forward over
  that cache expanded to as many rows (padded on the right, as above). A continuation long enough to reach a
  compression point (more than ``interval`` tokens fed after the context) would compress its own cache
  differently from its siblings, so it is scored on its own cache, as is the only continuation of a context.
  Those, and generation, run ``batch_size`` rows together on **ragged per-row caches**
  (:mod:`fi_toolkit.compress.batched`): rows padded on the left, their pads dead slots of that row; each row
  keeps its own signals (its tracker reads only its batch row), compresses at its own points to its own budget,
  and is re-padded to the batch's longest row after a compression; a row that ends leaves the batch.
  Continuations are fed teacher-forced in blocks that end at the rows' compression points.

``batch_size=auto`` starts at ``max_batch_size`` rows and halves the size on a CUDA out-of-memory error,
retrying the batch that failed (the smaller size is kept for the rest of the call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from fi_toolkit.compress.batched import BatchedDecoder, decode_batch
from fi_toolkit.compress.decoder import CompressedDecoder, Schedule
from fi_toolkit.compress.sampling import Sampling
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.lmeval.arguments import AUTO
from fi_toolkit.evaluation.lmeval.requests import CacheRecord
from fi_toolkit.eviction import shared_cache
from fi_toolkit.model.architectures import decoder_parts
from fi_toolkit.model.attention import hidden_slots, ragged_attention
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.policies import Policy

Scored = tuple[float, bool, CacheRecord]
Progress = Callable[[int], object] | None


def run_batched(order: Sequence[int], batch_size: int | str, max_batch_size: int, run: Callable[[list[int]], None]):
    """``run(rows)`` on consecutive slices of ``order`` of ``batch_size`` items. ``batch_size=AUTO``: slices of
    ``max_batch_size``, halved on a CUDA out-of-memory error and the slice retried (``run`` must write its
    results only once its forwards succeeded)."""
    size = max_batch_size if batch_size == AUTO else int(batch_size)
    start = 0
    while start < len(order):
        rows = list(order[start : start + size])
        try:
            run(rows)
        except torch.cuda.OutOfMemoryError:
            if batch_size != AUTO or size == 1:
                raise
            torch.cuda.empty_cache()
            size //= 2
            continue
        start += len(rows)


def _add(scored: tuple[float, bool], logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, bool]:
    """``scored`` plus the log-probabilities of ``targets [q]`` under ``logits [q, V]`` (float32 log-softmax,
    summed in float64, as :func:`~.requests.score_continuation` does) and whether each is the argmax."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    total = scored[0] + float(logp.gather(1, targets[:, None]).double().sum())
    return total, scored[1] and bool((logits.argmax(-1) == targets).all())


def _right_padded(rows: list[list[int]], device) -> torch.Tensor:
    """``[b, longest]`` ids, each row padded on the right with its own last id (never read by a real row)."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


@torch.no_grad()
def score_full_cache(
    model,
    pairs: Sequence[tuple[list[int], list[int]]],
    batch_size,
    max_batch_size: int = 64,
    prefill_chunk: int = 2048,
    progress: Progress = None,
) -> list[Scored]:
    """``policy=None``: ``log P(continuation | context)`` and is-greedy of every ``(context [p >= 1],
    continuation [m >= 1])`` pair, rows of context + continuation[:-1] padded on the right, ``batch_size``
    per forward (chunks of ``prefill_chunk`` positions, through a cache, for long rows)."""
    device = next(model.parameters()).device
    base, lm_head = model.base_model, decoder_parts(model)[2]
    out: list[Scored | None] = [None] * len(pairs)
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))

    def run(rows: list[int]) -> None:
        ids = _right_padded([list(pairs[i][0]) + list(pairs[i][1])[:-1] for i in rows], device)
        hidden, cache = [], DynamicCache(config=model.config)
        for a in range(0, ids.shape[1], prefill_chunk):
            chunk = ids[:, a : a + prefill_chunk]
            positions = torch.arange(a, a + chunk.shape[1], device=device).expand(len(rows), -1)
            hidden.append(
                base(
                    input_ids=chunk, position_ids=positions, use_cache=True, **cache_kwargs(base, cache)
                ).last_hidden_state
            )
        hidden = torch.cat(hidden, dim=1)
        done = {}
        for r, i in enumerate(rows):
            context, continuation = pairs[i]
            p, m = len(context), len(continuation)
            targets = torch.tensor(list(continuation), dtype=torch.long, device=device)
            total, greedy = _add((0.0, True), lm_head(hidden[r, p - 1 : p + m - 1]).float(), targets)
            done[i] = (total, greedy, CacheRecord("loglikelihood", p, m, p + m - 1, p + m - 1, 0, [], "none"))
        for i, result in done.items():
            out[i] = result
        if progress is not None:
            progress(len(rows))

    run_batched(order, batch_size, max_batch_size, run)
    return out


def reaches_compression(schedule: Schedule, fed: int) -> bool:
    """Whether feeding ``fed`` tokens after the context compresses the cache before the last of them (a
    compression after the last one is never run: nothing reads the cache then)."""
    point = schedule.next_point(0)
    while point is not None and point < fed:
        if schedule.compresses_at(point):
            return True
        point = schedule.next_point(point)
    return False


@torch.no_grad()
def score_shared_context(
    model,
    pairs: Sequence[tuple[list[int], list[int]]],
    policy: Policy,
    interval: int,
    batch_size,
    max_batch_size: int = 64,
    prefill_chunk: int = 2048,
    progress: Progress = None,
) -> list[Scored]:
    """Under ``policy``: every pair scored as :func:`~.requests.score_continuation` scores it, each distinct
    context prefilled and compressed once for all the continuations that follow it (up to ``batch_size`` of
    them per forward), except a continuation that reaches a compression point, or the only one of its context,
    scored on its own cache, ``batch_size`` of those together (:func:`_score_own_caches`)."""
    schedule = Schedule.of(policy, interval)
    out: list[Scored | None] = [None] * len(pairs)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (context, _) in enumerate(pairs):
        groups.setdefault(tuple(context), []).append(i)
    own = []  # each on its own cache, batch_size per batch: the continuations that reach a compression point,
    for context, members in groups.items():  # and those whose context has no other continuation to share it
        shared = []
        for i in members:
            (own if reaches_compression(schedule, len(pairs[i][1]) - 1) else shared).append(i)
        if len(shared) == 1:
            own, shared = own + shared, []
        if shared:
            _score_from_context(
                model,
                list(context),
                pairs,
                shared,
                policy,
                interval,
                batch_size,
                max_batch_size,
                prefill_chunk,
                out,
                progress,
            )
    if own:
        _score_own_caches(model, pairs, own, policy, interval, batch_size, max_batch_size, prefill_chunk, out, progress)
    return out


def _score_own_caches(
    model, pairs, members, policy, interval, batch_size, max_batch_size, prefill_chunk, out, progress
) -> None:
    """The pairs ``members``, each scored as :func:`~.requests.score_continuation` scores it on its own cache,
    ``batch_size`` per batch (:class:`~fi_toolkit.compress.batched.BatchedDecoder`): the contexts prefilled
    together (padded on the left), each compressed by its own rule, then the continuations fed together in
    blocks that end at the rows' compression points (their fed counts are equal) or where the shortest row's
    continuation ends; a row leaves the batch once its continuation is scored (no compression after its last
    token: nothing reads it). Longest continuations first, so that a batch holds similar lengths."""
    device = next(model.parameters()).device
    lm_head = decoder_parts(model)[2]
    order = sorted(members, key=lambda i: (-len(pairs[i][1]), -len(pairs[i][0])))

    def run(rows: list[int]) -> None:
        contexts = [list(pairs[i][0]) for i in rows]
        targets = [torch.tensor(list(pairs[i][1]), dtype=torch.long, device=device) for i in rows]
        capacities = [len(c) + len(t) for c, t in zip(contexts, targets)]
        batch = BatchedDecoder(model, policy, capacities, prefill_chunk=prefill_chunk, interval=interval)
        try:
            with ragged_attention(model):
                first = batch.prefill(contexts)
                scored = [_add((0.0, True), first[r : r + 1], t[:1]) for r, t in enumerate(targets)]
                batch.leave([r for r, t in enumerate(targets) if t.numel() == 1])
                fed = 0  # continuation tokens fed to every active row so far
                while batch.active:
                    active = batch.active
                    q = batch.block_end(min(targets[r].numel() - 1 - fed for r in active))
                    last = [targets[r].numel() - 1 == fed + q for r in active]
                    hidden, _ = batch.feed([targets[r][fed : fed + q].tolist() for r in active], [not x for x in last])
                    for slot, r in enumerate(active):
                        scored[r] = _add(scored[r], lm_head(hidden[slot]).float(), targets[r][fed + 1 : fed + q + 1])
                    fed += q
                    batch.leave([r for r, x in zip(active, last) if x])
        finally:
            batch.close()
        for r, i in enumerate(rows):
            steps = batch.rows[r].compression_steps
            p, m = len(contexts[r]), targets[r].numel()
            record = CacheRecord(
                "loglikelihood", p, m, max(batch.lengths(r)), batch.rows[r].seen, len(steps), steps, policy.label
            )
            out[i] = (*scored[r], record)
        if progress is not None:
            progress(len(rows))

    run_batched(order, batch_size, max_batch_size, run)


def _score_from_context(
    model, context, pairs, members, policy, interval, batch_size, max_batch_size, prefill_chunk, out, progress
) -> None:
    """The continuations ``members`` of one ``context``: the context prefilled and compressed once, then
    ``batch_size`` continuations per forward over its cache, expanded (not copied) to that many rows."""
    device = next(model.parameters()).device
    base, lm_head = model.base_model, decoder_parts(model)[2]
    p = len(context)
    longest = max(len(pairs[i][1]) for i in members)
    decoder = CompressedDecoder(model, policy, p + longest, prefill_chunk=prefill_chunk, interval=interval)
    try:
        with ragged_attention(model):
            first, _ = decoder.prefill(torch.tensor(context, dtype=torch.long, device=device))
    finally:
        decoder.close()  # its signals are no longer needed: no continuation here reaches a compression
    first = first[None]  # [1, V]: the context's last logits score every continuation's first token
    keys, values = [l.keys for l in decoder.cache.layers], [l.values for l in decoder.cache.layers]
    entries, steps, label = max(decoder.lengths()), decoder.compression_steps, policy.label
    dead = decoder.row.dead  # an uneven prompt map's pads, hidden per head in every row (None: none)
    order = sorted(members, key=lambda i: -len(pairs[i][1]))

    def run(rows: list[int]) -> None:
        fed = [list(pairs[i][1])[:-1] for i in rows]
        hidden = None
        if any(fed):
            ids = _right_padded([f or [pairs[i][1][0]] for f, i in zip(fed, rows)], device)
            positions = torch.arange(p, p + ids.shape[1], device=device).expand(len(rows), -1)
            cache = shared_cache(keys, values, len(rows), model.config)
            with ragged_attention(model), hidden_slots(model, dead):
                hidden = base(
                    input_ids=ids, position_ids=positions, use_cache=True, **cache_kwargs(base, cache)
                ).last_hidden_state
        done = {}
        for r, i in enumerate(rows):
            continuation = list(pairs[i][1])
            m = len(continuation)
            targets = torch.tensor(continuation, dtype=torch.long, device=device)
            scored = _add((0.0, True), first, targets[:1])
            if m > 1:
                scored = _add(scored, lm_head(hidden[r, : m - 1]).float(), targets[1:])
            done[i] = (
                *scored,
                CacheRecord("loglikelihood", p, m, entries + m - 1, p + m - 1, len(steps), steps, label),
            )
        for i, result in done.items():
            out[i] = result
        if progress is not None:
            progress(len(rows))

    run_batched(order, batch_size, max_batch_size, run)


def score_pairs(
    model,
    pairs,
    policy: Policy | None,
    interval: int,
    batch_size,
    max_batch_size: int = 64,
    prefill_chunk: int = 2048,
    progress: Progress = None,
) -> list[Scored]:
    """``(log P, is_greedy, record)`` of every ``(context, continuation)`` pair, batched by the design for
    ``policy`` (None: :func:`score_full_cache`; a policy: :func:`score_shared_context`)."""
    for context, continuation in pairs:
        if not context or not continuation:
            raise FIError("a log-likelihood request needs a non-empty context and continuation")
    if policy is None:
        return score_full_cache(model, pairs, batch_size, max_batch_size, prefill_chunk, progress)
    return score_shared_context(model, pairs, policy, interval, batch_size, max_batch_size, prefill_chunk, progress)


@dataclass(frozen=True)
class Generation:
    """One generation request: ``prompt`` ids, at most ``max_new`` tokens, ``stop(tokens)`` (a stop string
    reached), and how tokens are drawn (``sampling``, its own seed)."""

    prompt: list[int]
    max_new: int
    stop: Callable[[list[int]], bool]
    sampling: Sampling


@torch.no_grad()
def generate_full_cache(
    model,
    requests: Sequence[Generation],
    eos: set[int],
    batch_size,
    max_batch_size: int = 64,
    prefill_chunk: int = 2048,
    progress: Progress = None,
) -> list[tuple[list[int], CacheRecord]]:
    """``policy=None``: each request's generated ids (an EOS id not included) and its record, prompts padded
    on the left, ``batch_size`` per forward. A row stops as :meth:`CompressedDecoder.decode` stops it (an
    ``eos`` id, ``max_new`` tokens, then ``stop``, checked in that order after each token); the batch runs until
    its last row stops, finished rows dropped from it."""
    if any(not r.prompt for r in requests):
        raise FIError("a generation request needs a non-empty prompt")
    device = next(model.parameters()).device
    base, lm_head = model.base_model, decoder_parts(model)[2]
    out: list[tuple[list[int], CacheRecord] | None] = [None] * len(requests)
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i].prompt))

    def forward(ids, mask, positions, cache) -> torch.Tensor:
        hidden = base(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache_kwargs(base, cache)
        ).last_hidden_state
        return lm_head(hidden[:, -1]).float()

    def run(rows: list[int]) -> None:
        prompts = [requests[i].prompt for i in rows]
        width = max(len(q) for q in prompts)
        ids = torch.tensor([[q[0]] * (width - len(q)) + q for q in prompts], dtype=torch.long, device=device)
        mask = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in prompts], dtype=torch.long, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        for a in range(0, width, prefill_chunk):
            e = min(width, a + prefill_chunk)
            logits = forward(ids[:, a:e], mask[:, :e], positions[:, a:e], cache)
        samplers = [requests[i].sampling.sampler(device) for i in rows]
        tokens: list[list[int]] = [[] for _ in rows]
        eos_at: list[bool] = [False] * len(rows)
        live = list(range(len(rows)))  # rows of this batch still generating, in the order of the cache's rows
        last = positions[:, -1:]
        while True:
            fed, keep = [], []
            for slot, r in enumerate(live):
                request = requests[rows[r]]
                history = torch.tensor(request.prompt + tokens[r], dtype=torch.long)
                tokens[r].append(samplers[r](logits[slot], history))
                if tokens[r][-1] in eos:
                    eos_at[r] = True
                elif len(tokens[r]) < request.max_new and not request.stop(tokens[r]):
                    fed.append(tokens[r][-1])
                    keep.append(slot)
            if not keep:
                break
            if len(keep) < len(live):  # drop the finished rows from the batch and its cache
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, last = mask[index], last[index]
                live = [live[s] for s in keep]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            last = last + 1
            logits = forward(torch.tensor(fed, device=device)[:, None], mask, last, cache)
        done = {}
        for r, i in enumerate(rows):
            p, n = len(requests[i].prompt), len(tokens[r])
            kept = tokens[r][:-1] if eos_at[r] else tokens[r]
            done[i] = (kept, CacheRecord("generate_until", p, len(kept), p + n - 1, p + n - 1, 0, [], "none"))
        for i, result in done.items():
            out[i] = result
        if progress is not None:
            progress(len(rows))

    run_batched(order, batch_size, max_batch_size, run)
    return out


@torch.no_grad()
def generate_compressed(
    model,
    requests: Sequence[Generation],
    policy: Policy,
    interval: int,
    eos: set[int],
    batch_size,
    max_batch_size: int = 64,
    prefill_chunk: int = 2048,
    progress: Progress = None,
) -> list[tuple[list[int], CacheRecord]]:
    """Under ``policy``: each request's generated ids (an EOS id not included) and its record, as
    :func:`~.requests.generate_tokens` gives them one at a time, ``batch_size`` prompts decoded together
    (:func:`~fi_toolkit.compress.batched.decode_batch`: rows padded on the left, each its own signals,
    compression points and budget; a row leaves the batch when it stops). Prompts are sorted longest first, so a
    batch holds prompts of similar lengths."""
    if any(not r.prompt for r in requests):
        raise FIError("a generation request needs a non-empty prompt")
    out: list[tuple[list[int], CacheRecord] | None] = [None] * len(requests)
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i].prompt))

    def run(rows: list[int]) -> None:
        specs = [requests[i] for i in rows]
        decoded, batch = decode_batch(
            model,
            [s.prompt for s in specs],
            policy,
            interval,
            [s.max_new for s in specs],
            [s.sampling for s in specs],
            eos,
            [s.stop for s in specs],
            prefill_chunk=prefill_chunk,
        )
        for r, (i, spec, done) in enumerate(zip(rows, specs, decoded)):
            tokens = done.tokens[:-1] if done.stop_reason == "eos" else done.tokens
            steps = batch.rows[r].compression_steps
            record = CacheRecord(
                "generate_until",
                len(spec.prompt),
                len(tokens),
                max(batch.lengths(r)),
                batch.rows[r].seen,
                len(steps),
                steps,
                policy.label,
            )
            out[i] = (tokens, record)
        if progress is not None:
            progress(len(rows))

    run_batched(order, batch_size, max_batch_size, run)
    return out
