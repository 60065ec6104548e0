"""The KL divergence of Forward Influence (docs/method.md, "Forward Influence", "The KL"): the
arithmetic alone, shared by the probe, the gradient estimator's checks and the compressed replays.

With reference logits ``z`` and evicted logits ``y`` over the full vocabulary ``V``,
``log p = z - LSE(z)`` and ``log q = y - LSE(y)``::

    KL(P || Q) = sum_v p_v (z_v - y_v) / sum_v p_v + LSE(y) - LSE(z)    (nats)

which is ``sum_v p_v (log p_v - log q_v)``. The logit differences are formed in float64 (exact for
float32 inputs), the normalisers accumulate in float64 and ``p`` is renormalised, so the result is
accurate to ~1e-8 at any constant logit shift. Nothing is clamped: a value below
``-NEGATIVE_KL_TOLERANCE`` is a numerical fault and raises.
"""

from __future__ import annotations

import torch

from fi_toolkit.errors import FIError

NEGATIVE_KL_TOLERANCE = 1e-6  # the KL below is accurate to ~1e-8; anything lower than this is a bug, not noise


def log_sum_exp(logits: torch.Tensor) -> torch.Tensor:
    """``log sum_v exp(z_v)`` over the last axis of float32 ``logits``, the sum accumulated in float64 -> float64."""
    top = logits.max(dim=-1, keepdim=True).values
    return top.squeeze(-1).double() + torch.exp(logits - top).sum(dim=-1, dtype=torch.float64).log()


def reference_terms(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 reference ``logits [n, V]`` -> (probabilities, logits, normalisers), float64, as
    :func:`kl_from_reference` reads them (computed once per reference position)."""
    logits = logits.float()
    lse = log_sum_exp(logits)
    wide = logits.double()
    return torch.exp(wide - lse[:, None]), wide, lse


def kl_from_reference(
    ref_p: torch.Tensor,
    ref_logits: torch.Tensor,
    ref_lse: torch.Tensor,
    logits: torch.Tensor,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """``KL(P_ref || P)`` per row over the full vocabulary -> ``[B, n]`` float32.

    ``ref_p``, ``ref_logits [n, V]`` and ``ref_lse [n]`` (float64, from float32 logits) describe the
    reference (computed once per position); ``logits [B, n, V]`` the evicted rows. With ``log p = z - LSE(z)``
    and ``log q = y - LSE(y)``: ``KL = sum_v p_v (z_v - y_v) / sum_v p_v + LSE(y) - LSE(z)``.

    Why not a float32 log-softmax: its normaliser is off by up to ~1e-6 nats, which shifts a whole
    row's KL by that much, the size of per-token FI on far chunks (a real run hit -1e-6); and when an
    eviction shifts every logit by a constant ``c`` (removing a sink does), float32 differences lose
    ``~c * 6e-8``. Here the logit differences are exact (float64), the normalisers accumulate in
    float64, and ``p`` is renormalised, so the result is accurate to ~1e-8 at any shift. Identical
    logits give exactly 0. Nothing is clamped: a value below ``-NEGATIVE_KL_TOLERANCE`` is an error.
    ``lse`` passes the rows' own :func:`log_sum_exp` where the caller has it already.
    """
    logits = logits.float()
    lse = log_sum_exp(logits) if lse is None else lse
    p = ref_p.double()
    diff = logits.double().neg_().add_(ref_logits)
    kl = torch.einsum("nv,bnv->bn", p, diff) / p.sum(dim=-1) + (lse - ref_lse)
    if kl.numel() and float(kl.min()) < -NEGATIVE_KL_TOLERANCE:
        raise FIError(
            f"negative KL divergence ({float(kl.min()):.3g}): the two distributions were not "
            "computed consistently (a numerical fault, not a result)"
        )
    return kl.float()
