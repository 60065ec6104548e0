"""``fi nearfar``'s section: the FI of equal-size sets (entropy, attention, random ...) on chunks at increasing
distance from the prefix end p, the paired test of entropy against attention, and the word classes in each set.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns

from fi_toolkit.intervals import MIN_BOOTSTRAP_UNITS
from fi_toolkit.report.display import NEEDS_TWO
from fi_toolkit.report.figures import MARKERS, colors, finish, legend_outside, plt
from fi_toolkit.report.kinds.base import LeadTable, RunKind
from fi_toolkit.report.kinds.common import documents, documents_interval, pivot, study_caption
from fi_toolkit.report.numbers import formatted, value_with_interval
from fi_toolkit.studies.nearfar import summarize_nearfar

SELECTOR_ORDER = ["entropy", "attention", "distance", "infokv", "random"]
TABLE_TITLES = {
    "nearfar_summary": "Equal-size sets per selector and chunk distance: FI (nats), FI / random FI and FI / FI on the "
    "nearest chunk, mean over documents [bootstrap 95 % CI]",
    "nearfar_tests": "Does entropy beat attention? One-sided paired tests over documents per chunk distance "
    "(Wilcoxon signed-rank; t-test of the log ratio)",
    "token_class_summary": "Word classes in each selector's set: share of content words, function words and other "
    "tokens",
}


def caption(run: dict) -> str:
    """Model, documents, prefix, chunk length, distances and set size
    (:func:`~fi_toolkit.report.kinds.common.study_caption`)."""
    return study_caption(
        run["manifest"],
        lambda s: (
            f"chunks of {s.get('chunk_len')} tokens at distances {s.get('distances')} from p, sets of {s.get('budget')}"
        ),
    )


def nearfar_lead(summary: pd.DataFrame, budget: str | None) -> LeadTable | None:
    """Mean FI of each selector's equal-size set per chunk distance, with its bootstrap CI over documents."""
    if summary.empty:
        return None
    s = summary.assign(
        sets=[
            f"{sel} ({'sinks protected' if k else 'sinks not protected'})"
            for sel, k in zip(summary["selector"], summary["sinks"].fillna(0))
        ]
    )
    table = pivot(
        s,
        ["sets"],
        "distance_from_p",
        lambda r: value_with_interval(r["fi_mean"], r["fi_ci_low"], r["fi_ci_high"]),
        {"sets": "set", "distance_from_p": "FI at p +"},
    )
    n = int(summary["n_documents"].max())
    interval = documents_interval(n)
    return LeadTable(
        f"FI (nats) of equal-size sets ({budget or 'one budget'}) on chunks at increasing distance from p: mean over "
        f"{documents(n)} [{interval}]; higher: the set mattered more to that chunk.",
        table,
    )


def lead(run: dict) -> LeadTable | None:
    """:func:`nearfar_lead` of the run's summary, titled with its budget."""
    return nearfar_lead(run["tables"]["nearfar_summary"], run["manifest"].get("settings", {}).get("budget"))


def nearfar_lines(t: dict) -> list[str]:
    """At the farthest chunk: how often entropy sets beat attention sets, and the paired test."""
    tests = t["nearfar_tests"]
    far = tests[
        tests["metric"].isin(["fi", "fi_share_near"]) & (tests["distance_from_p"] == tests["distance_from_p"].max())
    ]
    lines = []
    for r in far.itertuples():
        why = NEEDS_TWO if r.n_documents < 2 else ""
        sinks = "sinks protected" if r.sinks else "sinks not protected"
        metric = "FI" if r.metric == "fi" else "FI / FI on the nearest chunk"
        lines.append(
            f"{sinks}, farthest chunk (p + {int(r.distance_from_p)}), {metric}: entropy sets beat attention sets in "
            f"{r.a_wins} of {r.n_documents} documents; one-sided Wilcoxon p = {formatted(r.wilcoxon_p, '.3g', why)}"
        )
    return lines


def _sinks_title(s) -> str:
    return f"sinks protected (first {int(s)})" if s else "no sink protection"


