"""The section of lm-evaluation-harness output (``fi lm-eval``): lm-eval's score per task, metric, policy and
budget with its 95 % band, beside the full cache's, and the realised cache per request
(:mod:`~fi_toolkit.report.kinds.lmeval_results` reads the files). Beside a ``fi eval`` text run, the score is the
other side of the cross-run table (does replay KL predict it?)."""

from __future__ import annotations

import pandas as pd

from fi_toolkit.report.figures import finish, plt
from fi_toolkit.report.kinds.base import LeadTable, RunKind
from fi_toolkit.report.kinds.common import pivot
from fi_toolkit.report.kinds.lmeval_results import NAME, NONE, TABLES, is_lmeval_dir, load_lmeval_run
from fi_toolkit.report.kinds.retention import against_retention
from fi_toolkit.report.numbers import significant, value_text, value_with_interval

TABLE_TITLES = {
    "lmeval_accuracy": "lm-eval score per task, metric, policy and budget [95 % band]",
    "lmeval_cache": "Realised cache per request: entries kept and in the full cache, their share, compressions",
}


def caption(run: dict) -> str:
    """Model, results files, tasks, and which bands the scores carry."""
    acc = run["tables"]["lmeval_accuracy"]
    bands = sorted(set(acc["band"]))
    return (
        f"lm-eval output, model {run['manifest']['model']['name']} | "
        f"{len(run['manifest']['settings']['results_files'])} "
        f"results file(s) | tasks {', '.join(dict.fromkeys(acc['task']))} | bands: "
        + "; ".join(
            {"bootstrap": "bootstrap 95% over samples", "stderr": "lm-eval's ±1.96·stderr", "none": "none"}[b]
            for b in bands
        )
    )


def lmeval_lead(acc: pd.DataFrame) -> LeadTable | None:
    """lm-eval's score per task x metric x policy (rows) and budget (columns), with its band."""
    rows = acc[acc["policy"] != "none"]
    if rows.empty:
        return None
    rows = rows.assign(full=rows["full_value"].map(value_text))
    table = pivot(
        rows,
        ["task", "metric", "policy", "full"],
        "budget",
        lambda r: value_with_interval(r["value"], r["value_low"], r["value_high"]),
        {"full": "full cache", "budget": ""},
    )
    table.attrs["numeric"] = ["full cache", *table.attrs["numeric"]]
    return LeadTable("lm-eval score per task, metric, policy and budget [95 % band]; full cache: uncompressed", table)


def lead(run: dict) -> LeadTable | None:
    """:func:`lmeval_lead` of the run's scores."""
    return lmeval_lead(run["tables"]["lmeval_accuracy"])


def headline(tables: dict) -> list[str]:
    """Per task and metric: the full cache's value and the best compressed policy per budget."""
    acc, lines = tables["lmeval_accuracy"], []
    for (task, filt, metric), part in acc.groupby(["task", "filter", "metric"], sort=False):
        full = part[part["policy"] == NONE]
        head = f"{task} {metric} ({filt})"
        if len(full):
            lines.append(f"{head}: full cache {significant(full['value'].iloc[0], 4)}")
        best = part[part["policy"] != NONE].sort_values("value", ascending=False).groupby("budget", sort=False).head(1)
        for r in best.itertuples():
            band = (
                "no band"
                if pd.isna(r.value_low) or pd.isna(r.value_high)
                else f"[{significant(r.value_low, 4)}, {significant(r.value_high, 4)}]"
            )
            lines.append(f"{head}, {r.budget}: best {r.policy} {significant(r.value, 4)} {band} ({r.band})")
    for r in tables["lmeval_cache"].itertuples():
        lines.append(
            f"{r.task}, {r.policy} {r.budget}: {significant(r.cache_entries, 4)} of "
            f"{significant(r.full_entries, 4)} cache entries per request, {significant(r.compressions, 3)} "
            "compressions per request"
        )
    return lines


def accuracy_vs_budget(acc: pd.DataFrame, text: str):
    """Every task x metric against the budget, a line per policy with its 95 % band, the full cache dashed."""
    if acc.empty:
        return None
    groups = list(acc.groupby(["model", "task", "filter", "metric"], sort=False))
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for i, ((model, task, filt, metric), part) in enumerate(groups):
        ax = axes[i // cols][i % cols]
        part = part.assign(policy=part["policy"].replace(NONE, "full"))  # the dashed full-cache line
        against_retention(ax, part, "value", metric, i == cols - 1)
        compressed = part[part["policy"] != "full"]["retention"].dropna()
        shares = bool(len(compressed)) and compressed.max() <= 1
        ax.set_xlabel("budget (share of the cache kept)" if shares else "budget (cache entries kept)")
        band = {"bootstrap": "bootstrap band", "stderr": "±1.96·stderr band"}.get(part["band"].iloc[0], "no band")
        ax.set_title(
            f"{task} ({filt})" + (f", {model}" if acc["model"].nunique() > 1 else "") + f"; {band}", fontsize=10
        )
    for j in range(len(groups), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(
        "lm-eval score (higher is better) against budget per policy (95% bands; dashed: full cache)", fontsize=11
    )
    return finish(fig, text)


def kl_vs_benchmark(
    replay_summary: pd.DataFrame, accuracy: pd.DataFrame, n_resamples: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Does a ``fi eval`` text run's mean replay KL predict the lm-eval value? One row per future x task
    x filter x metric: Spearman across the compressed (policy, budget) cells both hold, bootstrap CI
    (:func:`fi_toolkit.evaluation.summaries.kl_predicts_accuracy`, as for ``fi eval`` tasks). The full
    cache (``full``, ``none``) is left out. Cells match on the policy's name and budget label, which
    ``fi_policy`` (``Policy.label``) and ``fi eval`` (``Policy.name``, ``Budget.label``) spell alike."""
    from fi_toolkit.evaluation.summaries import kl_predicts_accuracy

    replay = replay_summary[replay_summary["policy"] != "full"]
    bench = accuracy[accuracy["policy"] != NONE]
    rows = []
    for future, part in replay.groupby("future", sort=False):
        kl = part.groupby(["policy", "budget"])["mean_kl"].mean()
        for (task, filt, metric), b in bench.groupby(["task", "filter", "metric"], sort=False):
            value = b.groupby(["policy", "budget"])["value"].mean()
            rows.append(
                kl_predicts_accuracy(
                    kl, value, f"replay KL ({future}) vs lm-eval {task} {metric} ({filt})", n_resamples, seed
                )
            )
    return pd.DataFrame(rows)


def versus_replay(runs: list[dict], replay: pd.DataFrame) -> pd.DataFrame:
    """:func:`kl_vs_benchmark` of the runs' scores together."""
    return kl_vs_benchmark(replay, pd.concat([t["lmeval_accuracy"] for t in runs]))


def figures(tables: dict, text: str) -> list[tuple[str, object]]:
    """Every task and metric against the budget."""
    return [("accuracy_vs_budget", accuracy_vs_budget(tables["lmeval_accuracy"], text))]


KIND = RunKind(
    name=NAME,
    title="lm-evaluation-harness under compression (fi lm-eval)",
    tables=TABLES,
    table_titles=TABLE_TITLES,
    caption=caption,
    lead=lead,
    headline=headline,
    figures=figures,
    reads_directory=is_lmeval_dir,
    load=load_lmeval_run,
    versus_replay=versus_replay,
)
