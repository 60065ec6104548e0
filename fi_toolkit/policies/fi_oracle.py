"""FI oracle: keep, per layer and KV head, the entries whose removal the model's own future
would feel most. An **oracle**, not a policy one could deploy: its scores are estimates of Forward
Influence on a named future chunk of the text (docs/method.md, "Forward Influence"), so it sees tokens
after the compression point. It bounds what any heuristic could reach at the same budget (the
*headroom*, :mod:`fi_toolkit.probe.headroom`). "Oracle" as in H2O's heavy-hitter oracle (arXiv 2306.14048),
but scored by the quantity the toolkit measures instead of attention.

Its scores are a signal like the others, read from the :class:`~fi_toolkit.signals.policy_view.Signals` it is
given (``fi_estimates``, per layer ``[H_kv, n_l]``), which only what knows the future can fill: policies sit below
the probe (tests/test_layers.py), so :func:`fi_toolkit.probe.oracle.oracle_keep_map` (the probe) or, while a
replay decodes known text, :mod:`fi_toolkit.compress.lookahead` (the next ``interval`` tokens, every cache slot)
estimates them (the Fisher estimate per layer and KV head, ``head_fi [L, H_kv, p, K]`` of
:func:`fi_toolkit.probe.estimator.fisher_fi`, or exact leave-one-out FI per position, shared by every head).
Selection is every policy's
(:meth:`Policy.keep_map`: same budget meaning and window rule; higher = keep). Options (spelled
``fi-oracle:chunk=A:B,rounds=R,estimator=fisher|exact,samples=S,seed=N,precision=auto|float64|model``): ``chunk`` the
future chunk scored (default: the first probed chunk), ``rounds`` removes the budget in that many rounds,
re-estimating after each with the earlier removals masked, ``estimator``, ``samples`` (label draws of the Fisher
estimate), ``seed`` (the seed of those draws: another seed is another draw of the same estimate, which is how a
headroom table measures the oracle's own noise, :mod:`fi_toolkit.probe.headroom`), ``precision`` (``float64``:
the estimate is computed in float64, so the same inputs give the same keep map on any thread count,
:mod:`fi_toolkit.probe.oracle`; ``model``: in the model's compute dtype, faster, 8 bytes per weight less, and a
keep map that a BLAS's thread count can change at the cut; ``auto``, the default: ``float64`` on a CPU, where
the thread count varies with the machine's load, ``model`` on an accelerator, where float64 would widen an 8B
model's weights by 64 GB and run at a fraction of the tensor cores' rate, and a fixed kernel configuration
gives the same result from run to run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy, select

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    import torch

    from fi_toolkit.signals.policy_view import Signals

ORACLE_ESTIMATORS = ("fisher", "exact")
ORACLE_PRECISIONS = ("auto", "float64", "model")  # auto: float64 on a CPU, the model's compute dtype elsewhere
MAX_ROUNDS = 64  # each round is one estimate (a backward pass per sample); more is a typo, not a study
MAX_ORACLE_SAMPLES = 10_000
LABEL_SEEDS = (0, 1)  # the label seeds a headroom table measures the FI oracle at: 0 the reference, 1 its noise
REMOVED_SCORE = -1.0  # below every FI estimate (all >= 0 up to ~1e-8 rounding): entries removed in an earlier round


class Spelled(str):
    """A text option that labels show as spelled (``chunk=512:640``, not ``chunk='512:640'``), so a
    label parses back to the same policy; quotes from an earlier label are dropped."""

    def __new__(cls, text=""):
        return super().__new__(cls, str(text).strip().strip("'\""))

    def __repr__(self) -> str:
        return str(self)


def parse_span(text: str) -> tuple[int, int] | None:
    """``"512:640"`` -> ``(512, 640)``; ``""`` -> None (the first probed chunk)."""
    if not text:
        return None
    a, sep, b = text.partition(":")
    try:
        if not sep:
            raise ValueError
        start, end = int(a), int(b)
    except ValueError:
        raise FIError(f"chunk must be START:END with integers, like chunk=512:640, got '{text}'") from None
    if start < 0 or end <= start:
        raise FIError(f"chunk {text} must have 0 <= START < END")
    return start, end


@dataclass
class FIOracle(Policy):
    chunk: Spelled = Spelled("")
    rounds: int = 1
    estimator: Spelled = Spelled("fisher")
    samples: int = 16
    seed: int = 0
    precision: Spelled = Spelled("auto")

    name: ClassVar[str] = "fi-oracle"
    sees_future: ClassVar[bool] = (
        True  # scores from the probe or a replay's look-ahead; fi generate and tasks refuse it
    )
    needs_signals: ClassVar[bool] = False  # its scores are FI estimates, not tracked signals
    no_layer_weight: ClassVar[str] = "fi-oracle's scores are estimates on a future chunk, not shared by layer"

    def __post_init__(self):
        super().__post_init__()
        self.chunk, self.estimator, self.precision = (
            Spelled(self.chunk),
            Spelled(self.estimator),
            Spelled(self.precision),
        )
        parse_span(self.chunk)
        if self.estimator not in ORACLE_ESTIMATORS:
            raise FIError(f"unknown estimator '{self.estimator}' (choose {' or '.join(ORACLE_ESTIMATORS)})")
        if isinstance(self.rounds, float) and not math.isfinite(self.rounds):
            raise FIError(f"rounds must be a whole number in [1, {MAX_ROUNDS}], got {self.rounds}")
        if not 1 <= self.rounds <= MAX_ROUNDS:
            raise FIError(f"rounds must lie in [1, {MAX_ROUNDS}], got {self.rounds}")
        if not 1 <= self.samples <= MAX_ORACLE_SAMPLES:
            raise FIError(f"samples must lie in [1, {MAX_ORACLE_SAMPLES:,}], got {self.samples}")
        if not 0 <= self.seed < 2**63:
            raise FIError(f"seed must be a whole number >= 0, got {self.seed}")
        if self.precision not in ORACLE_PRECISIONS:
            raise FIError(f"unknown precision '{self.precision}' (choose {' or '.join(ORACLE_PRECISIONS)})")

    def in_float64(self, device_type: str) -> bool:
        """Whether the estimate is computed in float64 on a model whose weights are on ``device_type``."""
        return self.precision == "float64" or (self.precision == "auto" and device_type == "cpu")

    @property
    def span(self) -> tuple[int, int] | None:
        return parse_span(self.chunk)

    def scores(self, s: Signals, layer: int) -> torch.Tensor:
        """The estimated FI of each entry of ``layer`` on the future the signals' giver knows, ``[H_kv, n_l]``
        (``s.fi_estimates[layer]``; entries removed in an earlier round score ``REMOVED_SCORE``)."""
        if s.fi_estimates is None:
            raise FIError(
                "fi-oracle sees the future: its scores are FI estimates that only the probe computes "
                "(a probe selection policy:fi-oracle@BUDGET), or a replay of known text (fi eval on "
                "documents); it cannot compress while generating"
            )
        return s.fi_estimates[layer].to(s.keys[layer].device)


def check_decoding_oracle(policy, where: str = "") -> None:
    """Refuse the prefill oracle's options that have no meaning while decoding (one line each)."""
    inner = getattr(policy, "policy", policy)
    if not isinstance(inner, FIOracle):
        return
    where = f"{where}: " if where else ""
    if inner.estimator != "fisher":
        raise FIError(
            f"{where}fi-oracle in a replay scores every cache entry by the Fisher estimate; "
            f"estimator={inner.estimator} is the prefill oracle's (a probe selection policy:fi-oracle@BUDGET)"
        )
    if inner.span is not None:
        raise FIError(
            f"{where}fi-oracle in a replay scores the next interval of tokens at each compression; "
            f"chunk={inner.chunk} is the prefill oracle's (a probe selection policy:fi-oracle@BUDGET)"
        )


