"""Document-level entry points shared by the CLI, the notebooks and the analyses.

``probe_document`` is the whole ``fi probe`` job for one document: trace the prefix, resolve the
selections into token sets, measure Forward Influence, return a tidy table (one row per eviction x
chunk).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import context_limit
from fi_toolkit.model.loading import LoadedModel
from fi_toolkit.probe.forward_influence import (
    CONTROL,
    NOISE_MARGIN,
    Chunk,
    ProbeResult,
    check_chunks,
    forward_influence,
)
from fi_toolkit.probe.selections import Selection, parse_selections, token_scores
from fi_toolkit.signals.trace import SignalConfig, Trace, trace_prefix


def max_context(lm: LoadedModel) -> int | None:
    return context_limit(lm.config)  # the declared context, or a sliding window / longrope bound narrowing it


def trace_document(lm: LoadedModel, doc: Document, prefix: int, config: SignalConfig = SignalConfig()) -> Trace:
    """Trace ``doc[:prefix]`` with clear errors for documents or models too short for it."""
    limit = max_context(lm)
    if limit is not None and prefix > limit:
        raise FIError(f"prefix {prefix:,} is past the model's context of {limit:,} tokens")
    doc.require(prefix, f"a prefix of {prefix:,}")
    return trace_prefix(lm.model, doc.ids, prefix, config)


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
    rows whose FI is below ``NOISE_MARGIN`` x the chunk's noise floor."""
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
            rows.append({
                **base,
                "chunk": c.label,
                "chunk_start": c.start,
                "chunk_end": c.end,
                "distance_from_p": c.start - trace.prefix_len,
                "fi": float(fi[i, j]),
                "below_noise_floor": None if below is None else bool(below[i, j]),
                **signals,
            })
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
    """The ``fi probe`` job for one document -> tidy FI table. ``prefix`` defaults to the smallest chunk start."""
    chunks = list(chunks)
    if not chunks:
        raise FIError("no chunk given: pass at least one --chunk START:END")
    prefix = min(c.start for c in chunks) if prefix is None else prefix
    check_chunks(chunks, prefix, len(doc), max_context(lm))
    parsed = [s for s in selections if isinstance(s, Selection)] + parse_selections(
        [s for s in selections if isinstance(s, str)]
    )
    if sinks < 0:
        raise FIError(f"--sinks must be >= 0, got {sinks}")
    trace = trace if trace is not None else trace_document(lm, doc, prefix, config)
    evictions = [s.resolve(trace, sinks=sinks, alpha=config.alpha, model=lm.model, ids=doc.ids, chunks=chunks)
                 for s in parsed]
    result = forward_influence(
        lm.model, trace, doc.ids, evictions, chunks, batch_size=batch_size, block=block, on_progress=on_progress,
        controls=True,
    )
    return fi_table(doc, trace, result)


def noise_floor(table: pd.DataFrame) -> dict:
    """``{document: {chunk: floor}}`` from a table's control rows (docs/method.md, "Noise floor")."""
    controls = table[table["selector"] == CONTROL]
    floors = controls.assign(fi=controls["fi"].abs()).groupby(["document", "chunk"], sort=False)["fi"].max()
    out: dict = {}
    for (doc, chunk), value in floors.items():
        out.setdefault(doc, {})[chunk] = float(value)
    return out


def flag_below_noise_floor(table: pd.DataFrame, floors: dict | None = None) -> pd.DataFrame:
    """``below_noise_floor`` of every row, as :func:`fi_table` sets it from a :class:`ProbeResult`
    (float32 ``fi < NOISE_MARGIN x floor``, per document and chunk): for a document measured in parts,
    of which only the first holds the controls. ``floors``: :func:`noise_floor` of the table holding
    the controls (default ``table`` itself)."""
    fi = table["fi"].to_numpy(dtype=np.float32)
    floors = noise_floor(table) if floors is None else floors
    floor = np.array([floors.get(d, {}).get(c, np.nan) for d, c in zip(table["document"], table["chunk"])],
                     dtype=np.float32)
    below = pd.Series(fi < np.float32(NOISE_MARGIN) * floor, index=table.index)
    out = table.drop(columns="below_noise_floor", errors="ignore")
    out.insert(out.columns.get_loc("fi") + 1, "below_noise_floor", below)
    return out


def noise_warning(table: pd.DataFrame, floors: dict | None = None) -> str | None:
    """One line when any measured (non-control) row is below ``NOISE_MARGIN`` x its noise floor
    (``floors``: :func:`noise_floor` of the table holding the controls, default ``table`` itself)."""
    if "below_noise_floor" not in table:
        return None
    floors = noise_floor(table) if floors is None else floors
    measured = table[table["selector"] != CONTROL] if "selector" in table else table
    flagged = measured["below_noise_floor"].astype(bool)
    if not flagged.any():
        return None
    top = max(v for chunks in floors.values() for v in chunks.values())
    return (f"warning: {int(flagged.sum())} of {len(measured)} FI values are below {NOISE_MARGIN:g}x the noise floor "
            f"(up to {top:.2g} nats); they measure rounding, not the eviction (column below_noise_floor)")
