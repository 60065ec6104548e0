"""Budgets: one spelling and one meaning wherever a user says how much of a cache goes or stays.

A budget names its side, ``keep=X`` (entries that stay) or ``remove=X`` (entries that go); a bare
``X`` means ``keep=X``, the usual sense of a KV-cache "budget". ``X`` with a decimal point (or an
exponent) is a share, anything else a token count: ``keep=0.25``, ``remove=0.1``, ``keep=512``,
``remove=100``, ``0.25``.

The denominator is always the same: the ``n`` entries the cache holds at the compression point that
the budget may act on (the prefix ``[0, p)`` for a probe, window and sinks included; the tokens seen
so far while generating, less a protected prompt). A share keeps ``round(r·n)`` (``keep=r``) or
removes ``round(r·n)`` (``remove=r``), rounding halves up, so ``keep=0.9`` and ``remove=0.1``
evict the same number of entries.

kvpress's ``compression_ratio`` is the share removed: ``compression_ratio=0.75`` is ``remove=0.75``
(``keep=0.25``) here, and a press is spelled with one, ``kvpress:SnapKVPress@keep=0.25`` (a bare
``kvpress:SnapKVPress@0.75`` is refused: it would mean the opposite of ``policy:snapkv@0.75``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fi_toolkit.errors import FIError

SIDES = ("keep", "remove")
DEFAULT_SIDE = "keep"


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


@dataclass(frozen=True)
class Budget:
    """How many of ``n`` entries stay: ``side`` is ``"keep"`` or ``"remove"``, ``amount`` a share
    (``float`` in ``[0, 1]``) or a token count (``int >= 0``)."""

    side: str
    amount: float | int

    @classmethod
    def parse(cls, spec: str | float | int | Budget, where: str = "") -> Budget:
        """``"keep=0.25"``, ``"remove=100"``, ``"0.25"`` (= keep), a float (share kept) or an int (count kept).

        ``where`` names the option in error messages (``"--budget"``, ``"--select entropy:x"``)."""
        if isinstance(spec, Budget):
            return spec
        what = f"budget in {where}" if where else "budget"
        if isinstance(spec, bool):
            raise FIError(f"invalid {what}: {spec!r}")
        if isinstance(spec, (int, float)):
            return cls._checked(DEFAULT_SIDE, spec, what, str(spec))
        text = str(spec).strip()
        side, sep, value = text.partition("=")
        if not sep:
            side, value = DEFAULT_SIDE, text
        side = side.strip().lower()
        if side not in SIDES:
            raise FIError(f"invalid {what}: '{text}'; write keep=X or remove=X (a share like 0.25 or a count like 512)")
        value = value.strip()
        try:
            amount: float | int = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            raise FIError(
                f"invalid {what}: '{value}' is not a number (a share like 0.25 or a count like 512)"
            ) from None
        return cls._checked(side, amount, what, text)

    @classmethod
    def _checked(cls, side: str, amount: float | int, what: str, text: str) -> Budget:
        if isinstance(amount, float):
            if not (math.isfinite(amount) and 0.0 <= amount <= 1.0):
                raise FIError(f"invalid {what}: '{text}'; a share must lie in [0, 1]")
        elif amount < 0:
            raise FIError(f"invalid {what}: '{text}'; a token count must be >= 0")
        return cls(side, amount)

    @property
    def is_share(self) -> bool:
        return isinstance(self.amount, float)

    @property
    def label(self) -> str:
        return f"{self.side}={self.amount}"

    def __str__(self) -> str:
        return self.label

    def kept(self, n: int) -> int:
        """Entries kept out of ``n`` (clipped to ``[0, n]``)."""
        if self.is_share:
            part = round_half_up(self.amount * n)
        else:
            part = int(self.amount)
        kept = part if self.side == "keep" else n - part
        return max(0, min(n, kept))

    def removed(self, n: int) -> int:
        """Entries removed out of ``n``."""
        return n - self.kept(n)

    def exceeds(self, n: int) -> bool:
        """True for a count that asks for more than the ``n`` entries there are."""
        return not self.is_share and self.amount > n

    @property
    def removed_share(self) -> float:
        """The share a share budget removes, as ``remove=`` spells it (kvpress's ``compression_ratio``):
        ``keep=s`` removes ``1 - s`` rounded to 12 decimals, so ``keep=0.7`` gives the float ``0.3``."""
        if not self.is_share:
            raise FIError(f"budget {self.label} is a token count, not a share of the cache")
        return self.amount if self.side == "remove" else round(1 - self.amount, 12)

    def compression_ratio(self, n: int) -> float:
        """kvpress's ``compression_ratio`` (share removed) of this budget on ``n`` entries."""
        return self.removed(n) / n if n else 0.0


def press_budget(text: str, where: str) -> Budget:
    """A press's budget, ``keep=X`` or ``remove=X``, ``X`` a share strictly between 0 and 1 (:class:`Budget`); a bare
    number is refused with both spellings of it, and so is a token count."""
    text = text.strip()
    budget = Budget.parse(text, where)
    if "=" not in text:
        if budget.is_share and 0.0 < budget.amount < 1.0:
            keep, remove = Budget("keep", round(1 - budget.amount, 12)), Budget("remove", budget.amount)
            raise FIError(
                f"{where}: write {keep.label} or {remove.label}: kvpress's compression_ratio is the share removed "
                "(a bare budget elsewhere is the share kept)"
            )
        raise FIError(f"{where}: write keep=X or remove=X, X a share of the prefix strictly between 0 and 1")
    if not budget.is_share:
        raise FIError(
            f"{where}: {budget.label} is a token count; a press takes a share of the prefix (keep=0.25), "
            "as kvpress's compression_ratio is one"
        )
    if not 0.0 < budget.removed_share < 1.0:
        raise FIError(f"{where}: {budget.label} must keep some and remove some: a share strictly between 0 and 1")
    return budget
