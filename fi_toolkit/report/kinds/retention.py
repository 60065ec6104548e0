"""A metric against retention, one line per policy: the kvpress-style panels of ``fi eval`` (replay and task
accuracy), ``fi field`` with tasks and lm-eval runs. Each line carries its bootstrap 95 % band where the table has
one; the full cache is a dashed line (its KL is the noise floor, in the caption instead)."""

from __future__ import annotations

import pandas as pd

from fi_toolkit.report.figures import LEGEND_OUTSIDE, MARKERS, colors, finish, plt

POLICY_ORDER = ["infokv", "snapkv", "pyramidkv", "streaming", "h2o", "knorm", "random", "rpc"]


def policy_order(policies) -> list[str]:
    """The compressed policies present, known ones in :data:`POLICY_ORDER` (so each keeps its colour), then the
    others in first-seen order."""
    present = [p for p in dict.fromkeys(policies) if p != "full"]
    return [p for p in POLICY_ORDER if p in present] + [p for p in present if p not in POLICY_ORDER]


def against_retention(ax, part: pd.DataFrame, metric: str, label: str, legend: bool) -> None:
    """``metric`` of each compressed policy against ``retention`` on ``ax`` (band: ``metric_low`` .. ``metric_high``
    where filled), the full cache's mean as a dashed line except for the KL; the legend outside when ``legend``."""
    full = part[part["policy"] == "full"]
    rows = part[(part["policy"] != "full") & part["retention"].notna()]
    for i, (policy, color) in enumerate(colors(policy_order(rows["policy"])).items()):
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


def accuracy_vs_retention(summary: pd.DataFrame, text: str):
    """Task accuracy against retention, one panel per task x context x protocol (``fi eval`` tasks, ``fi field``
    with tasks)."""
    if summary.empty:
        return None
    groups = list(summary.groupby(["task", "context", "protocol"], sort=False))
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for i, ((task, context, protocol), part) in enumerate(groups):
        ax = axes[i // cols][i % cols]
        against_retention(ax, part, "accuracy", "exact-match accuracy", i == min(cols, len(groups)) - 1)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{task}, {context} tokens, {protocol}", fontsize=10)
    for j in range(len(groups), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(
        "Exact-match accuracy (higher is better) against retention "
        "(bootstrap 95% bands over samples; dashed: full cache)",
        fontsize=11,
    )
    return finish(fig, text)