def nearfar_distance(summary: pd.DataFrame, text: str):
    """FI, FI relative to random, and share of near-chunk FI against chunk distance, per selector and sinks: the
    means and intervals of the run's ``nearfar_summary`` table (:func:`~fi_toolkit.studies.nearfar.summarize_nearfar`),
    so the bands are the table's intervals; no band where the table has none (too few documents). A tidy
    ``nearfar`` table (one row per document and set) is summarised first, as the run summarises it."""
    if "fi_mean" not in summary.columns:
        summary = summarize_nearfar(summary)
    if summary.empty:
        return None
    sinks = sorted(summary["sinks"].fillna(0).unique(), reverse=True)
    metrics = [("fi", "FI (nats)"), ("fi_rel_random", "FI / random FI"), ("fi_share_near", "FI / FI on nearest chunk")]
    fig, axes = plt.subplots(len(metrics), len(sinks), figsize=(5.2 * len(sinks), 10), squeeze=False)
    present = list(dict.fromkeys(summary["selector"]))
    order = [s for s in SELECTOR_ORDER if s in present] + [s for s in present if s not in SELECTOR_ORDER]
    palette = colors(order)
    n = int(summary["n_documents"].max())
    banded = False
    for col, s in enumerate(sinks):
        part = summary[summary["sinks"].fillna(0) == s]
        for row, (metric, label) in enumerate(metrics):
            ax = axes[row][col]
            for i, selector in enumerate(order):
                g = part[part["selector"] == selector].sort_values("distance_from_p")
                if g.empty:
                    continue
                x = g["distance_from_p"].to_numpy(float)
                ax.plot(
                    x,
                    g[f"{metric}_mean"].to_numpy(float),
                    marker=MARKERS[i % len(MARKERS)],
                    color=palette[selector],
                    label=selector,
                )
                low, high = g[f"{metric}_ci_low"].to_numpy(float), g[f"{metric}_ci_high"].to_numpy(float)
                if np.isfinite(low).any():
                    ax.fill_between(x, low, high, color=palette[selector], alpha=0.15, lw=0)
                    banded = True
            if row == 0 and col == len(sinks) - 1:
                ax.legend(title="selector")
                legend_outside(ax)
            ax.set_xlabel("chunk start - p (tokens)")
            ax.set_ylabel(label)
            ax.set_title(_sinks_title(s), fontsize=10)
    bands = (
        "bands: percentile bootstrap 95% CI over documents"
        if banded
        else f"no bands: {n} document{'s' if n != 1 else ''}, a bootstrap interval needs >= {MIN_BOOTSTRAP_UNITS}"
        if n < MIN_BOOTSTRAP_UNITS
        else "no bands: the table holds no interval"
    )
    fig.suptitle(
        "FI (nats) of equal-size sets, and its ratios to random sets and to the nearest chunk, against chunk "
        f"distance (mean over documents; {bands})",
        fontsize=11,
    )
    return finish(fig, text)


def token_classes(summary: pd.DataFrame, text: str):
    if summary.empty:
        return None
    long = summary.melt(
        id_vars=["sinks", "selector"],
        value_vars=["share_content", "share_function", "share_other"],
        var_name="class",
        value_name="share",
    )
    long["class"] = long["class"].str.removeprefix("share_")
    long["set"] = long["selector"] + " (sinks=" + long["sinks"].astype(int).astype(str) + ")"
    fig, ax = plt.subplots(figsize=(10, 4))
    sns.barplot(data=long, x="set", y="share", hue="class", palette=colors(long["class"]), ax=ax)
    legend_outside(ax)
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.set_xlabel("")
    ax.set_ylabel("share of the set's tokens")
    fig.suptitle(
        "Word classes in each selector's set: share of its tokens (closed-class function-word list)", fontsize=11
    )
    return finish(fig, text)


def figures(tables: dict, text: str) -> list[tuple[str, object]]:
    """FI against chunk distance, and the word classes in each set."""
    return [
        ("fi_vs_distance", nearfar_distance(tables["nearfar_summary"], text)),
        ("token_classes", token_classes(tables["token_class_summary"], text)),
    ]


KIND = RunKind(
    name="nearfar",
    title="Forward Influence of equal-size sets, near and far (fi nearfar)",
    tables=[
        ("nearfar_summary", True),
        ("nearfar_tests", True),
        ("token_class_summary", True),
        ("nearfar", False),
        ("token_classes", False),
    ],
    table_titles=TABLE_TITLES,
    caption=caption,
    lead=lead,
    headline=nearfar_lines,
    figures=figures,
    command="nearfar",
)
