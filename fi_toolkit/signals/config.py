"""The signal options (:class:`SignalConfig`) and the entropy convention (which distribution's entropy
``H_i`` is): what the prefix trace (:mod:`~fi_toolkit.signals.trace`) and the decoding tracker
(:mod:`~fi_toolkit.signals.tracker`) both read. Their own module, below both, so that the trace can
drive the tracker without an import cycle; :mod:`~fi_toolkit.signals.trace` re-exports every name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fi_toolkit.errors import FIError

ENTROPY_OF = ("produced", "next")


def entropy_of_tokens(at_position: torch.Tensor, entropy_of: str) -> torch.Tensor:
    """Per-token ``H`` from the entropies of the distributions computed *at* each position.

    ``"next"``: ``H_i`` is the entropy at ``i`` (predicting ``x_{i+1}``), returned as is.
    ``"produced"`` (the default): ``H_i`` is the entropy of the distribution that produced ``x_i``,
    i.e. the one computed at ``i - 1``; nothing predicted ``x_0``, so ``H_0 = 0``.
    """
    if entropy_of == "next":
        return at_position
    return torch.cat([at_position.new_zeros(1), at_position[:-1]])


@dataclass(frozen=True)
class SignalConfig:
    """Options of docs/method.md, "Signals"; defaults follow the paper where it states them."""

    top_k: int = 256  # entropy over the k largest logits; k >= V is the full entropy
    window: int = 32  # observation window w: the last w prefix positions
    pool_kernel: int = 7  # average-pool kernel over positions for window attention (1 = off)
    tau: float = 1.0  # bias in E = (D + tau) * H
    alpha: float = 0.9  # InfoKV mix: alpha * attention + (1 - alpha) * softmax(E)
    entropy_of: str = "produced"  # "produced": H of the distribution that produced x_i (logits at i-1; H_0 = 0);
    # "next": H of the distribution computed at i (predicting x_{i+1}). See docs/method.md, "Which entropy".
    final_norm: bool = False  # D against h^(L) after the final norm instead of before it
    prefill_chunk: int = 2048  # tokens per forward while tracing the prefix
    lm_head_block: int = 512  # rows of logits at a time in the streamed LM head

    def validate(self) -> None:
        if self.top_k < 1:
            raise FIError(f"top_k must be >= 1, got {self.top_k}")
        if self.window < 1:
            raise FIError(f"window must be >= 1, got {self.window}")
        if not math.isfinite(self.tau):
            raise FIError(f"tau must be a finite number, got {self.tau}")
        if not 0.0 <= self.alpha <= 1.0:
            raise FIError(f"alpha must lie in [0, 1], got {self.alpha}")
        if self.entropy_of not in ENTROPY_OF:
            raise FIError(f"entropy_of must be one of {', '.join(ENTROPY_OF)}, got '{self.entropy_of}'")
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise FIError(f"pool_kernel must be an odd number >= 1, got {self.pool_kernel}")
