"""The first table of each run in ``fi report``: the answer the run was made for, before any detail.

One row per thing compared (a token set, a signal, a policy), one column per chunk or budget, and in
each cell the result with its interval where the run has one: FI for ``fi probe`` and ``fi nearfar``,
Spearman ρ with its bootstrap CI for ``fi correlate``, replay KL for ``fi eval`` on text, accuracy for
tasks and lm-eval. Every number comes from the run's own tables (no new statistics), written as
:func:`fi_toolkit.report.display.number_text` writes it; a title says what the cells are, in which
unit, and which way is better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from fi_toolkit.intervals import MIN_BOOTSTRAP_UNITS
from fi_toolkit.report.display import NEEDS_DOCUMENTS, NO_INTERVAL, number_text
from fi_toolkit.studies.random_baseline import pooled_sets


@dataclass
class LeadTable:
    """``title``: what the cells are (unit, direction, over what); ``table``: cells as a reader sees them
    (``str``), ``table.attrs['numeric']`` the number columns; ``note``: one line under the table, or ''."""

    title: str
    table: pd.DataFrame
    note: str = ""


def _num(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else number_text(float(v))


def _with_interval(value, low, high) -> str:
    """``0.1234 [0.1, 0.15]``; the value alone when the run has no interval for it."""
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in (low, high)):
        return _num(value)
    return f"{_num(value)} [{_num(low)}, {_num(high)}]"


def _pivot(df: pd.DataFrame, rows: list[str], column: str, cell, names: dict[str, str]) -> pd.DataFrame:
    """One row per distinct ``rows`` (first-seen order), one column per ``column`` value; ``cell(row) -> str``."""
    keys = list(dict.fromkeys(map(tuple, df[rows].itertuples(index=False))))
    columns = list(dict.fromkeys(df[column]))
    out = {names.get(r, r): [k[i] for k in keys] for i, r in enumerate(rows)}
    index = {(tuple(r[rows]), r[column]): r for _, r in df.iterrows()}
    for c in columns:
        out[f"{names.get(column, column)} {c}".strip()] = [
            cell(index[(k, c)]) if (k, c) in index else "–" for k in keys
        ]
    table = pd.DataFrame(out, dtype=object)
    table.attrs["numeric"] = [f"{names.get(column, column)} {c}".strip() for c in columns]
    return table


def _documents(n: int) -> str:
    return f"{n} document{'s' if n != 1 else ''}"


def pooled_fi(fi: pd.DataFrame) -> pd.DataFrame:
    """The measured sets as every report table shows them, the random seeds of a size pooled into one baseline
    row: :func:`~fi_toolkit.studies.random_baseline.pooled_sets` without the bootstrap (what ``fi probe`` prints)."""
    return pooled_sets(fi, n_resamples=0)


def probe_lead(fi: pd.DataFrame) -> LeadTable | None:
    """Mean FI over documents of every set per chunk, sets of the same size together (smallest first), lowest
    FI first within a size; the random seeds of a size as one baseline row (the range of its per-seed means in
    brackets); the controls' largest |FI| is the noise floor under the table."""
    pooled = pooled_sets(fi)
    if pooled.empty:
        return None
    first = pooled["chunk"].iloc[0]
    order = pooled[pooled["chunk"] == first].sort_values(["n_removed", "fi"], kind="stable")["selection"]
    pooled["rank"] = pooled["selection"].map({s: i for i, s in enumerate(dict.fromkeys(order))})
    pooled = pooled.sort_values(["rank"], kind="stable")

    def cell(r) -> str:
        if r["baseline"]:
            return f"{_num(r['fi'])} (seeds {_num(r['seed_min'])} .. {_num(r['seed_max'])})"
        return _with_interval(r["fi"], r["fi_ci_low"], r["fi_ci_high"])

    table = _pivot(pooled, ["n_removed", "selection"], "chunk", cell, {"n_removed": "removed", "chunk": "FI on"})
    table["removed"] = [number_text(float(v), float(v).is_integer()) for v in table["removed"]]
    table.attrs["numeric"] = ["removed", *table.attrs["numeric"]]
    controls = fi[fi["selector"] == "control"]
    note = (
        f"noise floor (largest |FI| of the controls): {_num(float(controls['fi'].abs().max()))} nats"
        if len(controls)
        else ""
    )
    n = int(pooled["n_documents"].max())
    interval = "bootstrap 95 % CI over documents" if n >= MIN_BOOTSTRAP_UNITS else f"no interval: {NO_INTERVAL}"
    return LeadTable(
        f"FI (nats) of removing each token set, mean over {_documents(n)} [{interval}]; lower: the set mattered "
        "less to the chunk's predictions. Sets of equal size are compared together (removed: entries per layer "
        "and head); random positions are one baseline per size, its seeds' range in brackets.",
        table,
        note,
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
        table = _pivot(
            rows, ["signal"], "chunk", lambda r: _with_interval(r["rho"], r["ci_low"], r["ci_high"]), {"chunk": "ρ on"}
        )
        title = (
            "Spearman ρ between per-token FI and each signal, per chunk (1 document, bootstrap 95 % CI over its "
            "candidate tokens); higher: the signal ranks tokens more like FI does."
        )
        return LeadTable(title, table, f"an interval over documents is {NEEDS_DOCUMENTS}")
    table = _pivot(
        mean,
        ["signal"],
        "chunk",
        lambda r: f"{_num(r['rho_mean'])} ({_num(r['rho_min'])} .. {_num(r['rho_max'])})",
        {"chunk": "ρ on"},
    )
    title = (
        f"Spearman ρ between per-token FI and each signal, per chunk: mean over {_documents(n)} (range over "
        "documents); higher: the signal ranks tokens more like FI does."
    )
    return LeadTable(title, table)


def nearfar_lead(summary: pd.DataFrame, budget: str | None) -> LeadTable | None:
    """Mean FI of each selector's equal-size set per chunk distance, with its bootstrap CI over documents."""
    if summary.empty:
        return None
    s = summary.assign(
        sets=[
            f"{sel} ({'sinks protected' if k else 'sinks not protected'})"
            for sel, k in zip(summary["selector"], summary["sinks"].fillna(0))
        ]
    )
    table = _pivot(
        s,
        ["sets"],
        "distance_from_p",
        lambda r: _with_interval(r["fi_mean"], r["fi_ci_low"], r["fi_ci_high"]),
        {"sets": "set", "distance_from_p": "FI at p +"},
    )
    n = int(summary["n_documents"].max())
    interval = "bootstrap 95 % CI over documents" if n >= MIN_BOOTSTRAP_UNITS else f"no interval: {NO_INTERVAL}"
    return LeadTable(
        f"FI (nats) of equal-size sets ({budget or 'one budget'}) on chunks at increasing distance from p: mean over "
        f"{_documents(n)} [{interval}]; higher: the set mattered more to that chunk.",
        table,
    )


def eval_text_lead(summary: pd.DataFrame, documents: int) -> LeadTable | None:
    """Mean replay KL per policy (rows) and budget (columns), bootstrap 95 % CI; the full cache's KL is the floor."""
    rows = summary[summary["policy"] != "full"].sort_values("retention", kind="stable")
    if rows.empty:
        return None
    keys = ["future", "policy"] if rows["future"].nunique() > 1 else ["policy"]
    table = _pivot(
        rows,
        keys,
        "budget",
        lambda r: _with_interval(r["mean_kl"], r["mean_kl_low"], r["mean_kl_high"]),
        {"budget": ""},
    )
    full = summary[summary["policy"] == "full"]
    note = f"full cache (noise floor): {_num(float(full['mean_kl'].max()))} nats" if len(full) else ""
    interval = "bootstrap 95 % CI over documents" if documents >= MIN_BOOTSTRAP_UNITS else f"no interval: {NO_INTERVAL}"
    return LeadTable(
        f"Mean replay KL(full ‖ compressed) (nats; lower is better) per policy and budget, {_documents(documents)} "
        f"[{interval}]",
        table,
        note,
    )


def eval_tasks_lead(summary: pd.DataFrame) -> LeadTable | None:
    """Accuracy per task x context x protocol x policy (rows) and budget (columns), with the full cache's."""
    rows = summary[summary["policy"] != "full"].sort_values("retention", kind="stable")
    if rows.empty:
        return None
    rows = rows.assign(full=rows["full_accuracy"].map(_num))
    table = _pivot(
        rows,
        ["task", "context", "protocol", "policy", "full"],
        "budget",
        lambda r: _with_interval(r["accuracy"], r["accuracy_low"], r["accuracy_high"]),
        {"full": "full cache", "budget": ""},
    )
    table.attrs["numeric"] = ["full cache", *table.attrs["numeric"]]
    return LeadTable(
        "Exact-match accuracy (higher is better) per task, policy and budget [bootstrap 95 % CI over samples]; "
        "full cache: the same samples uncompressed",
        table,
    )


def lmeval_lead(acc: pd.DataFrame) -> LeadTable | None:
    """lm-eval's score per task x metric x policy (rows) and budget (columns), with its band."""
    rows = acc[acc["policy"] != "none"]
    if rows.empty:
        return None
    rows = rows.assign(full=rows["full_value"].map(_num))
    table = _pivot(
        rows,
        ["task", "metric", "policy", "full"],
        "budget",
        lambda r: _with_interval(r["value"], r["value_low"], r["value_high"]),
        {"full": "full cache", "budget": ""},
    )
    table.attrs["numeric"] = ["full cache", *table.attrs["numeric"]]
    return LeadTable("lm-eval score per task, metric, policy and budget [95 % band]; full cache: uncompressed", table)


def lead_table(run: dict) -> LeadTable | None:
    """The run's answer as one table (module docstring), or None when its tables hold nothing to compare."""
    t, kind = run["tables"], run["kind"]
    settings = run["manifest"].get("settings", {})
    if kind == "probe":
        return probe_lead(t["fi"])
    if kind == "correlate":
        return correlate_lead(t)
    if kind == "nearfar":
        return nearfar_lead(t["nearfar_summary"], settings.get("budget"))
    if kind == "eval-text":
        return eval_text_lead(t["replay_summary"], len(settings.get("documents", [])))
    if kind == "eval-tasks":
        return eval_tasks_lead(t["task_summary"])
    if kind == "lm-eval":
        return lmeval_lead(t["lmeval_accuracy"])
    return None
