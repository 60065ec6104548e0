"""Compute precision: weights stored in bfloat16 or float16, arithmetic in float32.

Per-token Forward Influence is a difference of ~1e-6 to 1e-4 nats between two runs that differ by
one cache entry. In bfloat16 arithmetic every activation is rounded to 8 significant bits, and a
run that differs by one entry rounds differently everywhere after it: its FI is ~1e-3 nats of
rounding whatever the entry (SmolLM2, *Alice*, p = 512: Spearman 0.41 with float32). So by default
a reduced-precision model keeps its weights in that dtype (the memory saving) and computes in
float32: each module's weights are cast to float32 for its own forward and the stored copy is put
back after, so at most one module's float32 weights exist at a time. The model this measures is the
float32 model with rounded weights, a smooth function of the cache (docs/method.md, "Precision").

:func:`float64_compute` makes a model compute in float64 for a block: the FI oracle's reproducible estimates.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from fi_toolkit.errors import FIError

_COMPUTE_ATTR = "_fi_compute_dtype"
REDUCED = (torch.bfloat16, torch.float16)


def weight_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype activations, caches and attention masks have: float32 when upcast, else the weights'."""
    return getattr(model, _COMPUTE_ATTR, None) or weight_dtype(model)


def _owns_weights(module: torch.nn.Module) -> bool:
    return any(p.is_floating_point() for p in module.parameters(recurse=False))


def upcast_compute(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model`` compute in float32 while its weights stay stored in their reduced dtype.

    Every module that owns weights (linear, embedding, norm) gets a pre-hook that swaps its
    parameters' storage for float32 copies and a post-hook (run even when the forward raises) that
    swaps the stored ones back. A no-op for a float32 model or one already upcast. Returns ``model``.
    """
    if weight_dtype(model) not in REDUCED or getattr(model, _COMPUTE_ATTR, None) is not None:
        return model
    stored: dict[int, torch.Tensor] = {}

    def widen(module, _args):
        for p in module.parameters(recurse=False):
            if p.dtype in REDUCED and id(p) not in stored:  # (float64 inside float64_compute: left as it is)
                stored[id(p)] = p.data
                p.data = p.data.float()

    def narrow(module, _args, _output):
        for p in module.parameters(recurse=False):
            if id(p) in stored:
                p.data = stored.pop(id(p))

    for module in model.modules():
        if _owns_weights(module):
            module.register_forward_pre_hook(widen)
            module.register_forward_hook(narrow, always_call=True)
    setattr(model, _COMPUTE_ATTR, torch.float32)
    return model


@contextmanager
def float64_compute(model: torch.nn.Module):
    """Inside the block ``model`` computes in float64: every floating parameter and buffer not already float64
    is widened in place (the same ``Parameter`` objects, new float64 data on its own device), and an upcast
    model's compute dtype reads float64, so activations, caches and masks are float64 too. On exit each one gets
    its stored data back, bit for bit. Costs 8 bytes per weight for the block's duration, beside the stored ones.

    What it is for: a float32 reduction's result depends on its order, which a BLAS picks by thread count
    and CPU, at ~1e-7 relative; in float64 the same orders differ at ~1e-16 (the FI oracle's estimates,
    :mod:`fi_toolkit.probe.oracle`). The model's own casts still apply (Llama's RMSNorm normalises in float32).
    """
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()}
    stored = [(t, t.data) for t in tensors.values() if t.dtype != torch.float64]
    if any(t.device.type == "mps" for t, _ in stored):
        raise FIError("float64 arithmetic is not available on MPS: run the FI oracle with precision=model")
    upcast = getattr(model, _COMPUTE_ATTR, None)
    try:
        for t, data in stored:
            t.data = data.to(torch.float64)
        if upcast is not None:
            setattr(model, _COMPUTE_ATTR, torch.float64)
        yield model
    finally:
        for t, data in stored:
            t.data = data
        if upcast is not None:
            setattr(model, _COMPUTE_ATTR, upcast)
