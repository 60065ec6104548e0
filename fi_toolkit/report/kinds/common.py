"""What several run kinds' sections share: the captions' common frame, the lead tables' pivot, and the words for
a count of documents and for the interval over them."""

from __future__ import annotations

from typing import Callable

import pandas as pd

from fi_toolkit.intervals import MIN_BOOTSTRAP_UNITS
from fi_toolkit.report.display import NO_INTERVAL
from fi_toolkit.report.numbers import significant


def listed(names: list[str], first: int = 6) -> str:
    """The first ``first`` names, and how many more there are: ``a, b, c (+3 more)``."""
    return ", ".join(names[:first]) + (f" (+{len(names) - first} more)" if len(names) > first else "")


def study_caption(manifest: dict, setup: Callable[[dict], str]) -> str:
    """One line stating model, documents, prefix and, as ``setup(settings)`` words them, the chunks and what the
    run measured on them (``fi probe``, ``fi correlate``, ``fi nearfar``, ``fi field``); the noise floor where
    the manifest records one."""
    s, docs = manifest.get("settings", {}), unit_names(manifest)
    text = (
        f"model {manifest.get('model', {}).get('name', s.get('model'))} | {len(docs)} document(s): {listed(docs)} | "
        f"p = {s.get('prefix')} | {setup(s)}"
    )
    floors = [v for chunks in (manifest.get("noise_floor") or {}).values() for v in chunks.values()]
    if floors:  # docs/method.md, "Noise floor"
        model = manifest.get("model", {})
        dtypes = f"{model.get('dtype')} weights, {model.get('compute_dtype')} arithmetic"
        text += f" | noise floor <= {significant(max(floors), 1)} nats ({dtypes})"
    return text


def eval_caption(manifest: dict, what: str) -> str:
    """One line of a ``fi eval`` run: the model with its precision, then ``what`` (its units and settings)."""
    s, model = manifest.get("settings", {}), manifest.get("model", {})
    return (
        f"model {model.get('name', s.get('model'))} ({model.get('dtype')} weights, {model.get('compute_dtype')} "
        f"arithmetic) | {what}"
    )


def unit_names(manifest: dict) -> list[str]:
    """The names of a run's documents (or task samples), as its manifest lists them."""
    return [d["name"] for d in manifest.get("settings", {}).get("documents", [])]


def pivot(df: pd.DataFrame, rows: list[str], column: str, cell, names: dict[str, str]) -> pd.DataFrame:
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


def documents(n: int) -> str:
    """``1 document``, ``4 documents``."""
    return f"{n} document{'s' if n != 1 else ''}"


def documents_interval(n: int) -> str:
    """The interval a lead table's cells carry over ``n`` documents, or why they carry none."""
    return "bootstrap 95 % CI over documents" if n >= MIN_BOOTSTRAP_UNITS else f"no interval: {NO_INTERVAL}"
