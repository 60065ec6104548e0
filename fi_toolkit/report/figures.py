"""Seaborn figures of correlate and nearfar result tables (matplotlib Agg backend outside notebooks, no display needed).

Each function takes the run's tables and a caption (model, documents, prefix, chunk settings) and
returns a Figure, or None when the tables hold nothing to draw. Every figure is titled by what it
shows, in which unit; its colours are the colour-blind-safe Okabe-Ito palette (:data:`PALETTE`), lines
also differ by marker; and :func:`_finish` puts every axis whose drawn values are positive and span more
than two decades on a log scale, so one large line (sets that remove the attention sinks) cannot
flatten the others.
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

from fi_toolkit.intervals import MIN_BOOTSTRAP_UNITS  # noqa: E402
from fi_toolkit.studies.nearfar import summarize_nearfar  # noqa: E402
from fi_toolkit.studies.random_baseline import pooled_sets  # noqa: E402

SELECTOR_ORDER = ["entropy", "attention", "distance", "infokv", "random"]
# The Okabe-Ito colours (Wong, Nature Methods 8:441, 2011), distinguishable with the common colour-vision
# deficiencies, ordered so that the first few differ most; grey in place of its yellow, which is faint on white.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#7F7F7F"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
DECADES = 100.0  # an axis whose positive values span more than this ratio is drawn on a log scale


def colors(names) -> dict:
    """A colour of :data:`PALETTE` for each name, in order (repeating past eight names)."""
    names = list(dict.fromkeys(names))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def caption(manifest: dict) -> str:
    """One line stating model, documents, prefix and chunks of a run."""
    s = manifest.get("settings", {})
    docs = [d["name"] for d in s.get("documents", [])]
    names = ", ".join(docs[:6]) + (f" (+{len(docs) - 6} more)" if len(docs) > 6 else "")
    chunks = s.get("chunks", [])
    if "selections" in s:  # fi probe
        chunk_text = f"chunks {', '.join(chunks)}, {len(s['selections'])} selection(s)"
    elif "methods" in s:  # fi field
        chunk_text = (
            f"chunks {', '.join(chunks)}, {len(s['methods'])} methods, budgets {', '.join(s.get('budgets', []))}"
        )
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


def _drawn(ax, axis: str) -> np.ndarray:
    """Every data value drawn along ``axis`` ('x' or 'y'): lines (reference lines across the axes too), markers,
    bands and bars."""
    i = 0 if axis == "x" else 1
    across = ax.get_yaxis_transform() if axis == "x" else ax.get_xaxis_transform()  # axhline/axvline: other axis
    values = [line.get_xydata()[:, i] for line in ax.get_lines() if line.get_transform() != across]
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets())
        if len(offsets) and coll.get_offset_transform() == ax.transData:
            values.append(offsets[:, i])
        if coll.get_transform() == ax.transData:  # fill_between bands, error bars
            values += [np.asarray(path.vertices)[:, i] for path in coll.get_paths()]
    for patch in ax.patches:  # bars (Rectangle) and spans (axvspan: a Rectangle or, in older matplotlib, a Polygon)
        t = patch.get_data_transform()  # where its coordinates live (data, or data along one axis only)
        if t != ax.transData and t != (ax.get_xaxis_transform() if axis == "x" else ax.get_yaxis_transform()):
            continue  # this axis of the patch is in axes coordinates (a span across the axes), not data
        if hasattr(patch, "get_xy") and not hasattr(patch, "get_width"):
            values.append(np.asarray(patch.get_xy(), dtype=float)[:, i])
            continue
        x, y, w, h = patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()
        values.append(np.array([x, x + w] if axis == "x" else [y, y + h], dtype=float))
    v = np.concatenate(values) if values else np.array([])
    return v[np.isfinite(v)]


def log_where_decades(ax) -> None:
    """A log scale on each axis of ``ax`` that autoscales and whose drawn values are never negative and,
    where positive, span more than :data:`DECADES` (zeros then fall off the axis, as a log scale must)."""
    for axis, autoscale, set_scale in (
        ("x", ax.get_autoscalex_on(), ax.set_xscale),
        ("y", ax.get_autoscaley_on(), ax.set_yscale),
    ):
        if not autoscale or getattr(ax, f"get_{axis}scale")() != "linear":
            continue
        v = _drawn(ax, axis)
        positive = v[v > 0]
        if len(positive) > 1 and (v >= 0).all() and positive.max() / positive.min() > DECADES:
            set_scale("log")


def _finish(fig, text: str):
    for ax in fig.axes:
        log_where_decades(ax)
    width = int(fig.get_figwidth() * 10)  # characters of an 11-point title that fit the figure, with margins
    if hasattr(fig, "get_suptitle") and len(fig.get_suptitle()) > width:
        fig.suptitle("\n".join(textwrap.wrap(fig.get_suptitle(), width)), fontsize=11)
    fig.text(0.5, 0.005, "\n".join(textwrap.wrap(text, 150)), ha="center", va="bottom", fontsize=7, color="#444")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _spans_decades(values) -> bool:
    """True when every value is positive and max/min exceeds 100 (a log axis reads better)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return v.size > 1 and v.min() > 0 and v.max() / v.min() > DECADES


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
    return _finish(fig, text)


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
                data=part,
                x=signal,
                y="fi",
                hue="document",
                palette=colors(tokens["document"]),
                s=12,
                alpha=0.7,
                ax=ax,
                legend=(row == 0 and col == 1),
            )
            legend_outside(ax)
            ax.set_xlabel(label)
            ax.set_ylabel(f"per-token FI on {chunk} (nats)")
    fig.suptitle(
        "Per-token FI (nats, leave-one-out) of each candidate token against its entropy and attention", fontsize=11
    )
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
    fig.suptitle("Spearman ρ of per-token FI with each layer's signal (mean over documents; -1 to 1)", fontsize=11)
    return _finish(fig, text)


def rho_vs_distance(correlations: pd.DataFrame, text: str):
    """Spearman rho of the mean signals against chunk distance (spread over documents: 1 sd)."""
    mean = correlations[(correlations["scope"] == "mean") & (correlations["method"] == "spearman")]
    if mean.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    order = list(dict.fromkeys(mean["signal"]))
    sns.lineplot(
        data=mean,
        x="distance_from_p",
        y="rho",
        hue="signal",
        hue_order=order,
        palette=colors(order),
        style="signal",
        style_order=order,
        markers=MARKERS[: len(order)],
        dashes=False,
        errorbar="sd",
        ax=ax,
    )
    legend_outside(ax)
    ax.axhline(0, color="#888", lw=0.8)
    ax.set_xlabel("chunk start - p (tokens)")
    ax.set_ylabel("Spearman ρ (per-token FI vs signal)")
    fig.suptitle(
        "Spearman ρ of per-token FI with each signal against chunk distance (band: 1 sd over documents)", fontsize=11
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
            palette=colors(validation["document"]),
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
    fig.suptitle("Fisher estimate of per-token FI against exact leave-one-out FI (nats; dashed: identity)", fontsize=11)
    return _finish(fig, text)
