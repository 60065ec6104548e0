"""Random positions as one baseline per budget, and every token set of a probe compared with it.

``fi probe`` measures ``random:B@0-2`` as three sets (one per seed) so that their spread is seen; a reader
compares every other set of the same size with random positions as a whole. :func:`pooled_sets` gives one row
per set and chunk with the random seeds pooled into one row per budget (its mean over documents and seeds, and
the spread of the per-seed means); :func:`versus_random` tests each set against it, paired over (document,
seed): the set's FI on a document against each random seed's FI on the same document (two-sided Wilcoxon
signed-rank, scipy's exact null distribution for few pairs). The pairs of one document share the set's value,
so they are not independent draws: the test asks whether the set lies outside random's spread, document by
document, not whether it would on other documents; with one document and three seeds the smallest two-sided
p-value is 0.25.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from fi_toolkit.intervals import FEW_PAIRS, NO_DIFFERENCE, mean_interval, paired_wilcoxon
from fi_toolkit.probe.headroom import RANDOM
from fi_toolkit.probe.noise_floor import CONTROL

_SEED = re.compile(r"@\d+$")


def baseline_label(selection: str, seeds: int) -> str:
    """``random:remove=0.1@2`` and its sibling seeds -> ``random:remove=0.1 (3 seeds)``."""
    return f"{_SEED.sub('', str(selection))} ({seeds} seed{'s' if seeds != 1 else ''})"


def _sets(fi: pd.DataFrame) -> pd.DataFrame:
    """The measured sets (controls aside), with ``size``: the entries removed per layer and head, rounded."""
    t = fi[fi["selector"] != CONTROL]
    return t.assign(size=t["n_removed"].astype(float).round(3))


def _random_per_seed(t: pd.DataFrame) -> pd.DataFrame:
    """Random rows per (size, chunk, document, selection = seed): FI."""
    return t[t["selector"] == RANDOM][["size", "chunk", "document", "selection", "fi"]]


def pooled_sets(fi: pd.DataFrame, n_resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per measured set and chunk, the random seeds of each size pooled into one row.

    Args:
        fi: ``fi probe``'s table (``fi.csv``): document, selection, selector, n_removed, chunk, fi.
        n_resamples: bootstrap resamples of the mean over documents (:func:`~fi_toolkit.intervals.mean_interval`).
        seed: the bootstrap's seed.

    Returns:
        Columns ``chunk``, ``n_removed``, ``selection`` (random: :func:`baseline_label`), ``selector``,
        ``baseline`` (True for the pooled random row), ``n_documents``, ``seeds`` (random's seed count, else
        1), ``fi`` (mean over documents; random: of each document's mean over its seeds), ``fi_ci_low`` /
        ``fi_ci_high`` (bootstrap over documents, NaN below four), ``seed_min`` / ``seed_max`` (random: the
        smallest and largest per-seed mean over documents, NaN for other sets), in the table's order.
    """
    t = _sets(fi)
    rows = []
    for (chunk, _), part in t.groupby(["chunk", "size"], sort=False):
        for selection, g in part[part["selector"] != RANDOM].groupby("selection", sort=False):
            per_doc = g.groupby("document", sort=False)["fi"].mean()
            mean, low, high = mean_interval(per_doc, n_resamples, seed=seed)
            rows.append(_row(chunk, g, selection, False, per_doc.size, 1, mean, low, high, np.nan, np.nan))
        rand = part[part["selector"] == RANDOM]
        if len(rand):
            per_doc = rand.groupby("document", sort=False)["fi"].mean()
            per_seed = rand.groupby("selection", sort=False)["fi"].mean()
            mean, low, high = mean_interval(per_doc, n_resamples, seed=seed)
            label = baseline_label(rand["selection"].iloc[0], per_seed.size)
            rows.append(
                _row(
                    chunk,
                    rand,
                    label,
                    True,
                    per_doc.size,
                    per_seed.size,
                    mean,
                    low,
                    high,
                    *per_seed.agg(["min", "max"]),
                )
            )
    return pd.DataFrame(rows, columns=POOLED_COLUMNS)


POOLED_COLUMNS = [
    "chunk",
    "n_removed",
    "selection",
    "selector",
    "baseline",
    "n_documents",
    "seeds",
    "fi",
    "fi_ci_low",
    "fi_ci_high",
    "seed_min",
    "seed_max",
]


def _row(chunk, g, selection, baseline, docs, seeds, mean, low, high, seed_min, seed_max) -> dict:
    return dict(
        zip(
            POOLED_COLUMNS,
            [
                chunk,
                float(g["n_removed"].astype(float).mean()),
                selection,
                g["selector"].iloc[0],
                baseline,
                int(docs),
                int(seeds),
                mean,
                low,
                high,
                float(seed_min),
                float(seed_max),
            ],
        )
    )


def versus_random(fi: pd.DataFrame) -> pd.DataFrame:
    """Each measured set against the random sets of its size, paired over (document, seed).

    Returns one row per chunk x set that has random sets of its size: ``chunk``, ``n_removed``, ``selection``,
    ``baseline`` (the pooled random label), ``n_documents``, ``pairs``, ``fi`` and ``fi_random`` (means over the
    pairs), ``ratio`` (their quotient), ``below_random`` (pairs where the set's FI is below the random seed's),
    ``wilcoxon_p`` (two-sided; NaN with fewer than two pairs or no nonzero difference) and ``note`` (why
    there is no p-value, else empty). Empty when the probe measured no random set."""
    t = _sets(fi)
    rand = _random_per_seed(t)
    rows = []
    for (chunk, size), part in t[t["selector"] != RANDOM].groupby(["chunk", "size"], sort=False):
        r = rand[(rand["chunk"] == chunk) & (rand["size"] == size)]
        if r.empty:
            continue
        seeds = r["selection"].nunique()
        for selection, g in part.groupby("selection", sort=False):
            own = g.groupby("document", sort=False)["fi"].mean()
            pairs = r.assign(own=r["document"].map(own)).dropna(subset=["own"])
            x, y = pairs["own"].to_numpy(float), pairs["fi"].to_numpy(float)
            _, p, why = paired_wilcoxon(x, y, alternative="two-sided")
            note = {FEW_PAIRS: "needs ≥ 2 pairs", NO_DIFFERENCE: "no difference"}.get(why, "")
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = float(np.mean(x) / np.mean(y)) if len(x) else float("nan")
            rows.append(
                {
                    "chunk": chunk,
                    "n_removed": float(g["n_removed"].astype(float).mean()),
                    "selection": selection,
                    "baseline": baseline_label(r["selection"].iloc[0], seeds),
                    "n_documents": int(pairs["document"].nunique()),
                    "pairs": len(x),
                    "fi": float(np.mean(x)) if len(x) else float("nan"),
                    "fi_random": float(np.mean(y)) if len(y) else float("nan"),
                    "ratio": ratio,
                    "below_random": int((x < y).sum()),
                    "wilcoxon_p": p,
                    "note": note,
                }
            )
    columns = [
        "chunk",
        "n_removed",
        "selection",
        "baseline",
        "n_documents",
        "pairs",
        "fi",
        "fi_random",
        "ratio",
        "below_random",
        "wilcoxon_p",
        "note",
    ]
    return pd.DataFrame(rows, columns=columns)
