"""Seaborn figures of correlate and nearfar result tables (matplotlib Agg backend outside notebooks, no display needed).

Each function takes the run's tables and a caption (model, documents, prefix, chunk settings) and
returns a Figure, or None when the tables hold nothing to draw.
"""

from __future__ import annotations

import sys
import textwrap

import matplotlib

if "ipykernel" not in sys.modules:  # in a notebook, keep its inline backend so the figures show
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from fi_toolkit.studies.nearfar import per_document_selector  # noqa: E402

SELECTOR_ORDER = ["entropy", "attention", "distance", "infokv", "random"]


def caption(manifest: dict) -> str:
    """One line stating model, documents, prefix and chunks of a run."""
    s = manifest.get("settings", {})
    docs = [d["name"] for d in s.get("documents", [])]
    names = ", ".join(docs[:6]) + (f" (+{len(docs) - 6} more)" if len(docs) > 6 else "")
    chunks = s.get("chunks", [])
    if "selections" in s:  # fi probe
        chunk_text = f"chunks {', '.join(chunks)}, {len(s['selections'])} selection(s)"
    elif "chunk_len" in s:
        chunk_text = (
            f"chunks of {s['chunk_len']} tokens at distances {s.get('distances')} from p, sets of {s.get('budget')}"
        )
    else:
        chunk_text = f"chunks {', '.join(chunks)}, candidates {s.get('candidates')}"
    text = (
        f"model {manifest.get('model', {}).get('name', s.get('model'))} | {len(docs)} document(s): {names} | "
        f"p = {s.get('prefix')} | {chunk_text}"
    )
    floors = [v for chunks in (manifest.get("noise_floor") or {}).values() for v in chunks.values()]
    if floors:  # docs/method.md, "Noise floor"
        model = manifest.get("model", {})
        dtypes = f"{model.get('dtype')} weights, {model.get('compute_dtype')} arithmetic"
        text += f" | noise floor <= {max(floors):.1g} nats ({dtypes})"
    return text


def legend_outside(ax) -> None:
    """Move ``ax``'s legend to the right of the axes, outside the data (seaborn's ``move_legend``);
    :func:`_finish`'s tight layout and ``bbox_inches='tight'`` keep it inside the saved figure."""
    if ax.get_legend() is not None:
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=8, title_fontsize=8)


def _sinks_title(s) -> str:
    return f"sinks protected (first {int(s)})" if s else "no sink protection"


