"""``fi eval``'s section on text: compressed decoding replayed against the full cache, per policy and budget:
mean KL(full ‖ compressed), top-1 agreement, ΔNLL and the first divergence of free generation. Its mean replay KL
is one side of the cross-run table (does replay KL predict task accuracy?)."""

from __future__ import annotations

import pandas as pd

from fi_toolkit.report.figures import LEGEND_OUTSIDE, colors, finish, plt
from fi_toolkit.report.kinds.base import LeadTable, RunKind
from fi_toolkit.report.kinds.common import documents, documents_interval, eval_caption, listed, pivot, unit_names
from fi_toolkit.report.kinds.retention import against_retention, policy_order
from fi_toolkit.report.numbers import formatted, significant, value_text, value_with_interval

TABLE_TITLES = {
    "replay_summary": "Decoding replay per policy and budget: mean KL(full ‖ compressed) (nats), top-1 agreement, "
    "ΔNLL (nats), first divergence of free generation (tokens), kept share [bootstrap 95 % CI over documents]",
}


def caption(run: dict) -> str:
    """Model, documents, prompt and decoding lengths, compression interval, and the full cache's replay KL (the
    noise floor) where the manifest records it."""
    manifest = run["manifest"]
    s, units = manifest.get("settings", {}), unit_names(manifest)
    what = (
        f"{len(units)} document(s): {listed(units)} | prompt {s.get('prompt')} tokens, {s.get('length')} in all, "
        f"future {s.get('future')} | compression every {s.get('interval')} tokens"
    )
    floors = [v for per in (manifest.get("noise_floor") or {}).values() for v in per.values()]
    if floors:
        what += f" | noise floor (full-cache replay KL) <= {significant(max(floors), 1)} nats"
    return eval_caption(manifest, what)


def eval_text_lead(summary: pd.DataFrame, n: int) -> LeadTable | None:
    """Mean replay KL per policy (rows) and budget (columns), bootstrap 95 % CI; the full cache's KL is the floor."""
    rows = summary[summary["policy"] != "full"].sort_values("retention", kind="stable")
    if rows.empty:
        return None
    keys = ["future", "policy"] if rows["future"].nunique() > 1 else ["policy"]
    table = pivot(
        rows,
        keys,
        "budget",
        lambda r: value_with_interval(r["mean_kl"], r["mean_kl_low"], r["mean_kl_high"]),
        {"budget": ""},
    )
    full = summary[summary["policy"] == "full"]
    note = f"full cache (noise floor): {value_text(float(full['mean_kl'].max()))} nats" if len(full) else ""
    interval = documents_interval(n)
    return LeadTable(
        f"Mean replay KL(full ‖ compressed) (nats; lower is better) per policy and budget, {documents(n)} [{interval}]",
        table,
        note,
    )


def lead(run: dict) -> LeadTable | None:
    """:func:`eval_text_lead` of the run's replay summary over its documents."""
    return eval_text_lead(
        run["tables"]["replay_summary"], len(run["manifest"].get("settings", {}).get("documents", []))
    )


def eval_text_lines(t: dict) -> list[str]:
    """Per future and budget: the policy with the lowest mean replay KL, its top-1 agreement, the noise floor."""
    lines = []
    for future, part in t["replay_summary"].groupby("future", sort=False):
        best = part[part["policy"] != "full"].sort_values("mean_kl").groupby("budget", sort=False).head(1)
        for r in best.itertuples():
            lines.append(
                f"future {future}, {r.budget}: lowest mean replay KL {r.policy} ({formatted(r.mean_kl)} nats, top-1 "
                f"agreement {formatted(r.top1_agreement, '.3f')}); noise floor {formatted(r.noise_floor, '.1g')} nats"
            )
    return lines


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
            against_retention(axes[r][c], summary[summary["future"] == future], metric, label, r == 0 and c == 2)
            axes[r][c].set_title(f"future: {future}", fontsize=10)
    fig.suptitle(
        "Decoding replay against retention: mean KL (nats; lower is better), top-1 agreement, ΔNLL (nats) "
        "(mean over documents, bootstrap 95% bands)",
        fontsize=11,
    )
    return finish(fig, text)


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
    palette = colors(policy_order(part["policy"]))
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
    return finish(fig, text)


def figures(tables: dict, text: str) -> list[tuple[str, object]]:
    """Replay metrics against retention, and KL over position."""
    return [
        ("replay_vs_retention", replay_vs_retention(tables["replay_summary"], text)),
        ("kl_over_position", kl_over_position(tables["positions"], tables["segments"], text)),
    ]


KIND = RunKind(
    name="eval-text",
    title="Compressed decoding against the full cache (fi eval, text)",
    tables=[
        ("replay_summary", True),
        ("segment_summary", False),
        ("replays", False),
        ("segments", False),
        ("positions", False),
    ],
    table_titles=TABLE_TITLES,
    caption=caption,
    lead=lead,
    headline=eval_text_lines,
    figures=figures,
    command="eval",
    settings_kind="text",
    replay_table="replay_summary",
)
