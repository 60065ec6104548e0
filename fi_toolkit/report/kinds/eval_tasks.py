"""``fi eval``'s section on tasks: exact-match accuracy per task, policy and budget beside the full cache's, and
whether the answer's KL predicts accuracy. Beside a text run, its accuracy is the other side of the cross-run
table (does replay KL predict task accuracy?)."""

from __future__ import annotations

import pandas as pd

from fi_toolkit.report.kinds.base import LeadTable, RunKind
from fi_toolkit.report.kinds.common import eval_caption, listed, pivot, unit_names
from fi_toolkit.report.kinds.retention import accuracy_vs_retention
from fi_toolkit.report.numbers import formatted, interval_text, value_text, value_with_interval

TASK_SUMMARY_TITLE = (
    "Task accuracy per policy and budget (exact match) and the answer's KL (nats) [bootstrap 95 % CI over samples]"
)
TABLE_TITLES = {
    "task_summary": TASK_SUMMARY_TITLE,
    "kl_accuracy": "Does the answer's KL predict accuracy? Spearman across cells [bootstrap 95 % CI]",
}


def caption(run: dict) -> str:
    """Model, task samples, protocols and the answers' length."""
    manifest = run["manifest"]
    s, units = manifest.get("settings", {}), unit_names(manifest)
    what = (
        f"{len(units)} task sample(s): {listed(units)} | protocols {', '.join(s.get('protocols', []))} | "
        f"greedy answers of at most {s.get('max_new')} tokens"
    )
    return eval_caption(manifest, what)


def eval_tasks_lead(summary: pd.DataFrame) -> LeadTable | None:
    """Accuracy per task x context x protocol x policy (rows) and budget (columns), with the full cache's."""
    rows = summary[summary["policy"] != "full"].sort_values("retention", kind="stable")
    if rows.empty:
        return None
    rows = rows.assign(full=rows["full_accuracy"].map(value_text))
    table = pivot(
        rows,
        ["task", "context", "protocol", "policy", "full"],
        "budget",
        lambda r: value_with_interval(r["accuracy"], r["accuracy_low"], r["accuracy_high"]),
        {"full": "full cache", "budget": ""},
    )
    table.attrs["numeric"] = ["full cache", *table.attrs["numeric"]]
    return LeadTable(
        "Exact-match accuracy (higher is better) per task, policy and budget [bootstrap 95 % CI over samples]; "
        "full cache: the same samples uncompressed",
        table,
    )


def lead(run: dict) -> LeadTable | None:
    """:func:`eval_tasks_lead` of the run's task summary."""
    return eval_tasks_lead(run["tables"]["task_summary"])


def eval_tasks_lines(t: dict) -> list[str]:
    """Whether the answer's KL predicts accuracy, and the full cache's accuracy per task."""
    lines = []
    for r in t["kl_accuracy"].itertuples():
        lines.append(
            f"{r.comparison}: Spearman {formatted(r.rho, '+.2f', 'too few cells')} "
            f"({interval_text(r.ci_low, r.ci_high, '+.2f', 'too few cells')}, {r.cells} cells)"
        )
    full = t["task_summary"][t["task_summary"]["policy"] == "full"]
    for r in full.itertuples():
        lines.append(
            f"full cache, {r.task} at {r.context} tokens ({r.protocol}): accuracy {formatted(r.accuracy, '.2f')} "
            f"over {r.samples} samples"
        )
    return lines


def figures(tables: dict, text: str) -> list[tuple[str, object]]:
    """Accuracy against retention."""
    return [("accuracy_vs_retention", accuracy_vs_retention(tables["task_summary"], text))]


def versus_replay(runs: list[dict], replay: pd.DataFrame) -> pd.DataFrame:
    """Spearman of mean replay KL against task accuracy across (policy, budget) cells
    (:func:`~fi_toolkit.evaluation.summaries.kl_accuracy_table`, its answer-KL row left out)."""
    from fi_toolkit.evaluation.summaries import kl_accuracy_table

    answers = pd.concat([t["task_summary"] for t in runs], ignore_index=True)
    return kl_accuracy_table(answers, replay).iloc[1:]


KIND = RunKind(
    name="eval-tasks",
    title="Task accuracy under compression (fi eval, tasks)",
    tables=[("task_summary", True), ("kl_accuracy", True), ("answers", False)],
    table_titles=TABLE_TITLES,
    caption=caption,
    lead=lead,
    headline=eval_tasks_lines,
    figures=figures,
    command="eval",
    settings_kind="tasks",
    versus_replay=versus_replay,
)
