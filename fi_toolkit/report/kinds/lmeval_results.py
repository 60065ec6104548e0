"""lm-evaluation-harness output (what ``fi lm-eval`` wrote) read into a run's tables for ``fi report``.

lm-eval 0.4.x writes ``OUTPUT_PATH/<model>/results_<date>.json`` per run (``results[task]`` holds
``"<metric>,<filter>"`` and ``"<metric>_stderr,<filter>"``; ``config`` holds ``model_args`` and,
from the toolkit's backend, ``fi_policy``: ``"infokv@keep=96"`` or ``"none"``) and, with
``--log_samples``, ``samples_<task>_<date>.jsonl`` beside it: one line per document with the
per-sample metric under its name, its ``filter``, and the backend's ``fi_toolkit`` records (one per
request: ``cache_entries``, ``full_entries``, ``compressions``, ...).

Tables: accuracy per (task, filter, metric, policy, budget) with a 95 % band -- the percentile
bootstrap of the mean over samples (:func:`fi_toolkit.evaluation.summaries.mean_ci`, as ``fi eval``)
where a samples file holds the metric, else lm-eval's own ``value ± 1.96·stderr`` (the ``band``
column says which) -- and the realised cache per request from the ``fi_toolkit`` records.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError

NAME = "lm-eval"  # the run kind (fi_toolkit.report.kinds.lmeval)
NONE = "none"
Z95 = 1.959964  # the normal quantile of a two-sided 95 % band from lm-eval's stderr
TABLES = [("lmeval_accuracy", True), ("lmeval_cache", True), ("lmeval_samples", False)]


def is_lmeval_dir(path: Path) -> bool:
    """A directory without a toolkit manifest: read as lm-eval output (``results_*.json`` below it)."""
    return Path(path).is_dir() and not (Path(path) / "manifest.json").exists()


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError, UnicodeDecodeError):
        raise FIError(f"'{path}' is not valid JSON") from None


def _policy_budget(config: dict, path: Path) -> tuple[str, str]:
    """``config.fi_policy`` (``infokv@keep=96``, ``none``) -> (policy, budget label); the full cache has budget
    ``keep=1``."""
    label = config.get("fi_policy") if isinstance(config, dict) else None
    if not isinstance(label, str) or not label.strip():
        raise FIError(
            f"'{path}' lacks 'config.fi_policy'; was it written by lm-eval with the toolkit's backend (model fi)?"
        )
    if label.strip().lower() == NONE:
        return NONE, "keep=1"
    policy, sep, budget = label.rpartition("@")
    if not sep or not policy:
        raise FIError(f"'{path}': 'config.fi_policy' is '{label}', expected POLICY@BUDGET or none")
    try:
        return policy, Budget.parse(budget).label
    except FIError:
        raise FIError(f"'{path}': 'config.fi_policy' is '{label}', whose budget is not a budget") from None


def _model(config: dict) -> str:
    args = config.get("model_args")
    if isinstance(args, dict):
        return str(args.get("pretrained", "smollm2-135m"))
    if isinstance(args, str):  # older lm-eval: the --model_args text
        found = [a.split("=", 1)[1] for a in args.split(",") if a.strip().startswith("pretrained=")]
        return found[0] if found else "smollm2-135m"
    return "?"


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _samples(results_file: Path, task: str) -> list[dict]:
    """The lines of ``samples_<task>_<date>.jsonl`` beside ``results_<date>.json`` (none: [])."""
    date = results_file.stem.removeprefix("results_")
    f = results_file.parent / f"samples_{task}_{date}.jsonl"
    if not f.is_file():
        return []
    rows = []
    for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                raise FIError(f"'{f}':{i}: not valid JSON") from None
            if not isinstance(row, dict):
                raise FIError(f"'{f}':{i}: expected a JSON object")
            rows.append(row)
    return rows


def _read_results(results_file: Path, seen: set) -> tuple[list[dict], list[dict], list[dict]]:
    """One results file -> rows of (reported metrics, per-sample metrics, per-request cache records);
    a (model, policy, budget, task) in ``seen`` (a later run of the same cell) is skipped."""
    data = _json(results_file)
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise FIError(f"'{results_file}' lacks 'results' (an object); is it lm-eval's results file?")
    config = data.get("config")
    policy, budget = _policy_budget(config, results_file)
    keys = {"model": _model(config), "policy": policy, "budget": budget}
    reported, per_sample, cache = [], [], []
    for task, metrics in data["results"].items():
        if not isinstance(metrics, dict):
            raise FIError(f"'{results_file}': 'results.{task}' is not an object")
        if (keys["model"], policy, budget, task) in seen:
            continue
        seen.add((keys["model"], policy, budget, task))
        rows = _samples(results_file, task)
        for key, value in metrics.items():
            metric, sep, filt = key.partition(",")
            if not sep or metric.endswith("_stderr") or _number(value) is None:
                continue
            stderr = _number(metrics.get(f"{metric}_stderr,{filt}"))
            reported.append(
                {**keys, "task": task, "filter": filt, "metric": metric, "value": _number(value), "stderr": stderr}
            )
            for row in rows:
                v = _number(row.get(metric))
                if v is not None and row.get("filter", filt) == filt:
                    per_sample.append(
                        {
                            **keys,
                            "task": task,
                            "filter": filt,
                            "metric": metric,
                            "doc_id": row.get("doc_id"),
                            "value": v,
                        }
                    )
        for row in rows:
            records = row.get("fi_toolkit") or []
            for rec in records if isinstance(records, list) else []:
                if isinstance(rec, dict):
                    cache.append(
                        {
                            **keys,
                            "task": task,
                            "doc_id": row.get("doc_id"),
                            **{k: _number(rec.get(k)) for k in ("cache_entries", "full_entries", "compressions")},
                        }
                    )
    return reported, per_sample, cache


def accuracy_table(
    reported: pd.DataFrame, per_sample: pd.DataFrame, n_resamples: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Per (model, task, filter, metric, policy, budget): ``value`` (the mean over samples where a
    samples file holds them, else lm-eval's), ``value_low``/``value_high`` (bootstrap or ±1.96·stderr:
    ``band``), ``samples``, and the full cache's value beside it (``full_value``)."""
    from fi_toolkit.evaluation.summaries import mean_ci

    keys = ["model", "task", "filter", "metric", "policy", "budget"]
    groups = (
        {k: part["value"].to_numpy() for k, part in per_sample.groupby(keys, sort=False)} if len(per_sample) else {}
    )
    rows = []
    for r in reported.drop_duplicates(keys, keep="last").itertuples(index=False):
        key = tuple(getattr(r, k) for k in keys)
        row = dict(zip(keys, key))
        if key in groups:
            mean, low, high = mean_ci(groups[key], n_resamples, seed)
            row.update(samples=len(groups[key]), value=mean, value_low=low, value_high=high, band="bootstrap")
        elif r.stderr is not None and not pd.isna(r.stderr):
            row.update(
                samples=np.nan,
                value=r.value,
                value_low=r.value - Z95 * r.stderr,
                value_high=r.value + Z95 * r.stderr,
                band="stderr",
            )
        else:
            row.update(samples=np.nan, value=r.value, value_low=np.nan, value_high=np.nan, band="none")
        rows.append(row)
    out = pd.DataFrame(rows, columns=keys + ["samples", "value", "value_low", "value_high", "band"])
    full = out[out["policy"] == NONE].set_index(["model", "task", "filter", "metric"])["value"]
    out.insert(
        out.columns.get_loc("value"),
        "full_value",
        [full.get(k, np.nan) for k in zip(out["model"], out["task"], out["filter"], out["metric"])],
    )
    out["retention"] = [np.nan if p == NONE else budget_position(b) for p, b in zip(out["policy"], out["budget"])]
    return out.sort_values(["model", "task", "filter", "metric", "policy", "retention"], kind="stable").reset_index(
        drop=True
    )


