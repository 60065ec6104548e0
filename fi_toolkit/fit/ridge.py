"""Fit a policy to Forward Influence: which compression-time signals, combined how, rank the
cache entries of each layer and KV head by their FI.

**Rows**: :func:`fi_toolkit.fit.rows.fit_rows` (what ``fi fit-data`` writes).

**Model** (:func:`fit_policy`): a policy ranks entries within each (layer, head), so the fit uses
within-head contrasts only: target and features are centred per (document, layer, head) (a linear
score ranks the same with or without a per-head constant), features are standardised by their
pooled standard deviation, and ridge regression is solved in closed form,
``beta = (X'X + lambda n I)^-1 X'y``. Target ``rank`` (default): the within-head rank scaled to
``[0, 1]``; ``log``: ``log(FI + 1e-30)``. Cross-validation leaves one document out: the mean over
(layer, head) of the Spearman correlation between the held-out score and the held-out FI, beside the
same for window attention alone (SnapKV's score) and InfoKV's score.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from scipy import stats

from fi_toolkit.errors import FIError
from fi_toolkit.fit.settings import check_fit_options
from fi_toolkit.policies.learned.fitted import FORMAT
from fi_toolkit.signals.formulas import infokv_score

INFOKV_ALPHA = 0.9  # the InfoKV score cross-validation compares with (the paper's default)


def _target(rows: pd.DataFrame, target: str) -> np.ndarray:
    groups = rows.groupby(["document", "layer", "head"], sort=False)["fi"]
    if target == "rank":
        return groups.rank(method="average", pct=True).to_numpy()
    return np.log(rows["fi"].to_numpy() + 1e-30)


def _centred(values: np.ndarray, rows: pd.DataFrame) -> np.ndarray:
    """``values [n, k]`` minus their mean per (document, layer, head)."""
    frame = pd.DataFrame(values)
    key = [rows["document"].to_numpy(), rows["layer"].to_numpy(), rows["head"].to_numpy()]
    return (frame - frame.groupby(key, sort=False).transform("mean")).to_numpy()


def ridge(x: np.ndarray, y: np.ndarray, penalty: float) -> np.ndarray:
    """Closed-form ridge ``(X'X + penalty n I)^-1 X'y`` for ``x [n, F]``, ``y [n]`` (no intercept)."""
    n, f = x.shape
    return np.linalg.solve(x.T @ x + penalty * n * np.eye(f), x.T @ y)


def _fit(rows: pd.DataFrame, features: list[str], target: str, penalty: float):
    """(mean, scale, coefficients) of the standardised ridge fit on ``rows``."""
    raw = rows[features].to_numpy(np.float64)
    xc = _centred(raw, rows)
    scale = xc.std(axis=0)
    flat = [f for f, s in zip(features, scale) if not s > 0]
    if flat:
        raise FIError(
            f"feature '{flat[0]}' does not vary within any head of the training rows: leave it out of features",
            parameter="features",
        )
    y = _centred(_target(rows, target)[:, None], rows)[:, 0]
    coef = ridge(xc / scale, y, penalty)
    return raw.mean(axis=0), scale, coef


def _infokv(rows: pd.DataFrame) -> np.ndarray:
    """InfoKV's score ``S`` of each row, the softmax of ``E^(l)`` over the rows of its (document, layer, head)."""
    out = np.empty(len(rows))
    for idx in rows.groupby(["document", "layer", "head"], sort=False).indices.values():
        a = torch.tensor(rows["attention"].to_numpy()[idx])
        e = torch.tensor(rows["layer_entropy"].to_numpy()[idx])
        out[idx] = infokv_score(a, e, INFOKV_ALPHA).double().numpy()
    return out


def within_head_spearman(rows: pd.DataFrame, score: np.ndarray) -> float | None:
    """Mean over (document, layer, head) of Spearman's rho between ``score`` and FI (constant groups
    skipped; None when every group is constant)."""
    fi = rows["fi"].to_numpy()
    rhos = []
    for idx in rows.groupby(["document", "layer", "head"], sort=False).indices.values():
        if np.ptp(score[idx]) > 0 and np.ptp(fi[idx]) > 0:
            rhos.append(stats.spearmanr(score[idx], fi[idx]).statistic)
    return float(np.mean(rhos)) if rhos else None


def _score(rows: pd.DataFrame, features: list[str], mean, scale, coef) -> np.ndarray:
    return ((rows[features].to_numpy(np.float64) - mean) / scale) @ coef


def fit_policy(
    rows: pd.DataFrame, features: Sequence[str], target: str = "rank", penalty: float = 1e-3, meta: dict | None = None
) -> dict:
    """The fitted-policy record (what ``policy.json`` holds) from training ``rows`` of several documents:
    standardisation, coefficients, leave-one-document-out scores and ``meta`` (model, signals, settings)."""
    features = list(features)
    check_fit_options(features, target, penalty)
    documents = list(dict.fromkeys(rows["document"]))
    if len(documents) < 2:
        raise FIError(
            f"fi fit needs rows of at least two documents to cross-validate (leaving one out), got {len(documents)}"
        )
    folds = []
    for held in documents:
        train, test = rows[rows["document"] != held], rows[rows["document"] == held]
        mean, scale, coef = _fit(train, features, target, penalty)
        folds.append(
            {
                "held_out": held,
                "spearman_fitted": within_head_spearman(test, _score(test, features, mean, scale, coef)),
                "spearman_snapkv": within_head_spearman(test, test["attention"].to_numpy()),
                "spearman_infokv": within_head_spearman(test, _infokv(test)),
            }
        )
    mean, scale, coef = _fit(rows, features, target, penalty)
    return {
        "format": FORMAT,
        **(meta or {}),
        "features": features,
        "mean": mean.tolist(),
        "scale": scale.tolist(),
        "coefficients": coef.tolist(),
        "target": target,
        "ridge": penalty,
        "rows": int(len(rows)),
        "documents": documents,
        "cross_validation": cross_validation(folds),
    }


def cross_validation(folds: list[dict]) -> dict:
    """The leave-one-document-out record of a fit (ridge or learned): its folds (``held_out`` and one within-head
    Spearman per score) and each score's mean over the folds (None where a fold has none)."""
    mean = {
        k: float(np.mean(v)) if None not in (v := [f[k] for f in folds]) else None for k in folds[0] if k != "held_out"
    }
    return {
        "scheme": "leave one document out",
        "metric": "mean within-head Spearman with FI",
        "folds": folds,
        "mean": mean,
    }


def policy_json(record: dict) -> str:
    """The record as the bytes a policy file (``fi fit``'s ridge or learned model) holds: sorted keys, two-space
    indent, floats as Python's repr."""
    return json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n"
