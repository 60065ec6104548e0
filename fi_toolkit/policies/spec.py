"""Policies by name, spelled like kvpress presses: ``NAME[:key=value,key=value]``.

``infokv:alpha=0.5,tau=2`` is ``InfoKV(alpha=0.5, tau=2.0)``: each value is parsed by the type of the
dataclass field it sets (float, int or bool: ``true``/``false``) and checked by the policy's own
validation (``alpha must lie in [0, 1], got 2.0``); an option the policy does not have is refused, naming
its options. The budget is no option: it has its own spelling (``--budget``, ``policy:NAME@BUDGET``).
``adaptive(NAME)[:key=value,...]`` wraps a scored policy in :class:`~fi_toolkit.policies.adaptive.Adaptive`
(the options set the wrapped policy's fields); ``NAME-adaptive`` means the same and is how labels spell it
(``infokv-adaptive``, the name result tables have always given adaptive InfoKV). Options spelled with the
name appear in the policy's name and label (``infokv:alpha=0.5@keep=0.25``). kvpress presses
(``kvpress:NAME``) are resolved above this package, by :func:`fi_toolkit.integrations.kvpress.names.named_policy`.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass

from fi_toolkit.errors import FIError
from fi_toolkit.policies.adaptive import Adaptive
from fi_toolkit.policies.base import Policy
from fi_toolkit.policies.fi_oracle import FIOracle
from fi_toolkit.policies.fitted import Fitted
from fi_toolkit.policies.h2o import H2O
from fi_toolkit.policies.infokv import InfoKV
from fi_toolkit.policies.knorm import KNorm
from fi_toolkit.policies.pyramidkv import PyramidKV
from fi_toolkit.policies.random import RandomPolicy
from fi_toolkit.policies.rpc import RPC
from fi_toolkit.policies.snapkv import SnapKV
from fi_toolkit.policies.streaming import StreamingLLM

POLICIES: dict[str, type[Policy]] = {
    "infokv": InfoKV,
    "snapkv": SnapKV,
    "pyramidkv": PyramidKV,
    "streaming": StreamingLLM,
    "h2o": H2O,
    "knorm": KNorm,
    "random": RandomPolicy,
    "rpc": RPC,
}
# Named like the others but not in POLICIES, which lists the policies that compress from their name alone:
# the FI oracle sees the future (its scores come from the probe, `fi probe --select`, or from a replay's
# look-ahead, `fi eval` on documents), and a
# fitted policy reads a file (fitted:path=FILE, a score learned by fi fit).
ORACLES: dict[str, type[Policy]] = {"fi-oracle": FIOracle}
FILE_POLICIES: dict[str, type[Policy]] = {"fitted": Fitted}
NAMED: dict[str, type[Policy]] = {**POLICIES, **ORACLES, **FILE_POLICIES}
SPELLING = "NAME[:key=value,...], adaptive(NAME)[:key=value,...] (alias NAME-adaptive) or kvpress:NAME"
_ADAPTIVE = re.compile(r"adaptive\((?P<inner>[^()]*)\)")
_OPTION = re.compile(r"[A-Za-z_][\w-]*=.*")  # a list item that continues the previous item's options


@dataclass(frozen=True)
class PolicySpec:
    """A parsed ``NAME[:key=value,...]``: the policy's name, whether it is wrapped in ``Adaptive``, and the
    options as spelled (values parsed by their field's type)."""

    name: str
    adaptive: bool = False
    options: tuple[tuple[str, object], ...] = ()

    @property
    def cls(self) -> type[Policy]:
        return NAMED[self.name]

    @property
    def options_label(self) -> str:
        """``alpha=0.5,tau=2.0``: the options as labels show them (they parse back to the same values)."""
        return ",".join(
            f"{k}={str(v).lower() if isinstance(v, bool) else v if isinstance(v, str) else repr(v)}"
            for k, v in self.options
        )


def options_of(cls: type[Policy]) -> dict[str, type]:
    """A policy's options and their types: its ``__init__`` fields but the budget, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init and f.name != "budget"}


def _unknown(name: str) -> FIError:
    return FIError(f"unknown policy '{name}' (choose from {', '.join(NAMED)}, or spell {SPELLING})")


def _value(text: str, kind: type, key: str, where: str):
    """``text`` as the field's type: bool (true/false/1/0/yes/no), int (a whole number) or float."""
    text = text.strip()
    if kind is bool:
        word = text.lower()
        if word in ("true", "1", "yes", "on"):
            return True
        if word in ("false", "0", "no", "off"):
            return False
        raise FIError(f"{where}: {key} must be true or false, got '{text}'")
    try:
        return kind(text)
    except (TypeError, ValueError):
        what = {int: "a whole number", float: "a number"}.get(kind, kind.__name__)
        raise FIError(f"{where}: {key} must be {what}, got '{text}'") from None


def parse_spec(text: str, where: str = "") -> PolicySpec:
    """``"adaptive(infokv):alpha=0.5"`` -> :class:`PolicySpec`; refuses unknown names and options in one line.

    Args:
        text: ``NAME[:key=value,...]``, ``adaptive(NAME)`` or ``NAME-adaptive``; ``kvpress:PRESS`` for a
            kvpress press.
        where: how error messages name the option (default: ``policy TEXT``).

    Returns:
        The :class:`PolicySpec`: the policy's name, its options as typed values, and whether it is adaptive.

    Raises:
        FIError: an unknown name, an option the policy lacks, or a value of the wrong type (one line).
    """
    where = where or f"policy {text}"
    head, colon, tail = text.strip().partition(":")
    head = head.strip().lower()
    match = _ADAPTIVE.fullmatch(head)
    adaptive = match is not None or (head.endswith("-adaptive") and head != "-adaptive")
    name = match["inner"].strip() if match else head.removesuffix("-adaptive") if adaptive else head
    if name not in NAMED:
        if adaptive and (name.endswith("-adaptive") or name.startswith("adaptive(")):
            raise FIError(f"{where}: '{name}' is adaptive already; adaptive(NAME) wraps a plain policy")
        raise _unknown(name if name else text.strip())
    if colon and not tail.strip():
        raise FIError(f"{where}: expected options after the colon, like {name}:key=value,key=value")
    known = options_of(NAMED[name])
    options: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in tail.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key.isidentifier():
            raise FIError(f"{where}: expected options like {name}:key=value,key=value, got '{part}'")
        if key not in known:
            budget = "; the budget is given with the budget argument or @BUDGET" if key == "budget" else ""
            raise FIError(
                f"{where}: {name} has no option '{key}' (its options: {', '.join(known)}){budget}",
                parameter={"the budget argument": "budget"},
            )
        if key in options:
            raise FIError(f"{where}: the option '{key}' is given twice")
        options[key] = _value(value, known[key], key, where)
    return PolicySpec(name, adaptive, tuple(options.items()))


def parse_policy(
    text: str,
    budget=None,
    window: int | None = None,
    *,
    where: str = "",
    shared: tuple[str, ...] = (),
    future: bool = False,
    **defaults,
) -> Policy:
    """A policy from its spelling: ``parse_policy("infokv:alpha=0.5", budget="keep=0.25", window=32)``.

    The options spelled in ``text`` override ``budget``, ``window`` and ``defaults``.

    Args:
        text: ``NAME[:key=value,...]`` (``adaptive(NAME)``, ``kvpress:PRESS`` too; :func:`parse_spec`).
        budget: ``keep=X`` or ``remove=X``, a share or a count (None: the policy's default).
        window: the observation window ``w`` (None: the policy's default).
        where: how error messages name the option.
        shared: options the caller fixes for every policy of a run (the signals' ``window`` and ``top_k``,
            which one trace serves to all): spelling them per policy is refused.
        future: whether the caller can give a policy that sees the future (the FI oracle) its scores: the
            probe (a future chunk) and replays of known text (``fi eval`` on documents); elsewhere
            (generation, tasks: no continuation is known) such a policy is refused.
        **defaults: the command line's global ``--alpha``, ``--tau``, ``--top-k``: values for whichever
            of these fields the policy has (the others are not its options and are not passed).

    Returns:
        The :class:`~fi_toolkit.policies.base.Policy`.

    Raises:
        FIError: an unknown name or option, a bad value, a shared option spelled per policy, or a policy
            that sees the future where none is known.
    """
    where = where or f"policy {text}"
    spec = parse_spec(text, where)
    if getattr(spec.cls, "sees_future", False) and not future:
        raise FIError(
            f"{where}: {spec.name} is an oracle that sees the future text; it is measured only where "
            f"the continuation is known: by a probe (the selection policy:{spec.name}@BUDGET) or in "
            "fi eval on documents, not to generate or on tasks"
        )
    known = options_of(spec.cls)
    given = {**defaults, "window": window}
    kwargs = {k: v for k, v in given.items() if k in known and v is not None}
    if budget is not None:
        kwargs["budget"] = budget
    kwargs.update(spec.options)
    try:
        policy = spec.cls(**kwargs)
        if spec.adaptive:
            policy = Adaptive(policy)
    except FIError as exc:
        raise FIError(f"{where}: {exc}") from None
    for key, _ in spec.options:  # (after the policy's own checks, which speak of the value)
        if key in shared:
            raise FIError(
                f"{where}: {key} is a signal option every policy of this run shares; give it with SignalConfig.{key}",
                parameter={f"SignalConfig.{key}": key},
            )
    if spec.options:
        policy.name = f"{policy.name}:{spec.options_label}"  # the label names the options spelled
    return policy


def make_policy(name: str, **kwargs) -> Policy:
    """``make_policy("infokv", budget="keep=0.25", alpha=0.9)`` (``name`` may spell options too:
    ``"infokv:alpha=0.9"``); a keyword the policy has no field for is refused (None: the default).

    Args:
        name: a policy's name, with options as the command line spells them (``"snapkv:window=16"``).
        **kwargs: the policy's fields: ``budget`` (``"keep=0.25"``, ``0.25``, ``512``), ``window``, and its
            own (``alpha``, ``tau``, ``top_k``, ``beta``, ``sinks``, ``seed``, ...); None keeps the default.

    Returns:
        The :class:`~fi_toolkit.policies.base.Policy`; ``policy.keep_map(trace)`` gives its
        :class:`~fi_toolkit.eviction.KeepMap` (``keep[l]``: ``[Hkv, k_l]``).

    Raises:
        FIError: an unknown name or a keyword the policy has no field for.
    """
    spec = parse_spec(name)
    known = {"budget", *options_of(spec.cls)}
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        raise FIError(f"{spec.name} has no option '{unknown[0]}' (its options: {', '.join(sorted(known))})")
    return parse_policy(name, **kwargs)


def split_policies(text: str, option: str = "policies") -> list[str]:
    """``infokv:alpha=0.5,tau=2,snapkv`` -> ``["infokv:alpha=0.5,tau=2", "snapkv"]``: a comma-separated
    list whose items may carry options (an item ``key=value`` continues the previous item's options).
    An empty item or an item given twice is refused.

    Args:
        text: the comma-separated list, as ``--policy`` takes it.
        option: the option's name in error messages.

    Returns:
        One spec per policy, in order, each for :func:`parse_policy`.

    Raises:
        FIError: an empty item or a repeated one.
    """
    items: list[str] = []
    for part in (t.strip() for t in text.split(",")):
        if not part or not text.strip():
            raise FIError(
                f"{option} must be a comma-separated list without empty items, got '{text}'", parameter=option
            )
        if items and ":" in items[-1] and _OPTION.fullmatch(part):
            items[-1] += f",{part}"
        else:
            items.append(part)
    if len(set(items)) != len(items):
        raise FIError(f"{option} lists an item twice: '{text}'", parameter=option)
    return items
