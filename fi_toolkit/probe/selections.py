"""The probe's selections (docs/method.md): what ``--select`` removes from the cache, parsed from specs.

Every spec is a method's spelling, ``NAME[@BUDGET][:key=value,...]``, parsed by the registry
(:mod:`fi_toolkit.policies.method`, :func:`~fi_toolkit.policies.registry.parse_method`), with a budget:

* a **policy** evicts what a compression policy would (per layer and head): ``infokv@keep=0.25:alpha=0.5,tau=2``,
  ``adaptive(infokv)@0.25``; ``fi-oracle@0.25[:chunk=A:B,rounds=R,estimator=fisher|exact,seed=N,
  precision=auto|float64|model]`` is the FI oracle, which sees the future chunk it scores
  (:mod:`fi_toolkit.probe.oracle`; default chunk: the first probed). The signal options ``window`` and ``top_k``
  are the trace's (``--window``, ``--top-k``). The first spelling, ``policy:NAME@BUDGET[:...]``, stays valid.
* a **press** of a provider: ``kvpress:NAME@keep=0.25`` is what a kvpress press keeps (its budget a share with
  its side: kvpress's compression_ratio is the share removed, so a bare ``X`` is refused, and so is a count).
* a **token set**, one set of positions removed from every layer and head: ``set:entropy@remove=0.1`` (and
  ``attention``, ``distance``, ``infokv``: the top positions by that signal; ``set:`` may be left out where no
  policy has the name, ``entropy@remove=0.1``), ``set:random@remove=0.1:seeds=0-4`` (a uniform sample per seed),
  ``set:positions:at=10-20,35`` (inclusive ranges). The first spellings, ``entropy:remove=0.1``,
  ``random:remove=0.1@0-4`` and ``positions:10-20,35``, stay valid and give the same labels.

``BUDGET`` has one meaning everywhere (:mod:`fi_toolkit.budget`): ``keep=X`` or ``remove=X``, a bare ``X`` being
``keep=X``; a share (``0.1``) is of the whole prefix ``[0, p)``, window and sinks included, else a token count;
so ``attention@remove=0.1`` and ``snapkv@keep=0.9`` evict the same number of entries. Score-based and random
sets draw only from ``[sinks, p - w)``: the first ``sinks`` positions are attention sinks and the window is
always kept.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.policies import Policy, registry
from fi_toolkit.policies.fi_oracle import FIOracle
from fi_toolkit.policies.method import POLICY, PRESS, SCORE_SETS, SET, SETS, Method

if TYPE_CHECKING:  # parsing and checking a spec imports no torch; resolving one (and a provider's) does
    import torch

    from fi_toolkit.eviction import KeepMap, TokenSet
    from fi_toolkit.policies.registry import ProvidedSelection
    from fi_toolkit.probe.chunks import Chunk
    from fi_toolkit.signals.config import SignalConfig
    from fi_toolkit.signals.trace import Trace

SCORE_SELECTORS = SCORE_SETS
SELECTORS = SETS + ("policy",)  # and the registry's provider prefixes (kvpress)
MAX_SEEDS = 1000  # random sets per spec: more is a typo, not a study
MAX_POSITION = 1 << 22  # past any model's context: refused before anything is expanded
TRACE_OPTIONS = ("window", "top_k")  # policy options the trace fixes for every selection (--window, --top-k)


def token_scores(trace: Trace, kind: str, alpha: float | None = None) -> torch.Tensor:
    """One score per prefix position ``[p]`` for a score-based selector (NaN where undefined)."""
    import torch

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


def selectors() -> tuple[str, ...]:
    """Every selection kind: the probe's own, then the registry's provider prefixes (``kvpress``)."""
    return SELECTORS + registry.prefixes()


@dataclass(frozen=True)
class Selection:
    """One ``--select`` set: its :class:`~fi_toolkit.policies.method.Method` (a policy, a press or a token set,
    as the registry parsed it), a random set's ``seed``, a ``positions`` set's positions; ``resolve`` turns it
    into a :class:`TokenSet` or :class:`KeepMap` for one trace."""

    spec: str
    method: Method
    seed: int | None = None
    positions: tuple[int, ...] = ()
    source: str | None = field(default=None, compare=False)  # the option that made it, for messages only
    provided: ProvidedSelection | None = None  # a provider's press (kvpress): what the provider resolved

    @property
    def kind(self) -> str:
        """``policy``, a token set's kind (``entropy``, ``random``, ``positions``, ...) or a provider's prefix
        (``kvpress``)."""
        m = self.method
        if m.kind == POLICY:
            return "policy"
        return m.head.partition(":")[0] if m.kind == PRESS else m.head

    @property
    def budget(self) -> Budget | None:
        return self.method.budget

    @property
    def policy(self) -> str | None:
        """A policy's name as the registry holds it (``infokv-adaptive`` for ``adaptive(infokv)``), else None."""
        return self.method.head if self.method.kind == POLICY else None

    @property
    def options(self) -> str:
        """A policy's options as labels spell them (``alpha=0.5,tau=2.0``), else ''."""
        return self.method.options if self.method.kind == POLICY else ""

    @property
    def option(self) -> str:
        return self.source or f"selection {self.spec}"

    def error(self, message: str, parameter=None) -> FIError:
        """An error about this selection; spelled ``selection SPEC`` (no ``source``), it names the parameter
        ``selections``, so the command line says its flag instead."""
        named = dict(FIError("", parameter).parameters)
        if self.source is None:
            named.setdefault("selection", "selections")
        return FIError(message, parameter=named)

    @property
    def label(self) -> str:
        if self.kind == "positions":
            return f"positions:{self.method.options.partition('=')[2]}"
        if self.kind == "policy":
            return f"policy:{self.policy}@{self.budget.label}" + (f":{self.options}" if self.options else "")
        if self.provided is not None:
            return self.provided.label
        return f"{self.kind}:{self.budget.label}" + (f"@{self.seed}" if self.seed is not None else "")

    def check(self, prefix_len: int, window: int, sinks: int) -> int:
        """Positions this selection removes from ``[0, p)`` (per layer and head, for a policy); refuses a
        set that is empty or larger than its candidates ``[sinks, p - w)``, and a policy budget that
        cannot be met. Needs no model, so the CLI calls it before loading one."""
        p = prefix_len
        if self.kind == "policy":
            self._check_oracle_chunk(p)
            return p - self._checked_policy_budget(p, window)
        if self.provided is not None:
            kept = self.provided.n_kept(p)
            if kept is None:  # a press without a ratio: what it removes is known once it has run
                return 0
            if kept >= p:
                raise self.error(f"{self.option} keeps all {p:,} prefix positions: nothing to measure")
            return p - kept
        if self.budget.exceeds(p):
            raise self.error(
                f"{self.option}: a count of {self.budget.amount:,} is more than the {p:,} positions of the prefix"
            )
        n = self.budget.removed(p)
        candidates = max(0, p - window - sinks)
        if n == 0:
            raise self.error(f"{self.option} removes 0 of the {p:,} prefix positions; give a larger share or a count")
        if n > candidates:
            raise self.error(
                f"{self.option}: removing {n:,} tokens needs more than the {candidates:,} candidate "
                f"positions [{sinks}, {p - window}) of the prefix (sinks and the window are never picked)"
            )
        return n

    def resolve(
        self,
        trace: Trace,
        sinks: int = 4,
        alpha: float | None = None,
        model=None,
        ids: torch.Tensor | None = None,
        chunks: list[Chunk] | None = None,
    ) -> TokenSet | KeepMap:
        """``model`` and the document's ``ids`` are needed by a provider's selections (a kvpress press runs
        its own prefill of ``ids[:p]``) and the FI oracle (which estimates FI on a chunk of ``ids``;
        ``chunks``: the probed chunks, the first of which it scores unless told another)."""
        import torch

        from fi_toolkit.eviction import TokenSet

        p, scored = trace.prefix_len, trace.scored
        if self.kind == "policy":
            return self._policy_keep_map(trace, alpha, model, ids, chunks)
        if self.provided is not None:
            return self._provided_keep_map(p, model, ids)
        meta = {
            "selection": self.label,
            "selector": self.kind,
            "seed": self.seed,
            "budget": None if self.budget is None else self.budget.label,
        }
        if self.kind == "positions":
            bad = [i for i in self.positions if i >= p]
            if bad:
                raise self.error(f"{self.option}: position {bad[0]} is outside the prefix [0, {p})")
            return TokenSet(self.label, torch.tensor(self.positions, dtype=torch.long), meta)
        n = self.check(p, p - scored, sinks)
        candidates = scored - sinks
        if self.kind == "random":
            gen = torch.Generator().manual_seed(self.seed or 0)
            picked = sinks + torch.randperm(candidates, generator=gen)[:n]
        else:
            scores = token_scores(trace, self.kind, alpha)[sinks:scored]
            if not torch.isfinite(scores).all():
                raise self.error(
                    f"{self.option}: the {self.kind} scores hold non-finite values (NaN or inf); refusing to rank them"
                )
            order = torch.sort(scores, descending=True, stable=True).indices  # ties: earlier position first
            picked = sinks + order[:n]
        return TokenSet(self.label, picked, meta)

    def _checked_policy_budget(self, prefix_len: int, window: int, policy=None) -> int:
        """Entries the policy keeps per layer and head (uneven budgets average to it); refuses a budget
        that cannot be met or that keeps everything (nothing to measure)."""
        policy = policy or self.make_policy(window)
        try:
            kept = policy.tokens(prefix_len)
        except FIError as exc:  # a budget that holds no more than the window: name the selection it came from
            raise self.error(f"{self.option}: {exc}", exc.parameters) from None
        if kept >= prefix_len:
            raise self.error(f"{self.option} keeps all {prefix_len:,} prefix positions: nothing to measure")
        return kept

    def make_policy(self, window: int | None = None, **defaults) -> Policy:
        """The policy of a policy selection: its budget, the trace's ``window``, and the options spelled,
        which override ``defaults`` (the trace's alpha, tau, top_k). Without arguments, one policy built once
        (what the checks before the model loads read)."""
        if window is None and not defaults:
            return self._bare_policy
        return registry.resolve(
            self.method, None, window, where=self.option, shared=TRACE_OPTIONS, future=True, **defaults
        )

    @functools.cached_property
    def _bare_policy(self) -> Policy:
        return registry.resolve(self.method, None, where=self.option, shared=TRACE_OPTIONS, future=True)

    def reads_until(self) -> int | None:
        """The end of the future chunk an FI oracle selection scores when its ``chunk`` option names one
        (the document must be read that far), else None."""
        if self.kind != "policy":
            return None
        policy = self.make_policy()
        span = policy.span if isinstance(policy, FIOracle) else None
        return None if span is None else int(span[1])

    def _check_oracle_chunk(self, prefix_len: int) -> None:
        """The FI oracle's chunk must start at or after p (its end is checked against the document later)."""
        policy = self.make_policy()
        span = policy.span if isinstance(policy, FIOracle) else None
        if span is not None and span[0] < prefix_len:
            raise self.error(
                f"{self.option}: the oracle's chunk {span[0]}:{span[1]} starts before the "
                f"compression point p={prefix_len}"
            )

    def _policy_keep_map(
        self,
        trace: Trace,
        alpha: float | None,
        model=None,
        ids: torch.Tensor | None = None,
        chunks: list[Chunk] | None = None,
    ) -> KeepMap:
        c = trace.config
        policy = self.make_policy(c.window, alpha=c.alpha if alpha is None else alpha, tau=c.tau, top_k=c.top_k)
        self._checked_policy_budget(trace.prefix_len, c.window, policy)
        if isinstance(policy, FIOracle):
            from fi_toolkit.probe.oracle import oracle_keep_map

            if model is None or ids is None:
                raise self.error(f"{self.option}: the FI oracle needs the model and the document's tokens")
            keep_map = oracle_keep_map(policy, model, trace, ids, chunks)
            keep_map.label = self.label
            keep_map.meta.update(selection=self.label, seed=None)
            return keep_map
        signals = trace
        if policy.needs_model:  # it scores by its own forward of the prefix's tokens
            if model is None or ids is None:
                raise self.error(f"{self.option}: {policy.name} needs the model and the document's tokens")
            import dataclasses

            from fi_toolkit.policies.base import as_signals

            signals = dataclasses.replace(as_signals(trace), model=model, tokens=ids[: trace.prefix_len])
        keep_map = policy.keep_map(signals)
        keep_map.label = self.label
        keep_map.meta.update(selection=self.label, seed=None)
        return keep_map

    def _provided_keep_map(self, prefix_len: int, model, ids: torch.Tensor | None) -> KeepMap:
        if model is None or ids is None:
            raise self.error(f"{self.option}: a {self.kind} selection needs the model and the document's tokens")
        self.check(prefix_len, 0, 0)
        keep_map = self.provided.keep_map(model, ids, prefix_len, self.option)
        keep_map.meta.update(selection=self.label, seed=None)
        return keep_map


