"""Evaluation on text: per document, one shared prefill and full-cache
reference, then for the full cache and every policy a teacher-forced replay
(:func:`fi_toolkit.compress.replay.replay`) and a free greedy generation compared with the full cache's.

Tables (one row per ...):

- ``positions``: position of every replay (KL, top-1 agreement, both NLLs, entries attended to,
  ``segment``: how many compressions precede the position).
- ``segments``: interval after each compression (its mean KL and top-1 agreement).
- ``replays``: replay (means over positions, ΔNLL = mean NLL compressed - full, the realised kept
  share, the free generation's first divergence and agreement).

An oracle (``fi-oracle``: at each compression it looks ahead to the next ``interval`` tokens of the
replayed text, :mod:`fi_toolkit.compress.lookahead`) is replayed like a policy; it has no free generation
(nothing to look ahead to), and the summaries mark it (``oracle``).

The ``full`` rows (no policy) replay the full cache through the same block forwards: their KL is
the arithmetic's noise floor (block vs chunked forwards, ~1e-10 nats in float32 on SmolLM2).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from fi_toolkit.compress.decoder import signal_config_for
from fi_toolkit.compress.future import continue_ids
from fi_toolkit.compress.replay import ReplayResult, SharedPrompt, replay
from fi_toolkit.compress.sampling import GREEDY
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.text_setting import TextSetting
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.policies import Policy
from fi_toolkit.signals.trace import SignalConfig

FULL = "full"


def policy_columns(policy: Policy | None) -> dict:
    """``policy``, ``budget`` and ``retention`` (the kept share the budget asks for; 1 for the full cache,
    NaN for a token count) of a result row."""
    if policy is None:
        return {"policy": FULL, "budget": "keep=1", "retention": 1.0}
    b = policy.budget
    share = b.is_share
    retention = (b.amount if b.side == "keep" else 1 - b.amount) if share else float("nan")
    return {"policy": policy.name, "budget": b.label, "retention": retention}


@torch.no_grad()
def free_generation(shared: SharedPrompt, policy: Policy | None, tokens: int, interval: int) -> list[int]:
    """Greedy tokens after the shared prompt under ``policy``, as :func:`fi_toolkit.compress.decoder.generate`
    decodes them (EOS does not stop it; compression every ``interval`` generated tokens)."""
    decoder, _ = shared.decoder.fork(policy, interval=interval)
    try:
        with ragged_attention(decoder.model):
            return decoder.decode(shared.logits, GREEDY, tokens).tokens
    finally:
        decoder.close()


def divergence(tokens: list[int], reference: list[int]) -> tuple[int, float]:
    """(index of the first token that differs, ``len`` when none does; share of equal tokens position by position)."""
    n = min(len(tokens), len(reference))
    same = np.asarray(tokens[:n]) == np.asarray(reference[:n])
    first = int(np.argmin(same)) if not same.all() else n
    return first, float(same.mean()) if n else float("nan")


def _segments(result: ReplayResult) -> np.ndarray:
    """Per row, the number of compressions that hid something from its query (a compression that had
    seen ``seen`` tokens affects positions ``>= seen``)."""
    seen = np.asarray([c.seen for c in result.compressions], dtype=np.int64)
    return np.searchsorted(np.sort(seen), result.positions.numpy(), side="right")


def _tables(
    result: ReplayResult,
    policy: Policy | None,
    keys: dict,
    free: tuple[int, float] | None,
    free_tokens: int,
    seconds: float,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    cols = {**keys, **policy_columns(policy)}
    positions = result.table()
    positions["segment"] = _segments(result)
    for k, v in reversed(list(cols.items())):
        positions.insert(0, k, v)
    steps = [0] + [c.seen for c in result.compressions]
    seg = (
        positions.groupby("segment", sort=True)
        .agg(
            first_position=("position", "min"),
            last_position=("position", "max"),
            mean_kl=("kl", "mean"),
            top1_agreement=("top1_agree", "mean"),
            positions=("kl", "size"),
        )
        .reset_index()
    )
    seg.insert(1, "compressed_at_seen", [steps[s] if s else 0 for s in seg["segment"]])
    for k, v in reversed(list(cols.items())):
        seg.insert(0, k, v)
    kl = result.kl.double()
    summary = {
        **cols,
        "positions": int(kl.numel()),
        "compressions": len(result.compressions),
        "mean_kl": float(kl.mean()),
        "median_kl": float(kl.median()),
        "p95_kl": float(torch.quantile(kl, 0.95)),
        "max_kl": float(kl.max()),
        "top1_agreement": float(result.top1_agree.double().mean()),
        "mean_nll_full": float(result.nll_full.double().mean()),
        "mean_nll_compressed": float(result.nll_compressed.double().mean()),
        "delta_nll": float((result.nll_compressed.double() - result.nll_full.double()).mean()),
        "kept_share": float((result.entries.double() / (result.positions.double() + 1)).mean()),
        "free_tokens": free_tokens,
        "free_first_divergence": free[0] if free else np.nan,
        "free_agreement": free[1] if free else np.nan,
        "seconds": round(seconds, 3),
    }
    return positions, seg, summary


@dataclass
class TextContext:
    """What every policy's replay of one sequence shares: the sequence (with its generated future), the
    prefill and full-cache reference (:class:`~fi_toolkit.compress.replay.SharedPrompt`) and the full cache's
    free generation. Parts of one document reuse it when they follow each other on a rank."""

    ids: torch.Tensor
    keys: dict
    config: SignalConfig
    shared: SharedPrompt
    reference_free: list[int] | None


def text_context(
    model,
    ids: torch.Tensor,
    name: str,
    policies: list[Policy],
    setting: TextSetting,
    config: SignalConfig | None = None,
    prefill_chunk: int = 2048,
) -> TextContext:
    """The shared part of :func:`evaluate_text` for sequence ``ids`` (see there)."""
    setting.check()
    ids = torch.as_tensor(ids).flatten().long()
    p = setting.prompt
    if setting.future.generated:
        if ids.numel() < p:
            raise FIError(f"'{name}' has {ids.numel():,} tokens, fewer than the {p:,}-token prompt")
        ids = continue_ids(model, ids[:p], setting.future, prefill_chunk)
    else:
        if ids.numel() < setting.length:
            raise FIError(
                f"'{name}' has {ids.numel():,} tokens but length asks for {setting.length:,}", parameter="length"
            )
        ids = ids[: setting.length]
    config = config or signal_config_for(policies[0] if policies else None)
    shared = SharedPrompt(model, ids, p, config, prefill_chunk, capacity=p + setting.free_tokens)
    reference_free = (
        free_generation(shared, None, setting.free_tokens, setting.interval) if setting.free_tokens else None
    )
    return TextContext(ids, {"document": name, "future": setting.future.label}, config, shared, reference_free)


def evaluate_text(
    model,
    ids: torch.Tensor,
    name: str,
    policies: list[Policy],
    setting: TextSetting,
    config: SignalConfig | None = None,
    prefill_chunk: int = 2048,
    progress=None,
    runs: slice = slice(None),
    context: TextContext | None = None,
) -> dict[str, pd.DataFrame]:
    """The full cache and every policy on one token sequence -> ``positions``, ``segments``, ``replays``.

    ``ids``: the document's tokens (a ``document`` future: the first ``setting.length`` are used) or
    the prompt alone (a generated future: the continuation is generated here). ``config``: the signal
    options every policy shares (by default the first policy's). ``runs``: only that block of
    ``[full cache, *policies]`` (a part of a document), with the document's ``context``
    (:func:`text_context`) when its parts share one; the blocks' tables, concatenated, are the whole's."""
    context = context or text_context(model, ids, name, policies, setting, config, prefill_chunk)
    ids, p, shared = context.ids, setting.prompt, context.shared
    positions, segments, summaries = [], [], []
    block = [None, *policies][runs]
    for i, policy in enumerate(block):
        t0 = time.perf_counter()
        result = replay(
            model, ids, p, policy, setting.interval, context.config, prefill_chunk=prefill_chunk, shared=shared
        )
        free = None
        if context.reference_free is not None and not getattr(policy, "sees_future", False):
            # an oracle has nothing to look ahead to in free generation: its free columns stay empty
            tokens = (
                context.reference_free
                if policy is None
                else free_generation(shared, policy, setting.free_tokens, setting.interval)
            )
            free = divergence(tokens, context.reference_free)
        pos, seg, summary = _tables(result, policy, context.keys, free, setting.free_tokens, time.perf_counter() - t0)
        positions.append(pos)
        segments.append(seg)
        summaries.append(summary)
        if progress:
            progress(i + 1, len(block))
    return {
        "positions": pd.concat(positions, ignore_index=True),
        "segments": pd.concat(segments, ignore_index=True),
        "replays": pd.DataFrame(summaries),
    }
