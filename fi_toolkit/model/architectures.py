"""Which models fi_toolkit can serve, checked before any forward, and how each computes its queries.

The toolkit hooks a Llama-style decoder: ``base_model.layers[i].self_attn``, a final ``norm`` and an
LM head. Window attention recomputes the last ``w`` rotated queries of every layer from the
attention module's input, which is exact only when it repeats the module's own query path step by
step. The paths reproduced here (those of transformers' Llama 3.x, Qwen2, Qwen3, Mistral and
Phi-3 modeling files):

- a query projection: ``q_proj`` (with or without bias), or the query rows of a fused ``qkv_proj``
  (Phi-3: the first ``num_attention_heads * head_dim`` outputs);
- Qwen3's per-head ``q_norm``;
- the RoPE of the model's own rotary embedding (``position_embeddings``, which carries any rope
  scaling, e.g. Llama 3's ``llama3`` type or Phi-3's ``longrope``), applied by the
  ``apply_rotary_pos_emb`` of the module's modeling file (which handles partial rotary).

:func:`check_model` refuses, in one line naming what is missing, any model whose attention holds
anything else (another norm, a soft-cap, a query path of another shape). :func:`context_limit` says
up to how many positions the toolkit is exact for a model it serves: the declared context, narrowed
by a sliding attention window (evicting entries would change which keys the window spans) or by
``longrope``'s original context (beyond it the model switches every position to other
frequencies in the middle of a run).
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref

import torch

from fi_toolkit.errors import FIError

QUERY_PROJECTIONS = ("q_proj", "qkv_proj")
ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "q_norm", "k_norm"}
ATTENTION_ATTRIBUTES = ("head_dim", "scaling", "layer_idx")
LAYER_TYPES = {"full_attention", "sliding_attention"}


def apply_rope(attn_module: torch.nn.Module):
    """The ``apply_rotary_pos_emb`` of the attention module's own modeling file, or None."""
    return getattr(sys.modules[type(attn_module).__module__], "apply_rotary_pos_emb", None)


@functools.cache
def _takes_position_embeddings(cls: type) -> bool:
    return "position_embeddings" in inspect.signature(cls.forward).parameters


def _attention_lacks(attn: torch.nn.Module) -> str | None:
    """What this attention module lacks for window queries to repeat its own, or None."""
    if not any(isinstance(getattr(attn, name, None), torch.nn.Module) for name in QUERY_PROJECTIONS):
        return "its attention has no query projection (q_proj or qkv_proj)"
    if getattr(attn, "qkv_proj", None) is not None and not hasattr(
        getattr(attn, "config", None), "num_attention_heads"
    ):
        return "its fused qkv_proj attention has no config to split the queries off by"
    for name in ATTENTION_ATTRIBUTES:
        if not hasattr(attn, name):
            return f"its attention has no '{name}'"
    unknown = sorted(name for name, _ in attn.named_children() if name not in ATTENTION_PARTS)
    if unknown:
        return f"its attention has parts the window queries do not reproduce ({', '.join(unknown)})"
    q_norm = getattr(attn, "q_norm", None)
    if q_norm is not None and getattr(q_norm, "weight", None) is not None and q_norm.weight.numel() != attn.head_dim:
        return f"its q_norm normalises {q_norm.weight.numel()} features, not one head's {attn.head_dim}"
    if not _takes_position_embeddings(type(attn)):
        return "its attention takes no rotary position_embeddings"
    if apply_rope(attn) is None:
        return f"no apply_rotary_pos_emb in {type(attn).__module__}"
    return None


def _lacks(model: torch.nn.Module) -> str | None:
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model, not a decoder-only causal LM"
    base = model.base_model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        return "no decoder layers at base_model.layers (a Llama-style decoder: layers, final norm, LM head)"
    if not isinstance(getattr(base, "norm", None), torch.nn.Module):
        return "no final norm at base_model.norm"
    if model.get_output_embeddings() is None:
        return "no LM head"
    if not isinstance(getattr(base, "rotary_emb", None), torch.nn.Module):
        return "no rotary position embedding (base_model.rotary_emb)"
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            return f"decoder layer {i} has no self_attn"
        lacks = _attention_lacks(attn)
        if lacks:
            return lacks
    other = sorted(set(getattr(config, "layer_types", None) or ()) - LAYER_TYPES)
    if other:
        return f"layers of type {', '.join(other)} (only full and sliding-window attention are served)"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "attention logit soft-capping, which window attention does not reproduce"
    return None


_ACCEPTED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # models check_model has accepted


def check_model(model: torch.nn.Module) -> None:
    """Raise :class:`FIError` with one line naming what ``model`` lacks, before any forward.

    A model is checked once: an accepted one is remembered (weakly) and later calls return at once, so
    the check costs one walk over the layers per command however many forwards follow."""
    if model in _ACCEPTED:
        return
    lacks = _lacks(model)
    if lacks:
        raise FIError(f"{type(model).__name__} is not supported by fi_toolkit: {lacks}")
    _ACCEPTED.add(model)


def decoder_parts(model: torch.nn.Module):
    """(decoder layers, final norm, LM head) of a model :func:`check_model` accepts."""
    check_model(model)
    return model.base_model.layers, model.base_model.norm, model.get_output_embeddings()


def _sliding_window(config) -> int | None:
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return int(window)


def _longrope_original(config) -> int | None:
    rope = getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type") == "longrope":
        original = rope.get("original_max_position_embeddings")
        return int(original) if original is not None else None
    return None


def context_limits(config) -> dict[str, int]:
    """Every bound on the positions a run may reach, by what sets it (empty when nothing does)."""
    limits = {
        "context": getattr(config, "max_position_embeddings", None),
        "sliding attention window": _sliding_window(config),
        "longrope original context": _longrope_original(config),
    }
    return {why: int(n) for why, n in limits.items() if n is not None}


def context_limit(config) -> int | None:
    """Positions ``[0, n)`` a run may span and stay exact: the tightest of :func:`context_limits`."""
    limits = context_limits(config)
    return min(limits.values()) if limits else None


def context_phrase(config) -> str:
    """``"context of 4,096 tokens"``, or what narrows it: ``"sliding attention window of 512 tokens"``."""
    limits = context_limits(config)
    why = min(limits, key=limits.get)
    return f"{why} of {limits[why]:,} tokens"


def queries(attn_module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """Queries of ``hidden_states [B, n, d]`` before RoPE, as the module computes them -> ``[B, Hq, n, hd]``."""
    if getattr(attn_module, "qkv_proj", None) is not None:  # Phi-3: one fused projection, the query rows first
        width = attn_module.config.num_attention_heads * attn_module.head_dim
        q = attn_module.qkv_proj(hidden_states)[..., :width]
    else:
        q = attn_module.q_proj(hidden_states)
    q = q.view(*hidden_states.shape[:-1], -1, attn_module.head_dim)
    if getattr(attn_module, "q_norm", None) is not None:  # Qwen3: RMSNorm over each head's query
        q = attn_module.q_norm(q)
    return q.transpose(1, 2)