def remove_in_rounds(
    score: Callable[[torch.Tensor], torch.Tensor],
    shape: tuple[int, int, int],
    kept: int,
    rounds: int,
    protected: int,
    window: int,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The oracle's rounds, shared by the probe (:mod:`fi_toolkit.probe.oracle`) and the replay
    (:mod:`fi_toolkit.compress.lookahead`): ``n - kept`` evictions per head in ``rounds`` rounds of
    ``round((n - kept) r / rounds)`` cumulative removals; round ``r`` ranks ``score(removed)`` (``removed``:
    bool ``[L, H_kv, n]``, the earlier rounds' evictions, which must score :data:`REMOVED_SCORE`; ->
    ``[L, H_kv, n]``) with every policy's :func:`~fi_toolkit.policies.base.select`. Returns the last round's
    scores, its evictions and the evictions per (layer 0, head 0) after each round."""
    import torch

    n = shape[2]
    removed = torch.zeros(shape, dtype=torch.bool)
    history = []
    for r in range(1, rounds + 1):
        scores = score(removed)
        keep_r = n - round((n - kept) * r / rounds)
        visible = torch.zeros(shape, dtype=torch.bool)
        for layer in range(shape[0]):
            visible[layer].scatter_(1, select(scores[layer], keep_r, protected, window).cpu(), True)
        if (visible & removed).any():  # pragma: no cover - guarded by REMOVED_SCORE and the shrinking budget
            raise FIError("fi-oracle: a round brought back an entry an earlier round removed")
        removed = ~visible
        history.append(int(removed[0, 0].sum()))
    return scores, removed, history
