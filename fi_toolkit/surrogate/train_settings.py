"""What ``fi fit-surrogate`` trains (:class:`SurrogateFitSettings`); every field carries its flag and help, from
which the command's options are generated. Imports nothing heavy.

The choices the issue asks to compare are options: the form (``linear``: KVzap's linear layer, solved in closed
form as a ridge regression; ``mlp``: its two-layer MLP, trained with Adam), the loss (``log``: squared error of
log FI, every entry alike; ``weighted``: the same weighted by each entry's FI over its head's mean, so the few
entries whose removal costs most dominate; ``listwise``: within each (unit, layer, KV head), the cross-entropy of
the softmax of the scores against FI's own shares, ListNet's loss, which also puts the weight where FI is large)
and the target (``fi``: the mean of the near and far chunks' FI; ``fi_near``, ``fi_far``; ``kvzip_plus``: KVzip+
scores, KVzap's own teacher, computed while training, the like-for-like anchor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.runs.settings import check_int, check_number, check_type, option

FORMS = ("linear", "mlp")
LOSSES = ("log", "weighted", "listwise")
KVZIP_PLUS = "kvzip_plus"  # KVzap's teacher, computed while training (fi_toolkit.surrogate.kvzip_plus)
TARGETS = ("fi", "fi_near", "fi_far", KVZIP_PLUS)


@dataclass(frozen=True)
class SurrogateFitSettings:
    """``fi fit-surrogate``'s options, checked by :meth:`check` (one line naming the parameter)."""

    OPTION_ORDER: ClassVar[tuple[str, ...]] = (
        "form",
        "loss",
        "target",
        "ridge",
        "hidden",
        "epochs",
        "lr",
        "positions",
        "batch_units",
        "seed",
    )

    form: str = field(default="linear", metadata=option("--form", help="linear (KVzap's linear) or mlp (2 layers)."))
    loss: str = field(
        default="log", metadata=option("--loss", help="log (squared error of log FI), weighted (by FI), listwise.")
    )
    target: str = field(
        default="fi",
        metadata=option("--target", help="fi (near and far), fi_near, fi_far, or kvzip_plus (KVzap's teacher)."),
    )
    ridge: float = field(
        default=1e-2, metadata=option("--ridge", help="Ridge penalty on the standardised hidden states (linear).")
    )
    hidden: int = field(default=64, metadata=option("--hidden", help="Hidden units of the MLP (KVzap: 64)."))
    epochs: int = field(default=30, metadata=option("--epochs", help="Passes over the rows (mlp and listwise)."))
    lr: float = field(default=1e-3, metadata=option("--lr", help="Adam's learning rate (mlp and listwise)."))
    positions: int = field(
        default=256,
        metadata=option("--positions", help="Positions per unit kept for mlp and listwise training (a seeded sample)."),
    )
    batch_units: int = field(
        default=0,
        metadata=option(
            "--batch-units",
            help="Units per Adam step, whole units in a seeded order (0: the full batch; mlp, listwise).",
        ),
    )
    seed: int = field(default=0, metadata=option("--seed", help="Seed of the sample and of the initial weights."))

    def check(self) -> SurrogateFitSettings:
        for name, allowed in (("form", FORMS), ("loss", LOSSES), ("target", TARGETS)):
            value = check_type(name, getattr(self, name), str)
            if value not in allowed:
                raise FIError(f"{name} must be one of {', '.join(allowed)}, got '{value}'", parameter=name)
        if not check_number("ridge", self.ridge) >= 0:
            raise FIError(f"ridge must be >= 0, got {self.ridge}", parameter="ridge")
        check_int("hidden", self.hidden, 1, 4096)
        check_int("epochs", self.epochs, 1, 10_000)
        if not 0 < check_number("lr", self.lr) <= 1:
            raise FIError(f"lr must lie in (0, 1], got {self.lr}", parameter="lr")
        check_int("positions", self.positions, 2)
        check_int("batch_units", self.batch_units, 0)
        check_int("seed", self.seed, 0)
        return self

    @property
    def closed_form(self) -> bool:
        """Solved exactly (ridge) rather than by Adam: the linear form with a squared-error loss."""
        return self.form == "linear" and self.loss != "listwise"
