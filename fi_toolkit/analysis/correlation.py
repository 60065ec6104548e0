"""Correlation analysis (docs/method.md, "Correlation analysis"): per-token Forward Influence against the signals.

For candidate positions ``j`` of the prefix, ``FI_j = FI({j}; C)`` (leave-one-out) on every chunk,
then Spearman (primary), Pearson and Kendall correlations with ``H``, ``A``, ``D``, ``E`` and ``S``
(layer-and-head means), plus Spearman per layer for ``A^(l)``, ``D^(l)``, ``E^(l)`` and ``S^(l)``;
every coefficient carries a paired bootstrap 95% interval from :func:`scipy.stats.bootstrap`.

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
import warnings
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import stats

from ..errors import FIError
from ..eviction import TokenSet
from ..experiment import fi_table, flag_below_noise_floor, noise_floor
from ..probe import Chunk, ProbeResult, forward_influence
from ..trace import Trace

METHODS = ("spearman", "pearson", "kendall")
# Short signal names of docs/method.md, "Signals" -> columns of Trace.token_table (layer-and-head means).
MEAN_SIGNALS = {"H": "entropy", "A": "attention", "D": "distance", "E": "layer_entropy", "S": "infokv"}
LAYER_SIGNALS = ("A", "D", "E", "S")


SAMPLINGS = ("all", "sample", "stratified")


def parse_candidates(spec: str) -> tuple[str, int | None]:
    """``"all"`` -> ("all", None); ``"sample:256"`` -> ("sample", 256); ``"stratified:64"`` -> ("stratified", 64)."""
    text = spec.strip().lower()
    if text == "all":
        return "all", None
    m = re.fullmatch(r"(sample|stratified):(\d+)", text)
    if not m or int(m.group(2)) < 1:
        raise FIError(f"invalid --candidates '{spec}': use 'all', 'sample:N' (uniform) or 'stratified:N' "
                      "(by entropy, reweighted) with N >= 1, e.g. sample:256")
    return m.group(1), int(m.group(2))


def candidate_positions(trace: Trace, spec: str = "sample:256", sinks: int = 4,
                        seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """Candidate positions from ``[sinks, p - w)`` and each one's weight (inverse inclusion probability,
    normalised to mean 1): ``all`` and ``sample:N`` (uniform) weigh every position equally."""
    kind, n = parse_candidates(spec)
    if seed < 0:
        raise FIError(f"--seed must be >= 0, got {seed}")
    if sinks < 0 or sinks >= trace.scored:
        raise FIError(f"--sinks {sinks} leaves no candidates: the scored prefix [0, {trace.scored}) "
                      f"has {trace.scored} positions")
    pool = torch.arange(sinks, trace.scored)
    if n is None or n >= pool.numel():
        return pool, np.ones(pool.numel())
    rng = np.random.default_rng(seed)
    if kind == "sample":
        picked = np.sort(rng.choice(pool.numel(), size=n, replace=False))
        return pool[picked], np.ones(n)
    order = np.argsort(trace.entropy[pool].numpy(), kind="stable")
    strata = np.array_split(order, n)
    picked = np.array([int(rng.choice(stratum)) for stratum in strata])
    weights = np.array([len(stratum) for stratum in strata], dtype=np.float64)
    by_position = np.argsort(picked)
    return pool[picked[by_position]], weights[by_position] / weights.mean()


def per_token_fi(
    model,
    trace: Trace,
    ids: torch.Tensor,
    positions: torch.Tensor,
    chunks: Sequence[Chunk],
    batch_size: int | None = None,
    block: int = 512,
    on_progress: Callable[[int], None] | None = None,
    controls: bool = True,
    reference=None,
) -> ProbeResult:
    """Leave-one-out FI of every position in one batched probe, every chunk in the same pass, after the
    noise controls (rows ``[0, 2)`` of the result; the candidates follow in order). ``controls=False``
    and a shared ``reference``: a later block of a document measured in parts."""
    evictions = [TokenSet(f"positions:{int(j)}", [int(j)], {"selector": "positions"}) for j in positions]
    return forward_influence(model, trace, ids, evictions, chunks, batch_size=batch_size, block=block,
                             on_progress=on_progress, controls=controls, reference=reference)


# -- coefficients and their bootstrap intervals ------------------------------------------------------------


def _pearson(x, y, axis=-1):
    xm = x - x.mean(axis=axis, keepdims=True)
    ym = y - y.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (xm * ym).sum(axis=axis) / np.sqrt((xm * xm).sum(axis=axis) * (ym * ym).sum(axis=axis))


def _spearman(x, y, axis=-1):
    return _pearson(stats.rankdata(x, axis=axis), stats.rankdata(y, axis=axis), axis=axis)


def _kendall(x, y):
    return stats.kendalltau(x, y).statistic


def weighted_pearson(x, y, w) -> float:
    w = w / w.sum()
    xm, ym = x - (w * x).sum(), y - (w * y).sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        return float((w * xm * ym).sum() / np.sqrt((w * xm * xm).sum() * (w * ym * ym).sum()))


def weighted_ranks(x, w) -> np.ndarray:
    """Weighted mid-ranks: the weight strictly below each value plus half the weight of its ties."""
    below = (w[None, :] * (x[None, :] < x[:, None])).sum(axis=1)
    tied = (w[None, :] * (x[None, :] == x[:, None])).sum(axis=1)
    return below + 0.5 * tied


def weighted_spearman(x, y, w) -> float:
    return weighted_pearson(weighted_ranks(x, w), weighted_ranks(y, w), w)


def weighted_kendall(x, y, w) -> float:
    """Tau-b over pairs weighted ``w_i w_j``."""
    sx, sy = np.sign(x[:, None] - x[None, :]), np.sign(y[:, None] - y[None, :])
    ww = w[:, None] * w[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        return float((ww * sx * sy).sum() / np.sqrt((ww * (sx != 0)).sum() * (ww * (sy != 0)).sum()))


# method -> (scipy point estimate with p-value, bootstrap statistic, is it vectorized, weighted statistic)
_METHODS = {
    "spearman": (stats.spearmanr, _spearman, True, weighted_spearman),
    "pearson": (stats.pearsonr, _pearson, True, weighted_pearson),
    "kendall": (stats.kendalltau, _kendall, False, weighted_kendall),
}


def correlation(
    x, y, method: str = "spearman", n_resamples: int = 1000, confidence: float = 0.95, seed: int = 0,
    weights=None,
) -> dict:
    """Coefficient, p-value and paired percentile bootstrap interval of ``x`` vs ``y`` (non-finite pairs dropped).

    Unweighted (``weights`` None or all equal): equal to ``scipy.stats.<method>`` and
    ``scipy.stats.bootstrap((x, y), stat, paired=True, method="percentile",
    rng=np.random.default_rng(seed))`` on the same arrays. Weighted: the weighted coefficient, no
    p-value (NaN), the bootstrap over (x, y, w) triples. Constant input or fewer than 3 pairs gives
    NaN (a correlation is undefined there).
    """
    if method not in _METHODS:
        raise FIError(f"unknown correlation method '{method}' (choose from {', '.join(METHODS)})")
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y, w = x[ok], y[ok], w[ok]
    weighted = bool(w.size and np.ptp(w) > 0)
    row = {"method": method, "weighted": weighted, "rho": np.nan, "p_value": np.nan, "ci_low": np.nan,
           "ci_high": np.nan, "n": int(x.size)}
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return row
    point, statistic, vectorized, weighted_statistic = _METHODS[method]
    if weighted:
        row["rho"] = weighted_statistic(x, y, w)
        data, stat, vectorized = (x, y, w), weighted_statistic, False
    else:
        res = point(x, y)
        row["rho"], row["p_value"] = float(res.statistic), float(res.pvalue)
        data, stat = (x, y), statistic
    if n_resamples > 0:
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            boot = stats.bootstrap(
                data, stat, paired=True, vectorized=vectorized, n_resamples=n_resamples,
                confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed),
            )
        row["ci_low"], row["ci_high"] = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
    return row


def signal_columns(trace: Trace, positions: torch.Tensor) -> pd.DataFrame:
    """Every signal at ``positions``: H, A, D, E, S (means) and A_l, D_l, E_l, S_l per layer."""
    table = trace.token_table().iloc[positions.numpy()].reset_index(drop=True)
    infokv = trace.infokv().mean(dim=1)  # [L, p - w]; candidates lie in the scored range
    for layer in range(trace.num_layers):
        table[f"S_{layer}"] = infokv[layer, positions].numpy()
    return table


def correlate_signals(
    fi: np.ndarray, signals: pd.DataFrame, chunks: Sequence[Chunk], prefix: int, n_resamples: int = 1000,
    seed: int = 0, methods: Sequence[str] = METHODS, weights: np.ndarray | None = None,
) -> pd.DataFrame:
    """Tidy correlations: one row per chunk x signal x (mean or layer) x method (``weights``: per candidate)."""
    rows = []
    layers = sum(1 for c in signals.columns if re.fullmatch(r"D_\d+", c))
    for c_idx, chunk in enumerate(chunks):
        base = {"chunk": chunk.label, "chunk_start": chunk.start, "distance_from_p": chunk.start - prefix}
        y = fi[:, c_idx]
        for short, column in MEAN_SIGNALS.items():
            for method in methods:
                r = correlation(signals[column].to_numpy(), y, method, n_resamples, seed=seed, weights=weights)
                rows.append({**base, "signal": short, "scope": "mean", "layer": pd.NA, **r})
        for short in LAYER_SIGNALS:
            for layer in range(layers):
                r = correlation(signals[f"{short}_{layer}"].to_numpy(), y, "spearman", n_resamples, seed=seed,
                                weights=weights)
                rows.append({**base, "signal": short, "scope": "layer", "layer": layer, **r})
    table = pd.DataFrame(rows)
    table["layer"] = table["layer"].astype("Int64")
    return table


def exact_fi(model, doc, trace: Trace, chunks: Sequence[Chunk], candidates: str = "sample:256", sinks: int = 4,
             seed: int = 0, batch_size: int | None = None, block: int = 512,
             on_progress: Callable[[int], None] | None = None, part: slice = slice(None), reference=None):
    """Leave-one-out FI of the candidate positions, with the noise controls -> :class:`.agreement.Measured`.

    ``part``: only that block of the candidates; the controls go with the block that starts at 0, and
    the other blocks' ``below`` and ``controls`` are None (:func:`assemble_parts` completes them)."""
    from .agreement import Measured

    positions, weights = candidate_positions(trace, candidates, sinks, seed)
    positions, weights = positions[part], weights[part]
    with_controls = part.start in (None, 0)
    result = per_token_fi(model, trace, doc.ids, positions, chunks, batch_size, block, on_progress, with_controls,
                          reference)
    controls = result.control_rows()
    measured = [i for i in range(len(result.evictions)) if i not in controls]
    fi = result.fi()[measured].double().numpy()
    if not with_controls:
        return Measured(positions, weights, fi, None, None)
    control_table = fi_table(doc, trace, result.rows(controls))
    return Measured(positions, weights, fi, result.below_noise_floor()[measured].numpy(),
                    control_table[["document", "selection", "selector", "chunk", "chunk_start", "distance_from_p", "fi"]])


