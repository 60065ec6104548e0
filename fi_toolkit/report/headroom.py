"""The headroom figure: per budget and chunk, each selection's share of the random-to-oracle
gap (:func:`fi_toolkit.probe.headroom.headroom_table`) with its bootstrap 95 % CI over documents. The
reference is the FI oracle fitted on the chunk measured (it sees that chunk: an oracle, not a policy);
oracles fitted on another chunk appear as bars of their own (``oracle fit on A:B``)."""

from __future__ import annotations

import sys

import matplotlib

if "ipykernel" not in sys.modules:  # in a notebook, keep its inline backend so the figures show
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fi_toolkit.probe.headroom import ORACLE, fit_chunk  # noqa: E402
from fi_toolkit.report.figures import colors  # noqa: E402


def reference_rows(hr: pd.DataFrame, rounds: bool = True) -> pd.DataFrame:
    """Rows measured against the oracle fitted on the chunk measured, one-round Fisher oracle only
    (options other than ``chunk`` name another oracle); the reference's own row (1 by construction) dropped."""
    plain = ~hr["oracle"].str.contains("rounds=|estimator=|samples=")
    own = hr[plain & (hr["fit_chunk"] == hr["chunk"]) & (hr["selection"] != hr["oracle"])].copy()
    if not rounds:
        own = own[~own["selection"].str.contains("rounds=")]
    is_oracle = own["selector"] == ORACLE
    own["bar"] = own["selection"].str.replace(r"^policy:", "", regex=True).str.replace(r"@[^:]*", "", regex=True)
    default = hr.loc[~hr["oracle"].str.contains("chunk="), "fit_chunk"]
    first = default.iloc[0] if len(default) else ""
    fits = own.loc[is_oracle, "selection"].map(lambda s: fit_chunk(s, first))
    extra = own.loc[is_oracle, "selection"].str.extract(r"((?:rounds|estimator|samples)=[^,]+)")[0].fillna("")
    own.loc[is_oracle, "bar"] = ("ORACLE fit on " + fits + " " + extra).str.strip()
    return own


def own_noise(hr: pd.DataFrame, n: float, chunk: str) -> float:
    """The reference oracle's ``headroom_seed_sd`` on its own row (how far its "1" moves over its label seeds) at
    ``n`` removed on ``chunk``; NaN where not measured."""
    if "headroom_seed_sd" not in hr:
        return float("nan")
    plain = ~hr["oracle"].str.contains("rounds=|estimator=|samples=")  # the reference, as reference_rows picks it
    own = hr[plain & (hr["fit_chunk"] == hr["chunk"]) & (hr["selection"] == hr["oracle"])]
    own = own[(own["n_removed"] == n) & (own["chunk"] == chunk)]
    return float(own["headroom_seed_sd"].iloc[0]) if len(own) else float("nan")


def headroom_figure(hr: pd.DataFrame, text: str):
    """Horizontal bars of headroom (0: random, 1: the FI oracle of that chunk) with CIs; one panel per
    budget (rows) and chunk (columns); a band around 1 of the reference oracle's own noise over its label seeds
    (``headroom_seed_sd`` of its own row) where measured. None when there is nothing to draw."""
    rows = reference_rows(hr)
    if rows.empty:
        return None
    budgets = sorted(rows["n_removed"].unique())
    chunks = list(dict.fromkeys(rows["chunk"]))
    order = rows.groupby("bar")["headroom"].mean().sort_values().index.tolist()
    height = 0.32 * len(order) * len(budgets) + 1.5
    fig, axes = plt.subplots(
        len(budgets), len(chunks), figsize=(max(6.0, 4.2 * len(chunks)), height), squeeze=False, sharey=True
    )
    policy_color, oracle_color = colors(["policy", "oracle"]).values()  # colour-blind-safe blue and orange
    for i, n in enumerate(budgets):
        for j, chunk in enumerate(chunks):
            ax = axes[i][j]
            g = rows[(rows["n_removed"] == n) & (rows["chunk"] == chunk)].set_index("bar").reindex(order)
            y = np.arange(len(order))
            err = np.vstack([g["headroom"] - g["ci_low"], g["ci_high"] - g["headroom"]])
            shade = [oracle_color if b.startswith("ORACLE") else policy_color for b in order]
            ax.barh(y, g["headroom"], xerr=np.where(np.isfinite(err), err, 0), color=shade, capsize=2)
            ax.axvline(0, color="k", lw=0.8)
            ax.axvline(1, color=oracle_color, lw=0.8, ls="--")
            sd = own_noise(hr, n, chunk)
            if sd == sd:  # the "1" itself moves over the oracle's label seeds: a band of one sd
                ax.axvspan(1 - sd, 1 + sd, color=oracle_color, alpha=0.15, lw=0)
            ax.set_yticks(y, order, fontsize=8)
            ax.set_title(f"chunk {chunk}, {n:g} removed per head", fontsize=9)
            ax.xaxis.set_major_locator(
                MaxNLocator(nbins=5, steps=[1, 2.5, 5, 10])
            )  # apart, and 1 (the oracle) labelled
            if i == len(budgets) - 1:  # the bottom row only, on two lines: side by side, labels never run together
                ax.set_xlabel("share of the random-to-oracle\nFI gap closed", fontsize=9)
    fig.suptitle(
        "Headroom: share of the random-to-oracle FI gap each set closes (0: random, 1: the FI oracle; 95% CI)",
        fontsize=10,
    )
    fig.text(0.5, 0.005, text, ha="center", va="bottom", fontsize=7, color="#444", wrap=True)
    fig.tight_layout(rect=(0, min(0.3, 0.45 / height), 1, 1), w_pad=2.0)  # room for a caption of up to three lines
    return fig
