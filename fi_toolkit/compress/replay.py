"""Decoding replay (docs/method.md, "Decoding replay"): a known token sequence fed to a compressed
cache exactly as compressed decoding would see it, teacher-forced, scored against the full cache.

``ids [N]`` splits into a prompt ``ids[:p]`` and a continuation. :func:`replay` treats the
continuation as if :func:`fi_toolkit.compress.decoder.generate` had produced it with ``max_new_tokens =
N - p``: :meth:`~fi_toolkit.compress.decoder.CompressedDecoder.prefill` on the prompt (compressed or kept
by the policy's rule), then the continuation through the decoder's
:meth:`~fi_toolkit.compress.decoder.CompressedDecoder.feed_blocks`: one forward per block, the decoder
compressing back to the budget after every ``interval`` fed tokens, where ``generate`` would (its
:class:`~fi_toolkit.compress.decoder.Schedule`'s points), and the block forward records the signals that
single steps record.

Positions (the convention): row ``r`` of every per-position tensor is position ``t = p - 1 + r``,
``r = 0 .. N - p - 1``, whose distribution predicts ``ids[t + 1]``. Row 0 is the prompt's last
position (before any compression: the prompt is compressed after it); decoding feeds ``ids[p .. N - 2]``
(``ids[N - 1]`` is only predicted). The full-cache reference is one plain chunked forward of
``ids[:N - 1]`` through a standard cache.

Memory: logits exist for one block at a time (``interval`` rows, or ``max_block``), the reference's
final hidden states for the ``N - p`` scored rows (``N - p x d``), never an ``N x V`` matrix
(unless ``keep_logits``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
from transformers import DynamicCache

from fi_toolkit.compress.budget_check import check_budget
from fi_toolkit.compress.decoder import CompressedDecoder, Compression
from fi_toolkit.compress.lookahead import Lookahead
from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import check_model, context_limit, context_phrase, decoder_parts
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.policies import Policy
from fi_toolkit.policies.fi_oracle import check_decoding_oracle
from fi_toolkit.probe.kl import kl_from_reference, log_sum_exp, reference_terms
from fi_toolkit.signals.trace import SignalConfig


@dataclass
class ReplayResult:
    """Per-position results, rows ``t = prompt_len - 1 .. N - 2`` (see the module docstring).

    ``kl``: ``KL(P_full || P_compressed)`` over the full vocabulary (float32, computed as the probe's
    :func:`~fi_toolkit.probe.kl.kl_from_reference`); ``top1_agree``: same argmax; ``nll_full``,
    ``nll_compressed``: ``-log P(ids[t + 1])`` under each (float32, normalisers in float64);
    ``entries``: cache entries the query at ``t`` attends to in the compressed run (mean over layers,
    itself included). ``logits_full``/``logits_compressed`` ``[n, V]`` only with ``keep_logits``."""

    prompt_len: int
    interval: int
    label: str
    positions: torch.Tensor
    targets: torch.Tensor
    kl: torch.Tensor
    top1_agree: torch.Tensor
    nll_full: torch.Tensor
    nll_compressed: torch.Tensor
    entries: torch.Tensor
    compressions: list[Compression] = field(default_factory=list)
    logits_full: torch.Tensor | None = None
    logits_compressed: torch.Tensor | None = None

    @property
    def compression_steps(self) -> list[int]:
        return [c.step for c in self.compressions]

    def table(self) -> pd.DataFrame:
        """One row per position."""
        return pd.DataFrame(
            {
                "position": self.positions.numpy(),
                "target": self.targets.numpy(),
                "kl": self.kl.numpy(),
                "top1_agree": self.top1_agree.numpy(),
                "nll_full": self.nll_full.numpy(),
                "nll_compressed": self.nll_compressed.numpy(),
                "entries": self.entries.numpy(),
            }
        )

    def summary(self) -> dict:
        return {
            "label": self.label,
            "prompt_len": self.prompt_len,
            "positions": int(self.kl.numel()),
            "interval": self.interval,
            "compressions": len(self.compressions),
            "compression_steps": self.compression_steps,
            "mean_kl": float(self.kl.mean()),
            "max_kl": float(self.kl.max()),
            "top1_agreement": float(self.top1_agree.float().mean()),
            "mean_nll_full": float(self.nll_full.mean()),
            "mean_nll_compressed": float(self.nll_compressed.mean()),
        }


def _nll(logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``-log P(target)`` per row from float32 ``logits [n, V]`` and their float64 normalisers -> float32."""
    return (lse - logits.gather(1, targets[:, None])[:, 0].double()).float()