def trace_scorer(selections: Sequence[Selection]):
    """What the prefix trace should score every position with as it feeds it: the scorer of the first ``policy:``
    selection that scores tokens by their attention inputs (the surrogate's model), so that its keep map needs no
    forward of its own; None when no selection has one. A second surrogate in the same probe scores by its own
    forward (a trace holds one scorer's scores)."""
    for s in selections:
        if s.kind == "policy":
            scorer = getattr(s.make_policy(), "input_scorer", None)
            if scorer is not None:
                return scorer
    return None


def _parse_positions(text: str, where: str) -> tuple[int, ...]:
    ranges: list[tuple[int, int]] = []
    try:
        for part in filter(None, text.split(",")):
            a, _, b = part.partition("-")
            lo, hi = int(a), int(b) if b else int(a)
            if lo < 0 or hi < lo:
                raise ValueError
            ranges.append((lo, hi))
    except ValueError:
        raise FIError(f"{where}: expected positions like 10-20,35 (inclusive, non-negative)") from None
    if not ranges:
        raise FIError(f"{where}: no positions given")
    last = max(hi for _, hi in ranges)
    if last >= MAX_POSITION:
        raise FIError(f"{where}: position {last:,} is past any model's context")
    merged: list[int] = []  # sorted, each position once
    for lo, hi in sorted(ranges):
        merged.extend(range(max(lo, merged[-1] + 1 if merged else 0), hi + 1))
    return tuple(merged)


