"""Features of the learned policy beyond the fitted policy's (:data:`fi_toolkit.policies.learned.fitted.FEATURES`),
computable at the compression point from :class:`Signals` alone, per (layer, KV head, slot):

- ``depth``: layer / number of layers (constant over a layer);
- ``kv_head``: the KV head's index (constant over a head);
- ``keydiff``: KeyDiff's score (arXiv 2504.15364), ``-cos(k_j, a)`` with the anchor ``a`` the mean of the
  head's L2-normalised (rotated) keys over every slot it holds at this compression (higher = more distinct
  = keep). Simplified: the paper's anchor is the same mean; its block-wise variant is not used;
- ``vnorm``: ``||v_j||``, the L2 norm of the slot's value in the KV head;
- ``wo_vnorm``: ``mean_{h in G} ||W_o^h v_j||`` over the query heads ``G`` of the KV group (query head ``h``
  reads KV head ``h // (Hq / Hkv)``, as ``repeat_kv`` lays them out), with ``W_o^h`` the columns
  ``[h d, (h + 1) d)`` of the layer's ``o_proj`` weight: how far the slot's value can move the attention's
  output per unit of attention (the value side of value-aware pruning and CriticalKV).
  The mean, not the sum, so that groups of every size share one scale;
- ``acc_wo_vnorm``: H2O's accumulated attention of the slot times ``wo_vnorm``, the attention-weighted
  output norm (the accumulator is per KV head, so the product is too);
- ``expected_attention``: ExpectedAttention's score (Devoto et al., arXiv 2510.00636; kvpress's
  ``ExpectedAttentionPress``): the attention the *future* queries are expected to pay each key, modelled as
  Gaussian with the mean ``mu`` and covariance ``S`` of the pre-RoPE queries of the rows fed since the last
  compression (past its first ``QUERY_SINKS``), rotated by RoPE averaged over the next ``FUTURE_POSITIONS``
  positions (``R``): per query head, ``softmax_j(k_j' R mu / sqrt(d) + k_j' R S R' k_j / (2 d))`` over the slots
  past the first ``QUERY_SINKS``, averaged over the heads of the KV group, times ``||v_j||``; the first
  ``QUERY_SINKS`` slots score the layer's maximum + 1 (kept, as the press keeps its sinks). The future starts
  at the next position, ``Signals.seen`` (the press's ``q_len``, which is the same at a prefill);
- ``tova``: TOVA's score (Oren et al., arXiv 2401.06104; kvpress's ``TOVAPress``): the softmax attention of the
  last row's query over every slot, averaged over *all* query heads of the layer (the paper's layer-wise
  variant, which kvpress implements: one score for every KV head), the last slot scoring the maximum + 1.

ExpectedAttention reads ``Signals.query_moments`` and ``Signals.rotary`` (the tracker keeps the queries'
sums, never the rows), TOVA ``Signals.last_query``; both equal kvpress's presses' ``score``
(tests/test_features_kvpress.py).

The value side reads ``Signals.values`` (the cache's values) and ``Signals.out_proj`` (the layers'
``o_proj`` weights; from ``Signals.model`` when the signals carry none).

Nothing reads a token after the compression point: every value is a function of the slots held then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fi_toolkit.errors import FIError
from fi_toolkit.policies.learned.fitted import FEATURES, feature_matrix
from fi_toolkit.signals.config import QUERY_SINKS

if TYPE_CHECKING:
    import torch

    from fi_toolkit.signals.policy_view import Signals

EXTRA = {
    "depth": "layer / number of layers",
    "kv_head": "index of the KV head",
    "keydiff": "KeyDiff: -cos(key, mean normalised key of the head)",
    "vnorm": "L2 norm of the value",
    "wo_vnorm": "mean over the group's query heads h of ||W_o^h v||",
    "acc_wo_vnorm": "accumulated attention x wo_vnorm",
    "expected_attention": "ExpectedAttention: expected attention of the future queries x ||v||",
    "tova": "TOVA: attention of the last query, averaged over the layer's heads",
}
FUTURE_POSITIONS = 512  # ExpectedAttention's horizon (kvpress's n_future_positions default)
LEARNED_FEATURES = (*FEATURES, *EXTRA)
ROW_FEATURES = ("depth", "kv_head")  # known from a row's layer and head: fi fit-data stores no column for them


def keydiff(keys: torch.Tensor, dead: torch.Tensor | None = None) -> torch.Tensor:
    """KeyDiff's score of keys ``[1, Hkv, n, d]`` -> ``[Hkv, n]`` float64 (module docstring); ``dead [Hkv, n]``
    (an uneven cache's pad slots): left out of the anchor."""
    import torch

    k = torch.nn.functional.normalize(keys[0].double(), dim=-1)
    if dead is None:
        mean = k.mean(dim=1, keepdim=True)
    else:
        live = (~dead.to(k.device)).double()[..., None]
        mean = (k * live).sum(dim=1, keepdim=True) / live.sum(dim=1, keepdim=True)
    anchor = torch.nn.functional.normalize(mean, dim=-1)
    return -(k * anchor).sum(dim=-1)


def vnorm(values: torch.Tensor) -> torch.Tensor:
    """``||v||`` of values ``[1, Hkv, n, d]`` -> ``[Hkv, n]`` float64."""
    return values[0].double().norm(dim=-1)


_GRAMS: dict[int, tuple] = {}  # id(o_proj weight) -> (weakref to it, its version, device, head Gram matrices)


def head_grams(out_proj: torch.Tensor, hkv: int, d: int, device) -> torch.Tensor:
    """``W_o^h' W_o^h`` of every query head of an ``o_proj`` weight ``[hidden, Hq * d]``, laid out by KV group
    -> ``[Hkv, Hq / Hkv, d, d]`` float64 on ``device``. A constant of the model: kept per weight (while it lives
    and is not changed in place), so a compression pays for it once."""
    import weakref

    import torch

    hidden, width = out_proj.shape
    if width % d or (width // d) % hkv:
        raise FIError(f"o_proj takes {width} inputs: not a whole number of {d}-wide heads per {hkv} KV heads")
    key = id(out_proj)
    hit = _GRAMS.get(key)
    if hit is not None and hit[0]() is out_proj and hit[1] == out_proj._version and hit[2] == (device, hkv, d):
        return hit[3]
    w = out_proj.detach().to(device=device, dtype=torch.float64).reshape(hidden, hkv, width // d // hkv, d)
    a = w.permute(1, 2, 3, 0)  # [Hkv, group, d, hidden]
    gram = a @ a.transpose(-1, -2)
    _GRAMS[key] = (weakref.ref(out_proj), out_proj._version, (device, hkv, d), gram)
    return gram


def wo_vnorm(values: torch.Tensor, out_proj: torch.Tensor) -> torch.Tensor:
    """``mean_{h in G(k)} ||W_o^h v_{k,j}||`` of values ``[1, Hkv, n, d]`` and an ``o_proj`` weight
    ``[hidden, Hq * d]`` -> ``[Hkv, n]`` float64 (module docstring). Computed as the quadratic form
    ``v' (W_o^h' W_o^h) v`` with each head's ``d x d`` Gram matrix (:func:`head_grams`), so no
    ``[Hq, n, hidden]`` product is built."""
    v = values[0].double()[:, None]  # [Hkv, 1, n, d]
    gram = head_grams(out_proj, v.shape[0], v.shape[-1], v.device)
    squared = ((v @ gram) * v).sum(dim=-1)  # [Hkv, group, n]
    return squared.clamp_min(0).sqrt().mean(dim=1)


def average_rotation(rotary, start: int, horizon: int, head_dim: int, like: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation averaged over positions ``[start, start + horizon)`` -> ``[d, d]`` float64:
    ``mean_t (diag(cos_t) + diag(sin_t) P)`` with ``P q = rotate_half(q)``, from the model's own ``rotary`` module
    (called on ``like``'s dtype and device, as the model calls it)."""
    import torch

    positions = torch.arange(start, start + horizon, device=like.device)[None]
    cos, sin = rotary(like, positions)
    cos, sin = cos[0].double().mean(dim=0), sin[0].double().mean(dim=0)
    half = head_dim // 2
    turn = torch.zeros(head_dim, head_dim, dtype=torch.float64, device=cos.device)
    turn[:half, half:] = -torch.eye(half, dtype=torch.float64, device=cos.device)
    turn[half:, :half] = torch.eye(half, dtype=torch.float64, device=cos.device)
    return torch.diag(cos) + sin[:, None] * turn


def expected_attention(
    moments: tuple,
    keys: torch.Tensor,
    values: torch.Tensor,
    rotation: torch.Tensor,
    sinks: int = QUERY_SINKS,
    dead: torch.Tensor | None = None,
) -> torch.Tensor:
    """ExpectedAttention's score (module docstring) of keys and values ``[1, Hkv, n, d]`` under query statistics
    ``moments`` (:func:`~fi_toolkit.signals.formulas.add_query_moments`, ``Hq`` heads) and the averaged rotation
    ``rotation`` (:func:`average_rotation`) -> ``[Hkv, n]`` float64. ``dead [Hkv, n]`` (an uneven cache's pad
    slots): zero weight in the softmax, which runs over the live slots, and a score of 0."""
    import math

    import torch

    count, total, outer = moments
    hkv, n, d = keys.shape[1:]
    if n <= sinks:
        raise FIError(f"expected_attention needs more than {sinks} slots (its sinks), got {n}")
    mean = total.double() / count  # [Hq, d]
    cov = outer.double() / count - mean[:, :, None] * mean[:, None, :]
    rot = rotation.to(mean.device)
    mean, cov = mean @ rot.T, rot @ cov @ rot.T
    group = mean.shape[0] // hkv
    k = keys[0, :, sinks:].double().to(mean.device).repeat_interleave(group, dim=0)  # [Hq, n - sinks, d]
    logits = (k @ mean[:, :, None])[..., 0] / math.sqrt(d) + ((k @ cov) * k).sum(dim=-1) / d / 2
    if dead is not None:
        hidden = dead[:, sinks:].to(logits.device).repeat_interleave(group, dim=0)
        logits = logits.masked_fill(hidden, float("-inf"))
    scores = torch.softmax(logits, dim=-1).view(hkv, group, n - sinks).mean(dim=1)
    scores = scores * values[0, :, sinks:].double().to(scores.device).norm(dim=-1)
    return torch.cat([scores.new_full((hkv, sinks), scores.max().item() + 1), scores], dim=1)


def tova(last_query: torch.Tensor, keys: torch.Tensor, dead: torch.Tensor | None = None) -> torch.Tensor:
    """TOVA's score (module docstring) of keys ``[1, Hkv, n, d]`` under the last row's rotated query
    ``[Hq, d]`` -> ``[Hkv, n]`` float64. ``dead [Hkv, n]`` (an uneven cache's pad slots): zero weight, each query
    head's softmax over its KV head's live slots."""
    import math

    import torch

    hkv, n, d = keys.shape[1:]
    q = last_query.double()
    k = keys[0].double().to(q.device).repeat_interleave(q.shape[0] // hkv, dim=0)  # [Hq, n, d]
    logits = (k @ q[:, :, None])[..., 0] / math.sqrt(d)
    if dead is not None:
        logits = logits.masked_fill(dead.to(q.device).repeat_interleave(q.shape[0] // hkv, dim=0), float("-inf"))
    attention = torch.softmax(logits, dim=-1)[:, :-1].mean(dim=0)
    return torch.cat([attention, attention.max()[None] + 1]).expand(hkv, n)


def expected_attention_scores(s: Signals, layer: int) -> torch.Tensor:
    """:func:`expected_attention` of one layer of the signals ``s`` -> ``[Hkv, n_l]`` float64."""
    moments = None if s.query_moments is None else s.query_moments[layer]
    if moments is None or s.rotary is None:
        raise FIError(
            "expected_attention needs the statistics of the queries fed since the last "
            "compression and the model's rotary embedding; these signals carry none"
        )
    keys = s.keys[layer]
    rotation = average_rotation(s.rotary, s.seen, FUTURE_POSITIONS, keys.shape[-1], keys)
    return expected_attention(moments, keys, _values(s, layer, "expected_attention"), rotation, dead=s.dead_in(layer))


def tova_scores(s: Signals, layer: int) -> torch.Tensor:
    """:func:`tova` of one layer of the signals ``s`` -> ``[Hkv, n_l]`` float64."""
    if s.last_query is None:
        raise FIError("tova needs the last row's query; these signals carry none")
    return tova(s.last_query[layer], s.keys[layer], s.dead_in(layer))


def _out_proj(s: Signals, layer: int) -> torch.Tensor:
    if s.out_proj is not None:
        return s.out_proj[layer]
    if s.model is not None:
        from fi_toolkit.model.architectures import decoder_parts

        o_proj = getattr(decoder_parts(s.model)[0][layer].self_attn, "o_proj", None)
        if getattr(o_proj, "weight", None) is not None:
            return o_proj.weight
    raise FIError("the learned policy's wo_vnorm needs the attention's o_proj weight; these signals carry none")


def _values(s: Signals, layer: int, name: str) -> torch.Tensor:
    if s.values is None:
        raise FIError(f"the learned policy's {name} needs the cache's values; these signals carry none")
    return s.values[layer]


def _accumulated(s: Signals, layer: int) -> torch.Tensor:
    if s.accumulated is None:
        raise FIError(
            "the learned policy's acc_wo_vnorm needs accumulated attention; these signals were tracked without it"
        )
    return s.accumulated[layer].double()


def learned_matrix(s: Signals, layer: int, names, entropy_of: str, tau: float) -> torch.Tensor:
    """The features ``names`` (of :data:`LEARNED_FEATURES`) of every slot of one layer -> ``[F, Hkv, n_l]``
    float64."""
    import torch

    hkv, n = int(s.keys[layer].shape[1]), s.slots(layer)
    device = s.keys[layer].device
    rows, wo = [], None
    for name in names:
        if name == "depth":
            rows.append(torch.full((hkv, n), layer / s.num_layers, dtype=torch.float64, device=device))
        elif name == "kv_head":
            rows.append(torch.arange(hkv, dtype=torch.float64, device=device)[:, None].expand(hkv, n))
        elif name == "keydiff":
            rows.append(keydiff(s.keys[layer], s.dead_in(layer)))
        elif name == "vnorm":
            rows.append(vnorm(_values(s, layer, name)))
        elif name in ("wo_vnorm", "acc_wo_vnorm"):
            wo = wo_vnorm(_values(s, layer, name), _out_proj(s, layer)) if wo is None else wo
            rows.append(wo if name == "wo_vnorm" else _accumulated(s, layer).to(wo.device) * wo)
        elif name == "expected_attention":
            rows.append(expected_attention_scores(s, layer).to(device))
        elif name == "tova":
            rows.append(tova_scores(s, layer).to(device))
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