def cache_table(cache: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task, policy, budget): requests, mean realised cache entries and full-cache entries
    per request, their ratio (``cache_share``), and compressions per request (mean, max)."""
    cols = [
        "model",
        "task",
        "policy",
        "budget",
        "requests",
        "cache_entries",
        "full_entries",
        "cache_share",
        "compressions",
        "compressions_max",
    ]
    if cache.empty:
        return pd.DataFrame(columns=cols)
    out = (
        cache.assign(share=cache["cache_entries"] / cache["full_entries"])
        .groupby(["model", "task", "policy", "budget"], sort=False)
        .agg(
            requests=("cache_entries", "size"),
            cache_entries=("cache_entries", "mean"),
            full_entries=("full_entries", "mean"),
            cache_share=("share", "mean"),
            compressions=("compressions", "mean"),
            compressions_max=("compressions", "max"),
        )
        .reset_index()
    )
    return out[cols]


def budget_position(label: str) -> float:
    """Where a budget sits on the figure's x axis: a kept share, or a kept token count (``remove=X``: NaN)."""
    b = Budget.parse(label)
    return float(b.amount) if b.side == "keep" else (1.0 - b.amount if b.is_share else np.nan)


def load_lmeval_run(path: Path) -> dict:
    """An lm-eval output directory (every ``results_*.json`` below it) -> a run as
    :func:`fi_toolkit.report.export.load_run` returns it, ``kind`` ``lm-eval``, tables computed."""
    path = Path(path)
    files = sorted(path.rglob("results_*.json"))
    if not files:
        if any(path.rglob("samples_*.jsonl")):
            raise FIError(f"'{path}' holds lm-eval samples but no results_*.json; did lm-eval finish?")
        from fi_toolkit.report.preflight import not_a_run

        raise not_a_run(path)
    reported, per_sample, cache, seen = [], [], [], set()
    for f in reversed(files):  # newest first (lm-eval's date names sort by time): a rerun replaces a cell
        a, b, c = _read_results(f, seen)
        reported, per_sample, cache = reported + a, per_sample + b, cache + c
    if not reported:
        raise FIError(f"'{path}': its results files report no numeric metric")
    reported_df = pd.DataFrame(reported)
    samples = pd.DataFrame(
        per_sample, columns=["model", "policy", "budget", "task", "filter", "metric", "doc_id", "value"]
    )
    tables = {
        "lmeval_accuracy": accuracy_table(reported_df, samples),
        "lmeval_cache": cache_table(
            pd.DataFrame(
                cache,
                columns=[
                    "model",
                    "policy",
                    "budget",
                    "task",
                    "doc_id",
                    "cache_entries",
                    "full_entries",
                    "compressions",
                ],
            )
        ),
        "lmeval_samples": samples,
    }
    text = {
        name: df.map(
            lambda v: (
                ""
                if v is None or (not isinstance(v, str) and pd.isna(v))
                else (repr(v) if isinstance(v, float) else str(v))
            )
        )
        for name, df in tables.items()
    }
    models = sorted(set(reported_df["model"]))
    manifest = {
        "command": NAME,
        "model": {"name": ", ".join(models)},
        "settings": {"results_files": [str(f.relative_to(path)) for f in files]},
    }
    return {
        "label": path.name,
        "path": path,
        "manifest": manifest,
        "kind": NAME,
        "tables": tables,
        "text": text,
        "names": TABLES,
        "views": [],
        "computed": True,
    }
