"""Train the learned policy (:mod:`fi_toolkit.policies.learned`): LightGBM LambdaRank on ``fi fit-data`` rows.

One query group = one (document, layer, KV head) (``group="head"``, the default: the scores rank the entries
of a head) or one (document, layer) (``group="layer"``: the scores rank the entries of every KV head of a layer
together, so that a top-k over the layer's heads sets per-head budgets, as AdaKV, arXiv 2407.11550, shares a
layer's budget over its heads by scores; ``learned:heads=global``). A group's label = the within-group rank of
the Fisher FI estimate, binned into :data:`LEVELS` integer grades (``ceil(pct_rank * LEVELS) - 1``: the top
1/LEVELS of a group's candidates gets grade ``LEVELS - 1``), with LightGBM's default gains ``2^g - 1`` and the
NDCG truncation at the largest group (the whole ranking counts, not only its top 30). FI is comparable across
the heads of a layer (each entry's loss change, in nats, on the same continuation), so its rank over a layer
is a well-defined label. Training is
deterministic (fixed seed, ``deterministic=True``, one thread, row-wise histograms): the same rows give the
same model string. Leave-one-document-out cross-validation reports the mean within-head Spearman with FI,
as the ridge fit does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fi_toolkit.errors import FIError
from fi_toolkit.fit.ridge import _infokv, cross_validation, within_head_spearman
from fi_toolkit.policies.learned.features import ROW_FEATURES, check_features
from fi_toolkit.policies.learned.lambdarank import FORMAT

LEVELS = 31  # grades 0..30: LightGBM's default label_gain covers 31 grades
GROUPS = {"head": ["document", "layer", "head"], "layer": ["document", "layer"]}  # query group -> its columns
GROUP = GROUPS["head"]
PARAMS = {
    "objective": "lambdarank",
    "metric": "ndcg",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 20,
    "seed": 0,
    "deterministic": True,
    "force_row_wise": True,
    "num_threads": 1,
    "verbosity": -1,
}
ROUNDS = 100


def feature_frame(rows: pd.DataFrame, features: Sequence[str], layers: int) -> np.ndarray:
    """``[n, F]`` float64 features of ``rows`` (``depth`` = layer / ``layers``, ``kv_head`` = head)."""
    cols = []
    for name in features:
        if name == "depth":
            cols.append(rows["layer"].to_numpy(np.float64) / layers)
        elif name == "kv_head":
            cols.append(rows["head"].to_numpy(np.float64))
        else:
            cols.append(rows[name].to_numpy(np.float64))
    return np.stack(cols, axis=1)


def check_group(group: str) -> str:
    """``group`` if it names a query group (:data:`GROUPS`), else one line naming the parameter."""
    if not isinstance(group, str) or group not in GROUPS:
        raise FIError(f"group must be head or layer, got {group!r}", parameter="group")
    return group


def grades(rows: pd.DataFrame, group: str = "head") -> np.ndarray:
    """Integer grades ``0..LEVELS-1`` of FI's rank within each query group (module docstring)."""
    pct = rows.groupby(GROUPS[check_group(group)], sort=False)["fi"].rank(method="average", pct=True).to_numpy()
    return np.clip(np.ceil(pct * LEVELS) - 1, 0, LEVELS - 1).astype(np.int64)


def _lightgbm():
    try:
        import lightgbm
    except ImportError:
        raise FIError("the lambdarank learner needs LightGBM: pip install -e '.[learned]'") from None
    return lightgbm


def train(rows: pd.DataFrame, features: Sequence[str], layers: int, rounds: int = ROUNDS, group: str = "head"):
    """A LambdaRank booster on ``rows`` (sorted here by document, layer, head, position; one query group per
    ``group``) -> (booster, params)."""
    lgb = _lightgbm()

    rows = rows.sort_values([*GROUP, "position"], kind="stable").reset_index(drop=True)
    sizes = rows.groupby(GROUPS[check_group(group)], sort=False).size().to_numpy()
    params = {**PARAMS, "lambdarank_truncation_level": int(sizes.max())}
    data = lgb.Dataset(
        feature_frame(rows, features, layers),
        label=grades(rows, group),
        group=sizes,
        feature_name=list(features),
        free_raw_data=False,
    )
    return lgb.train(params, data, num_boost_round=rounds), params


def within_layer_spearman(rows: pd.DataFrame, score: np.ndarray) -> float | None:
    """Mean over (document, layer) of Spearman's rho between ``score`` and FI over all the layer's KV heads
    together (constant groups skipped; None when every group is constant): how well a score ranks across heads."""
    from scipy import stats

    fi = rows["fi"].to_numpy()
    rhos = [
        stats.spearmanr(score[idx], fi[idx]).statistic
        for idx in rows.groupby(GROUPS["layer"], sort=False).indices.values()
        if np.ptp(score[idx]) > 0 and np.ptp(fi[idx]) > 0
    ]
    return float(np.mean(rhos)) if rhos else None


def learn_policy(
    rows: pd.DataFrame, features: Sequence[str], meta: dict, rounds: int = ROUNDS, group: str = "head"
) -> dict:
    """The learned-model record (what the model JSON holds): the LightGBM model string, gain importances,
    leave-one-document-out Spearman, the query ``group`` and ``meta`` (model with ``layers``, signals, settings).
    With ``group="layer"`` the folds also hold the within-layer Spearman (:func:`within_layer_spearman`) of the
    learned score and of H2O's accumulated attention, the scores a top-k over a layer's heads compares."""
    lgb = _lightgbm()

    check_group(group)
    from fi_toolkit.runs.results import versions

    features = list(features)
    check_features(features)
    layers = int(meta["model"]["layers"])
    missing = [f for f in features if f not in ROW_FEATURES and f not in rows.columns]
    if missing:
        raise FIError(f"the fit-data rows hold no '{missing[0]}' (made by an older fi fit-data? run it again)")
    documents = list(dict.fromkeys(rows["document"]))
    if len(documents) < 2:
        raise FIError(f"fi fit needs rows of at least two documents (leaving one out), got {len(documents)}")
    folds = []
    for held in documents:
        model, _ = train(rows[rows["document"] != held], features, layers, rounds, group)
        test = rows[rows["document"] == held]
        score = model.predict(feature_frame(test, features, layers), num_threads=1)
        fold = {
            "held_out": held,
            "spearman_learned": within_head_spearman(test, score),
            "spearman_snapkv": within_head_spearman(test, test["attention"].to_numpy()),
            "spearman_infokv": within_head_spearman(test, _infokv(test)),
        }
        if group == "layer":
            fold["layer_spearman_learned"] = within_layer_spearman(test, score)
            if "log_accumulated" in test:
                fold["layer_spearman_h2o"] = within_layer_spearman(test, test["log_accumulated"].to_numpy())
        folds.append(fold)
    model, params = train(rows, features, layers, rounds, group)
    gain = model.feature_importance(importance_type="gain")
    return {
        "format": FORMAT,
        **meta,
        "learner": "lambdarank",
        "features": features,
        "model_string": model.model_to_string(),
        "model_dump": model.dump_model(),
        "params": params,
        "rounds": rounds,
        "group": group,
        "labels": {
            "target": f"within-{'head' if group == 'head' else 'layer (all KV heads)'} rank of Fisher FI",
            "levels": LEVELS,
            "grade": "ceil(pct_rank*levels)-1",
        },
        "importance_gain": {f: float(g) for f, g in zip(features, gain)},
        "rows": int(len(rows)),
        "documents": documents,
        "versions": {**versions(), "lightgbm": lgb.__version__},
        "cross_validation": cross_validation(folds),
    }
