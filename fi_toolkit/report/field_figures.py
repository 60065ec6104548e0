"""Figures of ``fi field`` runs, from its leaderboard (:mod:`fi_toolkit.studies.field_summary`):

- :func:`field_headroom`: every method on the headroom scale (0: random positions with sinks kept, 1: the FI
  oracle that saw the chunk), one panel per budget (rows) and chunk (columns), bootstrap 95 % CIs over
  documents; bars coloured by kind (project policy, press, anchor). The axis stops at ``-1``: a method that
  does worse than random by more than the whole gap (random positions that evict the sinks reach -10) is
  drawn to the edge with its value written, so it cannot flatten the bars that matter;
- :func:`fi_vs_replay`: prefill FI on the nearest chunk against replay KL in decoding, one point per method
  and budget (with ``fi field --replay`` only): does the prefill ranking carry over to decoding?
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from fi_toolkit.report.figures import MARKERS, _finish, colors, legend_outside, plt

KINDS = ("policy", "press", "anchor")
FLOOR = -1.0  # the headroom axis's left end (module docstring)


def chunk_names(board: pd.DataFrame) -> list[str]:
    """The leaderboard's chunk names (``near``, ``far``, ``dD``), in column order."""
    return [c.removeprefix("headroom_") for c in board.columns if c.startswith("headroom_") and c.count("_") == 1]


def field_headroom(board: pd.DataFrame, text: str):
    """Horizontal bars of each method's headroom with its CI, one panel per budget x chunk; None when the
    board holds no headroom."""
    names = [c for c in chunk_names(board) if board[f"headroom_{c}"].notna().any()]
    if board.empty or not names:
        return None
    budgets = list(dict.fromkeys(board["budget"]))
    order = board.groupby("method")[[f"headroom_{c}" for c in names]].mean().mean(axis=1).sort_values().index
    kind_of = board.drop_duplicates("method").set_index("method")["kind"]
    shade = colors(KINDS)
    height = 0.22 * len(order) * len(budgets) + 2.6
    fig, axes = plt.subplots(
        len(budgets), len(names), figsize=(max(6.5, 4.4 * len(names)), height), squeeze=False, sharey=True
    )
    y = np.arange(len(order))
    for i, budget in enumerate(budgets):
        for j, chunk in enumerate(names):
            ax = axes[i][j]
            g = board[board["budget"] == budget].set_index("method").reindex(order)
            value = g[f"headroom_{chunk}"].astype(float)
            low = g[f"headroom_low_{chunk}"].astype(float) if f"headroom_low_{chunk}" in g else value * np.nan
            high = g[f"headroom_high_{chunk}"].astype(float) if f"headroom_high_{chunk}" in g else value * np.nan
            drawn = value.clip(lower=FLOOR)
            err = np.vstack([(drawn - low.clip(lower=FLOOR)).clip(lower=0), (high - drawn).clip(lower=0)])
            ax.barh(
                y,
                drawn.fillna(0),
                xerr=np.where(np.isfinite(err), err, 0),
                color=[shade.get(kind_of.get(m, "policy"), "#7F7F7F") for m in order],
                capsize=2,
            )
            for k, v in enumerate(value):
                if v == v and v < FLOOR:
                    ax.text(FLOOR + 0.02, k, f"{v:.1f} ◀", va="center", ha="left", fontsize=7, color="white")
            ax.axvline(0, color="k", lw=0.8)
            ax.axvline(1, color=shade["anchor"], lw=0.8, ls="--")
            ax.set_xlim(FLOOR, 1.1)
            ax.set_yticks(y, list(order), fontsize=7)
            ax.set_title(f"{budget}, chunk {chunk}", fontsize=9)
            if i == len(budgets) - 1:
                ax.set_xlabel("share of the random-to-oracle\nFI gap closed", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=shade[k]) for k in KINDS]
    title = (
        "Field map: share of the random-to-oracle FI gap each method closes (0: random positions with sinks kept, "
        "1: the FI oracle; 95 % CI over documents)"
    )
    inch = 1 / height  # one inch in figure coordinates: the title's two lines, then the legend, then the panels
    fig.suptitle("\n".join(textwrap.wrap(title, int(fig.get_figwidth() * 11))), fontsize=10, y=1 - 0.1 * inch)
    top = 1 - 0.6 * inch
    fig.legend(
        handles,
        ["project policy", "press", "anchor"],
        loc="upper center",
        bbox_to_anchor=(0.5, top),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.text(0.5, 0.005, text, ha="center", va="bottom", fontsize=7, color="#444", wrap=True)
    fig.tight_layout(rect=(0, min(0.3, 0.45 * inch), 1, top - 0.35 * inch), w_pad=2.0)
    return fig


def fi_vs_replay(board: pd.DataFrame, text: str):
    """Prefill FI on the nearest chunk against replay KL, one point per method and budget (marker: budget);
    None without replays."""
    if "replay_kl" not in board or "fi_near" not in board:
        return None
    rows = board[board["replay_kl"].notna() & board["fi_near"].notna()]
    if rows.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    shade = colors(KINDS)
    for i, budget in enumerate(dict.fromkeys(rows["budget"])):
        part = rows[rows["budget"] == budget]
        ax.scatter(
            part["fi_near"],
            part["replay_kl"],
            marker=MARKERS[i % len(MARKERS)],
            c=[shade.get(k, "#7F7F7F") for k in part["kind"]],
            label=budget,
        )
        for _, r in part.iterrows():
            ax.annotate(r["method"].removeprefix("kvpress:"), (r["fi_near"], r["replay_kl"]), fontsize=6)
    ax.set_xlabel("prefill FI on the nearest chunk (nats)")
    ax.set_ylabel("replay KL in decoding (nats)")
    ax.legend(title="budget (marker)", fontsize=8)
    legend_outside(ax)
    ax.set_title("Does the prefill ranking carry over to decoding? (colour: policy / press)", fontsize=10)
    return _finish(fig, text)