def _legacy_set(spec: str, where: str) -> Method | None:
    """The probe's first spellings of a token set as a method: ``KIND:BUDGET`` (``entropy:remove=0.1``),
    ``random:BUDGET[@SEEDS]``, ``positions:A-B,C``; None for any other spelling (``infokv:alpha=0.5`` is the
    policy's options, ``set:KIND@BUDGET`` the set's own spelling)."""
    kind, sep, rest = spec.partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in SETS:
        return None
    rest = rest.strip()
    if kind == "positions":
        return None if rest.startswith("at=") else Method(SET, kind, options=f"at={rest}")
    amount, at, seeds = rest.partition("@")
    side = amount.partition("=")[0].strip().lower()
    if "=" in amount and side not in ("keep", "remove") and registry.is_policy_name(kind):
        return None  # infokv:alpha=0.5: a policy's options
    if not amount:
        raise FIError(f"{where}: expected {kind}:BUDGET, e.g. {kind}:remove=0.1")
    budget = Budget.parse(amount, where)
    if at and kind != "random":
        raise FIError(f"{where}: only random takes @SEED")
    return Method(SET, kind, budget, f"seeds={seeds}" if at else "")


def _seeds(method: Method, where: str) -> range:
    """A random set's seeds, ``seeds=A`` or ``seeds=A-B`` (default: 0)."""
    text = method.options.partition("=")[2].strip()
    if not text:
        return range(0, 1)
    try:
        lo, _, hi = text.partition("-")
        first, last = int(lo), int(hi or lo)
    except ValueError:
        raise FIError(f"{where}: seed must be an integer or a range like 0-4") from None
    if first < 0 or last < first:
        raise FIError(f"{where}: seeds must be >= 0 and a range must go upwards, like 0-4")
    if last - first + 1 > MAX_SEEDS:
        raise FIError(f"{where}: {last - first + 1:,} seeds; at most {MAX_SEEDS} per spec")
    return range(first, last + 1)


