"""The policy registry: every policy a command, a probe selection or the Python API can name, with its kind,
a one-line summary, its paper and its options. Names resolve here and nowhere else (tests/test_imports.py).

**Spelling**, kvpress style: ``NAME[@BUDGET][:key=value,...]``, one grammar for every method that chooses cache entries,
policy, press or probe token set (:mod:`fi_toolkit.policies.method`; :func:`parse_method` parses it into one
:class:`~fi_toolkit.policies.method.Method`). ``infokv:alpha=0.5,tau=2`` is ``InfoKV(alpha=0.5, tau=2.0)``: each value
is parsed by the type of the dataclass field it sets (float, int or bool: ``true``/``false``) and checked by the
policy's own validation (``alpha must lie in [0, 1], got 2.0``); an option the policy does not have is refused, naming
its options. The budget is no option: it has its own spelling (``--budget``, ``NAME@BUDGET``; a budget spelled with the
name wins). A wrapper wraps a scored policy: ``adaptive(NAME)[:key=value,...]`` is
:class:`~fi_toolkit.policies.adaptive.Adaptive` (the options set the wrapped policy's fields), also spelled
``NAME-adaptive`` (how labels spell it: ``infokv-adaptive``). Options spelled with the name appear in the policy's name
and label (``infokv:alpha=0.5@keep=0.25``).

**Kinds**: ``policy`` (compresses from its name alone), ``wrapper``, ``oracle`` (sees the future text: only a
probe or a replay of known text can give it its scores), ``file policy`` (reads a file: ``fitted:path=FILE``)
and ``press`` (a family a provider resolves under its prefix: ``kvpress:NAME``).

**Adding a policy**: its dataclass in a file of its own and one :func:`register` line at the end of this module
(or ``@register(summary=..., paper=...)`` on the class).

**Providers**: a family of policies that lives above this package (the kvpress integration) plugs in under a
prefix, as an object with ``prefix``, ``entries()``, ``resolve(text, budget, window, where)`` (``PREFIX:NAME[:...]``
-> a policy) and ``selection(text, where)`` (a probe's ``PREFIX:NAME@B[:...]`` -> a :class:`ProvidedSelection`).
Providers are found through the entry-point group ``fi_toolkit.policies`` (pyproject.toml), read with
:mod:`importlib.metadata` the first time one is needed (a name with a prefix no project policy has, a listing,
an error that lists the names), never when a project policy is named. Why entry points: this module sits below
the integrations (tests/test_layers.py) and must not import them, and no command may import the kvpress
integration either (it needs torch and kvpress); an entry point lets an installed package plug in without
anyone importing it by name, the toolkit's own integration like any other package's. An installation whose
metadata predates the group (a development install made before it was declared) still finds the toolkit's own
providers: :data:`IN_TREE_PROVIDERS` names their modules, imported by name for a prefix no entry point gives.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.policies.adaptive import Adaptive
from fi_toolkit.policies.base import Policy
from fi_toolkit.policies.expected_attention import ExpectedAttention
from fi_toolkit.policies.fi_oracle import FIOracle
from fi_toolkit.policies.h2o import H2O
from fi_toolkit.policies.infokv import InfoKV
from fi_toolkit.policies.knorm import KNorm
from fi_toolkit.policies.learned import Fitted, Learned
from fi_toolkit.policies.method import (
    LEGACY_POLICY_PREFIX,
    SET_OPTIONS,
    SET_PREFIX,
    SETS,
    Method,
    split_spelling,
)
from fi_toolkit.policies.method import POLICY as POLICY_METHOD
from fi_toolkit.policies.method import PRESS as PRESS_METHOD
from fi_toolkit.policies.method import SET as SET_METHOD
from fi_toolkit.policies.pyramidkv import PyramidKV
from fi_toolkit.policies.random import RandomPolicy
from fi_toolkit.policies.rpc import RPC
from fi_toolkit.policies.snapkv import SnapKV
from fi_toolkit.policies.streaming import StreamingLLM
from fi_toolkit.policies.surrogate import Surrogate
from fi_toolkit.policies.tova import TOVA

if TYPE_CHECKING:
    import torch

    from fi_toolkit.eviction import KeepMap

POLICY, WRAPPER, ORACLE, FILE_POLICY, PRESS = "policy", "wrapper", "oracle", "file policy", "press"
KINDS = (POLICY, WRAPPER, ORACLE, FILE_POLICY, PRESS)
ENTRY_POINT_GROUP = "fi_toolkit.policies"
IN_TREE_PROVIDERS = {"kvpress": "fi_toolkit.integrations.kvpress.provider:PROVIDER"}  # prefix -> module:object
OPTIONS = "[:key=value,...]"
_WRAPPED = re.compile(r"(?P<wrapper>[a-z][\w-]*)\((?P<inner>[^()]*)\)")
_OPTION = re.compile(r"[A-Za-z_][\w-]*=.*")  # a list item that continues the previous item's options
_TYPE_NAMES = {float: "float", int: "int", bool: "bool"}


@dataclass(frozen=True)
class Option:
    """One option of a policy: its field's name, type (``float``, ``int``, ``bool`` or ``text``) and default."""

    name: str
    type: str
    default: object

    @property
    def label(self) -> str:
        """``alpha=0.9``; the name alone where the default is empty (``chunk``: the first probed chunk)."""
        value = str(self.default).lower() if isinstance(self.default, bool) else str(self.default)
        return f"{self.name}={value}" if value else self.name


