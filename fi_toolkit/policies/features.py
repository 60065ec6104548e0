"""Features of the learned policy beyond the fitted policy's (:data:`fi_toolkit.policies.fitted.FEATURES`),
computable at the compression point from :class:`Signals` alone, per (layer, KV head, slot):

- ``depth``: layer / number of layers (constant over a layer);
- ``kv_head``: the KV head's index (constant over a head);
- ``keydiff``: KeyDiff's score (arXiv 2504.15364), ``-cos(k_j, a)`` with the anchor ``a`` the mean of the
  head's L2-normalised (rotated) keys over every slot it holds at this compression (higher = more distinct
  = keep). Simplified: the paper's anchor is the same mean; its block-wise variant is not used.

Nothing reads a token after the compression point: every value is a function of the slots held then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fi_toolkit.errors import FIError
from fi_toolkit.policies.fitted import FEATURES, feature_matrix

if TYPE_CHECKING:
    import torch

    from fi_toolkit.signals.policy_view import Signals

EXTRA = {
    "depth": "layer / number of layers",
    "kv_head": "index of the KV head",
    "keydiff": "KeyDiff: -cos(key, mean normalised key of the head)",
}
LEARNED_FEATURES = (*FEATURES, *EXTRA)
ROW_FEATURES = ("depth", "kv_head")  # known from a row's layer and head: fi fit-data stores no column for them


def keydiff(keys: torch.Tensor) -> torch.Tensor:
    """KeyDiff's score of keys ``[1, Hkv, n, d]`` -> ``[Hkv, n]`` float64 (module docstring)."""
    import torch

    k = torch.nn.functional.normalize(keys[0].double(), dim=-1)
    anchor = torch.nn.functional.normalize(k.mean(dim=1, keepdim=True), dim=-1)
    return -(k * anchor).sum(dim=-1)


def learned_matrix(s: Signals, layer: int, names, entropy_of: str, tau: float) -> torch.Tensor:
    """The features ``names`` (of :data:`LEARNED_FEATURES`) of every slot of one layer -> ``[F, Hkv, n_l]``
    float64."""
    import torch

    hkv, n = int(s.keys[layer].shape[1]), s.slots(layer)
    device = s.keys[layer].device
    rows = []
    for name in names:
        if name == "depth":
            rows.append(torch.full((hkv, n), layer / s.num_layers, dtype=torch.float64, device=device))
        elif name == "kv_head":
            rows.append(torch.arange(hkv, dtype=torch.float64, device=device)[:, None].expand(hkv, n))
        elif name == "keydiff":
            rows.append(keydiff(s.keys[layer]))
        else:
            rows.append(feature_matrix(s, layer, [name], entropy_of, tau)[0])
    return torch.stack(rows)


def check_feature_names(features: Sequence[str], known: Sequence[str]) -> None:
    """Refuse a feature not in ``known``, an empty list or a feature listed twice (FIError naming ``features``);
    no heavy import, so ``fi fit`` checks before it reads anything. The ridge fit and the learned policy share it."""
    unknown = [f for f in features if f not in known]
    if unknown:
        raise FIError(
            f"features names an unknown feature '{unknown[0]}' (known: {', '.join(known)})", parameter="features"
        )
    if not features:
        raise FIError("features lists no feature", parameter="features")
    if len(set(features)) != len(features):
        raise FIError("features lists a feature twice", parameter="features")


def check_features(features: Sequence[str]) -> None:
    """The learned policy's features: :func:`check_feature_names` against :data:`LEARNED_FEATURES`."""
    check_feature_names(features, LEARNED_FEATURES)