def _unknown_selector(spec: str, where: str) -> FIError | None:
    """The probe's refusal of a name that is neither a selection kind, a provider's prefix nor a policy."""
    name = re.split(r"[:@]", spec.strip(), maxsplit=1)[0].strip().lower()
    if name in SELECTORS or name in (*registry.prefixes(), "set") or registry.is_policy_name(name):
        return None
    return FIError(
        f"unknown selector '{name}' in {where} (choose from {', '.join(selectors())}, or a policy NAME@BUDGET)"
    )


def parse_selection(spec: str, option: str = "selection") -> list[Selection]:
    """Parse one ``--select`` spec, any method's spelling (:mod:`fi_toolkit.policies.method`) or the probe's
    first spellings of a set; ``random`` with a range of seeds expands to one selection per seed. ``option``
    names the spec in messages (``selection SPEC: ...``; the CLI passes its flag)."""
    where = f"{option} {spec}"
    source = None if option == "selection" else where
    method = _legacy_set(spec, where)
    if method is None:
        unknown = _unknown_selector(spec, where)
        if unknown is not None:
            raise unknown
        method = registry.parse_method(spec, where)
    if method.kind == PRESS:  # a provider's (kvpress: only such a spec imports torch and kvpress)
        provided = registry.resolve_selection(spec, where)
        return [Selection(spec, method, source=source, provided=provided)]
    if method.kind == SET and method.head == "positions":
        return [Selection(spec, method, source=source, positions=_parse_positions(method.options[3:], where))]
    if method.budget is None:
        example = "infokv@keep=0.25:alpha=0.5" if method.kind == POLICY else f"set:{method.head}@remove=0.1"
        raise FIError(f"{where}: a probe selection needs a budget, NAME@BUDGET[:key=value,...], e.g. {example}")
    if method.kind == POLICY:  # the policy's own checks now, before any model work (make_policy keeps it)
        selection = Selection(spec, method, source=source)
        selection.make_policy()
        return [selection]
    if method.head != "random":
        return [Selection(spec, method, source=source)]
    return [Selection(spec, method, s, source=source) for s in _seeds(method, where)]


