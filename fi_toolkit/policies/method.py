"""One spelling and one type for everything that chooses cache entries: ``NAME[@BUDGET][:key=value,...]`` is a
:class:`Method`, whatever NAME names. The registry parses it (:func:`fi_toolkit.policies.registry.parse_method`);
``fi probe --select``, ``--policy`` (``fi eval``, ``fi generate``, ``fi field``, ``fi view``), ``fi lm-eval``'s
``policy=`` and the Python API all take the same strings.

NAME is one of:

* **a project policy** of the registry: ``snapkv``, ``infokv@keep=0.25:alpha=0.5,tau=2``,
  ``adaptive(infokv)@0.25`` (alias ``infokv-adaptive``), a file policy ``surrogate@keep=0.25:path=DIR``, the FI
  oracle ``fi-oracle@keep=0.25:chunk=512:640``. The probe's first spelling, ``policy:NAME@BUDGET[:...]``, is the
  same method.
* **a provider's press**: ``kvpress:SnapKVPress@keep=0.25``, ``kvpress:AdaKVPress/SnapKVPress@remove=0.75:
  window_size=32``. A press's budget names its side, ``keep=`` or ``remove=``: kvpress's compression_ratio is
  the share removed, where a bare budget is the share kept, so a bare number is refused with both spellings
  of the fix (:func:`fi_toolkit.budget.press_budget`).
* **a token set** of the probe's set-level analysis (docs/method.md): ``set:entropy@remove=0.1`` (and
  ``set:attention``, ``set:distance``, ``set:infokv``: the top positions by that signal),
  ``set:random@remove=0.1:seeds=0-4`` (a uniform sample per seed), ``set:positions:at=10-20,35``. A token set
  removes the same positions from every layer and head once, so only a probe measures one. The probe's first
  spellings, ``entropy:remove=0.1``, ``random:remove=0.1@0-4`` and ``positions:10-20,35``, are the same sets.

``BUDGET`` has one meaning everywhere (:mod:`fi_toolkit.budget`). Where a command also takes budgets of its own
(``--budget``), a budget spelled with the name is that method's: it is measured at that budget alone.

This module holds the type and the spelling's grammar (which part is the name, the budget, the options); what a
name means is the registry's to say.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fi_toolkit.budget import Budget

POLICY, PRESS, SET, ANCHOR = "policy", "press", "set", "anchor"  # ANCHOR: a field map's fixed ends, no spelling
SET_PREFIX = "set"
SCORE_SETS = ("entropy", "attention", "distance", "infokv")  # remove the top positions by that signal
SETS = SCORE_SETS + ("random", "positions")
SET_OPTIONS = {"random": ("seeds",), "positions": ("at",)}  # the only options a token set takes
LEGACY_POLICY_PREFIX = "policy"  # the probe's first spelling: policy:NAME@BUDGET[:...]


@dataclass(frozen=True)
class Method:
    """One method that chooses cache entries.

    ``kind``: ``policy`` (a project policy), ``press`` (a provider's), ``set`` (a probe token set) or ``anchor``
    (a field map's random or oracle end). ``head``: the name as the registry holds it, without options
    (``snapkv``, ``infokv-adaptive``, ``fi-oracle``, ``kvpress:AdaKVPress/SnapKVPress``, ``entropy``).
    ``budget``: the budget spelled with it, or None (a command's own budgets apply). ``options``: as labels spell
    them (``alpha=0.5,tau=2.0``; a press's and a set's as written). ``name``: how the user wrote it without its
    budget, what a field map's tables call it (``adaptive(infokv)``, ``infokv:alpha=0.5``); not compared."""

    kind: str
    head: str
    budget: Budget | None = None
    options: str = ""
    name: str = field(default="", compare=False)

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", self.policy_text)

    @property
    def policy_text(self) -> str:
        """``NAME[:options]`` without the budget, canonical (``infokv-adaptive:alpha=0.5``)."""
        return self.head + (f":{self.options}" if self.options else "")

    @property
    def spelling(self) -> str:
        """``NAME[@BUDGET][:options]``, canonical: it parses back to an equal method."""
        at = "" if self.budget is None else f"@{self.budget.label}"
        prefix = f"{SET_PREFIX}:" if self.kind == SET else ""
        return f"{prefix}{self.head}{at}" + (f":{self.options}" if self.options else "")

    def at(self, budget: Budget) -> Method:
        """This method at ``budget``."""
        return replace(self, budget=budget)

    def runs_at(self, budget: Budget) -> bool:
        """Whether a command measures this method at one of its own budgets: every budget where none is spelled
        with the name, else that one alone (``keep=0.25`` and ``remove=0.75`` are one share)."""
        return self.budget is None or _same_budget(self.budget, budget)


def _same_budget(a: Budget, b: Budget) -> bool:
    if a.is_share and b.is_share:
        return a.removed_share == b.removed_share
    return a == b


@dataclass(frozen=True)
class Spelled:
    """A spelling split into its parts, nothing looked up: ``prefix`` (``kvpress``, ``set``, ``policy`` or
    ''), ``name``, ``budget`` text (None: no ``@``) and ``options`` text (None: no colon after the name or
    budget)."""

    prefix: str
    name: str
    budget: str | None
    options: str | None


def split_spelling(text: str, prefix: str = "") -> Spelled:
    """``PREFIX:NAME@BUDGET:options`` -> its parts. The name runs to the first ``@`` or ``:``; the budget from the
    ``@`` to the next colon; the options are the rest (they may hold colons and ``@``: ``chunk=512:640``,
    ``path=a@b``)."""
    rest = text.strip()
    if prefix:
        rest = rest[len(prefix) + 1 :]
    cut = min((i for i in (rest.find("@"), rest.find(":")) if i >= 0), default=len(rest))
    name, tail = rest[:cut].strip(), rest[cut:]
    budget = options = None
    if tail.startswith("@"):
        budget, colon, after = tail[1:].partition(":")
        budget = budget.strip()
        options = after if colon else None
    elif tail.startswith(":"):
        options = tail[1:]
    return Spelled(prefix, name, budget, None if options is None else options.strip())
