"""Token-set selectors of SPEC "Set-level analysis", parsed from ``--select`` specs.

``KIND:R`` picks the top ``R`` positions by a signal, ``random:R@SEED`` (or ``@A-B`` for seeds A..B)
picks uniformly, ``positions:A-B,C`` names positions (inclusive ranges), ``policy:NAME@R`` is a
policy's keep map (per layer and head; ``R`` is its budget, what is *kept*: a ratio of ``p``, window
included, or a count; for the other selectors ``R`` is what is removed). ``R`` is a fraction of
the scored prefix ``[0, p - w)`` when it has a decimal point (``0.2``), else a token count (``100``).
Score-based and random selectors draw only from ``[sinks, p - w)``: the first ``sinks`` positions
are attention sinks and the window is always kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import FIError
from .eviction import KeepMap, TokenSet
from .trace import Trace

SCORE_SELECTORS = ("entropy", "attention", "distance", "infokv")
SELECTORS = SCORE_SELECTORS + ("random", "positions", "policy")


def token_scores(trace: Trace, kind: str, alpha: float | None = None) -> torch.Tensor:
    """One score per prefix position ``[p]`` for a score-based selector (NaN where undefined)."""
    if kind == "entropy":
        return trace.entropy
    if kind == "attention":  # layer-and-head mean of window attention
        return trace.attention.mean(dim=(0, 1))
    if kind == "distance":  # layer mean of representation distance
        return trace.distance.mean(dim=0)
    if kind == "infokv":  # layer-and-head mean of S; defined on the scored positions only
        out = torch.full((trace.prefix_len,), float("nan"))
        out[: trace.scored] = trace.infokv(alpha).mean(dim=(0, 1))
        return out
    raise FIError(f"unknown selector '{kind}' (choose from {', '.join(SELECTORS)})")


@dataclass(frozen=True)
class Selection:
    """A parsed ``--select`` spec; ``resolve`` turns it into a :class:`TokenSet` for one trace."""

    spec: str
    kind: str
    amount: str | None = None  # as typed: "0.2" (fraction) or "100" (count)
    seed: int | None = None
    positions: tuple[int, ...] = ()
    policy: str | None = None  # kind "policy": the policy's name

    @property
    def label(self) -> str:
        if self.kind == "positions":
            return self.spec
        if self.kind == "policy":
            return f"policy:{self.policy}@{self.amount}"
        return f"{self.kind}:{self.amount}" + (f"@{self.seed}" if self.seed is not None else "")

    def count(self, trace: Trace) -> int:
        return budget_count(self.amount, trace.scored, self.spec)

    def resolve(self, trace: Trace, sinks: int = 4, alpha: float | None = None) -> TokenSet | KeepMap:
        p, scored = trace.prefix_len, trace.scored
        if self.kind == "policy":
            return self._policy_keep_map(trace, alpha)
        meta = {"selection": self.label, "selector": self.kind, "seed": self.seed, "budget": self.amount}
        if self.kind == "positions":
            bad = [i for i in self.positions if i >= p]
            if bad:
                raise FIError(f"--select {self.spec}: position {bad[0]} is outside the prefix [0, {p})")
            return TokenSet(self.label, torch.tensor(self.positions, dtype=torch.long), meta)
        n = self.count(trace)
        candidates = max(0, scored - sinks)
        if n > candidates:
            raise FIError(
                f"--select {self.spec}: budget of {n:,} tokens is larger than the {candidates:,} candidate "
                f"positions [{sinks}, {scored}) of the prefix"
            )
        if self.kind == "random":
            gen = torch.Generator().manual_seed(self.seed or 0)
            picked = sinks + torch.randperm(candidates, generator=gen)[:n]
        else:
            scores = token_scores(trace, self.kind, alpha)[sinks:scored]
            order = torch.sort(scores, descending=True, stable=True).indices  # ties: earlier position first
            picked = sinks + order[:n]
        return TokenSet(self.label, picked, meta)

    def _policy_keep_map(self, trace: Trace, alpha: float | None) -> KeepMap:
        from .policies import make_policy

        c = trace.config
        policy = make_policy(self.policy, budget=self.amount, window=c.window, alpha=c.alpha if alpha is None else alpha,
                             tau=c.tau, top_k=c.top_k)
        keep_map = policy.keep_map(trace)
        keep_map.label = self.label
        keep_map.meta.update(selection=self.label, seed=None)
        return keep_map


def budget_count(amount: str, scored: int, spec: str) -> int:
    """``"0.2"`` -> ``round(0.2 * scored)``; ``"100"`` -> 100."""
    try:
        value = float(amount)
    except (TypeError, ValueError):
        raise FIError(f"--select {spec}: budget '{amount}' is not a number (use a fraction like 0.2 or a count like 100)") from None
    if not value >= 0 or value != value or value == float("inf"):
        raise FIError(f"--select {spec}: budget must be a finite number >= 0")
    if any(ch in amount for ch in ".eE"):
        if value > 1:
            raise FIError(f"--select {spec}: a fractional budget must lie in [0, 1]")
        return int(round(value * scored))
    return int(value)


def _parse_positions(text: str, spec: str) -> tuple[int, ...]:
    out: list[int] = []
    try:
        for part in filter(None, text.split(",")):
            a, _, b = part.partition("-")
            lo, hi = int(a), int(b) if b else int(a)
            if lo < 0 or hi < lo:
                raise ValueError
            out.extend(range(lo, hi + 1))
    except ValueError:
        raise FIError(f"--select {spec}: expected positions like 10-20,35 (inclusive, non-negative)") from None
    if not out:
        raise FIError(f"--select {spec}: no positions given")
    return tuple(sorted(set(out)))


def parse_selection(spec: str) -> list[Selection]:
    """Parse one ``--select`` spec; ``random:R@A-B`` expands to one selection per seed."""
    kind, sep, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in SELECTORS:
        raise FIError(f"unknown selector '{kind}' in --select {spec} (choose from {', '.join(SELECTORS)})")
    if not sep or not rest:
        raise FIError(f"--select {spec}: expected {kind}:BUDGET, e.g. {kind}:0.2")
    if kind == "positions":
        return [Selection(spec, kind, positions=_parse_positions(rest, spec))]
    if kind == "policy":
        from .policies import make_policy

        name, _, amount = rest.partition("@")
        if not amount:
            raise FIError(f"--select {spec}: expected policy:NAME@BUDGET, e.g. policy:infokv@0.2")
        make_policy(name, budget=amount)  # validate name and budget now, before any model work
        return [Selection(spec, kind, amount.strip(), policy=name.strip().lower())]
    amount, at, seeds = rest.partition("@")
    budget_count(amount, 1, spec)  # validate now, before any model work
    if kind != "random":
        if at:
            raise FIError(f"--select {spec}: only random takes @SEED")
        return [Selection(spec, kind, amount)]
    if not at:
        return [Selection(spec, kind, amount, 0)]
    try:
        lo, _, hi = seeds.partition("-")
        seed_range = range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise FIError(f"--select {spec}: seed must be an integer or a range like 0-4") from None
    if not seed_range:
        raise FIError(f"--select {spec}: empty seed range")
    return [Selection(spec, kind, amount, s) for s in seed_range]


def parse_selections(specs: list[str]) -> list[Selection]:
    return [sel for spec in specs for sel in parse_selection(spec)]