def correlate_document(
    model, doc, trace: Trace, chunks: Sequence[Chunk], candidates: str = "sample:256", sinks: int = 4,
    seed: int = 0, n_resamples: int = 1000, batch_size: int | None = None, block: int = 512,
    token_text: Callable[[int], str] | None = None, on_progress: Callable[[int], None] | None = None,
    estimator: str = "exact", samples: int = 16, validate: int = 0, part: slice | None = None, reference=None,
) -> dict[str, pd.DataFrame]:
    """Per-token FI and its correlations for one document -> ``{"tokens", "correlations", "controls"}``.

    ``estimator="exact"``: leave-one-out FI of the ``candidates``. ``"fisher"``: the gradient estimate
    (:mod:`fi_toolkit.estimator`, ``samples`` label draws) at every position of ``[sinks, p - w)``,
    with ``validate`` positions also measured exactly (tables ``validation`` and ``agreement``).

    ``part`` (exact only; issue 11): one block of the candidates, sharing the document's ``reference``
    run. It returns its ``tokens`` (``below_noise_floor`` empty unless the block holds the controls),
    every signal column at its candidates (``signals``) and, in the first block, ``controls``;
    :func:`assemble_parts` turns the blocks into the whole document's tables.
    """
    from .agreement import estimated_fi

    if estimator == "fisher":
        if part is not None:
            raise FIError("--unit-candidates splits exact per-token FI; the fisher estimate is one unit per document")
        m = estimated_fi(model, doc, trace, chunks, sinks, seed, samples, validate, n_resamples, batch_size, block,
                         token_text, on_progress)
        sampling = "all"
    elif estimator == "exact":
        m = exact_fi(model, doc, trace, chunks, candidates, sinks, seed, batch_size, block, on_progress,
                     slice(None) if part is None else part, reference)
        sampling = parse_candidates(candidates)[0]
    else:
        raise FIError(f"unknown --estimator '{estimator}' (choose exact or fisher)")
    positions, weights, fi = m.positions, m.weights, m.fi
    signals = signal_columns(trace, positions)
    ids = doc.ids[positions].tolist()
    token_rows = []
    for c_idx, chunk in enumerate(chunks):
        rows = pd.DataFrame({
            "document": doc.name, "position": positions.numpy(),
            "token": [token_text(i) if token_text else str(i) for i in ids],
            "chunk": chunk.label, "chunk_start": chunk.start, "distance_from_p": chunk.start - trace.prefix_len,
            "fi": fi[:, c_idx], "below_noise_floor": None if m.below is None else m.below[:, c_idx], "weight": weights,
        })
        for column in MEAN_SIGNALS.values():
            rows[column] = signals[column].to_numpy()
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


def assemble_parts(doc_name: str, parts: dict[str, pd.DataFrame], chunks: Sequence[Chunk], prefix: int,
                   n_resamples: int, seed: int, sampling: str) -> dict[str, pd.DataFrame]:
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
    corr = correlate_signals(fi, signals, chunks, prefix, n_resamples, seed,
                             weights=tokens.loc[first, "weight"].to_numpy(dtype=np.float64))
    corr.insert(0, "document", doc_name)
    corr.insert(1, "sampling", sampling)
    return {"tokens": tokens, "correlations": corr, "controls": controls}


def summarize_correlations(corr: pd.DataFrame) -> pd.DataFrame:
    """Across documents: mean, spread (std, min, max) and sign agreement of each coefficient."""
    keys = ["chunk", "chunk_start", "distance_from_p", "signal", "scope", "layer", "method", "sampling", "weighted"]
    grouped = corr.groupby(keys, dropna=False, sort=False)["rho"]
    out = grouped.agg(rho_mean="mean", rho_std="std", rho_min="min", rho_max="max", n_documents="count")
    out["share_positive"] = grouped.apply(lambda r: float((r > 0).mean()))
    return out.reset_index()
