"""Attention with a per-key bias whose backward computes only what the Fisher estimator needs.

The estimator (:mod:`fi_toolkit.probe.estimator`) takes ``samples`` backward passes through one
forward, each from the final hidden states to the bias ``b [H_kv, p]`` on the ``p`` prefix keys of
every layer; the weights and the prefix's keys and values are constants. Autograd through the model's
own attention (sdpa's math path, once the mask needs a gradient) expands the keys and values to every
query head, keeps the logits and the weights, and computes key and value gradients for all ``p + n``
keys; on the CPU that was 85 % of a backward pass. Here one function does the forward and the
backward by hand, per KV group (the ``g`` query heads of a group share one matrix product):

* forward: ``S = scale Q K^T + mask + [b, 0]``, ``P = softmax(S)``, ``O = P V``; keeps ``P``.
* backward from ``dO``: ``dS = P * (dO V^T - rowsum(dO * O))`` (the softmax's backward),
  ``db = sum over the group's queries of dS[:, :p]``, ``dQ = scale dS K``, and the key and value
  gradients of the fed keys only (``j >= p``): ``dK = scale dS^T Q``, ``dV = P^T dO``; each of ``dQ``, ``dK``,
  ``dV`` only where autograd asks for it (not in the first layer, whose queries, keys and values come from the
  embeddings).

The same arithmetic as eager attention, in the order a float32 implementation may round differently
(tests/test_estimator.py compares with autograd through eager attention and with forward-mode AD).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ROWS = 64  # query rows per block of the backward: a block's dS [H_kv, 64, K] fits a core's cache at K of a few thousand


class BiasedAttention(torch.autograd.Function):
    """``apply(query [1, H_q, n, hd], key [1, H_kv, K, hd], value [1, H_kv, K, hd], mask [1, 1, n, K]
    (additive, constant), bias [H_kv, p] (p <= K), scale)`` -> output ``[1, n, H_q, hd]`` (the layout
    transformers' attention functions return)."""

    @staticmethod
    def forward(ctx, query, key, value, mask, bias, scale):
        _, heads, n, head_dim = query.shape
        kv_heads, keys, p = key.shape[1], key.shape[2], bias.shape[-1]
        group = heads // kv_heads
        q = query[0].reshape(kv_heads, group * n, head_dim)
        k, v = key[0], value[0]
        logits = torch.bmm(q, k.transpose(1, 2)).mul_(scale)  # [H_kv, g n, K]
        logits.view(kv_heads, group, n, keys).add_(mask[0, 0].to(logits.dtype))
        logits[..., :p] += bias.to(logits.dtype)[:, None, :]
        weights = torch.softmax(logits, dim=-1)
        del logits
        out = torch.bmm(weights, v)  # [H_kv, g n, hd]
        ctx.save_for_backward(q, k, v.transpose(1, 2).contiguous(), weights, out)
        ctx.scale, ctx.shape, ctx.p = scale, (heads, n, head_dim), p
        return out.view(heads, n, head_dim).transpose(0, 1).unsqueeze(0)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v_t, weights, out = ctx.saved_tensors
        heads, n, head_dim = ctx.shape
        kv_heads, p, scale = k.shape[0], ctx.p, ctx.scale
        d_out = grad_out[0].transpose(0, 1).reshape(kv_heads, -1, head_dim)  # [H_kv, g n, hd]
        delta = (d_out * out).sum(-1, keepdim=True)  # rowsum(dP * P) = rowsum(dO * O)
        wants_query, wants_key = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        d_bias = torch.zeros(kv_heads, k.shape[1], dtype=k.dtype, device=k.device)
        d_query = torch.empty_like(q) if wants_query else None
        d_key_fed = torch.zeros(kv_heads, k.shape[1] - p, head_dim, dtype=k.dtype, device=k.device)
        for a in range(0, q.shape[1], ROWS):  # query rows in blocks, so dS stays in the CPU's cache
            rows = slice(a, a + ROWS)
            d_logits = torch.bmm(d_out[:, rows], v_t)  # dP [H_kv, rows, K]
            d_logits.sub_(delta[:, rows]).mul_(weights[:, rows])  # dS
            d_bias += d_logits.sum(1)
            if wants_query:  # not in the first layer, whose queries come from the embeddings (no bias upstream)
                torch.bmm(d_logits, k, out=d_query[:, rows])
            if wants_key:
                d_key_fed += torch.bmm(d_logits[..., p:].transpose(1, 2), q[:, rows])
        if wants_query:
            d_query = d_query.mul_(scale).view(heads, n, head_dim).unsqueeze(0)
        d_key = F.pad(d_key_fed.mul_(scale), (0, 0, p, 0)).unsqueeze(0) if wants_key else None
        d_value = None
        if ctx.needs_input_grad[2]:
            d_value = F.pad(torch.bmm(weights[..., p:].transpose(1, 2), d_out), (0, 0, p, 0)).unsqueeze(0)
        return d_query, d_key, d_value, None, d_bias[:, :p], None
