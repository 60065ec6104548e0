"""``fi field``'s section, the field map: every policy and kvpress press against the FI oracle, on the headroom
scale (0: random positions with sinks kept, 1: the FI oracle that saw the chunk), from its leaderboard
(:mod:`fi_toolkit.field.summary`); with replays, prefill FI against replay KL; with tasks, accuracy.

- :func:`field_headroom`: every method on the headroom scale, one panel per budget (rows) and chunk (columns),
  bootstrap 95 % CIs over documents; bars coloured by kind (project policy, press, anchor). The axis stops at
  ``-1``: a method that does worse than random by more than the whole gap (random positions that evict the sinks
  reach -10) is drawn to the edge with its value written, so it cannot flatten the bars that matter;
- :func:`fi_vs_replay`: prefill FI on the nearest chunk against replay KL in decoding, one point per method
  and budget (with replays only): does the prefill ranking carry over to decoding?
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from fi_toolkit.report.figures import MARKERS, colors, finish, legend_outside, plt
from fi_toolkit.report.kinds.base import RunKind
from fi_toolkit.report.kinds.common import study_caption
from fi_toolkit.report.kinds.eval_tasks import TASK_SUMMARY_TITLE
from fi_toolkit.report.kinds.retention import accuracy_vs_retention
from fi_toolkit.report.numbers import formatted

METHOD_KINDS = ("policy", "press", "anchor")
FLOOR = -1.0  # the headroom axis's left end (module docstring)
TABLE_TITLES = {
    "leaderboard": "Each method per budget, best first: FI (nats) per chunk, headroom (0: random positions with "
    "sinks kept, 1: the FI oracle) [bootstrap 95 % CI over documents], replay KL (nats), seconds per compression",
    "tests": "Is the best method better? Each method against the lowest mean, paired over documents (one-sided "
    "Wilcoxon signed-rank, uncorrected)",
    "refused": "Methods that could not run here, and why",
    "task_summary": TASK_SUMMARY_TITLE,  # fi field with tasks writes fi eval's task table
}


def caption(run: dict) -> str:
    """Model, documents, prefix, chunks, how many methods and the budgets
    (:func:`~fi_toolkit.report.kinds.common.study_caption`)."""
    return study_caption(
        run["manifest"],
        lambda s: (
            f"chunks {', '.join(s.get('chunks', []))}, {len(s.get('methods', []))} methods, "
            f"budgets {', '.join(s.get('budgets', []))}"
        ),
    )


def no_lead(run: dict) -> None:
    """The leaderboard is the field map's answer; it has no lead table of its own."""
    return None


def field_lines(t: dict) -> list[str]:
    """Per budget and chunk: the method that closes most of the headroom (anchors aside), with its CI, and how
    many methods the paired test cannot tell from the best."""
    board = t["leaderboard"]
    board = board[board["kind"] != "anchor"]
    tests = t.get("tests", pd.DataFrame())
    lines = []
    for budget, g in board.groupby("budget", sort=False):
        for chunk in [c.removeprefix("fi_") for c in g.columns if c.startswith("fi_")]:
            col = f"headroom_{chunk}"
            if col not in g or g[col].isna().all():
                continue
            best = g.sort_values(f"fi_{chunk}").iloc[0]
            ci = best.get(f"headroom_ci_{chunk}", "")
            text = (
                f"{budget}, {chunk} chunk: lowest FI {best['method']} ({formatted(best[f'fi_{chunk}'])} nats), closing "
                f"{formatted(best[col], '.2f')} of the random-to-oracle gap {ci}"
            )
            part = tests[(tests["budget"] == budget) & (tests["metric"] == f"fi_{chunk}")] if len(tests) else tests
            p = pd.to_numeric(part["wilcoxon_p"], errors="coerce") if len(part) else pd.Series(dtype=float)
            if len(part) and p.notna().any():
                text += f"; {int((p >= 0.05).sum())} of {len(part)} others not significantly worse (p >= 0.05)"
            lines.append(text)
    return lines


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
    shade = colors(METHOD_KINDS)
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
    handles = [plt.Rectangle((0, 0), 1, 1, color=shade[k]) for k in METHOD_KINDS]
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
    shade = colors(METHOD_KINDS)
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
    return finish(fig, text)


def figures(tables: dict, text: str) -> list[tuple[str, object]]:
    """Headroom per method, FI against replay KL; with tasks, each method's accuracy at each budget (the full
    cache's beside)."""
    made = [
        ("field_headroom", field_headroom(tables["leaderboard"], text)),
        ("fi_vs_replay", fi_vs_replay(tables["leaderboard"], text)),
    ]
    if "task_summary" in tables:
        made.append(("accuracy_vs_budget", accuracy_vs_retention(tables["task_summary"], text)))
    return made


KIND = RunKind(
    name="field",
    title="The field map: every policy and press against the FI oracle (fi field)",
    tables=[
        ("leaderboard", True),
        ("tests", True),
        ("refused", True),
        ("headroom", False),
        ("fi", False),
        ("replays", False),
    ],
    optional_tables=[("task_summary", True), ("answers", False)],  # fi field with tasks
    table_titles=TABLE_TITLES,
    caption=caption,
    lead=no_lead,
    headline=field_lines,
    figures=figures,
    command="field",
)
