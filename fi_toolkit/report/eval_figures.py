"""Figures of ``fi eval`` runs: kvpress-style metric against retention (one line per
policy, bootstrap 95 % bands, the full cache as a dashed line) and KL over position with the
compression points marked. Colours and markers as in :mod:`fi_toolkit.report.figures` (colour-blind
safe); axes that span decades are drawn on a log scale there (:func:`~fi_toolkit.report.figures.log_where_decades`).
"""

from __future__ import annotations

import pandas as pd

from fi_toolkit.report.figures import MARKERS, _finish, colors, plt

LEGEND_OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "frameon": False, "fontsize": 8}

POLICY_ORDER = ["infokv", "snapkv", "pyramidkv", "streaming", "h2o", "knorm", "random", "rpc"]


def eval_caption(manifest: dict) -> str:
    s, model = manifest.get("settings", {}), manifest.get("model", {})
    units = [d["name"] for d in s.get("documents", [])]
    names = ", ".join(units[:6]) + (f" (+{len(units) - 6} more)" if len(units) > 6 else "")
    if s.get("kind") == "tasks":
        what = (
            f"{len(units)} task sample(s): {names} | protocols {', '.join(s.get('protocols', []))} | "
            f"greedy answers of at most {s.get('max_new')} tokens"
        )
    else:
        what = (
            f"{len(units)} document(s): {names} | prompt {s.get('prompt')} tokens, {s.get('length')} in all, "
            f"future {s.get('future')} | compression every {s.get('interval')} tokens"
        )
        floors = [v for per in (manifest.get("noise_floor") or {}).values() for v in per.values()]
        if floors:
            what += f" | noise floor (full-cache replay KL) <= {max(floors):.1g} nats"
    return (
        f"model {model.get('name', s.get('model'))} ({model.get('dtype')} weights, {model.get('compute_dtype')} "
        f"arithmetic) | {what}"
    )


def _order(policies) -> list[str]:
    present = [p for p in dict.fromkeys(policies) if p != "full"]
    return [p for p in POLICY_ORDER if p in present] + [p for p in present if p not in POLICY_ORDER]


def _against_retention(ax, part: pd.DataFrame, metric: str, label: str, legend: bool) -> None:
    full = part[part["policy"] == "full"]
    rows = part[(part["policy"] != "full") & part["retention"].notna()]
    for i, (policy, color) in enumerate(colors(_order(rows["policy"])).items()):
        p = rows[rows["policy"] == policy].sort_values("retention")
        ax.plot(p["retention"], p[metric], marker=MARKERS[i % len(MARKERS)], color=color, label=policy)
        if f"{metric}_low" in p and p[f"{metric}_low"].notna().any():
            ax.fill_between(p["retention"], p[f"{metric}_low"], p[f"{metric}_high"], color=color, alpha=0.15, lw=0)
    if len(full) and metric in full and metric != "mean_kl":  # the full cache's KL is the noise floor (caption)
        ax.axhline(float(full[metric].mean()), color="#333", ls="--", lw=1, label="full cache")
    ax.set_xlabel("retention (share of the cache kept)")
    ax.set_ylabel(label)
    if legend:  # right of the panel, outside the data
        ax.legend(**LEGEND_OUTSIDE)


def replay_vs_retention(summary: pd.DataFrame, text: str):
    """Mean replay KL, top-1 agreement and ΔNLL against retention, one panel each (per future: rows)."""
    if summary.empty:
        return None
    futures = list(dict.fromkeys(summary["future"]))
    metrics = [
        ("mean_kl", "mean KL(full || compressed) (nats)"),
        ("top1_agreement", "top-1 agreement"),
        ("delta_nll", "ΔNLL of the true token (nats)"),
    ]
    fig, axes = plt.subplots(len(futures), 3, figsize=(15, 4.2 * len(futures)), squeeze=False)
    for r, future in enumerate(futures):
        for c, (metric, label) in enumerate(metrics):
            _against_retention(axes[r][c], summary[summary["future"] == future], metric, label, r == 0 and c == 2)
            axes[r][c].set_title(f"future: {future}", fontsize=10)
    fig.suptitle(
        "Decoding replay against retention: mean KL (nats; lower is better), top-1 agreement, ΔNLL (nats) "
        "(mean over documents, bootstrap 95% bands)",
        fontsize=11,
    )
    return _finish(fig, text)


def accuracy_vs_retention(summary: pd.DataFrame, text: str):
    """Task accuracy against retention, one panel per task x context x protocol."""
    if summary.empty:
        return None
    groups = list(summary.groupby(["task", "context", "protocol"], sort=False))
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for i, ((task, context, protocol), part) in enumerate(groups):
        ax = axes[i // cols][i % cols]
        _against_retention(ax, part, "accuracy", "exact-match accuracy", i == min(cols, len(groups)) - 1)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{task}, {context} tokens, {protocol}", fontsize=10)
    for j in range(len(groups), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(
        "Exact-match accuracy (higher is better) against retention "
        "(bootstrap 95% bands over samples; dashed: full cache)",
        fontsize=11,
    )
    return _finish(fig, text)


def kl_over_position(positions: pd.DataFrame, segments: pd.DataFrame, text: str, smooth: int = 16):
    """KL over position for the first document and future, one panel per budget, compression points marked."""
    if positions.empty:
        return None
    doc, future = positions["document"].iloc[0], positions["future"].iloc[0]
    part = positions[(positions["document"] == doc) & (positions["future"] == future) & (positions["policy"] != "full")]
    budgets = list(dict.fromkeys(part["budget"]))
    if not budgets:
        return None
    fig, axes = plt.subplots(len(budgets), 1, figsize=(12, 3.4 * len(budgets)), squeeze=False, sharex=True)
    palette = colors(_order(part["policy"]))
    for i, budget in enumerate(budgets):
        ax = axes[i][0]
        b = part[part["budget"] == budget]
        for policy, color in palette.items():
            p = b[b["policy"] == policy].sort_values("position")
            if len(p):  # KL >= 0; float rounding can leave -1e-9, drawn as 0 so a log axis keeps the line
                kl = p["kl"].clip(lower=0).rolling(smooth, min_periods=1).mean()
                ax.plot(p["position"], kl, color=color, lw=1, label=policy)
        seg = segments[(segments["document"] == doc) & (segments["future"] == future) & (segments["budget"] == budget)]
        for seen in sorted(set(seg["compressed_at_seen"]) - {0}):
            ax.axvline(seen, color="#999", ls=":", lw=0.8)
        ax.set_ylabel(f"KL (nats), {budget}")
        if i == 0:
            ax.legend(**LEGEND_OUTSIDE)
    axes[-1][0].set_xlabel(f"position (dotted: compressions; rolling mean over {smooth} positions)")
    fig.suptitle(f"Replay KL(full ‖ compressed) (nats) over position: {doc}, future {future}", fontsize=11)
    return _finish(fig, text)
