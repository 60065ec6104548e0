"""``fi correlate``'s section: which signal (entropy, attention, ...) ranks tokens most like their per-token
Forward Influence, as Spearman ρ per chunk; with the Fisher estimator, its agreement with exact leave-one-out FI.
"""

from __future__ import annotations

import pandas as pd
import seaborn as sns

from fi_toolkit.report.display import NEEDS_DOCUMENTS, display_table
from fi_toolkit.report.figures import MARKERS, colors, finish, legend_outside, plt
from fi_toolkit.report.kinds.base import LeadTable, RunKind
from fi_toolkit.report.kinds.common import documents, pivot, study_caption
from fi_toolkit.report.numbers import formatted, value_text, value_with_interval

TOP_TOKENS_TITLE = "Tokens with the largest per-token FI (nats), first chunk"
TABLE_TITLES = {
    "correlation_summary": "Correlation of per-token FI with each signal per chunk: mean ρ over documents, its range "
    "and sd, and the share of documents with ρ > 0",
    "agreement": "Fisher estimate against exact leave-one-out FI, per document (bootstrap 95 % CI)",
    "agreement_summary": "Fisher estimate against exact leave-one-out FI: mean over documents",
}
SHOWN_COLUMNS = {  # results first (all columns stay in CSV/JSON)
    "correlation_summary": [
        "chunk",
        "signal",
        "method",
        "rho_mean",
        "rho_std",
        "rho_min",
        "rho_max",
        "share_positive",
        "n_documents",
        "sampling",
        "weighted",
    ],
}


def caption(run: dict) -> str:
    """Model, documents, prefix, chunks and candidate tokens (:func:`~fi_toolkit.report.kinds.common.study_caption`)."""
    return study_caption(
        run["manifest"], lambda s: f"chunks {', '.join(s.get('chunks', []))}, candidates {s.get('candidates')}"
    )


def correlate_lead(tables: dict) -> LeadTable | None:
    """Spearman ρ(per-token FI, signal) per chunk: one document with its bootstrap 95 % CI, several as the mean
    over documents with their range."""
    summary = tables["correlation_summary"]
    mean = summary[(summary["scope"] == "mean") & (summary["method"] == "spearman")]
    if mean.empty:
        return None
    n = int(mean["n_documents"].max())
    if n < 2:
        per_doc = tables["correlations"]
        rows = per_doc[(per_doc["scope"] == "mean") & (per_doc["method"] == "spearman")]
        table = pivot(
            rows,
            ["signal"],
            "chunk",
            lambda r: value_with_interval(r["rho"], r["ci_low"], r["ci_high"]),
            {"chunk": "ρ on"},
        )
        title = (
            "Spearman ρ between per-token FI and each signal, per chunk (1 document, bootstrap 95 % CI over its "
            "candidate tokens); higher: the signal ranks tokens more like FI does."
        )
        return LeadTable(title, table, f"an interval over documents is {NEEDS_DOCUMENTS}")
    table = pivot(
        mean,
        ["signal"],
        "chunk",
        lambda r: f"{value_text(r['rho_mean'])} ({value_text(r['rho_min'])} .. {value_text(r['rho_max'])})",
        {"chunk": "ρ on"},
    )
    title = (
        f"Spearman ρ between per-token FI and each signal, per chunk: mean over {documents(n)} (range over "
        "documents); higher: the signal ranks tokens more like FI does."
    )
    return LeadTable(title, table)


def lead(run: dict) -> LeadTable | None:
    """:func:`correlate_lead` of the run's tables."""
    return correlate_lead(run["tables"])


def correlate_lines(t: dict) -> list[str]:
    """Per chunk: the Fisher estimate's agreement with exact FI (with the estimator), and the signal that ranks
    tokens most like FI."""
    lines = []
    for r in t.get("agreement_summary", pd.DataFrame()).itertuples():
        lines.append(
            f"chunk {r.chunk}: Fisher estimate vs exact FI, {r.metric} = {formatted(r.value_mean, '.3f')} "
            f"(range {formatted(r.value_min, '.3f')} .. {formatted(r.value_max, '.3f')} over {r.n_documents} "
            "document(s))"
        )
    s = t["correlation_summary"]
    m = s[(s["scope"] == "mean") & (s["method"] == "spearman")]
    for chunk, g in m.groupby("chunk", sort=False):
        best = g.sort_values("rho_mean", ascending=False).iloc[0]
        n = int(best["n_documents"])
        spread = (
            f"range {formatted(best['rho_min'], '+.3f')} .. {formatted(best['rho_max'], '+.3f')} over {n} documents"
            if n >= 2
            else "1 document"
        )
        lines.append(
            f"chunk {chunk}: the signal that ranks tokens most like FI is {best['signal']}, Spearman ρ = "
            f"{formatted(best['rho_mean'], '+.3f')} ({spread})"
        )
    return lines


def top_tokens(run: dict, n: int = 12) -> list[tuple[str, str, pd.DataFrame]]:
    """The ``n`` candidate tokens with the largest per-token FI on the first chunk, as a shown table."""
    text = run["text"]["tokens"]
    first = text["chunk"].iloc[0] if len(text) else None
    part = text[text["chunk"] == first]
    order = run["tables"]["tokens"].loc[part.index, "fi"].sort_values(ascending=False).index[:n]
    columns = ["document", "position", "token", "chunk", "fi", "entropy", "attention"]
    return [(TOP_TOKENS_TITLE, "tokens.csv", display_table(part.loc[order, columns]))]


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
    return finish(fig, text)


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
    return finish(fig, text)


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
    return finish(fig, text)


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
    return finish(fig, text)


def figures(tables: dict, text: str) -> list[tuple[str, object]]:
    """Per-token FI against the signals, ρ per layer and against distance; with validation, estimate vs exact."""
    made = [
        ("fi_vs_signals", fi_vs_signals(tables["tokens"], text)),
        ("rho_heatmap", rho_heatmap(tables["correlation_summary"], text)),
        ("rho_vs_distance", rho_vs_distance(tables["correlations"], text)),
    ]
    if "validation" in tables:
        made.append(("estimate_vs_exact", estimate_vs_exact(tables["validation"], text)))
    return made


KIND = RunKind(
    name="correlate",
    title="Which signal predicts a token's Forward Influence? (fi correlate)",
    tables=[("correlation_summary", True), ("correlations", False), ("tokens", False)],
    # with the Fisher estimator and validation (fi correlate's estimator and validate settings)
    optional_tables=[("agreement", True), ("agreement_summary", True), ("validation", False)],
    table_titles=TABLE_TITLES,
    shown_columns=SHOWN_COLUMNS,
    shown_rows={"correlation_summary": lambda df: df[df["scope"] == "mean"]},  # per-layer rows: heatmap and CSV
    caption=caption,
    lead=lead,
    headline=correlate_lines,
    figures=figures,
    extra_tables=top_tokens,
    command="correlate",
)
