"""Document-level entry points shared by the CLI, the notebooks and the analyses.

``probe_document`` is the whole ``fi probe`` job for one document: trace the prefix, resolve the
selections into token sets, measure Forward Influence, return a tidy table (one row per eviction x
chunk).
"""

from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd
import torch

from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import context_limit
from fi_toolkit.model.loading import LoadedModel
from fi_toolkit.probe.chunks import Chunk, check_chunks
from fi_toolkit.probe.forward_influence import ProbeResult, forward_influence
from fi_toolkit.probe.selections import Selection, parse_selections, token_scores, trace_scorer
from fi_toolkit.signals.trace import SignalConfig, Trace, trace_prefix


def max_context(lm: LoadedModel) -> int | None:
    return context_limit(lm.config)  # the declared context, or a sliding window / longrope bound narrowing it


def trace_document(
    lm: LoadedModel, doc: Document, prefix: int, config: SignalConfig = SignalConfig(), scorer=None
) -> Trace:
    """Trace ``doc[:prefix]`` with clear errors for documents or models too short for it.

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        doc: the document; ``doc.ids`` ``[N]`` must hold at least ``prefix`` tokens.
        prefix: the compression point ``p`` (``config.window < p <= N``, within the model's context).
        config: the signal options (window, top-k, ...).
        scorer: scores every position from its attention input during the same forward (a surrogate's model:
            :func:`~fi_toolkit.probe.selections.trace_scorer`), kept as the trace's ``input_scores``.

    Returns:
        The :class:`~fi_toolkit.signals.trace.Trace` of ``doc.ids[:prefix]``: the prefix cache
        (``keys[l]``, ``values[l]``: ``[1, Hkv, p, head_dim]``) and every signal (``entropy [p]``,
        ``attention [L, Hkv, p]``, ...).

    Raises:
        FIError: the document or the model's context is shorter than ``prefix``, or ``prefix`` is not
            above the window.
    """
    limit = max_context(lm)
    if limit is not None and prefix > limit:
        raise FIError(f"prefix {prefix:,} is past the model's context of {limit:,} tokens")
    doc.require(prefix, f"a prefix of {prefix:,}")
    return trace_prefix(lm.model, doc.ids, prefix, config, scorer)


def set_signals(trace: Trace, removed: torch.Tensor | None) -> dict:
    """Mean signals of a removed set (NaN for an empty set or a keep map that differs per head)."""
    if removed is None or removed.numel() == 0:
        return {f"mean_{k}": float("nan") for k in ("entropy", "attention", "distance", "infokv")}
    return {
        f"mean_{k}": float(torch.nanmean(token_scores(trace, k)[removed]))
        for k in ("entropy", "attention", "distance", "infokv")
    }


def fi_table(doc: Document, trace: Trace, result: ProbeResult) -> pd.DataFrame:
    """Tidy FI table: one row per eviction x chunk, with the removed and kept counts of each eviction
    (per layer and head; the mean over layers where budgets differ), so rows compare like with like.
    With the noise controls in ``result``, their rows come first and ``below_noise_floor`` flags the
    rows whose FI is below ``NOISE_MARGIN`` x the chunk's noise floor (:mod:`fi_toolkit.probe.noise_floor`)."""
    fi = result.fi()
    below = result.below_noise_floor()
    p = trace.prefix_len
    rows = []
    for i, e in enumerate(result.evictions):
        base = {
            "document": doc.name,
            "selection": e.label,
            "selector": e.meta.get("selector", e.label),
            "budget": e.meta.get("budget"),
            "seed": e.meta.get("seed"),
            "n_removed": e.n_removed(p),
            "n_kept": e.n_kept(p),
            "prefix": p,
            "entropy_of": trace.config.entropy_of,
        }
        signals = set_signals(trace, e.removed_positions())
        for j, c in enumerate(result.chunks):
            rows.append(
                {
                    **base,
                    "chunk": c.label,
                    "chunk_start": c.start,
                    "chunk_end": c.end,
                    "distance_from_p": c.start - trace.prefix_len,
                    "fi": float(fi[i, j]),
                    "below_noise_floor": None if below is None else bool(below[i, j]),
                    **signals,
                }
            )
    table = pd.DataFrame(rows)
    if below is None:
        table = table.drop(columns="below_noise_floor")
    if "seed" in table:
        table["seed"] = table["seed"].astype("Int64")
    return table


def probe_document(
    lm: LoadedModel,
    doc: Document,
    chunks: Sequence[Chunk],
    selections: Sequence[str | Selection],
    prefix: int | None = None,
    sinks: int = 4,
    config: SignalConfig = SignalConfig(),
    batch_size: int | None = None,
    block: int = 512,
    trace: Trace | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """The ``fi probe`` job for one document: trace the prefix, resolve the selections, measure FI.

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        doc: the document; ``doc.ids`` ``[N]`` must reach the last chunk's end.
        chunks: future chunks ``[start, end)``, each ``p <= start < end <= N``.
        selections: ``--select`` specs (``"attention:remove=0.1"``, ``"random:remove=0.1@0-2"``,
            ``"policy:snapkv@keep=0.25"``) or parsed :class:`~fi_toolkit.probe.selections.Selection` objects.
        prefix: the compression point ``p``; default the smallest chunk start.
        sinks: the first ``sinks`` positions are never picked by score-based or random selectors.
        config: the signal options (window, top-k, alpha, tau, pooling, entropy convention).
        batch_size: evictions per batched forward (default: 1 on CPU, 8 on CUDA).
        block: query positions per block of the continuation forward.
        trace: a :class:`~fi_toolkit.signals.trace.Trace` of ``doc.ids[:p]`` to reuse (else traced here).
        on_progress: called with the number of evictions finished after each batch.

    Returns:
        A tidy ``pandas.DataFrame``, one row per eviction x chunk, the two noise controls first
        (``control:null``, ``control:reorder``): ``document``, ``selection``, ``selector``, ``n_removed``,
        ``n_kept`` (per layer and KV head), ``chunk``, ``fi`` (nats, float32), ``below_noise_floor``,
        and the removed set's mean signals (:func:`fi_table`).

    Raises:
        FIError: a spec, chunk or prefix that does not fit the document or the model (one line).
    """
    chunks = list(chunks)
    if not chunks:
        raise FIError("no chunk given: pass at least one START:END in chunks", parameter="chunks")
    prefix = min(c.start for c in chunks) if prefix is None else prefix
    check_chunks(chunks, prefix, len(doc), max_context(lm))
    parsed = [s for s in selections if isinstance(s, Selection)] + parse_selections(
        [s for s in selections if isinstance(s, str)]
    )
    if sinks < 0:
        raise FIError(f"sinks must be >= 0, got {sinks}", parameter="sinks")
    trace = trace if trace is not None else trace_document(lm, doc, prefix, config, trace_scorer(parsed))
    evictions = [
        s.resolve(trace, sinks=sinks, alpha=config.alpha, model=lm.model, ids=doc.ids, chunks=chunks) for s in parsed
    ]
    result = forward_influence(
        lm.model,
        trace,
        doc.ids,
        evictions,
        chunks,
        batch_size=batch_size,
        block=block,
        on_progress=on_progress,
        controls=True,
    )
    return fi_table(doc, trace, result)
