"""The field map's methods and budgets, parsed and checked without torch, pandas or scipy (the command line
checks them before the model loads; :mod:`fi_toolkit.field.run` runs the map).

A **method** (:class:`~fi_toolkit.policies.method.Method`) is a project policy (``snapkv``, ``infokv:alpha=0.5``,
``adaptive(infokv)``) or a provider's press (``kvpress:SnapKVPress``, ``kvpress:AdaKVPress/SnapKVPress``),
spelled as ``--policy`` and ``--select`` spell it; without a budget it is measured at every budget of the map,
with one (``snapkv@keep=0.25``) at that budget alone, which must be one of the map's. Two **anchors** are
measured beside them on every document, the ends of the headroom scale (docs/results/headroom.md): random
positions with the first ``sinks`` kept (0) and the FI oracle that saw the chunk (1), one oracle per chunk, with
fi-oracle's own options or those ``--oracle`` gives (``samples=4``: fewer label draws, faster and noisier).
``random``, the policy, which evicts sinks, is a method like any other, no anchor.

Each method at budget ``B`` is a probe selection, as ``fi probe --select`` spells it:
``NAME@B[:options]`` for a policy, ``kvpress:NAMES@B[:options]`` for a press (kvpress's
``compression_ratio`` is the share ``B`` removes), so a cell of the map is what ``fi probe`` measures with
that selection. In decoding it is what ``fi eval --policy NAME --budget B`` replays.
"""

from __future__ import annotations

from typing import Sequence

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.policies import registry
from fi_toolkit.policies.fi_oracle import LABEL_SEEDS
from fi_toolkit.policies.method import ANCHOR, POLICY, PRESS, Method
from fi_toolkit.probe.chunks import Chunk

RANDOM_ANCHOR = "random-positions"  # random positions, the first sinks kept: 0 on the headroom scale
ORACLE_ANCHOR = "fi-oracle"  # the FI oracle that saw the chunk: 1 on the headroom scale


def method_selections(method: Method, budget: Budget, chunks: Sequence[Chunk], seeds: int) -> list[str]:
    """The probe selections (``fi probe --select`` specs) of ``method`` at ``budget``: one for a policy or a
    press, ``seeds`` random sets for the random anchor, one FI oracle per chunk (it scores that chunk) for the
    oracle anchor, then each again at label seed 1 (the oracle's own noise,
    :func:`fi_toolkit.field.summary.headroom`)."""
    if method.kind == POLICY:
        return [f"policy:{method.at(budget).spelling}"]
    if method.kind == PRESS:
        return [method.at(budget).spelling]
    if method.head == RANDOM_ANCHOR:
        return [f"random:{budget.label}@0-{seeds - 1}"]
    options = f"{method.options}," if method.options else ""  # --oracle's, then chunk= and seed= (the map's)
    oracles = [f"policy:fi-oracle@{budget.label}:{options}chunk={c.label}" for c in chunks]
    return oracles + [f"{o},seed={s}" for s in LABEL_SEEDS if s for o in oracles]  # its own noise


ORACLE_OWN = ("chunk", "seed")  # the oracle anchor's options the map sets itself: each chunk, each label seed


def anchors(oracle: str = "") -> tuple[Method, Method]:
    """The two anchors: random positions, and the FI oracle with ``oracle``'s options (``samples=4``; fi-oracle's
    own defaults where empty), parsed and checked by the registry as ``--policy fi-oracle:OPTIONS`` would be.
    Options the map sets itself (:data:`ORACLE_OWN`) are refused."""
    options = ""
    if oracle.strip():
        where = f"--oracle {oracle}"
        method = registry.parse_method(f"{ORACLE_ANCHOR}:{oracle}", where)
        for key in (o.partition("=")[0] for o in method.options.split(",")):
            if key in ORACLE_OWN:
                raise FIError(
                    f"oracle may not set {key}: the field map sets it (each chunk, label seeds 0 and 1)",
                    parameter="oracle",
                )
        registry.resolve(method, "keep=0.5", where=where, future=True)  # its names and values
        options = method.options
    return Method(ANCHOR, RANDOM_ANCHOR), Method(ANCHOR, ORACLE_ANCHOR, options=options, name=ORACLE_ANCHOR)


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
    return [Method(POLICY, e.name) for e in registry.entries() if e.kind == registry.POLICY]


def parse_methods(
    names: Sequence[str | Method], budgets: Sequence[Budget] = (), option: str = "--policy"
) -> list[Method]:
    """``--policy`` values, methods' spellings (:mod:`fi_toolkit.policies.method`) -> methods; unknown names and
    options are refused in one line (the registry's), and so are a token set (a probe's, with no replay), the FI
    oracle (an anchor, always measured), a method named twice at one budget and a budget spelled with a name
    that is none of the map's ``budgets`` (the anchors that scale it are measured at those alone)."""
    methods: list[Method] = []
    for given in names:
        text = given.spelling if isinstance(given, Method) else given.strip()
        where = f"{option} {text}"
        m = registry.parse_method(given if isinstance(given, Method) else text, where)
        if m.kind not in (POLICY, PRESS):
            raise FIError(f"{where}: a token set is a probe's selection; the field map places policies and presses")
        if registry.is_oracle(m.head):
            raise FIError(f"{where}: the FI oracle is the map's anchor (1 on the headroom scale), always measured")
        if m.budget is not None and budgets and not any(m.runs_at(b) for b in budgets):
            shown = ", ".join(b.label for b in budgets)
            raise FIError(
                f"{where}: its budget {m.budget.label} is none of the map's ({shown}), where the anchors that "
                f"scale it are measured; add the budget {m.budget.label}"
            )
        if any(_clash(o, m) for o in methods):
            raise FIError(f"{option} gives '{text}' twice")
        methods.append(m)
    return methods


def _clash(a: Method, b: Method) -> bool:
    """Whether two methods would fill the same cells: one policy or press with the same options, measured at a
    budget both take."""
    same = (a.kind, a.head, a.options) == (b.kind, b.head, b.options)
    return same and (a.budget is None or b.budget is None or a.runs_at(b.budget))


def check_methods(
    methods: Sequence[Method],
    budgets: Sequence[Budget],
    prefix: int,
    window: int,
    sinks: int,
    anchored: Sequence[Method],
) -> None:
    """Every selection of every method at every budget parses and fits the prefix (a policy's options, a budget
    that keeps something and removes something); the anchors (``anchored``: :func:`anchors`) too. Presses need
    their provider's library here."""
    from fi_toolkit.probe.selections import parse_selections

    chunks = [Chunk(prefix, prefix + 1)]  # only the oracle's chunk label is read; its place is checked later
    for m in [*anchored, *methods]:
        for b in (b for b in budgets if m.runs_at(b)):
            where = f"--policy {m.name}"
            if m.kind == ANCHOR:
                where = f"--oracle {m.options}" if m.options else f"--budget {b.label}"
            for sel in parse_selections(method_selections(m, b, chunks, 1), where):
                sel.check(prefix, window, sinks)


def replay_policy(method: Method, budget: Budget, config):
    """The policy ``fi eval --policy NAME --budget B`` replays, resolved as it resolves them (``config``: the
    run's :class:`~fi_toolkit.signals.config.SignalConfig`, whose window, alpha, tau and top-k it takes)."""
    return registry.resolve(
        method.at(budget),
        None,
        config.window,
        where=f"--policy {method.name}",
        shared=("window", "top_k"),
        alpha=config.alpha,
        tau=config.tau,
        top_k=config.top_k,
        future=True,
    )
