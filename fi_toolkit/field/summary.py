"""The field map's summaries, from its per-cell tables (:mod:`fi_toolkit.field.run` writes them):

- ``headroom``: per budget x chunk x method, the share of the random-to-oracle gap in FI the method closes,
  ``(FI_random - FI) / (FI_random - FI_oracle)`` (0: random positions with sinks kept, 1: the FI oracle that
  saw the chunk), a ratio of means over documents with a paired bootstrap CI over documents
  (:func:`fi_toolkit.probe.headroom.gap_closed`, ``scipy.stats.bootstrap``), and beside it the oracle's own
  noise: the oracle anchor is measured at label seeds 0 and 1 (:data:`~fi_toolkit.policies.fi_oracle.LABEL_SEEDS`,
  seed 0 the reference), ``fi_oracle_seed_sd`` and ``headroom_seed_sd`` their standard deviations over the seeds
  (:mod:`fi_toolkit.probe.headroom`);
- ``leaderboard``: one row per method x budget: mean FI per chunk, headroom with its CI (spelled ``n/a (needs
  ≥ 2 documents)`` where one document gives none) and the oracle's seed noise (``headroom_seed_sd_CHUNK``), mean
  replay KL, seconds per compression, and the rank by
  FI on the nearest chunk within the budget;
- ``tests``: per budget and metric (FI on each chunk, replay KL), each method against the best one (the lowest
  mean) paired over documents: a one-sided Wilcoxon signed-rank test that the method's value is greater
  (``scipy.stats.wilcoxon``; exact null distribution with few documents, so with n = 5 the smallest p is
  1/32 = 0.031; p-values are not corrected for the number of methods).

Chunks are named by their place: ``near`` (the one nearest ``p``), ``far`` (the farthest), ``dD`` between.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fi_toolkit.field.spec import ANCHOR, ORACLE_ANCHOR, RANDOM_ANCHOR
from fi_toolkit.intervals import FEW_PAIRS, MIN_BOOTSTRAP_UNITS, NEEDS_BOOTSTRAP, NO_DIFFERENCE, paired_wilcoxon
from fi_toolkit.probe.headroom import fit_chunk, gap_closed, oracle_seed, seed_noise

NEEDS_TWO = "n/a (needs ≥ 2 documents)"  # the wording of fi_toolkit.report.display
NO_INTERVAL = f"n/a ({NEEDS_BOOTSTRAP})"
NO_GAP = "n/a (the oracle equals random)"
IDENTICAL = "n/a (equal on every document)"
TEST_COLUMNS = [
    "budget",
    "metric",
    "best",
    "method",
    "n_documents",
    "mean",
    "best_mean",
    "method_wins",
    "median_difference",
    "wilcoxon_statistic",
    "wilcoxon_p",
    "note",
]


def chunk_names(fi: pd.DataFrame) -> dict[str, str]:
    """``{chunk label: near | far | dD}`` by distance from ``p``."""
    dist = fi.drop_duplicates("chunk").set_index("chunk")["distance_from_p"].astype(int).sort_values()
    names = {}
    for i, (label, d) in enumerate(dist.items()):
        names[label] = "near" if i == 0 else "far" if i == len(dist) - 1 else f"d{d}"
    return names


def saw_chunk(selection: str, chunk: str) -> bool:
    """Whether an oracle anchor's label is the one at label seed 0 that scored ``chunk`` (its ``chunk=`` option:
    ``policy:fi-oracle@keep=0.25:chunk=C``, ``...:samples=4,chunk=C``)."""
    base, label_seed = oracle_seed(selection)
    return not label_seed and fit_chunk(base, "") == chunk


def per_document(fi: pd.DataFrame) -> pd.DataFrame:
    """One FI per document x method x budget x chunk: the random anchor's seeds averaged, the oracle anchor
    only where it saw the chunk (its selection's ``chunk=`` option)."""
    t = fi.copy()
    oracle = t["method"] == ORACLE_ANCHOR
    saw = pd.Series([saw_chunk(str(s), c) for s, c in zip(t["selection"], t["chunk"])], index=t.index, dtype=bool)
    t = t[~oracle | saw]
    keys = ["document", "method", "kind", "budget", "chunk"]
    return (
        t.groupby(keys, sort=False).agg(fi=("fi", "mean"), compress_seconds=("compress_seconds", "mean")).reset_index()
    )


def ci_text(low: float, high: float, n: int) -> str:
    """``[0.12, 0.45]``, or why there is no interval (never ``nan``)."""
    if n < MIN_BOOTSTRAP_UNITS:
        return NO_INTERVAL
    if low != low or high != high:
        return NO_GAP
    return f"[{low:.2f}, {high:.2f}]"


def headroom(fi: pd.DataFrame, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per budget x chunk x method (the anchors included: random 0, the oracle 1): ``fi_random``,
    ``fi_method``, ``fi_oracle`` (means over the documents all three have), ``headroom``, ``ci_low``,
    ``ci_high`` (NaN below four documents) and ``ci`` (the interval as text, or why there is none), and the
    oracle anchor's own noise over its label seeds (``oracle_seeds``, ``fi_oracle_seed_sd``, ``headroom_seed_sd``:
    :func:`fi_toolkit.probe.headroom.seed_noise`, on the documents every seed has; NaN with one seed)."""
    pd_ = per_document(fi)
    draws = oracle_draws(fi)
    rows = []
    for (budget, chunk), part in pd_.groupby(["budget", "chunk"], sort=False):
        by = {m: g.set_index("document")["fi"] for m, g in part.groupby("method", sort=False)}
        if RANDOM_ANCHOR not in by or ORACLE_ANCHOR not in by:
            continue
        kinds = part.drop_duplicates("method").set_index("method")["kind"]
        for method, values in by.items():
            docs = by[RANDOM_ANCHOR].index.intersection(values.index).intersection(by[ORACLE_ANCHOR].index)
            r, s, o = (x[docs].to_numpy(float) for x in (by[RANDOM_ANCHOR], values, by[ORACLE_ANCHOR]))
            if not len(docs):
                continue
            h, low, high = gap_closed(r, s, o, resamples=resamples, seed=seed)
            seeds = [by[ORACLE_ANCHOR], *draws.get((budget, chunk), [])]
            common = docs
            for d in seeds:
                common = common.intersection(d.index)
            fi_sd, headroom_sd = seed_noise(
                by[RANDOM_ANCHOR][common].to_numpy(float),
                values[common].to_numpy(float),
                [d[common].to_numpy(float) for d in seeds],
            )
            rows.append(
                {
                    "budget": budget,
                    "chunk": chunk,
                    "method": method,
                    "kind": kinds[method],
                    "n_documents": len(docs),
                    "fi_random": r.mean(),
                    "fi_method": s.mean(),
                    "fi_oracle": o.mean(),
                    "headroom": h,
                    "ci_low": low,
                    "ci_high": high,
                    "ci": ci_text(low, high, len(docs)),
                    "oracle_seeds": len(seeds),
                    "fi_oracle_seed_sd": fi_sd,
                    "headroom_seed_sd": headroom_sd,
                }
            )
    return pd.DataFrame(rows)


def oracle_draws(fi: pd.DataFrame) -> dict[tuple[str, str], list[pd.Series]]:
    """The oracle anchor at its other label seeds (``...:chunk=C,seed=1``): per (budget, chunk) the per-document
    FI of each, on the chunk it saw."""
    t = fi[fi["method"] == ORACLE_ANCHOR]
    out: dict[tuple[str, str], list[pd.Series]] = {}
    for (budget, chunk, selection), g in t.groupby(["budget", "chunk", "selection"], sort=False):
        base, label_seed = oracle_seed(str(selection))
        if label_seed and saw_chunk(base, chunk):
            out.setdefault((budget, chunk), []).append(g.groupby("document")["fi"].mean())
    return out


def leaderboard(fi: pd.DataFrame, replays: pd.DataFrame, hr: pd.DataFrame) -> pd.DataFrame:
    """One row per method x budget (module docstring), sorted by budget, then FI on the nearest chunk."""
    names = chunk_names(fi)
    pd_ = per_document(fi)
    base = (
        pd_.groupby(["method", "kind", "budget"], sort=False)
        .agg(n_documents=("document", "nunique"), compress_seconds=("compress_seconds", "mean"))
        .reset_index()
    )
    for label, name in names.items():
        part = pd_[pd_["chunk"] == label].groupby(["method", "budget"], sort=False)["fi"].mean().rename(f"fi_{name}")
        base = base.join(part, on=["method", "budget"])
        if len(hr):
            h = hr[hr["chunk"] == label].set_index(["method", "budget"])
            cols = {"headroom": f"headroom_{name}", "ci": f"headroom_ci_{name}"}
            cols.update({"ci_low": f"headroom_low_{name}", "ci_high": f"headroom_high_{name}"})
            cols["headroom_seed_sd"] = f"headroom_seed_sd_{name}"  # the oracle's own noise, in headroom units
            base = base.join(h[list(cols)].rename(columns=cols), on=["method", "budget"])
    if len(replays):
        kl = replays.groupby(["method", "budget"], sort=False).agg(
            replay_kl=("mean_kl", "mean"), replay_top1=("top1_agreement", "mean")
        )
        base = base.join(kl, on=["method", "budget"])
    else:
        base["replay_kl"] = np.nan
        base["replay_top1"] = np.nan
    near = "fi_near"
    ranked = base[base["kind"] != ANCHOR]
    base["rank_near"] = ranked.groupby("budget")[near].rank(method="min").astype("Int64")
    order = {b: i for i, b in enumerate(dict.fromkeys(base["budget"]))}
    base = base.assign(_b=base["budget"].map(order)).sort_values(["_b", near], kind="stable").drop(columns="_b")
    return base.reset_index(drop=True)


def _metric_tables(fi: pd.DataFrame, replays: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """``{(budget, metric): document x method values}`` of the methods (anchors left out)."""
    names = chunk_names(fi)
    pd_ = per_document(fi)
    pd_ = pd_[pd_["kind"] != ANCHOR]
    out = {}
    for (budget, chunk), g in pd_.groupby(["budget", "chunk"], sort=False):
        out[budget, f"fi_{names[chunk]}"] = g.pivot_table(index="document", columns="method", values="fi")
    if len(replays):
        for budget, g in replays.groupby("budget", sort=False):
            out[budget, "replay_kl"] = g.pivot_table(index="document", columns="method", values="mean_kl")
    return out


def paired_tests(fi: pd.DataFrame, replays: pd.DataFrame) -> pd.DataFrame:
    """Each method against the best (lowest mean) per budget and metric, paired over documents (module docstring)."""
    rows = []
    for (budget, metric), wide in _metric_tables(fi, replays).items():
        means = wide.mean()
        if means.empty:
            continue
        best = means.idxmin()
        for method in wide.columns:
            if method == best:
                continue
            pair = wide[[method, best]].dropna()
            x, y = pair[method].to_numpy(float), pair[best].to_numpy(float)
            row = {
                "budget": budget,
                "metric": metric,
                "best": best,
                "method": method,
                "n_documents": len(x),
                "mean": float(means[method]),
                "best_mean": float(means[best]),
                "method_wins": int((x < y).sum()),
                "median_difference": float(np.median(x - y)) if len(x) else np.nan,
                "wilcoxon_statistic": np.nan,
                "wilcoxon_p": np.nan,
                "note": "",
            }
            statistic, p, why = paired_wilcoxon(x, y, alternative="greater")
            row["wilcoxon_statistic"], row["wilcoxon_p"] = statistic, p
            row["note"] = {FEW_PAIRS: NEEDS_TWO, NO_DIFFERENCE: IDENTICAL}.get(why, "")
            rows.append(row)
    return pd.DataFrame(rows, columns=TEST_COLUMNS)


def _numeric(table: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``columns`` as numbers: a cell whose table was empty (a method refused everywhere) writes a header only,
    and a column joined from such parts reads back as text."""
    table = table.copy()
    for c in columns:
        if c in table:
            table[c] = pd.to_numeric(table[c])
    return table


def field_summaries(fi: pd.DataFrame, replays: pd.DataFrame, resamples: int = 2000) -> dict[str, pd.DataFrame]:
    """``headroom``, ``leaderboard`` and ``tests`` from the run's ``fi`` and ``replays`` tables."""
    fi = _numeric(fi, ["fi", "compress_seconds", "distance_from_p", "n_removed", "n_kept"])
    replays = _numeric(replays, ["mean_kl", "top1_agreement", "delta_nll"])
    if fi.empty:
        return {}
    hr = headroom(fi, resamples)
    return {"headroom": hr, "leaderboard": leaderboard(fi, replays, hr), "tests": paired_tests(fi, replays)}
