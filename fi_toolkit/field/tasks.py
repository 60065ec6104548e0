"""Task accuracy in ``fi field``: every method at every budget answers the generated long-context tasks
(passkey, needle, variable tracking) as ``fi eval --task`` answers them, one unit per task sample.

A method answers as its replay policy (:func:`~fi_toolkit.field.spec.replay_policy`, what
``fi eval --policy NAME --budget B`` resolves): the prompt compressed to the budget, then every ``interval``
generated tokens (:func:`~fi_toolkit.evaluation.task_runs.evaluate_sample`, the same call ``fi eval --task``
makes, with the full cache first). A method and budget that cannot run on the shortest task prompt (a policy
whose budget leaves nothing but its window) is a row of ``refused``, stage ``tasks``; so is one that fails while
it answers (a press whose ``score()`` supports the prefill only stops at its first compression while decoding):
the sample is then answered again without it, so the other methods' answers are what they would have been had it
never been named.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.settings import TaskSettings
from fi_toolkit.evaluation.summaries import summarise_answers
from fi_toolkit.evaluation.task_runs import evaluate_sample
from fi_toolkit.field.spec import replay_policy
from fi_toolkit.policies.method import ANCHOR, Method


@dataclass
class TaskEntry:
    """One method at one budget, as the policy its tasks are answered with."""

    method: Method
    budget: object
    policy: object


def task_entries(methods, budgets, config, tasks: TaskSettings, refusal) -> tuple[list[TaskEntry], list[dict]]:
    """Each method (anchors left out: they select in prefill only) at each budget that can run on the shortest
    task prompt -> the entries and the ``refused`` rows (``refusal(method, kind, budget, reason)``) of the rest."""
    from fi_toolkit.compress.budget_check import check_budget

    shortest = min(tasks.contexts)
    entries, refused = [], []
    for m in (m for m in methods if m.kind != ANCHOR):
        for b in (b for b in budgets if m.runs_at(b)):
            try:
                policy = replay_policy(m, b, config)
                check_budget(policy, shortest, tasks.max_new, policy.compress_prompt)
            except FIError as exc:
                refused.append(refusal(m.name, m.kind, b.label, " ".join(str(exc).split())))
                continue
            entries.append(TaskEntry(m, b, policy))
    return entries, refused


def task_cell(
    lm, unit, entries: list[TaskEntry], tasks: TaskSettings, interval: int, config, refusal
) -> tuple[pd.DataFrame, list[dict]]:
    """One task sample under the full cache and every entry -> ``fi eval --task``'s ``answers`` rows with the
    ``method`` and ``kind`` that answered (the full cache: method ``full``, kind ``full``), and the ``refused``
    rows (``refusal(method, kind, budget, reason)``) of the entries that failed while answering; the sample is
    then answered by the others alone (each entry is tried on its own to find which fail)."""
    try:
        return _answers(lm, unit, entries, tasks, interval, config), []
    except FIError:
        pass
    answering, refused = [], []
    for entry in entries:
        try:
            evaluate_sample(lm, unit, [entry.policy], list(tasks.protocols), tasks.max_new, interval, config)
        except FIError as exc:
            m = entry.method
            refused.append(refusal(m.name, m.kind, entry.budget.label, " ".join(str(exc).split())))
            continue
        answering.append(entry)
    return _answers(lm, unit, answering, tasks, interval, config), refused


def _answers(lm, unit, entries: list[TaskEntry], tasks: TaskSettings, interval: int, config) -> pd.DataFrame:
    answers = evaluate_sample(
        lm, unit, [e.policy for e in entries], list(tasks.protocols), tasks.max_new, interval, config
    )
    names = [("full", "full"), *((e.method.name, e.method.kind) for e in entries)]
    per_protocol = len(names)
    method = [names[i % per_protocol][0] for i in range(len(answers))]
    kind = [names[i % per_protocol][1] for i in range(len(answers))]
    answers.insert(0, "kind", kind)
    answers.insert(0, "method", method)
    return answers


def task_summary(answers: pd.DataFrame, resamples: int) -> pd.DataFrame:
    """``fi eval``'s task summary (accuracy with its interval per task, context, protocol, policy and budget)
    with each row's method."""
    summary = summarise_answers(answers.drop(columns=["method", "kind"]), resamples)
    method = answers.drop_duplicates(["policy", "budget"]).set_index(["policy", "budget"])["method"]
    summary.insert(0, "method", [method.get((p, b), p) for p, b in zip(summary["policy"], summary["budget"])])
    return summary


def accuracy_columns(board: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard with ``accuracy`` (mean over tasks, contexts and protocols) per method and budget and
    ``full_accuracy``, the full cache's on the same samples; NaN where a method did not answer."""
    compressed = summary[summary["method"] != "full"]
    accuracy = compressed.groupby(["method", "budget"], sort=False)["accuracy"].mean()
    full = summary.loc[summary["method"] == "full", "accuracy"].mean()
    out = board.join(accuracy.rename("accuracy"), on=["method", "budget"])
    out["full_accuracy"] = np.where(out["kind"] == ANCHOR, np.nan, full)
    return out
