"""Near/far set analysis (docs/method.md, "Set-level analysis"): which selector's sets matter for distant chunks?

Equal-size sets (one :class:`~fi_toolkit.budget.Budget`, default ``remove=0.1`` of the prefix) are
selected by entropy, attention, distance, InfoKV and random (several seeds), each removed at ``p``; FI is measured on
chunks ``[p + d, p + d + len)`` at increasing distances
``d``, all in one batched pass per batch of sets. Each set is measured with sink protection (the
first ``s`` positions never picked) and without it (``s = 0``). Derived columns:

- ``fi_rel_random``: FI divided by the mean FI of the random sets (same document, sinks, chunk);
- ``fi_share_near``: FI divided by the same set's FI on the nearest chunk: how much of its
  influence survives with distance (the paper's claim is about this decay).

The claim "entropy sets beat attention sets on far chunks" is tested across documents with a
one-sided Wilcoxon signed-rank test on the paired per-document values (:func:`paired_tests`):
FI is strongly skewed and its scale varies by orders of magnitude between documents, so a
rank test of the paired differences is preferred to a t-test that assumes normal differences;
with few documents scipy uses the exact null distribution (with n = 5 the smallest one-sided
p-value possible is 1/32 = 0.031).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import stats

from fi_toolkit.budget import Budget
from fi_toolkit.eviction import KeepMap
from fi_toolkit.intervals import mean_interval, paired_wilcoxon
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import fi_table
from fi_toolkit.probe.forward_influence import forward_influence
from fi_toolkit.probe.headroom import ORACLE
from fi_toolkit.probe.noise_floor import CONTROL
from fi_toolkit.probe.selections import parse_selections
from fi_toolkit.signals.trace import Trace
from fi_toolkit.studies.nearfar_spec import (  # noqa: F401  (nearfar_chunks, parse_distances: importable here too)
    nearfar_chunks,
    nearfar_selections,
    parse_distances,
)
from fi_toolkit.studies.token_classes import token_class_table


def count_sets(budget: Budget | str, seeds: int, sink_options: Sequence[int], selections: Sequence[str] = ()) -> int:
    """Sets a document's study measures (every selector and seed and every extra selection, for every sink
    option), controls aside."""
    return (len(parse_selections(nearfar_selections(budget, seeds))) + len(parse_selections(selections))) * len(
        sink_options
    )


def nearfar_document(
    model,
    doc,
    trace: Trace,
    chunks: Sequence[Chunk],
    budget: Budget | str = "remove=0.1",
    seeds: int = 3,
    sink_options: Sequence[int] = (4, 0),
    batch_size: int | None = None,
    block: int = 512,
    token_text: Callable[[int], str] | None = None,
    on_progress: Callable[[int], None] | None = None,
    sets: slice = slice(None),
    reference=None,
    selections: Sequence[str] = (),
) -> dict[str, pd.DataFrame]:
    """FI of every selector's set on every chunk, with and without sink protection, for one document.

    Identical sets (a selector that never picks a sink gives the same set for every ``sinks``) are
    measured once. Returns ``{"nearfar": tidy FI table, "token_classes": class shares per set}``.

    ``sets`` measures a block of the sets only (a part of a split document): the noise
    controls go with the block that starts at 0, and the blocks' tables, concatenated in order, are
    the whole document's; blocks without the controls leave ``below_noise_floor`` to the merge
    (:func:`fi_toolkit.probe.noise_floor.flag_below_noise_floor`). ``reference``: the document's
    :func:`~fi_toolkit.probe.forward_influence.chunk_reference`, shared by its parts.

    ``selections``: more ``--select`` specs measured beside the study's sets (a kvpress press, a policy). Such
    a selection decides its own entries, sinks included: it is resolved once, measured once, and listed
    under every sink option; its token classes are those of the positions every layer and head removed.
    """
    study = parse_selections(nearfar_selections(budget, seeds))
    extra = [
        s.resolve(trace, alpha=trace.config.alpha, model=model, ids=doc.ids, chunks=list(chunks))
        for s in parse_selections(selections)
    ]
    evictions = []
    for sinks in sink_options:
        for sel in study:
            e = sel.resolve(trace, sinks=sinks, alpha=trace.config.alpha)
            e.meta["sinks"] = sinks
            evictions.append(e)
        evictions += [dataclasses.replace(e, meta={**e.meta, "sinks": sinks}) for e in extra]
    controls = sets.start in (None, 0)
    evictions = evictions[sets]
    index: dict[tuple, int] = {}
    distinct = []
    for e in evictions:
        if _key(e) not in index:
            index[_key(e)] = len(distinct)
            distinct.append(e)
    result = forward_influence(
        model,
        trace,
        doc.ids,
        distinct,
        chunks,
        batch_size=batch_size,
        block=block,
        on_progress=on_progress,
        controls=controls,
        reference=reference,
    )
    controls = result.control_rows()
    rows = controls + [len(controls) + index[_key(e)] for e in evictions]
    measured = result.rows(rows)
    measured.evictions = measured.evictions[: len(controls)] + evictions  # each with its own label and sinks
    table = fi_table(doc, trace, measured)
    sinks = pd.array([e.meta.get("sinks") for e in measured.evictions], dtype="Int64")
    table.insert(2, "sinks", np.repeat(sinks, len(chunks)))
    text = token_text or str
    classes = token_class_table(
        [
            {
                "document": doc.name,
                "sinks": e.meta["sinks"],
                "selection": e.label,
                "selector": e.meta["selector"],
                "seed": e.meta.get("seed"),
                "texts": [text(int(i)) for i in doc.ids[_removed_everywhere(e, trace.prefix_len)]],
            }
            for e in evictions
        ]
    )
    classes["seed"] = classes["seed"].astype("Int64")
    return {"nearfar": table, "token_classes": classes}


def _key(e) -> tuple:
    """Evictions with the same key are measured once: a token set by its positions, a keep map by its entries."""
    if isinstance(e, KeepMap):
        return ("keep map", *(tuple(k.flatten().tolist()) for k in e.keep))
    return tuple(e.removed.tolist())


def _removed_everywhere(e, prefix_len: int):
    """Positions removed from every layer and KV head (a token set's own)."""
    if isinstance(e, KeepMap):
        return torch.nonzero(~e.visible(prefix_len).any(dim=1).any(dim=0)).flatten()
    return e.removed


def add_relative_columns(nf: pd.DataFrame) -> pd.DataFrame:
    """``fi_rel_random`` (vs the mean random set) and ``fi_share_near`` (vs the set's nearest chunk); where
    the table holds FI-oracle rows (selector ``oracle:fi-oracle``), ``headroom``: the share of the
    random-to-oracle gap each set closes per document (the lowest oracle FI of that document, sinks and
    chunk is the reference; :mod:`fi_toolkit.probe.headroom` gives the across-document version with CIs)."""
    nf = nf.copy()
    random_mean = nf[nf.selector == "random"].groupby(["document", "sinks", "chunk"])["fi"].mean().rename("random_fi")
    nf = nf.join(random_mean, on=["document", "sinks", "chunk"])
    keys = ["document", "sinks", "selection"]
    nearest = nf.groupby(keys)["distance_from_p"].transform("min") == nf["distance_from_p"]
    near_fi = nf.assign(near_fi=nf["fi"].where(nearest)).groupby(keys)["near_fi"].transform("max")
    with np.errstate(divide="ignore", invalid="ignore"):
        nf["fi_rel_random"] = nf["fi"] / nf["random_fi"]
        nf["fi_share_near"] = nf["fi"] / near_fi
    if (nf["selector"] == ORACLE).any():  # sets measured beside an FI oracle: the share of its gap closed
        oracle = nf[nf["selector"] == ORACLE].groupby(["document", "sinks", "chunk"])["fi"].min().rename("oracle_fi")
        nf = nf.join(oracle, on=["document", "sinks", "chunk"])
        with np.errstate(divide="ignore", invalid="ignore"):
            nf["headroom"] = (nf["random_fi"] - nf["fi"]) / (nf["random_fi"] - nf["oracle_fi"])
        nf = nf.drop(columns="oracle_fi")
    return nf.drop(columns="random_fi")


METRICS = ("fi", "fi_rel_random", "fi_share_near")


def per_document_selector(nf: pd.DataFrame) -> pd.DataFrame:
    """One value per document x sinks x selector x distance (random seeds averaged within a document;
    the noise controls left out)."""
    nf = nf[nf["selector"] != CONTROL]
    keys = ["document", "sinks", "selector", "distance_from_p", "chunk"]
    return nf.groupby(keys, sort=False)[list(METRICS)].mean().reset_index()


def summarize_nearfar(
    nf: pd.DataFrame, confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Across documents: mean, sd and the percentile bootstrap interval of the mean
    (:func:`~fi_toolkit.studies.statistics.mean_interval`: inside the values' range, so never negative for FI
    or its ratios; NaN below four documents) of each metric per selector x sinks x distance. The report's
    table and figure both draw these columns."""
    per_doc = per_document_selector(nf)
    rows = []
    for (sinks, selector, dist, chunk), g in per_doc.groupby(
        ["sinks", "selector", "distance_from_p", "chunk"], sort=False
    ):
        row = {"sinks": sinks, "selector": selector, "distance_from_p": dist, "chunk": chunk, "n_documents": len(g)}
        for m in METRICS:
            v = g[m].to_numpy(dtype=float)
            mean, low, high = mean_interval(v, n_resamples, confidence, seed)
            std = float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")
            row.update({f"{m}_mean": mean, f"{m}_std": std, f"{m}_ci_low": low, f"{m}_ci_high": high})
        rows.append(row)
    return (
        pd.DataFrame(rows)
        .sort_values(["sinks", "selector", "distance_from_p"], ascending=[False, True, True])
        .reset_index(drop=True)
    )


def paired_tests(nf: pd.DataFrame, a: str = "entropy", b: str = "attention") -> pd.DataFrame:
    """Per sinks x distance x metric: is ``a`` > ``b`` across documents? One-sided Wilcoxon signed-rank.

    Columns: n documents, how many documents ``a`` wins, median paired difference, mean log ratio,
    the Wilcoxon statistic and p-value (alternative "greater"), and the paired t-test p-value on
    log ratios for reference.
    """
    per_doc = per_document_selector(nf)
    rows = []
    for (sinks, dist), g in per_doc.groupby(["sinks", "distance_from_p"], sort=False):
        wide = {m: g.pivot_table(index="document", columns="selector", values=m) for m in METRICS}
        for m, w in wide.items():
            if a not in w or b not in w:
                continue
            pair = w[[a, b]].dropna()
            x, y = pair[a].to_numpy(float), pair[b].to_numpy(float)
            row = {
                "sinks": sinks,
                "distance_from_p": dist,
                "metric": m,
                "hypothesis": f"{a} > {b}",
                "n_documents": len(x),
                "a_wins": int((x > y).sum()),
                "median_difference": float(np.median(x - y)) if len(x) else float("nan"),
            }
            with np.errstate(divide="ignore", invalid="ignore"):
                logr = np.log(x / y)
            logr = logr[np.isfinite(logr)]
            row["mean_log_ratio"] = float(np.mean(logr)) if len(logr) else float("nan")
            row["wilcoxon_statistic"], row["wilcoxon_p"], _ = paired_wilcoxon(x, y, alternative="greater")
            if len(logr) >= 2 and np.std(logr) > 0:
                row["ttest_log_ratio_p"] = float(stats.ttest_1samp(logr, 0.0, alternative="greater").pvalue)
            else:
                row["ttest_log_ratio_p"] = float("nan")
            rows.append(row)
    return pd.DataFrame(rows)


def token_class_summary(classes: pd.DataFrame) -> pd.DataFrame:
    """Mean shares of content, function and other tokens per selector x sinks, across documents and seeds."""
    cols = ["share_content", "share_function", "share_other"]
    return classes.groupby(["sinks", "selector"], sort=False)[cols + ["n_tokens"]].mean().reset_index()
