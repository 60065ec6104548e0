"""Evaluation on long-context tasks: per generated sample and protocol, one shared
prefill of what the compression may see, then the full cache and every policy answer greedily.

Protocols (:mod:`fi_toolkit.evaluation.tasks`): question-aware prefills the whole prompt, so the prefill
compression sees the question; question-agnostic prefills the context alone, compresses it, and
only then feeds the question (kvpress's context/question split). Either way the question and the
answer are fed after the prefill compression; later compressions (every ``interval`` generated
tokens) happen only for answers longer than the interval.

Per answer: ``correct`` (:func:`fi_toolkit.evaluation.tasks.score`), the free generation's first divergence
from the full cache's answer, and ``answer_kl``: the mean KL(P_full || P_compressed) over the
positions that predict the full cache's answer tokens, teacher-forced on that answer (a replay of
the question and the full cache's answer).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import pandas as pd
import torch

from fi_toolkit.compress.decoder import CompressedDecoder, Schedule, _eos_ids, signal_config_for
from fi_toolkit.compress.sampling import GREEDY
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.replay_runs import divergence, policy_columns
from fi_toolkit.evaluation.tasks import TASKS, TaskSample, check_protocol, encode_split, make_sample, score
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.policies import Policy
from fi_toolkit.probe.kl import kl_from_reference, reference_terms
from fi_toolkit.signals.trace import SignalConfig

TASK_ALIASES = {"niah": "multikey_needle", "multikey": "multikey_needle", "vartrack": "variable_tracking"}


def task_name(name: str) -> str:
    key = TASK_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in TASKS:
        raise FIError(
            f"unknown task '{name}' (tasks: {', '.join(TASKS)}; aliases: "
            f"{', '.join(f'{a}={b}' for a, b in TASK_ALIASES.items())})"
        )
    return key


@dataclass(frozen=True)
class SampleUnit:
    """One (task, context length, seed): the unit a task run saves and resumes."""

    task: str
    context: int
    seed: int
    sample: TaskSample

    @property
    def name(self) -> str:
        return f"{self.task}-{self.context}-s{self.seed}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256((self.sample.prompt + "\0" + self.sample.answer).encode()).hexdigest()

    def __len__(self) -> int:
        return self.sample.prompt_tokens


def make_units(
    tasks: list[str], contexts: list[int], samples: int, tokenizer, config=None, first_seed: int = 0
) -> list[SampleUnit]:
    return [
        SampleUnit(t, c, s, make_sample(t, tokenizer, c, s, config))
        for t in tasks
        for c in contexts
        for s in range(first_seed, first_seed + samples)
    ]


def _stops(tokenizer, tokens: list[int], eos: set[int]) -> bool:
    """Greedy answers end at EOS or at the end of the first non-empty line (all that is scored)."""
    if tokens[-1] in eos:
        return True
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return "\n" in text.lstrip()


@torch.no_grad()
def _answer(
    shared: CompressedDecoder,
    policy: Policy | None,
    question: torch.Tensor,
    prefill_logits: torch.Tensor,
    max_new: int,
    interval: int,
    tokenizer,
    eos: set[int],
) -> tuple[list[int], list[int]]:
    """Greedy answer under ``policy`` (forked from the shared prefill; the question ends the prompt), as
    generate() decodes, and the entries per layer kept of the prefill."""
    decoder, keep = shared.fork(policy, interval=interval)
    kept = keep.counts() if keep is not None else [shared.seen]
    try:
        with ragged_attention(shared.model):
            logits = decoder.feed(question, prompt=question.numel())[-1] if question.numel() else prefill_logits
            decoded = decoder.decode(logits, GREEDY, max_new, stop=lambda tokens: _stops(tokenizer, tokens, eos))
            return decoded.tokens, kept
    finally:
        decoder.close()


@torch.no_grad()
def _forced(
    shared: CompressedDecoder,
    policy: Policy | None,
    question: torch.Tensor,
    answer: list[int],
    prefill_logits: torch.Tensor,
    interval: int,
) -> torch.Tensor:
    """Float32 logits ``[len(answer), V]`` of the positions predicting ``answer``, teacher-forced on it
    after the question (which ends the prompt), compressed where the schedule says."""
    decoder, _ = shared.fork(policy, interval=interval)
    try:
        with ragged_attention(shared.model):
            fed = torch.cat(
                [question.to(decoder.device), torch.tensor(answer[:-1], dtype=torch.long, device=decoder.device)]
            )
            rows = decoder.feed(fed, prompt=question.numel())
            if question.numel():
                return rows[question.numel() - 1 :].float()
            return torch.cat([prefill_logits[None].float(), rows]).float()
    finally:
        decoder.close()


def _kl_top1(full: torch.Tensor, compressed: torch.Tensor) -> tuple[float, float]:
    kl = kl_from_reference(*reference_terms(full), compressed[None])[0]
    return float(kl.double().mean()), float((full.argmax(-1) == compressed.argmax(-1)).double().mean())


def evaluate_sample(
    lm,
    unit: SampleUnit,
    policies: list[Policy],
    protocols: list[str],
    max_new: int = 12,
    interval: int = 1024,
    config: SignalConfig | None = None,
    on_prefill=None,
    progress=None,
) -> pd.DataFrame:
    """One row per (protocol, full cache or policy): the answer, whether it is right, its KL to the full cache.

    ``on_prefill(protocol, ids)``: called with exactly the token ids the compression sees (tests use it
    to assert that question-agnostic compression never sees the question)."""
    model, tokenizer = lm.model, lm.tokenizer
    if tokenizer is None:
        raise FIError("task evaluation needs a model with a tokenizer")
    config = config or signal_config_for(policies[0] if policies else None)
    eos = _eos_ids(model, tokenizer, None)
    sample = unit.sample
    rows = []
    runs: list[Policy | None] = [None, *policies]
    done = 0
    for protocol in protocols:
        context, question = encode_split(tokenizer, sample, protocol)
        if protocol == "question-agnostic" and not question.numel():  # the split must keep the question out
            raise FIError(f"{unit.name}: the question-agnostic split left no question to append")
        if on_prefill:
            on_prefill(protocol, context)
        shared = CompressedDecoder.shared(model, context.numel() + question.numel() + max_new, config)
        device = shared.device
        context, question = context.to(device), question.to(device)
        with ragged_attention(model):
            prefill_logits, _ = shared.prefill(context)
        full_answer: list[int] = []
        full_rows = None
        for policy in runs:
            t0 = time.perf_counter()
            tokens, kept = _answer(shared, policy, question, prefill_logits, max_new, interval, tokenizer, eos)
            if policy is None:
                full_answer = tokens
            # teacher forcing where the free generation of the full answer compressed nowhere (it would
            # have reached a point: its KL is left empty)
            forced = policy is None or not Schedule.of(policy, interval).reaches_point(len(full_answer) - 1)
            rows_c = _forced(shared, policy, question, full_answer, prefill_logits, interval) if forced else None
            if policy is None:
                full_rows = rows_c
            answer_kl, answer_top1 = _kl_top1(full_rows, rows_c) if rows_c is not None else (float("nan"),) * 2
            first, agree = divergence(tokens, full_answer)
            output = tokenizer.decode(tokens, skip_special_tokens=True)
            rows.append(
                {
                    "task": unit.task,
                    "context": unit.context,
                    "seed": unit.seed,
                    "protocol": protocol,
                    **policy_columns(policy),
                    "prompt_tokens": sample.prompt_tokens,
                    "compressed_tokens": int(context.numel()),
                    "kept_entries": sum(kept) / len(kept),
                    "answer": sample.answer,
                    "output": output,
                    "correct": score(output, sample.answer),
                    "answer_kl": answer_kl,
                    "answer_top1": answer_top1,
                    "first_divergence": first,
                    "answer_tokens": len(tokens),
                    "seconds": round(time.perf_counter() - t0, 3),
                }
            )
            done += 1
            if progress:
                progress(done, len(runs) * len(protocols))
    return pd.DataFrame(rows)


def check_protocols(protocols: list[str]) -> list[str]:
    return [check_protocol(p) for p in protocols]
