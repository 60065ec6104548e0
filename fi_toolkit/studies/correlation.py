"""Correlation analysis (docs/method.md, "Correlation analysis"): per-token Forward Influence against the signals.

For candidate positions ``j`` of the prefix, ``FI_j = FI({j}; C)`` (leave-one-out) on every chunk,
then Spearman (primary), Pearson and Kendall correlations with ``H``, ``A``, ``D``, ``E`` and ``S``
(layer-and-head means), plus Spearman per layer for ``A^(l)``, ``D^(l)``, ``E^(l)`` and ``S^(l)``
and per (layer, KV head) for the window attention ``A^(l)_h``;
every coefficient carries a paired bootstrap 95% interval from :func:`scipy.stats.bootstrap`.

Both entropy conventions (docs/method.md, "Which entropy") in one run: ``H`` is the run's
``entropy_of``, and the mean signals ``H_produced`` and ``H_next`` are ``H`` under each convention,
so one measurement of FI (the Fisher estimate, computed once) serves both.

The tidy table: one row per chunk x signal x scope x method; ``scope`` is ``mean`` (``layer`` and
``head`` NA), ``layer`` (``layer`` set) or ``head`` (signal ``A``, ``layer`` and ``head`` set: the KV
head's window attention at that layer, Spearman only).

Choices (each an argument):
- Candidates (``[sinks, p - w)``): ``all``; ``sample:N``, a uniform sample without replacement
  (seeded; the default, so every coefficient estimates the population's); or ``stratified:N``,
  the positions sorted by ``H`` cut into ``N`` strata and one drawn from each, which spans the
  entropy range evenly but gives each position the inclusion probability ``1 / |stratum|``: its
  coefficients are then computed with weights ``|stratum|`` (inverse inclusion probability), so
  they estimate the population's too. Weighted Spearman is the weighted Pearson of weighted
  mid-ranks, weighted Kendall the tau-b of pairs weighted ``w_i w_j``; both equal scipy's with
  equal weights. Weighted coefficients have no closed-form p-value (reported NaN); their
  intervals come from the bootstrap over (x, y, w) triples.
- Bootstrap intervals are percentile intervals (``method="percentile"``): BCa is undefined for
  degenerate resample distributions (a perfect monotone relation gives rho = 1 in every resample).
- Per-layer signals get Spearman only (the primary coefficient); the five mean signals get all three.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.noise_floor import flag_below_noise_floor, noise_floor
from fi_toolkit.signals.trace import Trace
from fi_toolkit.studies.agreement import estimated_fi
from fi_toolkit.studies.per_token import exact_fi, parse_candidates
from fi_toolkit.studies.statistics import METHODS, correlation

# Short signal names of docs/method.md, "Signals" -> columns of Trace.token_table (layer-and-head means).
MEAN_SIGNALS = {
    "H": "entropy",
    "A": "attention",
    "D": "distance",
    "E": "layer_entropy",
    "S": "infokv",
    "H_produced": "entropy_produced",
    "H_next": "entropy_next",
}
LAYER_SIGNALS = ("A", "D", "E", "S")
HEAD_SIGNALS = ("A",)  # per (layer, KV head): columns A_{layer}_h{head}


def head_column(short: str, layer: int, head: int) -> str:
    """The signal column of one (layer, KV head): ``A_3_h1``."""
    return f"{short}_{layer}_h{head}"


def signal_columns(trace: Trace, positions: torch.Tensor) -> pd.DataFrame:
    """Every signal at ``positions [n]``: H, A, D, E, S, H_produced, H_next (means), A_l, D_l, E_l, S_l per
    layer and A_l_h per (layer, KV head) (``trace.attention [L, Hkv, p]``) -> ``[n]`` rows."""
    table = trace.token_table().iloc[positions.numpy()].reset_index(drop=True)
    infokv = trace.infokv().mean(dim=1)  # [L, p - w]; candidates lie in the scored range
    columns = {f"S_{layer}": infokv[layer, positions].numpy() for layer in range(trace.num_layers)}
    for layer in range(trace.num_layers):
        for head in range(trace.num_kv_heads):
            columns[head_column("A", layer, head)] = trace.attention[layer, head, positions].numpy()
    return pd.concat([table, pd.DataFrame(columns)], axis=1)


def correlate_signals(
    fi: np.ndarray,
    signals: pd.DataFrame,
    chunks: Sequence[Chunk],
    prefix: int,
    n_resamples: int = 1000,
    seed: int = 0,
    methods: Sequence[str] = METHODS,
    weights: np.ndarray | None = None,
) -> pd.DataFrame:
    """Tidy correlations: one row per chunk x signal x (mean, layer or head) x method (``weights``: per candidate).

    ``fi [n, K]`` per candidate and chunk; ``signals``: :func:`signal_columns` (``n`` rows). Signals
    whose columns are absent (tables saved before a signal existed) are skipped."""
    rows = []
    layers = sum(1 for c in signals.columns if re.fullmatch(r"D_\d+", c))
    heads = [tuple(int(v) for v in m.groups()) for c in signals.columns if (m := re.fullmatch(r"A_(\d+)_h(\d+)", c))]
    for c_idx, chunk in enumerate(chunks):
        base = {"chunk": chunk.label, "chunk_start": chunk.start, "distance_from_p": chunk.start - prefix}
        y = fi[:, c_idx]
        for short, column in MEAN_SIGNALS.items():
            if column not in signals.columns:
                continue
            for method in methods:
                r = correlation(signals[column].to_numpy(), y, method, n_resamples, seed=seed, weights=weights)
                rows.append({**base, "signal": short, "scope": "mean", "layer": pd.NA, "head": pd.NA, **r})
        for short in LAYER_SIGNALS:
            for layer in range(layers):
                r = correlation(
                    signals[f"{short}_{layer}"].to_numpy(), y, "spearman", n_resamples, seed=seed, weights=weights
                )
                rows.append({**base, "signal": short, "scope": "layer", "layer": layer, "head": pd.NA, **r})
        for short in HEAD_SIGNALS:
            for layer, head in heads:
                r = correlation(
                    signals[head_column(short, layer, head)].to_numpy(),
                    y,
                    "spearman",
                    n_resamples,
                    seed=seed,
                    weights=weights,
                )
                rows.append({**base, "signal": short, "scope": "head", "layer": layer, "head": head, **r})
    table = pd.DataFrame(rows)
    table["layer"] = table["layer"].astype("Int64")
    table["head"] = table["head"].astype("Int64")
    return table


def correlate_document(
    model,
    doc,
    trace: Trace,
    chunks: Sequence[Chunk],
    candidates: str = "sample:256",
    sinks: int = 4,
    seed: int = 0,
    n_resamples: int = 1000,
    batch_size: int | None = None,
    block: int = 512,
    token_text: Callable[[int], str] | None = None,
    on_progress: Callable[[int], None] | None = None,
    estimator: str = "exact",
    samples: int = 16,
    validate: int = 0,
    part: slice | None = None,
    reference=None,
) -> dict[str, pd.DataFrame]:
    """Per-token FI and its correlations for one document -> ``{"tokens", "correlations", "controls"}``.

    ``estimator="exact"``: leave-one-out FI of the ``candidates``. ``"fisher"``: the gradient estimate
    (:mod:`fi_toolkit.probe.estimator`, ``samples`` label draws) at every position of ``[sinks, p - w)``,
    with ``validate`` positions also measured exactly (tables ``validation`` and ``agreement``).

    ``part`` (exact only): one block of the candidates, sharing the document's ``reference``
    run. It returns its ``tokens`` (``below_noise_floor`` empty unless the block holds the controls),
    every signal column at its candidates (``signals``) and, in the first block, ``controls``;
    :func:`assemble_parts` turns the blocks into the whole document's tables.
    """
    if estimator == "fisher":
        if part is not None:
            raise FIError(
                "unit_candidates splits exact per-token FI; the fisher estimate is one unit per document",
                parameter="unit_candidates",
            )
        m = estimated_fi(
            model,
            doc,
            trace,
            chunks,
            sinks=sinks,
            seed=seed,
            samples=samples,
            validate=validate,
            n_resamples=n_resamples,
            batch_size=batch_size,
            block=block,
            token_text=token_text,
            on_progress=on_progress,
        )
        sampling = "all"
    elif estimator == "exact":
        m = exact_fi(
            model,
            doc,
            trace,
            chunks,
            candidates=candidates,
            sinks=sinks,
            seed=seed,
            batch_size=batch_size,
            block=block,
            on_progress=on_progress,
            part=slice(None) if part is None else part,
            reference=reference,
        )
        sampling = parse_candidates(candidates)[0]
    else:
        raise FIError(f"unknown estimator '{estimator}' (choose exact or fisher)", parameter="estimator")
    positions, weights, fi = m.positions, m.weights, m.fi
    signals = signal_columns(trace, positions)
    ids = doc.ids[positions].tolist()
    token_rows = []
    for c_idx, chunk in enumerate(chunks):
        rows = pd.DataFrame(
            {
                "document": doc.name,
                "position": positions.numpy(),
                "token": [token_text(i) if token_text else str(i) for i in ids],
                "chunk": chunk.label,
                "chunk_start": chunk.start,
                "distance_from_p": chunk.start - trace.prefix_len,
                "fi": fi[:, c_idx],
                "below_noise_floor": None if m.below is None else m.below[:, c_idx],
                "weight": weights,
            }
        )
        for column in MEAN_SIGNALS.values():
            rows[column] = signals[column].to_numpy()  # H under both conventions too (entropy_produced, _next)
        for name, values in m.columns.items():
            rows[name] = values[:, c_idx] if values.ndim == 2 else values
        token_rows.append(rows)
    tokens = pd.concat(token_rows, ignore_index=True)
    if part is not None:
        return {"tokens": tokens, "signals": signals, **({} if m.controls is None else {"controls": m.controls})}
    corr = correlate_signals(fi, signals, chunks, trace.prefix_len, n_resamples, seed, weights=weights)
    corr.insert(0, "document", doc.name)
    corr.insert(1, "sampling", sampling)
    out = {"tokens": tokens, "correlations": corr, "controls": m.controls}
    for name, table in m.tables.items():
        out[name] = table
    return out


def assemble_parts(
    doc_name: str,
    parts: dict[str, pd.DataFrame],
    chunks: Sequence[Chunk],
    prefix: int,
    n_resamples: int,
    seed: int,
    sampling: str,
) -> dict[str, pd.DataFrame]:
    """A document's ``tokens``, ``correlations`` and ``controls`` from its blocks' tables (concatenated in
    block order), as :func:`correlate_document` computes them in one piece: the token rows chunk by
    chunk, ``below_noise_floor`` against the controls' floor (float32, as the probe flags), and the
    coefficients on the float32 signals (CSV keeps float32 values exact)."""
    order = {c.label: i for i, c in enumerate(chunks)}
    tokens = parts["tokens"]
    tokens = tokens.iloc[np.argsort(tokens["chunk"].map(order).to_numpy(), kind="stable")].reset_index(drop=True)
    controls = parts["controls"]
    tokens = flag_below_noise_floor(tokens, noise_floor(controls))
    signals = parts["signals"]
    signals = signals.astype({c: np.float32 for c in signals.columns if signals[c].dtype.kind == "f"})
    first = tokens["chunk"] == chunks[0].label
    fi = np.stack([tokens.loc[tokens["chunk"] == c.label, "fi"].to_numpy(dtype=np.float64) for c in chunks], axis=1)
    corr = correlate_signals(
        fi, signals, chunks, prefix, n_resamples, seed, weights=tokens.loc[first, "weight"].to_numpy(dtype=np.float64)
    )
    corr.insert(0, "document", doc_name)
    corr.insert(1, "sampling", sampling)
    return {"tokens": tokens, "correlations": corr, "controls": controls}


def summarize_correlations(corr: pd.DataFrame) -> pd.DataFrame:
    """Across documents: mean, spread (std, min, max) and sign agreement of each coefficient."""
    keys = [
        "chunk",
        "chunk_start",
        "distance_from_p",
        "signal",
        "scope",
        "layer",
        "head",
        "method",
        "sampling",
        "weighted",
    ]
    keys = [k for k in keys if k in corr.columns]  # tables saved before the per-head rows have no head column
    grouped = corr.groupby(keys, dropna=False, sort=False)["rho"]
    out = grouped.agg(rho_mean="mean", rho_std="std", rho_min="min", rho_max="max", n_documents="count")
    out["share_positive"] = grouped.apply(lambda r: float((r > 0).mean()))
    return out.reset_index()
