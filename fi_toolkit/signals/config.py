"""The signal options (:class:`SignalConfig`): the settings object of H, A, D, E and S, shared by every
``fi`` command and the Python API. Imports nothing heavy: the CLI reads its options while parsing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.runs.settings import check_int, check_number, check_type, option

ENTROPY_OF = ("produced", "next")
QUERY_SINKS = 4  # ExpectedAttention's sink count (kvpress's ``n_sink``): rows and slots left out of its statistics


@dataclass(frozen=True)
class SignalConfig:
    """Options of docs/method.md, "Signals"; defaults follow the paper where it states them.

    The fields with an option in their metadata are the ``fi`` commands' signal options (listed in
    the help in the order ``--window``, ``--top-k``, ``--alpha``, ``--tau``, ``--pool``, ``--entropy-of``:
    :attr:`OPTION_ORDER`); the others keep their defaults on the command line.
    """

    OPTION_ORDER: ClassVar[tuple[str, ...]] = ("window", "top_k", "alpha", "tau", "pool_kernel", "entropy_of")

    top_k: int = field(
        default=256,
        metadata=option(  # entropy over the k largest logits; k >= V is the full entropy
            "--top-k", help="Entropy over the k largest logits (k >= vocab: full entropy)."
        ),
    )
    window: int = field(
        default=32,
        metadata=option(  # observation window w: the last w prefix positions
            "--window", help="Observation window w (last w prefix positions)."
        ),
    )
    pool_kernel: int = field(
        default=7,
        metadata=option(  # average-pool kernel over positions for window attention
            "--pool", help="Average-pool kernel for window attention (1 = off)."
        ),
    )
    tau: float = field(
        default=1.0,
        metadata=option(  # bias in E = (D + tau) * H
            "--tau", help="Bias in E = (D + tau) * H."
        ),
    )
    alpha: float = field(
        default=0.9,
        metadata=option(  # InfoKV mix: alpha * attention + (1 - alpha) * softmax(E)
            "--alpha", help="InfoKV mix: alpha*attention + (1-alpha)*softmax(E)."
        ),
    )
    # "produced": H of the distribution that produced x_i (logits at i-1; H_0 = 0);
    # "next": H of the distribution computed at i (predicting x_{i+1}). See docs/method.md, "Which entropy".
    entropy_of: str = field(
        default="produced",
        metadata=option(
            "--entropy-of",
            help="Which entropy H_i is: 'produced' = the distribution that produced token i (logits at i-1, the "
            "default), "
            "'next' = the distribution computed at i (predicting token i+1).",
        ),
    )
    final_norm: bool = False  # D against h^(L) after the final norm instead of before it
    prefill_chunk: int = 2048  # tokens per forward while tracing the prefix
    lm_head_block: int = 512  # rows of logits at a time in the streamed LM head

    def check(self) -> SignalConfig:
        """Every option in range, named by its field (the CLI names the flag): one line (FIError) for NaN,
        inf, negatives, wrong types."""
        if self.entropy_of not in ENTROPY_OF:
            raise FIError(
                f"entropy_of must be one of {', '.join(ENTROPY_OF)}, got '{self.entropy_of}'", parameter="entropy_of"
            )
        check_int("top_k", self.top_k, 1)
        check_int("window", self.window, 1)
        check_number("tau", self.tau)
        check_number("alpha", self.alpha, finite=False)
        if not 0.0 <= self.alpha <= 1.0:  # NaN too
            raise FIError(f"alpha must lie in [0, 1], got {self.alpha}", parameter="alpha")
        if check_int("pool_kernel", self.pool_kernel, 1) % 2 == 0:
            raise FIError(f"pool_kernel must be an odd number >= 1, got {self.pool_kernel}", parameter="pool_kernel")
        check_type("final_norm", self.final_norm, bool)
        check_int("prefill_chunk", self.prefill_chunk, 1)
        check_int("lm_head_block", self.lm_head_block, 1)
        return self

    def validate(self) -> None:
        """Earlier name of :meth:`check`."""
        self.check()


def signal_config_for(policy, **overrides) -> SignalConfig:
    """The signal options a policy implies (its window, top-k and tau), with explicit overrides."""
    base = {"window": getattr(policy, "window", 32)}
    for name in ("top_k", "tau", "alpha"):
        if hasattr(policy, name):
            base[name] = getattr(policy, name)
    config = SignalConfig(**{**base, **{k: v for k, v in overrides.items() if v is not None}})
    config.validate()
    return config