@dataclass(frozen=True)
class Entry:
    """What the registry holds under one name. ``spelling``: how ``--policy`` writes it; ``selection``: how a
    probe selection writes it (``NAME@B[:key=value,...]`` for the project's own); ``cls``: the policy's
    dataclass (None for a provider's family, which the provider resolves)."""

    name: str
    kind: str
    summary: str
    paper: str = ""  # arXiv id; "" for a control or a family of presses
    options: tuple[Option, ...] = ()
    spelling: str = ""
    selection: str = ""
    cls: type | None = None


class ProvidedSelection(Protocol):
    """A probe selection a provider resolved (``kvpress:SnapKVPress@keep=0.25``): its ``label`` in result tables,
    the entries per head it keeps of ``p`` (checked before the model loads) and its keep map."""

    label: str

    def n_kept(self, p: int) -> int: ...

    def keep_map(self, model, ids: torch.Tensor, p: int, where: str) -> KeepMap: ...


class Provider(Protocol):
    """A family of policies under ``prefix`` (module docstring)."""

    prefix: str

    def entries(self) -> list[Entry]: ...

    def resolve(self, text: str, budget, window: int | None, where: str) -> Policy: ...

    def selection(self, text: str, where: str) -> ProvidedSelection: ...

    # optional: ``budget(text, where) -> Budget``, the family's reading of a budget spelled with a name (kvpress: a
    # share with its side); without it any budget is read as :meth:`Budget.parse` reads it


_ENTRIES: dict[str, Entry] = {}


