"""``fi probe``'s section: the FI of each token set, random positions of its size pooled into one baseline, and
beside an FI oracle the headroom (the share of the random-to-oracle gap each set closes).

Lead table and headline compare only sets of the same size (FI grows with what is removed); every set is tested
against random positions of its size (:func:`~fi_toolkit.studies.random_baseline.versus_random`, a table the
report derives so runs written before it get it too).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from fi_toolkit.intervals import MIN_BOOTSTRAP_UNITS
from fi_toolkit.probe.headroom import ORACLE, fit_chunk
from fi_toolkit.report.display import pooled_fi
from fi_toolkit.report.figures import colors, finish, legend_outside, plt
from fi_toolkit.report.kinds.base import LeadTable, RunKind
from fi_toolkit.report.kinds.common import documents, documents_interval, pivot, study_caption
from fi_toolkit.report.numbers import formatted, number_text, significant, value_text, value_with_interval
from fi_toolkit.studies.random_baseline import pooled_sets, versus_random

TABLE_TITLES = {
    "fi": "FI (nats) of each token set, per chunk and document; controls first (their FI is the noise floor)",
    "headroom": "Headroom: the share of the random-to-oracle FI gap each set closes (0: random, 1: the FI oracle), "
    "bootstrap 95 % CI over documents, and the oracle's own noise (sd over its label seeds); FI columns in nats",
    "versus_random": "Each token set against random positions of its size, paired over (document, random seed): "
    "mean FI (nats) of the set and of random, their ratio, pairs where the set is below random, two-sided "
    "Wilcoxon signed-rank p (the pairs of one document share the set's value)",
}
SHOWN_COLUMNS = {  # results first (all columns stay in CSV/JSON)
    "fi": [
        "chunk",
        "selection",
        "document",
        "n_removed",
        "fi",
        "below_noise_floor",
        "n_kept",
        "mean_entropy",
        "mean_attention",
        "mean_distance",
        "mean_infokv",
        "prefix",
        "entropy_of",
    ],
    "headroom": [
        "chunk",
        "n_removed",
        "selection",
        "headroom",
        "ci_low",
        "ci_high",
        "headroom_seed_sd",
        "fi_policy",
        "fi_random",
        "fi_oracle",
        "fi_oracle_seed_sd",
        "oracle_seeds",
        "oracle",
        "fit_chunk",
        "n_documents",
    ],
}


def caption(run: dict) -> str:
    """Model, documents, prefix, chunks and how many selections
    (:func:`~fi_toolkit.report.kinds.common.study_caption`)."""
    return study_caption(
        run["manifest"],
        lambda s: f"chunks {', '.join(s.get('chunks', []))}, {len(s.get('selections', []))} selection(s)",
    )


def probe_lead(fi: pd.DataFrame) -> LeadTable | None:
    """Mean FI over documents of every set per chunk, sets of the same size together (smallest first), lowest
    FI first within a size; the random seeds of a size as one baseline row (the range of its per-seed means in
    brackets); the controls' largest |FI| is the noise floor under the table."""
    pooled = pooled_sets(fi)
    if pooled.empty:
        return None
    first = pooled["chunk"].iloc[0]
    order = pooled[pooled["chunk"] == first].sort_values(["n_removed", "fi"], kind="stable")["selection"]
    pooled["rank"] = pooled["selection"].map({s: i for i, s in enumerate(dict.fromkeys(order))})
    pooled = pooled.sort_values(["rank"], kind="stable")

    def cell(r) -> str:
        if r["baseline"]:
            return f"{value_text(r['fi'])} (seeds {value_text(r['seed_min'])} .. {value_text(r['seed_max'])})"
        return value_with_interval(r["fi"], r["fi_ci_low"], r["fi_ci_high"])

    table = pivot(pooled, ["n_removed", "selection"], "chunk", cell, {"n_removed": "removed", "chunk": "FI on"})
    table["removed"] = [number_text(float(v), float(v).is_integer()) for v in table["removed"]]
    table.attrs["numeric"] = ["removed", *table.attrs["numeric"]]
    controls = fi[fi["selector"] == "control"]
    note = (
        f"noise floor (largest |FI| of the controls): {value_text(float(controls['fi'].abs().max()))} nats"
        if len(controls)
        else ""
    )
    n = int(pooled["n_documents"].max())
    interval = documents_interval(n)
    return LeadTable(
        f"FI (nats) of removing each token set, mean over {documents(n)} [{interval}]; lower: the set mattered "
        "less to the chunk's predictions. Sets of equal size are compared together (removed: entries per layer "
        "and head); random positions are one baseline per size, its seeds' range in brackets.",
        table,
        note,
    )


def lead(run: dict) -> LeadTable | None:
    """:func:`probe_lead` of the run's ``fi`` table."""
    return probe_lead(run["tables"]["fi"])