@torch.no_grad()
def _reference_hidden(model, ids: torch.Tensor, first: int, chunk: int) -> torch.Tensor:
    """Final-normed hidden states of ``ids`` at positions ``first ..`` from a plain chunked forward."""
    cache = DynamicCache(config=model.config)
    device = next(model.parameters()).device
    out = []
    for a in range(0, ids.numel(), chunk):
        b = min(ids.numel(), a + chunk)
        hidden = model.base_model(
            input_ids=ids[None, a:b].to(device),
            position_ids=torch.arange(a, b, device=device)[None],
            use_cache=True,
            **cache_kwargs(model.base_model, cache),
        ).last_hidden_state[0]
        if b > first:
            out.append(hidden[max(0, first - a) :])
    return torch.cat(out)


def _check(model, ids: torch.Tensor, p: int, policy, interval: int, compress_prompt, max_block, shared) -> None:
    """Refuse a replay that cannot run (one FIError line each) before any model work."""
    n = ids.numel()
    if not 1 <= p < n:
        raise FIError(f"the prompt length must lie in [1, {n - 1}] for a {n}-token sequence, got {p}")
    if interval < 1:
        raise FIError(f"interval must be >= 1 fed tokens, got {interval}")
    if max_block is not None and max_block < 1:
        raise FIError(f"max_block must be >= 1, got {max_block}")
    check_model(model)
    limit = context_limit(model.config)
    if limit is not None and n - 1 > limit:
        raise FIError(f"the sequence ({n - 1} fed tokens) exceeds the model's {context_phrase(model.config)}")
    if policy is not None:  # the continuation as generate(max_new_tokens=n - p) would produce it
        check_budget(policy, p, n - p, policy.compress_prompt if compress_prompt is None else compress_prompt)
        check_decoding_oracle(policy)
    if shared is not None and (shared.prompt_len != p or not torch.equal(shared.ids.cpu(), ids)):
        raise FIError("the shared prompt was prefilled for other token ids or another prompt length")


class _Scores:
    """The per-row measures of a replay, block by block (float32 logits ``[q, V]`` of the compressed run
    against the reference's final hidden states ``[N - p, d]``), concatenated at the end."""

    def __init__(self, lm_head, reference: torch.Tensor, targets: torch.Tensor, keep_logits: bool):
        self.lm_head, self.reference, self.targets, self.keep_logits = lm_head, reference, targets, keep_logits
        self.out: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("kl", "top1", "nll_c", "nll_f", "entries", "lf", "lc")
        }

    def add(self, logits: torch.Tensor, first: int, lengths: list[int]) -> None:
        """Rows ``first .. first + q - 1``; ``lengths``: every layer's cache length before them."""
        rows = slice(first, first + logits.shape[0])
        full = self.lm_head(self.reference[rows]).float()
        ref_p, ref_logits, ref_lse = reference_terms(full)
        nll_f = _nll(full, ref_lse, self.targets[rows])
        logits = logits.float()
        lse = log_sum_exp(logits)  # once, for the NLL and the KL
        out = self.out
        out["kl"].append(kl_from_reference(ref_p, ref_logits, ref_lse, logits[None], lse[None])[0])
        out["top1"].append(full.argmax(-1) == logits.argmax(-1))
        out["nll_f"].append(nll_f)
        out["nll_c"].append(_nll(logits, lse, self.targets[rows]))
        out["entries"].append(sum(lengths) / len(lengths) + 1 + torch.arange(logits.shape[0], dtype=torch.float32))
        if self.keep_logits:
            out["lf"].append(full.cpu())
            out["lc"].append(logits.cpu())

    def result(self, p: int, n: int, interval: int, policy, compressions: list[Compression]) -> ReplayResult:
        cat = {k: torch.cat(v).cpu() if v else None for k, v in self.out.items()}
        return ReplayResult(
            prompt_len=p,
            interval=interval,
            label=policy.label if policy is not None else "full",
            positions=torch.arange(p - 1, n - 1),
            targets=self.targets.cpu(),
            kl=cat["kl"],
            top1_agree=cat["top1"],
            nll_full=cat["nll_f"],
            nll_compressed=cat["nll_c"],
            entries=cat["entries"],
            compressions=compressions,
            logits_full=cat["lf"],
            logits_compressed=cat["lc"],
        )


