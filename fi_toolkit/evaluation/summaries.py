"""Summaries of an evaluation: per setting x policy x budget, means with bootstrap
95 % intervals (:func:`scipy.stats.bootstrap`, percentile method, seeded), and the question whether
mean replay KL predicts task accuracy (Spearman across policy x budget cells, with a bootstrap CI).

Intervals resample the independent units: documents for text (positions within one document are
correlated), samples for tasks. With fewer than four units there is no interval (NaN):
:func:`fi_toolkit.studies.statistics.mean_interval` says why.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fi_toolkit.evaluation.replay_runs import FULL
from fi_toolkit.intervals import mean_interval
from fi_toolkit.probe.noise_floor import text_future_floor
from fi_toolkit.studies.statistics import correlation

CONFIDENCE = 0.95


def mean_ci(values, n_resamples: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): :func:`fi_toolkit.studies.statistics.mean_interval` at :data:`CONFIDENCE` (no interval
    below four units: a smaller sample's percentile interval is its range)."""
    return mean_interval(values, n_resamples, CONFIDENCE, seed)


def _summarise(
    table: pd.DataFrame, keys: list[str], metrics: dict[str, str], n_resamples: int, seed: int, count: str
) -> pd.DataFrame:
    rows = []
    for group, part in table.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, group if isinstance(group, tuple) else (group,)))
        row[count] = len(part)
        for name, column in metrics.items():
            row[name], row[f"{name}_low"], row[f"{name}_high"] = mean_ci(part[column], n_resamples, seed)
        rows.append(row)
    return pd.DataFrame(rows)


REPLAY_METRICS = {
    "mean_kl": "mean_kl",
    "top1_agreement": "top1_agreement",
    "delta_nll": "delta_nll",
    "free_first_divergence": "free_first_divergence",
    "kept_share": "kept_share",
}


def is_oracle(policy: str) -> bool:
    """Whether a result row's ``policy`` names an oracle that sees the future (``fi-oracle[:...]``)."""
    from fi_toolkit.policies.registry import is_oracle as named_oracle

    return named_oracle(str(policy))


def summarise_replays(replays: pd.DataFrame, n_resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per (future, policy, budget): each metric's mean over documents with its interval, the
    future's ``noise_floor`` (the largest full-cache replay ``|mean KL|`` over documents), and ``oracle``
    (True: the row is an oracle that saw the future text, a bound rather than a policy)."""
    out = _summarise(
        replays, ["future", "policy", "budget", "retention"], REPLAY_METRICS, n_resamples, seed, "documents"
    )
    out["noise_floor"] = out["future"].map(text_future_floor(replays, FULL))
    out["oracle"] = out["policy"].map(is_oracle)
    return out


def summarise_segments(segments: pd.DataFrame) -> pd.DataFrame:
    """Mean KL in the interval after each compression, averaged over documents (``oracle`` as in
    :func:`summarise_replays`)."""
    keys = ["future", "policy", "budget", "retention", "segment"]
    out = (
        segments.groupby(keys, sort=False, dropna=False)
        .agg(
            compressed_at_seen=("compressed_at_seen", "first"),
            mean_kl=("mean_kl", "mean"),
            top1_agreement=("top1_agreement", "mean"),
            documents=("document", "nunique"),
        )
        .reset_index()
    )
    out["oracle"] = out["policy"].map(is_oracle)
    return out


def summarise_answers(answers: pd.DataFrame, n_resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per (task, context, protocol, policy, budget): accuracy with its interval, the full cache's
    accuracy beside it, and the mean answer KL."""
    table = answers.assign(correct=answers["correct"].astype(float))
    keys = ["task", "context", "protocol", "policy", "budget", "retention"]
    out = _summarise(table, keys, {"accuracy": "correct", "answer_kl": "answer_kl"}, n_resamples, seed, "samples")
    full = out[out["policy"] == "full"].set_index(["task", "context", "protocol"])["accuracy"]
    out.insert(
        out.columns.get_loc("accuracy"),
        "full_accuracy",
        [full.get((t, c, p), np.nan) for t, c, p in zip(out["task"], out["context"], out["protocol"])],
    )
    return out


def kl_predicts_accuracy(
    kl: pd.Series, accuracy: pd.Series, label: str, n_resamples: int = 1000, seed: int = 0
) -> dict:
    """Spearman of ``kl`` against ``accuracy`` over the cells both hold (aligned on the index), with
    its bootstrap CI; a negative rho means: more divergence, fewer right answers."""
    both = pd.concat([kl.rename("kl"), accuracy.rename("accuracy")], axis=1, join="inner").dropna()
    row = correlation(both["kl"].to_numpy(), both["accuracy"].to_numpy(), "spearman", n_resamples, seed=seed)
    return {"comparison": label, "cells": len(both), **row}


def kl_accuracy_table(
    answer_summary: pd.DataFrame, replay_summary: pd.DataFrame | None = None, n_resamples: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Does divergence predict accuracy? Cells are compressed (policy, budget) settings per task,
    context and protocol. Always: the answer KL on the task itself. With a text run's summary: its mean
    replay KL per (policy, budget) against the task accuracy of the same (policy, budget)."""
    cells = answer_summary[answer_summary["policy"] != "full"]
    idx = ["task", "context", "protocol", "policy", "budget"]
    rows = [
        kl_predicts_accuracy(
            cells.set_index(idx)["answer_kl"],
            cells.set_index(idx)["accuracy"],
            "answer KL vs accuracy (all task cells)",
            n_resamples,
            seed,
        )
    ]
    if replay_summary is not None and len(replay_summary):
        replay = replay_summary[replay_summary["policy"] != "full"]
        for future, part in replay.groupby("future", sort=False):
            kl = part.set_index(["policy", "budget"])["mean_kl"]
            acc = cells.groupby(["policy", "budget"])["accuracy"].mean()
            rows.append(kl_predicts_accuracy(kl, acc, f"replay KL ({future}) vs mean task accuracy", n_resamples, seed))
    return pd.DataFrame(rows)
