"""The field map's methods and budgets, parsed and checked without torch, pandas or scipy (the command line
checks them before the model loads; :mod:`fi_toolkit.field.run` runs the map).

A **method** is a project policy (``snapkv``, ``infokv:alpha=0.5``, ``adaptive(infokv)``) or a provider's press
(``kvpress:SnapKVPress``, ``kvpress:AdaKVPress/SnapKVPress``), spelled as ``--policy`` spells it, without a
budget. Two **anchors** are measured beside them on every document, the ends of the headroom scale
(docs/results/headroom.md): random positions with the first ``sinks`` kept (0) and the FI oracle that saw
the chunk (1), one oracle per chunk. ``policy:random``, which evicts sinks, is a method like any other, no
anchor.

Each method at budget ``B`` is a probe selection, as ``fi probe --select`` spells it:
``policy:NAME@B[:options]`` for a policy, ``kvpress:NAMES@B[:options]`` for a press (kvpress's
``compression_ratio`` is the share ``B`` removes), so a cell of the map is what ``fi probe`` measures with
that selection. In decoding it is what ``fi eval --policy NAME --budget B`` replays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.policies import registry
from fi_toolkit.policies.fi_oracle import LABEL_SEEDS
from fi_toolkit.probe.chunks import Chunk

POLICY, PRESS, ANCHOR = "policy", "press", "anchor"
RANDOM_ANCHOR = "random-positions"  # random positions, the first sinks kept: 0 on the headroom scale
ORACLE_ANCHOR = "fi-oracle"  # the FI oracle that saw the chunk: 1 on the headroom scale


@dataclass(frozen=True)
class Method:
    """One row of the map: ``name`` as ``--policy`` spells it (``snapkv``, ``kvpress:SnapKVPress``), its
    ``kind`` (policy, press or anchor)."""

    name: str
    kind: str

    @property
    def head(self) -> str:
        """The name without options: ``infokv:alpha=0.5`` -> ``infokv``; ``kvpress:X:opt=1`` -> ``kvpress:X``."""
        if self.kind == PRESS:
            prefix, _, rest = self.name.partition(":")
            return f"{prefix}:{rest.partition(':')[0]}"
        return self.name.partition(":")[0]

    @property
    def options(self) -> str:
        """The options spelled after the name (``alpha=0.5``), or ''."""
        rest = self.name[len(self.head) :]
        return rest[1:] if rest.startswith(":") else ""

    def selections(self, budget: Budget, chunks: Sequence[Chunk], seeds: int) -> list[str]:
        """The probe selections (``fi probe --select`` specs) of this method at ``budget``: one for a policy
        or a press, ``seeds`` random sets for the random anchor, one FI oracle per chunk (it scores that
        chunk) for the oracle anchor, then each again at label seed 1 (the oracle's own noise,
        :func:`fi_toolkit.field.summary.headroom`)."""
        opts = f":{self.options}" if self.options else ""
        if self.kind == POLICY:
            return [f"policy:{self.head}@{budget.label}{opts}"]
        if self.kind == PRESS:
            return [f"{self.head}@{budget.label}{opts}"]
        if self.name == RANDOM_ANCHOR:
            return [f"random:{budget.label}@0-{seeds - 1}"]
        oracles = [f"policy:fi-oracle@{budget.label}:chunk={c.label}" for c in chunks]
        return oracles + [f"{o},seed={s}" for s in LABEL_SEEDS if s for o in oracles]  # its own noise


ANCHORS = (Method(RANDOM_ANCHOR, ANCHOR), Method(ORACLE_ANCHOR, ANCHOR))


def parse_budgets(specs: Sequence[str], option: str = "--budget") -> list[Budget]:
    """``["keep=0.25", "0.1"]`` -> budgets, each a share strictly between 0 and 1 (a press takes a share as its
    compression ratio, so a count is refused), none given twice."""
    if not specs:
        raise FIError(f"{option}: give at least one budget, like keep=0.25")
    budgets = []
    for spec in specs:
        b = Budget.parse(spec, option)
        if not b.is_share:
            raise FIError(
                f"{option} {spec}: the field map needs a share of the prefix (keep=0.25), not a token count: a "
                "press's budget is its compression ratio"
            )
        if not 0 < b.amount < 1:
            raise FIError(f"{option} {spec}: the share must lie strictly between 0 and 1 (keep or remove some)")
        if any(b.removed_share == o.removed_share for o in budgets):
            raise FIError(f"{option} gives one budget twice ({spec})")
        budgets.append(b)
    return budgets


def default_methods() -> list[Method]:
    """Every project policy of the registry (kind ``policy``: no wrapper, oracle or file policy); the presses
    that run here are added once the model is loaded (:func:`fi_toolkit.field.run.press_methods`)."""
    return [Method(e.name, POLICY) for e in registry.entries() if e.kind == registry.POLICY]


def parse_methods(names: Sequence[str], option: str = "--policy") -> list[Method]:
    """``--policy`` values -> methods; unknown names and options are refused in one line (the registry's),
    and so is the FI oracle (an anchor, always measured) and a name given twice."""
    methods = []
    for text in names:
        text = text.strip()
        where = f"{option} {text}"
        entry = registry.lookup(text, where)
        if entry.kind == registry.ORACLE:
            raise FIError(f"{where}: the FI oracle is the map's anchor (1 on the headroom scale), always measured")
        if entry.kind == registry.WRAPPER:  # pragma: no cover - lookup returns the wrapped policy's entry
            raise FIError(f"{where}: a wrapper wraps a policy: adaptive(NAME)")
        kind = PRESS if entry.kind == registry.PRESS else POLICY
        if any(m.name == text for m in methods):
            raise FIError(f"{option} gives '{text}' twice")
        methods.append(Method(text, kind))
    return methods


def check_methods(methods: Sequence[Method], budgets: Sequence[Budget], prefix: int, window: int, sinks: int) -> None:
    """Every selection of every method at every budget parses and fits the prefix (a policy's options, a budget
    that keeps something and removes something); the anchors too. Presses need their provider's library here."""
    from fi_toolkit.probe.selections import parse_selections

    chunks = [Chunk(prefix, prefix + 1)]  # only the oracle's chunk label is read; its place is checked later
    for m in [*ANCHORS, *methods]:
        for b in budgets:
            where = f"--budget {b.label}" if m.kind == ANCHOR else f"--policy {m.name}"
            for sel in parse_selections(m.selections(b, chunks, 1), where):
                sel.check(prefix, window, sinks)


def replay_policy(method: Method, budget: Budget, config):
    """The policy ``fi eval --policy NAME --budget B`` replays, resolved as it resolves them (``config``: the
    run's :class:`~fi_toolkit.signals.config.SignalConfig`, whose window, alpha, tau and top-k it takes)."""
    return registry.resolve(
        method.name,
        budget,
        config.window,
        where=f"--policy {method.name}",
        shared=("window", "top_k"),
        alpha=config.alpha,
        tau=config.tau,
        top_k=config.top_k,
        future=True,
    )
