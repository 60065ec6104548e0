"""The training rows of ``fi fit-data`` (:func:`fit_rows`): one per document, layer ``l``, KV head ``h`` and
candidate position ``j in [sinks, p - w)``: the features of :data:`fi_toolkit.policies.learned.fitted.FEATURES`
(computed by the policy's own :func:`~fi_toolkit.policies.learned.fitted.feature_matrix` from the prefill's
signals) and the target, the Fisher estimate of FI with the bias on that one layer's KV head
(:func:`fi_toolkit.probe.estimator.fisher_fi`'s ``head_fi``), the mean over the chunks. Both learners fit
them (:mod:`fi_toolkit.fit.ridge`, :mod:`fi_toolkit.fit.lambdarank`); the surrogate's label factory computes
its labels with them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from fi_toolkit.errors import FIError
from fi_toolkit.policies.learned.features import EXTRA, ROW_FEATURES, learned_matrix
from fi_toolkit.policies.learned.fitted import FEATURES, feature_matrix
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.signals.policy_view import Signals
from fi_toolkit.signals.trace import Trace

KEYS = ["document", "layer", "head", "position"]
SIGNAL_EXTRA = tuple(f for f in EXTRA if f not in ROW_FEATURES)  # columns fit_rows adds for the learned policy


def fit_rows(
    model,
    doc,
    trace: Trace,
    chunks: Sequence[Chunk],
    sinks: int = 0,
    samples: int = 16,
    seed: int = 0,
    on_progress=None,
    *,
    chunk_columns: Sequence[str] = (),
    features: bool = True,
) -> pd.DataFrame:
    """Training rows of one document (module docstring): columns ``document, layer, head, position, fi``
    and one per feature; ``L * H_kv * (p - w - sinks)`` rows. ``chunk_columns``: one name per chunk, a column
    of that chunk's FI each beside their mean ``fi`` (the label factory's near and far); ``features=False``
    leaves the feature columns out."""
    p, w = trace.prefix_len, trace.config.window
    if not 0 <= sinks < p - w:
        raise FIError(f"sinks {sinks} leaves no candidates in [0, {p - w})", parameter="sinks")
    if chunk_columns and len(chunk_columns) != len(chunks):
        raise FIError(f"{len(chunk_columns)} chunk column name(s) for {len(chunks)} chunk(s)")
    est = fisher_fi(model, trace, doc.ids, chunks, samples, seed, on_progress=on_progress)
    fi = est.head_fi.mean(dim=-1)[..., sinks : p - w]  # [L, H_kv, m]
    n_layers, n_heads, m = fi.shape
    grid = np.stack(np.meshgrid(np.arange(n_layers), np.arange(n_heads), np.arange(sinks, p - w), indexing="ij"))
    table = pd.DataFrame(
        {
            "document": doc.name,
            "layer": grid[0].ravel(),
            "head": grid[1].ravel(),
            "position": grid[2].ravel(),
            "fi": fi.numpy().ravel(),
        }
    )
    for c, name in enumerate(chunk_columns):
        table[name] = est.head_fi[..., sinks : p - w, c].numpy().ravel()
    if not features:
        return table
    s = Signals.from_trace(trace)
    names = list(FEATURES)
    x = torch.stack(
        [
            feature_matrix(s, layer, names, trace.config.entropy_of, trace.config.tau)[..., sinks : p - w]
            for layer in range(trace.num_layers)
        ]
    )  # [L, F, H_kv, m]
    for k, name in enumerate(names):
        table[name] = x[:, k].cpu().numpy().ravel()
    for name in SIGNAL_EXTRA:  # the learned policy's features that need the signals (its others need none)
        v = torch.stack([learned_matrix(s, layer, [name], "produced", 1.0)[0] for layer in range(trace.num_layers)])
        table[name] = v[..., sinks : p - w].cpu().numpy().ravel()
    return table
