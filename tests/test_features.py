"""The learned policy's extra features (:mod:`fi_toolkit.policies.features`) against explicit loops over
slots with Python's math (no torch vector code), and their independence of the text after the
compression point."""

from __future__ import annotations

import math

import torch

from fi_toolkit import SignalConfig
from fi_toolkit.policies.features import learned_matrix
from fi_toolkit.signals.policy_view import Signals
from fi_toolkit.signals.trace import trace_prefix

P = 64
CONFIG = SignalConfig(window=8)


def _cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a)) / math.sqrt(sum(y * y for y in b))


def test_keydiff_depth_and_head_by_explicit_loops(tiny, tiny_ids):
    s = Signals.from_trace(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    layer = 2
    x = learned_matrix(s, layer, ["keydiff", "depth", "kv_head"], "produced", 1.0)
    keys = s.keys[layer][0].double().tolist()  # [Hkv][n][d]
    for h, head in enumerate(keys):
        unit = [[v / math.sqrt(sum(c * c for c in k)) for v in k] for k in head]
        anchor = [sum(u[i] for u in unit) / len(unit) for i in range(len(unit[0]))]
        for j, k in enumerate(head):
            assert math.isclose(x[0, h, j].item(), -_cos(k, anchor), rel_tol=1e-9, abs_tol=1e-12)
            assert x[1, h, j].item() == layer / s.num_layers and x[2, h, j].item() == h


def test_features_at_p_ignore_the_text_after_it(tiny, tiny_ids):
    names = ["keydiff", "depth", "kv_head", "log_accumulated", "attention"]
    full = Signals.from_trace(trace_prefix(tiny.model, tiny_ids, P, CONFIG))
    cut = Signals.from_trace(trace_prefix(tiny.model, tiny_ids[:P].clone(), P, CONFIG))
    for layer in range(full.num_layers):
        torch.testing.assert_close(
            learned_matrix(full, layer, names, "produced", 1.0), learned_matrix(cut, layer, names, "produced", 1.0)
        )
