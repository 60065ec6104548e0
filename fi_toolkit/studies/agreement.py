"""Per-token FI from the gradient estimator (:mod:`fi_toolkit.probe.estimator`) for ``fi correlate --estimator
fisher``, and its agreement with exact leave-one-out FI on validated positions.

Agreement (per chunk): Spearman (primary) and Pearson of estimated against exact FI, each weighted by
the validation sample's inverse inclusion probabilities (:func:`.per_token.candidate_positions`,
``stratified:N`` by entropy), and the top-10 % overlap: of the ``k = max(1, round(0.1 n))`` validated
positions with the largest exact FI, the share that are also among the ``k`` largest estimates
(unweighted). Each comes with a paired percentile bootstrap 95 % interval (1000 resamples, seeded).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from fi_toolkit.errors import FIError
from fi_toolkit.intervals import bootstrap_interval
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.probe.experiment import fi_table
from fi_toolkit.signals.trace import Trace
from fi_toolkit.studies.per_token import Measured, candidate_positions, per_token_fi
from fi_toolkit.studies.statistics import correlation

TOP_SHARE = 0.1
AGREEMENT_METHODS = ("spearman", "pearson", "top10_overlap")


def top_overlap(x, y, share: float = TOP_SHARE) -> float:
    """Share of the ``max(1, round(share * n))`` largest ``x`` that are among the largest ``y`` (ties by position)."""
    x, y = np.asarray(x), np.asarray(y)
    k = max(1, int(round(share * x.size)))
    top_x = set(np.argsort(-x, kind="stable")[:k].tolist())
    return len(top_x & set(np.argsort(-y, kind="stable")[:k].tolist())) / k


def agreement(exact, estimate, weights=None, n_resamples: int = 1000, seed: int = 0) -> list[dict]:
    """Spearman, Pearson (weighted where ``weights`` differ) and top-10 % overlap of ``estimate`` against
    ``exact``, each with a paired percentile bootstrap interval -> rows of ``metric, value, ci_low, ci_high, n``."""
    exact, estimate = np.asarray(exact, dtype=np.float64), np.asarray(estimate, dtype=np.float64)
    rows = []
    for method in ("spearman", "pearson"):
        r = correlation(exact, estimate, method, n_resamples, seed=seed, weights=weights)
        rows.append(
            {
                "metric": method,
                "value": r["rho"],
                "ci_low": r["ci_low"],
                "ci_high": r["ci_high"],
                "n": r["n"],
                "weighted": r["weighted"],
            }
        )
    row = {
        "metric": "top10_overlap",
        "value": top_overlap(exact, estimate),
        "ci_low": np.nan,
        "ci_high": np.nan,
        "n": int(exact.size),
        "weighted": False,
    }
    if n_resamples > 0 and exact.size >= 3:
        row["ci_low"], row["ci_high"] = bootstrap_interval(
            (exact, estimate), top_overlap, paired=True, vectorized=False, n_resamples=n_resamples, seed=seed
        )
    rows.append(row)
    return rows


def estimated_fi(
    model,
    doc,
    trace: Trace,
    chunks: Sequence[Chunk],
    sinks: int = 4,
    seed: int = 0,
    samples: int = 16,
    validate: int = 0,
    n_resamples: int = 1000,
    batch_size: int | None = None,
    block: int = 512,
    token_text: Callable[[int], str] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Measured:
    """The Fisher estimate at every position of ``[sinks, p - w)`` (its standard error and per-layer
    estimates as extra columns); with ``validate = N``, exact leave-one-out FI at ``stratified:N``
    positions too (after the noise controls) -> tables ``validation`` and ``agreement``."""
    pool = torch.arange(sinks, trace.scored)
    if sinks < 0 or pool.numel() == 0:
        raise FIError(
            f"sinks {sinks} leaves no candidates: the scored prefix [0, {trace.scored}) has {trace.scored} positions",
            parameter="sinks",
        )
    if validate < 0 or validate > pool.numel():
        raise FIError(
            f"validate {validate} must lie in [0, {pool.numel()}], the number of candidates [{sinks}, {trace.scored})"
        )
    est = fisher_fi(model, trace, doc.ids, chunks, samples, seed, block, on_progress)
    columns = {"fi_se": est.se[pool].numpy()}
    for layer in range(trace.num_layers):
        columns[f"fi_layer_{layer}"] = est.layer_fi[layer, pool].numpy()
    measured = Measured(
        pool,
        np.ones(pool.numel()),
        est.fi[pool].numpy(),
        np.zeros((pool.numel(), len(chunks)), bool),
        pd.DataFrame(columns=["document", "selection", "selector", "chunk", "chunk_start", "distance_from_p", "fi"]),
        columns,
    )
    measured.tables["estimator_time"] = pd.DataFrame(
        [{"document": doc.name, "positions": int(pool.numel()), "samples": samples, "seconds": round(est.seconds, 2)}]
    )
    measured.tables["sink_estimates"] = pd.DataFrame(
        [  # the excluded sinks, for comparison with the candidates
            {
                "document": doc.name,
                "position": j,
                "chunk": c.label,
                "fi_estimate": float(est.fi[j, k]),
                "fi_se": float(est.se[j, k]),
            }
            for j in range(sinks)
            for k, c in enumerate(chunks)
        ],
        columns=["document", "position", "chunk", "fi_estimate", "fi_se"],
    )
    if validate:
        picked, weights = candidate_positions(trace, f"stratified:{validate}", sinks, seed)
        result = per_token_fi(model, trace, doc.ids, picked, chunks, batch_size, block, on_progress)
        controls = result.control_rows()
        rows = [i for i in range(len(result.evictions)) if i not in controls]
        exact, below = result.fi()[rows].double().numpy(), result.below_noise_floor()[rows].numpy()
        measured.controls = fi_table(doc, trace, result.rows(controls))[measured.controls.columns]
        measured.tables.update(
            _validation_tables(doc, trace, chunks, picked, weights, exact, below, est, n_resamples, seed, token_text)
        )
    return measured


def _validation_tables(doc, trace, chunks, picked, weights, exact, below, est, n_resamples, seed, token_text) -> dict:
    ids = doc.ids[picked].tolist()
    base = [
        {"document": doc.name, "chunk": c.label, "chunk_start": c.start, "distance_from_p": c.start - trace.prefix_len}
        for c in chunks
    ]
    validation = pd.concat(
        [
            pd.DataFrame(
                {
                    **b,
                    "position": picked.numpy(),
                    "token": [token_text(i) if token_text else str(i) for i in ids],
                    "fi_exact": exact[:, k],
                    "fi_estimate": est.fi[picked, k].numpy(),
                    "fi_se": est.se[picked, k].numpy(),
                    "below_noise_floor": below[:, k],
                    "weight": weights,
                    "entropy": trace.entropy[picked].numpy(),
                }
            )
            for k, b in enumerate(base)
        ],
        ignore_index=True,
    )
    rows = [
        {**b, **r}
        for k, b in enumerate(base)
        for r in agreement(exact[:, k], est.fi[picked, k].numpy(), weights, n_resamples, seed)
    ]
    return {"validation": validation, "agreement": pd.DataFrame(rows)}


def summarize_agreement(table: pd.DataFrame) -> pd.DataFrame:
    """Across documents: mean, sd, min and max of each agreement metric per chunk."""
    grouped = table.groupby(["chunk", "chunk_start", "distance_from_p", "metric"], sort=False)["value"]
    return grouped.agg(
        value_mean="mean", value_std="std", value_min="min", value_max="max", n_documents="count"
    ).reset_index()
