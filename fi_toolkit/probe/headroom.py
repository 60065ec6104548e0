"""Headroom: the share of the achievable gap a policy closes,

    headroom = (FI_random - FI_policy) / (FI_random - FI_oracle),

at one budget (the same number of entries removed per layer and head) on one chunk: 0 is no better
than removing at random, 1 is as good as the FI oracle (:mod:`fi_toolkit.probe.oracle`), above 1 better
than the oracle (it is an estimate-driven set, not the true optimum). The three FI values are each the
mean over documents (random: over its seeds within a document first), and the ratio of means is
bootstrapped over documents (``scipy.stats.bootstrap``, paired, percentile interval): a ratio of
per-document ratios would blow up where a document's gap is tiny.

Every oracle is a reference on every chunk, so an oracle fitted on the near chunk and measured on
the far one appears as a row (``fit_chunk`` != ``chunk``): does an oracle for the near future serve
the far one? Its own row on its own chunk is 1 by construction.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from scipy import stats

from fi_toolkit.probe.noise_floor import CONTROL

ORACLE = "oracle:fi-oracle"
RANDOM = "random"
_CHUNK = re.compile(r"chunk=(\d+:\d+)")


def fit_chunk(label: str, first_chunk: str) -> str:
    """The chunk an oracle selection scored: its ``chunk=A:B`` option, else the first probed chunk."""
    m = _CHUNK.search(label)
    return m.group(1) if m else first_chunk


def _ratio(r, s, o, axis=-1):
    return (np.mean(r, axis=axis) - np.mean(s, axis=axis)) / (np.mean(r, axis=axis) - np.mean(o, axis=axis))


def gap_closed(
    r: np.ndarray, s: np.ndarray, o: np.ndarray, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Per-document values ``[n]`` of random, the policy and the oracle -> (headroom, CI low, CI high):
    the ratio of means ``(mean r - mean s) / (mean r - mean o)`` and its paired percentile bootstrap interval
    over documents (NaN below two documents or where the oracle equals random everywhere)."""
    low = high = float("nan")
    if len(r) >= 2 and not np.allclose(r, o):
        ci = stats.bootstrap(
            (r, s, o),
            _ratio,
            paired=True,
            vectorized=True,
            n_resamples=resamples,
            confidence_level=confidence,
            method="percentile",
            random_state=np.random.default_rng(seed),
        ).confidence_interval
        low, high = float(ci.low), float(ci.high)
    return float(_ratio(r, s, o)), low, high


def headroom_table(table: pd.DataFrame, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Probe table (``fi probe``'s: document, selection, selector, n_removed, chunk, fi) -> one row per
    oracle x chunk x measured selection at the oracle's number of removed entries, with ``fi_random``,
    ``fi_policy``, ``fi_oracle`` (means over documents), ``headroom`` and its bootstrap CI over documents
    (NaN below two documents). Empty when the table holds no oracle or no random set."""
    t = table[table["selector"] != CONTROL]
    t = t.assign(n=t["n_removed"].round(3))
    chunks = list(dict.fromkeys(t["chunk"]))
    random = {k: g.groupby("document")["fi"].mean() for k, g in t[t["selector"] == RANDOM].groupby(["n", "chunk"])}
    measured = t[t["selector"] != RANDOM]
    fi = {k: g.groupby("document")["fi"].mean() for k, g in measured.groupby(["selection", "n", "chunk"], sort=False)}
    selectors = t.drop_duplicates("selection").set_index("selection")["selector"]
    rows = []
    for oracle in [s for s in selectors.index if selectors[s] == ORACLE]:
        for (sel, n, chunk), policy in fi.items():
            if (oracle, n, chunk) not in fi or (n, chunk) not in random:
                continue
            reference, rand = fi[oracle, n, chunk], random[n, chunk]
            docs = reference.index.intersection(policy.index).intersection(rand.index)
            r, s, o = (x[docs].to_numpy(float) for x in (rand, policy, reference))
            headroom, low, high = gap_closed(r, s, o, confidence, resamples, seed)
            rows.append(
                {
                    "oracle": oracle,
                    "fit_chunk": fit_chunk(oracle, chunks[0]),
                    "chunk": chunk,
                    "selection": sel,
                    "selector": selectors[sel],
                    "n_removed": n,
                    "n_documents": len(docs),
                    "fi_random": r.mean(),
                    "fi_policy": s.mean(),
                    "fi_oracle": o.mean(),
                    "headroom": headroom,
                    "ci_low": low,
                    "ci_high": high,
                }
            )
    columns = [
        "oracle",
        "fit_chunk",
        "chunk",
        "selection",
        "selector",
        "n_removed",
        "n_documents",
        "fi_random",
        "fi_policy",
        "fi_oracle",
        "headroom",
        "ci_low",
        "ci_high",
    ]
    return pd.DataFrame(rows, columns=columns)