@torch.no_grad()
def replay(
    model,
    ids: torch.Tensor,
    prompt_len: int,
    policy: Policy | None,
    interval: int,
    config: SignalConfig | None = None,
    compress_prompt: bool | None = None,
    prefill_chunk: int = 2048,
    max_block: int | None = None,
    keep_logits: bool = False,
    shared: SharedPrompt | None = None,
) -> ReplayResult:
    """Teacher-forced compressed decoding of ``ids`` after its first ``prompt_len`` tokens (module docstring).

    ``policy=None`` is the full cache. ``compress_prompt`` defaults to the policy's own (RPC: False).
    An oracle policy (``fi-oracle``) looks ahead to the next ``interval`` tokens of ``ids`` at each
    compression (:mod:`fi_toolkit.compress.lookahead`). ``max_block`` splits a block between two compression
    points into forwards of at most that many tokens (the same result, less memory); by default each block
    is one forward. ``shared``: a :class:`SharedPrompt` of the same ``ids`` and prompt, whose prefill and
    reference are reused (bitwise the same result as without it).
    """
    ids, p = torch.as_tensor(ids).flatten().long(), prompt_len
    n = ids.numel()
    _check(model, ids, p, policy, interval, compress_prompt, max_block, shared)
    ids = ids.to(next(model.parameters()).device)
    lookahead = Lookahead(ids, interval, n - 1)  # what an oracle policy may read: the tokens this replay feeds
    options = dict(interval=interval, lookahead=lookahead, keep_maps=True)
    decoder = None
    try:
        if shared is not None:
            reference, logits = shared.reference, shared.logits
            decoder, _ = shared.decoder.fork(policy, compress_prompt, **options)
        else:
            decoder = CompressedDecoder(model, policy, n, config, compress_prompt, prefill_chunk, **options)
            reference = _reference_hidden(model, ids[: n - 1], p - 1, prefill_chunk)
        scores = _Scores(decoder_parts(model)[2], reference, ids[p:], keep_logits)
        with ragged_attention(model):
            if shared is None:
                logits, _ = decoder.prefill(ids[:p])
            scores.add(logits[None], 0, [p - 1] * len(decoder.lengths()))  # the last prompt row saw p entries
            for block in decoder.feed_blocks(ids[p : n - 1], max_block):
                scores.add(block.logits, block.start + 1, block.lengths)
    finally:
        if decoder is not None:
            decoder.close()
    return scores.result(p, n, interval, policy, decoder.compressions)


class SharedPrompt:
    """One prefill and one full-cache reference, reused by the replays of ``ids`` under several
    policies (``fi eval``): :meth:`CompressedDecoder.shared` tracks every policy's signals on the
    prompt, and each replay forks it (:meth:`~fi_toolkit.compress.decoder.CompressedDecoder.fork`).
    ``config``: the signal options every policy shares (window, top-k, tau, alpha); ``capacity``: the
    most tokens a fork will hold (default: ``ids``' length; more for a longer free generation)."""

    def __init__(
        self,
        model,
        ids: torch.Tensor,
        prompt_len: int,
        config: SignalConfig | None = None,
        prefill_chunk: int = 2048,
        capacity: int | None = None,
    ):
        self.ids = torch.as_tensor(ids).flatten().long().to(next(model.parameters()).device)
        self.prompt_len = p = prompt_len
        n = self.ids.numel()
        if not 1 <= p < n:
            raise FIError(f"the prompt length must lie in [1, {n - 1}] for a {n}-token sequence, got {p}")
        self.decoder = CompressedDecoder.shared(model, max(n, capacity or 0), config, prefill_chunk)
        with torch.no_grad(), ragged_attention(model):
            self.logits, _ = self.decoder.prefill(self.ids[:p])
        self.reference = _reference_hidden(model, self.ids[: n - 1], p - 1, prefill_chunk)