def options_of(cls: type[Policy]) -> dict[str, type]:
    """A policy's options and their types: its ``__init__`` fields but the budget, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init and f.name != "budget"}


def _options(cls: type[Policy]) -> tuple[Option, ...]:
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    return tuple(Option(name, _TYPE_NAMES.get(kind, "text"), defaults[name]) for name, kind in options_of(cls).items())


def register(cls: type[Policy] | None = None, /, *, summary: str, paper: str = "", kind: str = POLICY, name: str = ""):
    """Register a policy class under ``name`` (default: its ``name``), as a call (``register(SnapKV, summary=...,
    paper="2404.14469")``) or a decorator (``@register(summary=...)``). A wrapper (``kind="wrapper"``) is
    spelled ``NAME(POLICY)`` or ``POLICY-NAME`` and built as ``cls(policy)``. A name is registered once."""
    if kind not in KINDS or kind == PRESS:
        raise ValueError(f"kind must be one of {', '.join(k for k in KINDS if k != PRESS)}, got {kind!r}")

    def add(policy_cls: type[Policy]) -> type[Policy]:
        key = name or policy_cls.name
        if key in _ENTRIES:
            raise ValueError(f"a policy named '{key}' is registered already ({_ENTRIES[key].cls.__name__})")
        base = f"{key}(NAME)" if kind == WRAPPER else key
        rest = ":path=FILE" if kind == FILE_POLICY else OPTIONS
        options = () if kind == WRAPPER else _options(policy_cls)  # a wrapper's options are the wrapped policy's
        spelling, selection = base + rest, f"{base}@B{rest}"
        _ENTRIES[key] = Entry(key, kind, summary, paper, options, spelling, selection, policy_cls)
        return policy_cls

    return add if cls is None else add(cls)


# --- providers ---------------------------------------------------------------------------------------


def _load(target: str):
    """``module:object`` -> the object (the in-tree providers' spelling, as an entry point writes it)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@functools.cache
def _providers() -> tuple[dict[str, Provider], dict[str, str]]:
    """The providers by prefix, and the prefixes whose provider failed to load with the reason (a broken
    package must not break every command: its prefix answers with the reason when named)."""
    from importlib.metadata import entry_points

    found: dict[str, Provider] = {}
    broken: dict[str, str] = {}
    targets = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    for prefix, target in IN_TREE_PROVIDERS.items():
        targets.setdefault(prefix, target)
    for prefix, target in targets.items():
        try:
            found[prefix.lower()] = _load(target) if isinstance(target, str) else target.load()
        except Exception as exc:  # an uninstallable plugin: reported when its prefix is named
            broken[prefix.lower()] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    return found, broken


def _provider(prefix: str, where: str) -> Provider | None:
    found, broken = _providers()
    if prefix in broken:
        raise FIError(f"{where}: the policies under '{prefix}:' cannot be loaded ({broken[prefix]})")
    return found.get(prefix)


def prefixes() -> tuple[str, ...]:
    """The providers' prefixes (``("kvpress",)``): what a probe selection may start with besides its own kinds."""
    return tuple(sorted(_providers()[0]))


def entries() -> list[Entry]:
    """Everything the registry holds: the project's entries in registration order, then each provider's."""
    out = list(_ENTRIES.values())
    for prefix in prefixes():
        out += _providers()[0][prefix].entries()
    return out


def catalog(ratio: float, layers: int) -> list[tuple[str, str | None, str]]:
    """Every press the providers offer, for a study over all of them (``fi field``): ``(name, spec, reason)``
    per press class, ``spec`` a probe selection at ``ratio`` (the share removed; ``layers``: the model's, for
    a press that takes one ratio per layer) or None with the ``reason`` it has none. A provider without a
    ``catalog``, or whose library is missing, gives one row ``PREFIX:*`` with the reason."""
    found, broken = _providers()
    out = [(f"{prefix}:*", None, reason) for prefix, reason in sorted(broken.items())]
    for prefix in sorted(found):
        listing = getattr(found[prefix], "catalog", None)
        if listing is None:
            out.append((f"{prefix}:*", None, "the provider lists no presses"))
            continue
        try:
            out += [
                (f"{prefix}:{name}", None if spec is None else f"{prefix}:{spec}", reason)
                for name, spec, reason in listing(ratio, layers)
            ]
        except FIError as exc:
            out.append((f"{prefix}:*", None, str(exc)))
    return out


# --- resolving names ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """A parsed ``NAME[:key=value,...]``: the entry, the wrapper around it (or None), the options as spelled."""

    entry: Entry
    wrapper: Entry | None = None
    options: tuple[tuple[str, object], ...] = ()

    @property
    def options_label(self) -> str:
        """``alpha=0.5,tau=2.0``: the options as labels show them (they parse back to the same values)."""
        return ",".join(
            f"{k}={str(v).lower() if isinstance(v, bool) else v if isinstance(v, str) else repr(v)}"
            for k, v in self.options
        )


def _wrappers() -> dict[str, Entry]:
    return {e.name: e for e in _ENTRIES.values() if e.kind == WRAPPER}


def _unwrap(head: str) -> tuple[Entry | None, str]:
    """``adaptive(infokv)`` or ``infokv-adaptive`` -> (the wrapper's entry, ``infokv``); else (None, head)."""
    wrappers = _wrappers()
    match = _WRAPPED.fullmatch(head)
    if match and match["wrapper"] in wrappers:
        return wrappers[match["wrapper"]], match["inner"].strip()
    for key, wrapper in wrappers.items():
        if head.endswith(f"-{key}") and head != f"-{key}":
            return wrapper, head.removesuffix(f"-{key}")
    return None, head


def _named(name: str) -> Entry | None:
    entry = _ENTRIES.get(name)
    return entry if entry is not None and entry.kind != WRAPPER else None


def _unknown(name: str, oracles: bool = True) -> FIError:
    """The one-line refusal of a name the registry does not hold, listing what it holds (the oracles only
    where the caller can give them the future: ``oracles``)."""
    names = [e.name for e in entries() if e.kind != WRAPPER and (oracles or e.kind != ORACLE)]
    wrapped = " or ".join(f"{e.spelling} (alias NAME-{e.name})" for e in _wrappers().values())
    return FIError(
        f"unknown policy '{name}' (choose from {', '.join(names)}; spell NAME[@BUDGET]{OPTIONS}"
        + (f" or {wrapped}" if wrapped else "")
        + ")"
    )


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


def _entry_of(text: str, where: str, oracles: bool = True) -> tuple[Entry | None, Entry]:
    """The wrapper (or None) and the entry a spelling's name names (``adaptive(infokv):...``); unknown names
    refused."""
    wrapper, name = _unwrap(re.split(r"[:@]", text.strip(), maxsplit=1)[0].strip().lower())
    entry = _named(name)
    if entry is None:
        if wrapper is not None and _unwrap(name)[0] is not None:
            raise FIError(f"{where}: '{name}' is {wrapper.name} already; {wrapper.name}(NAME) wraps a plain policy")
        raise _unknown(name if name else text.strip(), oracles)
    return wrapper, entry


def _parse(text: str, where: str, oracles: bool = True) -> _Spec:
    """``"adaptive(infokv):alpha=0.5"`` -> :class:`_Spec`; refuses unknown names and options in one line."""
    _, colon, tail = text.strip().partition(":")
    wrapper, entry = _entry_of(text, where, oracles)
    name = entry.name
    if colon and not tail.strip():
        raise FIError(f"{where}: expected options after the colon, like {name}:key=value,key=value")
    known = options_of(entry.cls)
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
    return _Spec(entry, wrapper, tuple(options.items()))


def _provider_of(text: str, where: str) -> Provider | None:
    """The provider a spelling names (``kvpress:...``), or None for the project's own names; providers are
    looked up only for a prefix that is no project name."""
    head, colon, _ = text.strip().partition(":")
    head = head.strip().lower()
    if not colon or "@" in head or _named(_unwrap(head)[1]) is not None:  # NAME@BUDGET:...: a project name's
        return None
    return _provider(head, where)


def parse_method(text: str | Method, where: str = "", *, oracles: bool = True) -> Method:
    """Any method's spelling, ``NAME[@BUDGET][:key=value,...]`` (:mod:`fi_toolkit.policies.method`) -> its
    :class:`~fi_toolkit.policies.method.Method`: a project policy (its name and options checked, the options
    as labels spell them), a provider's press (its budget a share with its side: a bare number is refused naming
    both spellings) or a probe token set (``set:KIND[@BUDGET][:options]``). Unknown names and options, and
    budgets that do not parse, are refused in one line; nothing is built and no model or file is read.
    A :class:`Method` is returned as it is. ``oracles``: whether an unknown name's refusal lists the oracles
    (where the caller can give them the future)."""
    if isinstance(text, Method):
        return text
    where = where or f"policy {text}"
    head = text.strip().partition(":")[0].strip().lower()
    if head == SET_PREFIX and ":" in text:
        return _parse_set(text, where)
    if head == LEGACY_POLICY_PREFIX and _named(LEGACY_POLICY_PREFIX) is None and ":" in text:
        text = text.strip()[len(LEGACY_POLICY_PREFIX) + 1 :]  # the probe's first spelling, policy:NAME@B
    provider = _provider_of(text, where)
    if provider is not None:
        return _parse_press(text, provider, where)
    parts = split_spelling(text)
    if parts.name.lower() in SETS and _named(parts.name.lower()) is None:  # entropy@remove=0.1: set:entropy@...
        return _parse_set(f"{SET_PREFIX}:{text.strip()}", where)
    budget = None if parts.budget is None else Budget.parse(parts.budget, where)
    if parts.options is not None and "@" in parts.options:
        misplaced = parts.options.rpartition("@")[2]
        if misplaced.partition("=")[0].strip().lower() in ("keep", "remove"):
            raise FIError(f"{where}: write the budget before the options: {parts.name}@{misplaced}:OPTIONS")
    spec = _parse(parts.name + ("" if parts.options is None else f":{parts.options}"), where, oracles)
    name = spec.entry.name if spec.wrapper is None else f"{spec.entry.name}-{spec.wrapper.name}"
    written = parts.name + (f":{parts.options}" if parts.options else "")
    return Method(POLICY_METHOD, name, budget, spec.options_label, name=written)


def _parse_press(text: str, provider: Provider, where: str) -> Method:
    """``PREFIX:NAMES[@BUDGET][:options]``; the provider reads the budget where it has its own rule (kvpress: a
    share with its side), else it is any budget."""
    prefix = text.strip().partition(":")[0].strip().lower()
    parts = split_spelling(text, prefix)
    if not parts.name or not all(n.strip() for n in parts.name.split("/")):
        raise FIError(f"{where}: expected {prefix}:NAME[@BUDGET][:key=value,...], e.g. {prefix}:SnapKVPress@keep=0.25")
    budget = None
    if parts.budget is not None:
        read = getattr(provider, "budget", None) or Budget.parse
        budget = read(parts.budget, where)
    head = f"{prefix}:{'/'.join(n.strip() for n in parts.name.split('/'))}"
    options = parts.options or ""
    return Method(PRESS_METHOD, head, budget, options, name=head + (f":{options}" if options else ""))


def _parse_set(text: str, where: str) -> Method:
    """``set:KIND[@BUDGET][:options]``: a probe token set; its options' values are the probe's to read."""
    parts = split_spelling(text, SET_PREFIX)
    kind = parts.name.lower()
    if kind not in SETS:
        raise FIError(f"{where}: unknown token set '{parts.name}' (choose from {', '.join(SETS)})")
    budget = None if parts.budget is None else Budget.parse(parts.budget, where)
    options = parts.options or ""
    allowed = SET_OPTIONS.get(kind, ())
    key = options.partition("=")[0].strip()
    if options and (key not in allowed or "=" not in options):
        takes = f"its option: {allowed[0]}=..." if allowed else "it takes no options"
        raise FIError(f"{where}: set:{kind} has no option '{key}' ({takes})")
    return Method(SET_METHOD, kind, budget, options)


def lookup(text: str, where: str = "") -> Entry:
    """The entry a spelling names (``adaptive(infokv):alpha=0.5`` -> infokv's, ``kvpress:TOVAPress`` -> the
    kvpress family's); an unknown name is refused in one line, the options are not read."""
    where = where or f"policy {text}"
    provider = _provider_of(text, where)
    if provider is not None:
        return provider.entries()[0]
    return _entry_of(text, where)[1]


def resolve(
    text: str | Method,
    budget=None,
    window: int | None = None,
    *,
    where: str = "",
    shared: tuple[str, ...] = (),
    future: bool = False,
    **defaults,
) -> Policy:
    """A policy from its spelling: ``resolve("infokv:alpha=0.5", budget="keep=0.25", window=32)``, a provider's
    (``resolve("kvpress:TOVAPress", "keep=0.25")``) included. The options spelled in ``text`` override
    ``budget``, ``window`` and ``defaults``.

    Args:
        text: a method's spelling, ``NAME[@BUDGET][:key=value,...]``, ``adaptive(NAME)[@...][:...]`` (alias
            ``NAME-adaptive``) or a provider's ``PREFIX:NAME[@...][:...]`` (``kvpress:PRESS``), or its parsed
            :class:`~fi_toolkit.policies.method.Method`.
        budget: ``keep=X`` or ``remove=X``, a share or a count (None: the policy's default); a budget spelled
            in ``text`` is the method's own and wins.
        window: the observation window ``w`` (None: the policy's default).
        where: how error messages name the option.
        shared: options the caller fixes for every policy of a run (the signals' ``window`` and ``top_k``,
            which one trace serves to all): spelling them per policy is refused.
        future: whether the caller can give a policy that sees the future (the FI oracle) its scores: the
            probe (a future chunk) and replays of known text (``fi eval`` on documents); elsewhere
            (generation, tasks: no continuation is known) such a policy is refused.
        **defaults: the command line's global ``--alpha``, ``--tau``, ``--top-k``: values for whichever of
            these fields the policy has (the others are not its options and are not passed).

    Returns:
        The :class:`~fi_toolkit.policies.base.Policy`.

    Raises:
        FIError: an unknown name or option, a bad value, a shared option spelled per policy, or a policy
            that sees the future where none is known (one line).
    """
    where = where or f"policy {text if isinstance(text, str) else text.spelling}"
    method = parse_method(text, where, oracles=future)
    if method.kind not in (POLICY_METHOD, PRESS_METHOD):
        raise FIError(
            f"{where}: {method.spelling} is a token set of the probe's analysis (it removes the same positions "
            "from every layer and head, once), not a policy: a probe selection measures it"
        )
    budget = budget if method.budget is None else method.budget
    if method.kind == PRESS_METHOD:
        return _provider_of(method.head, where).resolve(method.policy_text, budget, window, where)
    spec = _parse(method.policy_text, where, oracles=future)
    cls = spec.entry.cls
    if getattr(cls, "sees_future", False) and not future:
        raise FIError(
            f"{where}: {spec.entry.name} is an oracle that sees the future text; it is measured only where "
            f"the continuation is known: by a probe (the selection policy:{spec.entry.name}@BUDGET) or in "
            "fi eval on documents, not to generate or on tasks"
        )
    known = options_of(cls)
    given = {**defaults, "window": window}
    kwargs = {k: v for k, v in given.items() if k in known and v is not None}
    if budget is not None:
        kwargs["budget"] = budget
    kwargs.update(spec.options)
    try:
        policy = cls(**kwargs)
        if spec.wrapper is not None:
            policy = spec.wrapper.cls(policy)
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


def resolve_selection(text: str, where: str = "") -> ProvidedSelection:
    """A probe selection of a provider, ``PREFIX:NAME@B[:key=value,...]`` (``kvpress:SnapKVPress@keep=0.25``),
    checked now (the name, the budget, the options, that the provider's library is installed)."""
    where = where or f"selection {text}"
    prefix = text.strip().partition(":")[0].strip().lower()
    provider = _provider(prefix, where)
    if provider is None:
        raise FIError(f"{where}: no policies are registered under '{prefix}:' (prefixes: {', '.join(prefixes())})")
    return provider.selection(text, where)


def make_policy(name: str, **kwargs) -> Policy:
    """``make_policy("infokv", budget="keep=0.25", alpha=0.9)`` (``name`` may spell options too:
    ``"infokv:alpha=0.9"``); a keyword the policy has no field for is refused (None: the default)."""
    entry = lookup(name)
    known = {"budget", *(o.name for o in entry.options)}
    unknown_keys = [k for k in kwargs if k not in known] if entry.cls is not None else []
    if unknown_keys:
        raise FIError(f"{entry.name} has no option '{unknown_keys[0]}' (its options: {', '.join(sorted(known))})")
    return resolve(name, **kwargs)


parse_policy = resolve  # the name the tests, notebooks and docs have always used


def split_policies(text: str, option: str = "policies") -> list[str]:
    """``infokv:alpha=0.5,tau=2,snapkv`` -> ``["infokv:alpha=0.5,tau=2", "snapkv"]``: a comma-separated
    list whose items may carry options (an item ``key=value`` continues the previous item's options).
    An empty item or an item given twice is refused."""
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


def is_policy_name(name: str) -> bool:
    """Whether ``name`` (no options, no budget) names a project policy, wrapped or not (``adaptive(infokv)``,
    ``infokv-adaptive``)."""
    return _named(_unwrap(name.strip().lower())[1]) is not None


def is_oracle(name: str) -> bool:
    """Whether a policy's name or label (``fi-oracle:samples=2``, ``fi-oracle@keep=0.5``) is an oracle's."""
    entry = _named(re.split(r"[:@]", str(name).strip().lower(), maxsplit=1)[0])
    return entry is not None and entry.kind == ORACLE


# --- what the registry holds, for help texts and the docs --------------------------------------------


def _described(entry: Entry, selection: bool) -> str:
    """One entry as a help text lists it: its spelling, its options with their defaults, its summary when
    a name alone does not say what it is."""
    shown = [o.label for o in entry.options if o.name not in ("window", "path")]
    options = f" ({', '.join(shown)})" if shown else ""
    if entry.kind == POLICY:
        return entry.name + options
    spelled = (entry.selection if selection else entry.spelling).replace(OPTIONS, "")
    alias = f" (alias NAME-{entry.name})" if entry.kind == WRAPPER else ""
    return f"{spelled}{alias}{options}: {entry.summary}"


def policy_names(*, oracles: bool = True) -> list[str]:
    """The names a ``--policy`` may give, as spelled without options (``infokv``, ``adaptive(NAME)``,
    ``fitted:path=FILE``, ``kvpress:NAME``), for a compact list; ``oracles``: where the future is known."""
    return [e.spelling.replace(OPTIONS, "") for e in entries() if oracles or e.kind != ORACLE]


def policy_help(*, oracles: bool = True, selection: bool = False) -> str:
    """What the registry holds, for the help of an option that names policies (``--policy``; ``selection``:
    a probe's ``--select``, which needs the budget, ``NAME@B``): the policies with their options' defaults, then the
    wrappers, file policies, oracles (``oracles``: where the future is known) and providers' families. One
    clause, without a final period: the command's own sentences follow it."""
    held = [e for e in entries() if oracles or e.kind != ORACLE]
    plain = [_described(e, selection) for e in held if e.kind == POLICY]
    others = [_described(e, selection) for e in held if e.kind != POLICY]
    head = "NAME@B[:key=value,...] with NAME one of " if selection else "NAME[@B][:key=value,...] with NAME one of "
    return f"{head}{', '.join(plain)} (every policy also takes window=32); " + "; ".join(others)


# --- the project's policies --------------------------------------------------------------------------

register(InfoKV, paper="2606.26875", summary="top of α·A + (1−α)·softmax((D+τ)·H): window attention and entropy")
register(SnapKV, paper="2404.14469", summary="top window attention (pooled, kernel 7)")
register(PyramidKV, paper="2406.02069", summary="SnapKV scores, budgets shrinking linearly with depth")
register(StreamingLLM, paper="2309.17453", summary="the first sinks tokens and the most recent")
register(H2O, paper="2306.14048", summary="top accumulated attention: summed, unpooled")
register(KNorm, paper="2406.11430", summary="lowest key L2 norm")
register(RandomPolicy, summary="uniformly random (a control)")
register(RPC, paper="2505.13866", summary="generated tokens only, by the attention of the recent queries")
register(
    ExpectedAttention,
    paper="2510.00636",
    summary="top expected attention of the future queries (their mean and covariance, RoPE averaged) × ‖v‖",
)
register(TOVA, paper="2401.06104", summary="top attention of the last query, averaged over the layer's heads")
register(Adaptive, kind=WRAPPER, paper="2407.11550", summary="adaptive layer budgets for a scored policy")
register(FIOracle, kind=ORACLE, summary="ORACLE: keeps by estimated FI on the future text it sees")
register(Fitted, kind=FILE_POLICY, summary="a linear score of the signals learned by fi fit (window 0: the file's)")
register(Learned, kind=FILE_POLICY, summary="a LightGBM ranking of the signals learned by fi fit --learner lambdarank")
register(
    Surrogate,
    kind=FILE_POLICY,
    paper="2601.07891",
    summary="KVzap's form trained on FI: per layer, hidden states to one score per KV head (fi fit-surrogate)",
)