def parse_selections(specs: list[str], option: str = "selection") -> list[Selection]:
    """Every spec's selections; two specs that parse to one selection (equal labels: ``entropy:0.1`` and
    ``entropy:keep=0.1``, a random seed in two ranges) are refused in one line naming both.

    Args:
        specs: ``--select`` specs, e.g. ``["attention:remove=0.1", "random:remove=0.1@0-2",
            "policy:snapkv@keep=0.25"]``; a seed range gives one selection per seed.
        option: the option's name in error messages.

    Returns:
        The :class:`Selection` objects in order (resolved against a trace later, with
        :meth:`Selection.resolve`).

    Raises:
        FIError: an unknown selector or policy, a bad budget or seed, or a duplicate (one line)."""
    selections, by_label = [], {}
    for spec in specs:
        for sel in parse_selection(spec, option):
            if sel.label in by_label:
                raise FIError(
                    f"{option} {by_label[sel.label]} and {option} {spec} select the same set "
                    f"({sel.label}); give it once"
                )
            by_label[sel.label] = spec
            selections.append(sel)
    return selections


def check_prefix(prefix: int, window: int) -> None:
    """The traced prefix must be longer than the window: only ``[0, p - w)`` is scored."""
    if prefix <= window:
        raise FIError(
            f"prefix {prefix} leaves nothing to score: it must be larger than the window ({window})", parameter="prefix"
        )


def compression_point(chunks, prefix: int | None, signals) -> tuple[list[Chunk], int, SignalConfig]:
    """A settings object's future ``chunks`` (``START:END`` strings or chunks), compression point (``prefix``;
    None: the smallest chunk start) and signal options, parsed and checked in that order (one line each): at
    least one chunk, each starting at or after ``p``, and ``p`` past the window. Their lengths against the
    documents are checked once the documents are read."""
    from fi_toolkit.probe.chunks import check_chunks, parse_chunks
    from fi_toolkit.runs.settings import check_int, check_type
    from fi_toolkit.signals.config import SignalConfig

    parsed = parse_chunks(chunks)
    if not parsed:
        raise FIError("no chunk given: pass at least one START:END in chunks", parameter="chunks")
    p = min(c.start for c in parsed) if prefix is None else check_int("prefix", prefix)
    config = check_type("signals", signals, SignalConfig).check()
    check_chunks(parsed, p, float("inf"), None)
    check_prefix(p, config.window)
    return parsed, p, config


def check_sinks(sinks: int, prefix: int, window: int) -> int:
    """``[sinks, p - w)`` must hold at least one candidate; returns the number of scored positions."""
    scored = prefix - window
    if sinks < 0:
        raise FIError(f"sinks must be >= 0, got {sinks}", parameter="sinks")
    if sinks >= scored:
        raise FIError(
            f"sinks {sinks} leaves no candidates: the scored prefix [0, {scored}) has {scored} positions",
            parameter="sinks",
        )
    return scored


def check_selections(selections: Sequence[Selection], prefix: int, window: int, sinks: int) -> None:
    """Score-based and random selectors draw from ``[sinks, p - w)``: refuse sinks that leave none and
    sets that are empty or larger than their candidates, before the model is loaded; and two selections
    that remove the same set, however spelled."""
    if sinks < 0:
        raise FIError(f"sinks must be >= 0, got {sinks}", parameter="sinks")
    if any(s.kind not in ("positions", "policy", "kvpress") for s in selections):
        check_sinks(sinks, prefix, window)
    made: dict = {}
    for s in selections:
        if s.kind == "positions":
            continue
        removed = s.check(prefix, window, sinks)
        if s.provided is not None or not removed:
            continue
        key = (s.kind, s.policy, s.options, s.seed, removed)  # the set a selection removes, spelled any way
        if key in made:
            raise FIError(
                f"{made[key].option} and {s.option} select the same set (both remove {removed:,} of the "
                f"{prefix:,} prefix positions); give it once"
            )
        made[key] = s
