"""How the next token is drawn from a row of logits: greedy (argmax), or transformers' temperature and
top-p warpers and a multinomial draw from a seeded generator (what ``model.generate`` does, on one row).

:meth:`fi_toolkit.compress.decoder.CompressedDecoder.decode` is the one loop that samples; ``fi generate``,
free generation, tasks, generated futures and lm-eval's ``generate_until`` name a :class:`Sampling`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from fi_toolkit.errors import FIError

Sampler = Callable[[torch.Tensor, torch.Tensor], int]  # (logits [V], token ids so far [n]) -> the next id


@dataclass(frozen=True)
class Sampling:
    """``temperature == 0``: greedy; otherwise temperature and, when ``top_p < 1``, nucleus sampling from
    ``seed`` (one generator per :meth:`sampler`, so each generation draws its own reproducible sequence)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0) or not 0 < self.top_p <= 1:
            raise FIError(f"need a finite temperature >= 0 and 0 < top_p <= 1, got {self.temperature} and {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def sampler(self, device: torch.device | str) -> Sampler:
        """``sample(logits [V], ids [n]) -> int``. The warpers receive ``ids`` as transformers' processors
        do (temperature and top-p do not read them) and float32 scores."""
        if self.greedy:
            return lambda logits, _ids: int(torch.argmax(logits))
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        warpers = LogitsProcessorList(
            [TemperatureLogitsWarper(self.temperature)] + ([TopPLogitsWarper(self.top_p)] if self.top_p < 1 else [])
        )
        generator = torch.Generator(device=device).manual_seed(self.seed)

        def sample(logits: torch.Tensor, ids: torch.Tensor) -> int:
            scores = warpers(ids[None], logits[None].float())
            return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))

        return sample


GREEDY = Sampling()