def _finish(fig, text: str):
    fig.text(0.5, 0.005, "\n".join(textwrap.wrap(text, 150)), ha="center", va="bottom", fontsize=7, color="#444")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _spans_decades(values) -> bool:
    """True when every value is positive and max/min exceeds 100 (a log axis reads better)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return v.size > 1 and v.min() > 0 and v.max() / v.min() > 100


def nearfar_distance(nf: pd.DataFrame, text: str):
    """FI, FI relative to random, and share of near-chunk FI against chunk distance, per selector and sinks."""
    per_doc = per_document_selector(nf)
    sinks = sorted(per_doc["sinks"].unique(), reverse=True)
    metrics = [("fi", "FI (nats)"), ("fi_rel_random", "FI / random FI"), ("fi_share_near", "FI / FI on nearest chunk")]
    fig, axes = plt.subplots(len(metrics), len(sinks), figsize=(5.2 * len(sinks), 10), squeeze=False)
    hue_order = [s for s in SELECTOR_ORDER if s in set(per_doc["selector"])]
    for col, s in enumerate(sinks):
        part = per_doc[per_doc["sinks"] == s]
        for row, (metric, label) in enumerate(metrics):
            ax = axes[row][col]
            sns.lineplot(
                data=part,
                x="distance_from_p",
                y=metric,
                hue="selector",
                hue_order=hue_order,
                errorbar=("ci", 95),
                marker="o",
                ax=ax,
                legend=(row == 0 and col == len(sinks) - 1),
            )
            legend_outside(ax)
            if metric == "fi" and _spans_decades(part[metric]):
                ax.set_yscale("log")
            ax.set_xlabel("chunk start - p (tokens)")
            ax.set_ylabel(label)
            ax.set_title(_sinks_title(s), fontsize=10)
    fig.suptitle("Forward Influence of equal-size sets vs chunk distance (mean over documents, 95% CI)", fontsize=11)
    return _finish(fig, text)


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
    sns.barplot(data=long, x="set", y="share", hue="class", ax=ax)
    legend_outside(ax)
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    ax.set_xlabel("")
    ax.set_title("Token classes in each selector's set (closed-class function-word list)", fontsize=11)
    return _finish(fig, text)


def fi_vs_signals(tokens: pd.DataFrame, text: str):
    """Per-token FI against H and against A, one row per chunk; log axes where values span decades."""
    chunks = list(dict.fromkeys(tokens["chunk"]))
    fig, axes = plt.subplots(len(chunks), 2, figsize=(10, 3.6 * len(chunks)), squeeze=False)
    for row, chunk in enumerate(chunks):
        part = tokens[tokens["chunk"] == chunk]
        for col, (signal, label) in enumerate(
            [("entropy", "top-k entropy H (nats)"), ("attention", "window attention A (mean)")]
        ):
            ax = axes[row][col]
            sns.scatterplot(
                data=part, x=signal, y="fi", hue="document", s=12, alpha=0.7, ax=ax, legend=(row == 0 and col == 1)
            )
            legend_outside(ax)
            if _spans_decades(part["fi"]):
                ax.set_yscale("log")
            if _spans_decades(part[signal]):
                ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel(f"per-token FI on {chunk} (nats)")
    fig.suptitle("Leave-one-out Forward Influence of each candidate token", fontsize=11)
    return _finish(fig, text)


def rho_heatmap(summary: pd.DataFrame, text: str):
    """Mean Spearman rho (over documents) per layer x signal, one panel per chunk."""
    layer = summary[(summary["scope"] == "layer") & (summary["method"] == "spearman")]
    if layer.empty:
        return None
    chunks = list(dict.fromkeys(layer["chunk"]))
    n_layers = layer["layer"].nunique()
    fig, axes = plt.subplots(
        1, len(chunks), figsize=(3.2 * len(chunks) + 1, max(3.5, 0.22 * n_layers + 1.5)), squeeze=False
    )
    for i, chunk in enumerate(chunks):
        grid = layer[layer["chunk"] == chunk].pivot_table(index="layer", columns="signal", values="rho_mean")
        grid.index = grid.index.astype(int)  # read back from CSV as float (the mean rows have no layer)
        sns.heatmap(
            grid,
            cmap="RdBu_r",
            vmin=-1,
            vmax=1,
            center=0,
            ax=axes[0][i],
            cbar=(i == len(chunks) - 1),
            annot=n_layers <= 8,
            fmt=".2f",
        )
        axes[0][i].set_title(f"chunk {chunk}", fontsize=10)
    fig.suptitle("Spearman rho of per-token FI with per-layer signals (mean over documents)", fontsize=11)
    return _finish(fig, text)


def rho_vs_distance(correlations: pd.DataFrame, text: str):
    """Spearman rho of the mean signals against chunk distance (spread over documents: 1 sd)."""
    mean = correlations[(correlations["scope"] == "mean") & (correlations["method"] == "spearman")]
    if mean.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(data=mean, x="distance_from_p", y="rho", hue="signal", errorbar="sd", marker="o", ax=ax)
    legend_outside(ax)
    ax.axhline(0, color="#888", lw=0.8)
    ax.set_xlabel("chunk start - p (tokens)")
    ax.set_ylabel("Spearman rho (FI_j vs signal)")
    ax.set_title(
        "Correlation of per-token FI with each signal vs chunk distance (band: 1 sd over documents)", fontsize=10
    )
    return _finish(fig, text)


def estimate_vs_exact(validation: pd.DataFrame, text: str):
    """Estimated (Fisher) against exact leave-one-out FI of the validated positions, log-log, one panel per
    chunk, with the identity line: the estimate is the curvature at the full cache, so its scale may differ."""
    if validation.empty:
        return None
    chunks = list(dict.fromkeys(validation["chunk"]))
    fig, axes = plt.subplots(1, len(chunks), figsize=(4.6 * len(chunks), 4.4), squeeze=False)
    for i, chunk in enumerate(chunks):
        part = validation[
            (validation["chunk"] == chunk) & (validation["fi_exact"] > 0) & (validation["fi_estimate"] > 0)
        ]
        ax = axes[0][i]
        sns.scatterplot(
            data=part,
            x="fi_exact",
            y="fi_estimate",
            hue="document",
            s=14,
            alpha=0.8,
            ax=ax,
            legend=(i == len(chunks) - 1),
        )
        if len(part):
            lo = min(part["fi_exact"].min(), part["fi_estimate"].min())
            hi = max(part["fi_exact"].max(), part["fi_estimate"].max())
            ax.plot([lo, hi], [lo, hi], color="#888", lw=0.8, ls="--", label="identity")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"exact per-token FI on {chunk} (nats)")
        ax.set_ylabel("Fisher estimate (nats)")
        legend_outside(ax)
    fig.suptitle("Gradient (Fisher) estimate against exact leave-one-out FI (dashed: identity)", fontsize=11)
    return _finish(fig, text)
