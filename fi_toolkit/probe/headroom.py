"""Headroom: the share of the achievable gap a policy closes,

    headroom = (FI_random - FI_policy) / (FI_random - FI_oracle),

at one budget (the same number of entries removed per layer and head) on one chunk: 0 is no better
than removing at random, 1 is as good as the FI oracle (:mod:`fi_toolkit.probe.oracle`), above 1 better
than the oracle (it is an estimate-driven set, not the true optimum). The three FI values are each the
mean over documents (random: over its seeds within a document first), and the ratio of means is
bootstrapped over documents (``scipy.stats.bootstrap``, paired, percentile interval): a ratio of
per-document ratios would blow up where a document's gap is tiny.

Every oracle is a reference on every chunk, so an oracle fitted on the near chunk and measured on
the far one appears as a row (``fit_chunk`` != ``chunk``): does an oracle for the near future serve
the far one? Its own row on its own chunk is 1 by construction.

**The oracle's own noise.** The FI oracle keeps the top of a sampled Fisher estimate (``samples`` label draws,
seeded), so the "1" is itself an estimate: another label seed keeps other entries at the cut and measures
another FI. The probe therefore measures every FI oracle (at label seed 0, its default) at the other label
seeds of :data:`LABEL_SEEDS` too (:func:`with_oracle_seeds`: ``policy:fi-oracle@B:seed=1``, one more oracle
keep map and one more measured eviction per oracle and document; rows of ``fi.csv`` like any selection), and
beside each row :func:`headroom_table` gives ``oracle_seeds`` (the label seeds of the reference measured),
``fi_oracle_seed_sd`` (the standard deviation over those seeds of the reference's mean FI) and
``headroom_seed_sd`` (the standard deviation over them of the headroom, each seed's oracle the reference; with
two seeds ``|a - b| / sqrt(2)``), on the documents every seed has. A headroom closer to 1 than
``headroom_seed_sd``, or two headrooms closer than it, are not told apart by this oracle. The seed-0 oracle
stays the reference of every other column, and an oracle's other label seeds are no rows of their own (NaN
where only one seed was measured). The seed-to-seed spread is the estimate's noise for fixed inputs; the
oracle's keep map is otherwise reproducible (float64, :mod:`fi_toolkit.probe.oracle`).
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import pandas as pd

from fi_toolkit.intervals import MIN_BOOTSTRAP_UNITS, bootstrap_interval
from fi_toolkit.policies.fi_oracle import LABEL_SEEDS
from fi_toolkit.probe.noise_floor import CONTROL

ORACLE = "oracle:fi-oracle"
RANDOM = "random"
_CHUNK = re.compile(r"chunk=(\d+:\d+)")


def _options(label: str) -> tuple[str, list[str]]:
    """``policy:NAME@BUDGET:a=1,b=2`` (a probe selection) or ``NAME:a=1,b=2`` (a policy as ``fi eval`` names it)
    -> (the label before its options, the options)."""
    head, at, rest = label.partition("@")
    if at:
        budget, _, options = rest.partition(":")
        stem = f"{head}@{budget}"
    else:
        stem, _, options = label.partition(":")
    return stem, [o for o in options.split(",") if o]


def oracle_seed(label: str) -> tuple[str, int]:
    """An oracle selection's (or policy's) label without its ``seed=N`` option, and ``N`` (0 where not spelled):
    ``policy:fi-oracle@keep=0.25:chunk=9:10,seed=1`` -> ``(policy:fi-oracle@keep=0.25:chunk=9:10, 1)``,
    ``fi-oracle:seed=1`` -> ``(fi-oracle, 1)``."""
    stem, items = _options(label)
    seeds = [o.partition("=")[2] for o in items if o.startswith("seed=")]
    if len(seeds) != 1 or not seeds[0].isdigit():
        return label, 0
    kept = [o for o in items if not o.startswith("seed=")]
    return stem + (f":{','.join(kept)}" if kept else ""), int(seeds[0])


def seed_label(label: str, seed: int) -> str:
    """The same oracle at label seed ``seed`` (spelled last): ``...@keep=0.25:seed=1``, ``fi-oracle:seed=1``."""
    base, _ = oracle_seed(label)
    return f"{base}{',' if _options(base)[1] else ':'}seed={seed}" if seed else base


def with_oracle_seeds(selections: Sequence, seeds: Sequence[int] = LABEL_SEEDS) -> list:
    """``selections`` (parsed :class:`~fi_toolkit.probe.selections.Selection` objects) followed by, for each FI
    oracle among them at label seed 0 (``estimator=fisher``: exact leave-one-out draws no labels), the same oracle
    at each other label seed of ``seeds`` not given already (module docstring: the reference's own noise)."""
    from fi_toolkit.probe.selections import parse_selections

    out, labels = list(selections), {s.label for s in selections}
    for s in selections:
        if s.kind != "policy" or s.policy != "fi-oracle" or oracle_seed(s.label)[1] != 0:
            continue
        if s.make_policy().estimator != "fisher":  # exact leave-one-out draws no labels
            continue
        for seed in seeds:
            label = seed_label(s.label, seed)
            if seed and label not in labels:
                labels.add(label)
                out += parse_selections([label])
    return out


def seed_noise(r: np.ndarray, s: np.ndarray, oracles: Sequence[np.ndarray]) -> tuple[float, float]:
    """Per-document values of random, a selection and the reference oracle at each label seed (``[n]`` each, the
    same documents) -> (sd over seeds of the oracle's mean, sd over seeds of the headroom with that seed's
    oracle as the reference); NaN below two seeds."""
    if len(oracles) < 2 or not len(r):
        return float("nan"), float("nan")
    means = [float(np.mean(o)) for o in oracles]
    headrooms = [float(_ratio(r, s, o)) for o in oracles]
    return float(np.std(means, ddof=1)), float(np.std(headrooms, ddof=1))


def fit_chunk(label: str, first_chunk: str) -> str:
    """The chunk an oracle selection scored: its ``chunk=A:B`` option, else the first probed chunk."""
    m = _CHUNK.search(label)
    return m.group(1) if m else first_chunk


def _ratio(r, s, o, axis=-1):
    return (np.mean(r, axis=axis) - np.mean(s, axis=axis)) / (np.mean(r, axis=axis) - np.mean(o, axis=axis))


def gap_closed(
    r: np.ndarray, s: np.ndarray, o: np.ndarray, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Per-document values ``[n]`` of random, the policy and the oracle -> (headroom, CI low, CI high):
    the ratio of means ``(mean r - mean s) / (mean r - mean o)`` and its paired percentile bootstrap interval
    over documents (NaN below :data:`~fi_toolkit.intervals.MIN_BOOTSTRAP_UNITS` documents, where a percentile
    interval would be the data's range, or where the oracle equals random everywhere)."""
    low = high = float("nan")
    if len(r) >= MIN_BOOTSTRAP_UNITS and not np.allclose(r, o):
        low, high = bootstrap_interval(
            (r, s, o), _ratio, paired=True, vectorized=True, n_resamples=resamples, confidence=confidence, seed=seed
        )
    return float(_ratio(r, s, o)), low, high


def headroom_table(table: pd.DataFrame, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Probe table (``fi probe``'s: document, selection, selector, n_removed, chunk, fi) -> one row per
    oracle x chunk x measured selection at the oracle's number of removed entries, with ``fi_random``,
    ``fi_policy``, ``fi_oracle`` (means over documents), ``headroom`` and its bootstrap CI over documents
    (NaN below two documents), and the reference's own noise over its label seeds (``oracle_seeds``,
    ``fi_oracle_seed_sd``, ``headroom_seed_sd``; module docstring: an oracle at another label seed than 0 is no
    reference or row of its own where its seed-0 self is in the table). Empty when the table holds no oracle or
    no random set."""
    t = table[table["selector"] != CONTROL]
    t = t.assign(n=t["n_removed"].round(3))
    chunks = list(dict.fromkeys(t["chunk"]))
    random = {k: g.groupby("document")["fi"].mean() for k, g in t[t["selector"] == RANDOM].groupby(["n", "chunk"])}
    measured = t[t["selector"] != RANDOM]
    fi = {k: g.groupby("document")["fi"].mean() for k, g in measured.groupby(["selection", "n", "chunk"], sort=False)}
    selectors = t.drop_duplicates("selection").set_index("selection")["selector"]
    keyed = {o: oracle_seed(o) for o in selectors.index if selectors[o] == ORACLE}
    reference_of = {base: o for o, (base, label_seed) in keyed.items() if label_seed == 0}
    other_seeds: dict[str, list[str]] = {}  # a reference oracle -> its other label seeds' selections
    for o, (base, label_seed) in keyed.items():
        if label_seed and base in reference_of:
            other_seeds.setdefault(reference_of[base], []).append(o)
    seeded = {o for found in other_seeds.values() for o in found}
    rows = []
    for oracle in [o for o in keyed if o not in seeded]:
        for (sel, n, chunk), policy in fi.items():
            if (oracle, n, chunk) not in fi or (n, chunk) not in random or sel in seeded:
                continue
            reference, rand = fi[oracle, n, chunk], random[n, chunk]
            docs = reference.index.intersection(policy.index).intersection(rand.index)
            r, s, o = (x[docs].to_numpy(float) for x in (rand, policy, reference))
            headroom, low, high = gap_closed(r, s, o, confidence, resamples, seed)
            draws = [reference] + [fi[x, n, chunk] for x in other_seeds.get(oracle, []) if (x, n, chunk) in fi]
            common = docs
            for d in draws:
                common = common.intersection(d.index)
            fi_sd, headroom_sd = seed_noise(
                rand[common].to_numpy(float), policy[common].to_numpy(float), [d[common].to_numpy(float) for d in draws]
            )
            rows.append(
                {
                    "oracle": oracle,
                    "fit_chunk": fit_chunk(oracle, chunks[0]),
                    "chunk": chunk,
                    "selection": sel,
                    "selector": selectors[sel],
                    "n_removed": n,
                    "n_documents": len(docs),
                    "fi_random": r.mean(),
                    "fi_policy": s.mean(),
                    "fi_oracle": o.mean(),
                    "headroom": headroom,
                    "ci_low": low,
                    "ci_high": high,
                    "oracle_seeds": len(draws),
                    "fi_oracle_seed_sd": fi_sd,
                    "headroom_seed_sd": headroom_sd,
                }
            )
    columns = [
        "oracle",
        "fit_chunk",
        "chunk",
        "selection",
        "selector",
        "n_removed",
        "n_documents",
        "fi_random",
        "fi_policy",
        "fi_oracle",
        "headroom",
        "ci_low",
        "ci_high",
        "oracle_seeds",
        "fi_oracle_seed_sd",
        "headroom_seed_sd",
    ]
    return pd.DataFrame(rows, columns=columns)