def probe_lines(t: dict) -> list[str]:
    """Per chunk and set size: the sets with the lowest and highest mean FI, the random seeds pooled into one
    baseline (:func:`~fi_toolkit.studies.random_baseline.pooled_sets`) with the sets inside its seed spread;
    beside an FI oracle, the headroom."""
    pooled = pooled_fi(t["fi"])
    lines = []
    for (chunk, removed), g in pooled.groupby(["chunk", "n_removed"], sort=False):
        means = g.set_index("selection")["fi"].sort_values()
        size = f"{significant(removed)} removed"
        if len(means) == 1:
            lines.append(
                f"chunk {chunk}, {size}: {means.index[0]} {formatted(means.iloc[0])} nats (the only set this size)"
            )
            continue
        lines.append(
            f"chunk {chunk}, {size}: lowest mean FI {means.index[0]} ({formatted(means.iloc[0])} nats), highest "
            f"{means.index[-1]} ({formatted(means.iloc[-1])} nats)"
        )
        base = g[g["baseline"]]
        if len(base):
            b = base.iloc[0]
            others = g[~g["baseline"]]
            inside = others[(others["fi"] >= b["seed_min"]) & (others["fi"] <= b["seed_max"])]["selection"].tolist()
            spread = f"seeds {formatted(b['seed_min'])} .. {formatted(b['seed_max'])}"
            lines.append(
                f"chunk {chunk}, {size}: baseline {b['selection']} {formatted(b['fi'])} nats ({spread}); "
                + (f"inside its spread: {', '.join(inside)}" if inside else "no set lies inside its spread")
            )
    hr = t.get("headroom")
    if hr is not None:
        own = hr[(hr["fit_chunk"] == hr["chunk"]) & (hr["selection"] != hr["oracle"])]
        for r in own.sort_values("headroom", ascending=False).itertuples():
            lines.append(
                f"chunk {r.chunk}, {significant(r.n_removed)} removed: {r.selection} closes "
                f"{formatted(r.headroom, '.2f')} of the gap between random sets and the FI oracle (which saw the chunk)"
            )
    return lines


def derived(tables: dict) -> dict[str, pd.DataFrame]:
    """Every set against random positions of its size, where the run measured random sets of its size."""
    versus = versus_random(tables["fi"])
    return {"versus_random": versus} if len(versus) else {}


def probe_versus_random(fi: pd.DataFrame, text: str):
    """Each token set's FI (mean over documents, its bootstrap interval where there are four or more) against
    random positions of the same size (one band per size: the range of the random seeds' means, the line their
    pooled mean); one panel per set size (rows) and chunk (columns), near to far. None without measured sets."""
    pooled = pooled_sets(fi)
    if pooled.empty:
        return None
    chunks = list(dict.fromkeys(pooled["chunk"]))
    sizes = sorted(pooled["n_removed"].unique())
    heights = [max(1, (pooled["n_removed"] == s).sum() // len(chunks)) for s in sizes]
    fig, axes = plt.subplots(
        len(sizes),
        len(chunks),
        figsize=(4.6 * len(chunks) + 2.5, 1.2 + 0.42 * sum(heights) + 0.6 * len(sizes)),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    palette = colors(["set", "random"])
    for row, size in enumerate(sizes):
        for col, chunk in enumerate(chunks):
            ax = axes[row][col]
            part = pooled[(pooled["n_removed"] == size) & (pooled["chunk"] == chunk)]
            sets = part[~part["baseline"]].sort_values("fi")
            y = np.arange(len(sets))
            base = part[part["baseline"]]
            if len(base):
                b = base.iloc[0]
                ax.axvspan(
                    b["seed_min"],
                    b["seed_max"],
                    color=palette["random"],
                    alpha=0.25,
                    lw=0,
                    label="random: seeds' range",
                )
                ax.axvline(b["fi"], color=palette["random"], lw=1.2, label="random: mean")
            if len(sets):
                low, high = sets["fi_ci_low"].to_numpy(float), sets["fi_ci_high"].to_numpy(float)
                values = sets["fi"].to_numpy(float)
                if np.isfinite(low).all():
                    xerr = np.vstack([values - low, high - values])
                    ax.errorbar(values, y, xerr=xerr, fmt="none", ecolor=palette["set"], capsize=3)
                ax.plot(values, y, "o", color=palette["set"], label="token set")
            ax.set_yticks(y, sets["selection"].tolist(), fontsize=8)
            ax.set_ylim(-0.7, max(len(sets), 1) - 0.3)
            ax.set_xlabel(f"FI on {chunk} (nats)")
            title = f"{size:g} removed, chunk {chunk}"
            ax.set_title(title if len(base) else f"{title} (no random set this size)", fontsize=10)
            if row == 0 and col == len(chunks) - 1:
                ax.legend(fontsize=8)
                legend_outside(ax)
    n = int(pooled["n_documents"].max())
    fig.suptitle(
        f"FI (nats) of each token set against random positions of the same size, near to far (mean over {n} "
        f"document{'s' if n != 1 else ''}; band: the random seeds' range, line: their mean"
        + ("; bars: bootstrap 95% CI over documents)" if n >= MIN_BOOTSTRAP_UNITS else ")"),
        fontsize=11,
    )
    return finish(fig, text)


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


def figures(tables: dict, text: str) -> list[tuple[str, object]]:
    """Each set against random positions of its size; beside an FI oracle, the headroom."""
    made = [("versus_random", probe_versus_random(tables["fi"], text))]
    return made + ([("headroom", headroom_figure(tables["headroom"], text))] if "headroom" in tables else [])


KIND = RunKind(
    name="probe",
    title="Forward Influence of token sets (fi probe)",
    tables=[("fi", True)],
    optional_tables=[("headroom", True)],  # fi probe beside an FI oracle and random sets
    table_titles=TABLE_TITLES,
    shown_columns=SHOWN_COLUMNS,
    caption=caption,
    lead=lead,
    headline=probe_lines,
    figures=figures,
    derived=derived,
    command="probe",
    top_level_settings=("documents", "prefix", "chunks", "selections"),  # fi probe's manifest keeps them at the top
)
