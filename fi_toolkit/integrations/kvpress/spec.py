"""A kvpress press as the command line spells it, ``NAME@BUDGET[:key=value,...]``, parsed without kvpress, and
built with it (:func:`make_press`).

``BUDGET`` is a share of the prefix spelled as every budget is (:mod:`fi_toolkit.budget`): ``keep=0.25`` or
``remove=0.75``, both kvpress's ``compression_ratio=0.75`` (the share *removed*; ``keep=s`` gives ``1 - s``
rounded to 12 decimals, the float ``remove=`` would spell), which goes to the innermost press. A bare number
is refused (kvpress's ratio is the share removed, a bare budget elsewhere the share kept), and so is a token
count (``keep=100``: kvpress takes a ratio; ``fi eval --policy kvpress:NAME --budget`` takes counts). A press
that takes no ``compression_ratio`` (its budget comes from its own arguments: SimLayerKV's lazy layers,
DMS's threshold) is spelled without it, ``NAME[:key=value,...]``.
``OUTER/INNER`` wraps one press in another that takes a ``press`` (AdaKV, CriticalKV, CriticalAdaKV,
ChunkKV, Block, Chunk, per-layer ratios) or a ``base_press`` (kvpress's decoding presses). Options set the
presses' constructor arguments, each on the innermost press that takes it; a value is a Python literal
(``compression_ratios=[0.5,0.9]``, commas inside brackets included) or a bare word.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field

from fi_toolkit.budget import Budget, press_budget
from fi_toolkit.errors import FIError

KVPRESS_INSTALL = "pip install 'fi_toolkit[kvpress]'"
WRAPS = ("press", "base_press")  # the constructor arguments through which a press wraps another


def require_kvpress(what: str = "kvpress presses need", error: type[Exception] = FIError):
    """The ``kvpress`` module, or one line (an ``error``) saying how to install it; ``what`` names what
    the user wrote (``--policy kvpress:TOVAPress needs``, ``--select kvpress:SnapKVPress@keep=0.5 needs``)."""
    try:
        import kvpress
    except Exception as exc:  # not installed, or it cannot load under these versions
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise error(f"{what} the kvpress extra ({reason}); install it with: {KVPRESS_INSTALL}") from None
    return kvpress


@dataclass(frozen=True)
class PressSpec:
    """A parsed ``NAME@BUDGET[:key=value,...]``: press class names (outermost first), kvpress's
    ``compression_ratio``, options, and the budget as spelled (its label; not compared: ``@keep=0.25`` and
    ``@remove=0.75`` are one press)."""

    names: tuple[str, ...]
    ratio: float | None  # kvpress's compression_ratio; None: the press takes none
    options: tuple[tuple[str, object], ...] = ()
    budget: Budget | None = field(default=None, compare=False)  # None: remove=RATIO

    @property
    def spelled(self) -> Budget | None:
        """The budget as spelled (``remove=RATIO`` where none was); None for a press without a ratio."""
        return self.budget or (None if self.ratio is None else Budget("remove", self.ratio))

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={_spelled(v)}" for k, v in self.options)
        at = "" if self.ratio is None else f"@{self.spelled.label}"
        return f"kvpress:{'/'.join(self.names)}{at}" + (f":{opts}" if opts else "")

    def n_kept(self, n: int) -> int | None:
        """Entries per head a ``ScorerPress`` keeps out of ``n`` (kvpress's ``compute_n_kept``: truncation);
        None for a press without a ratio (known once it has run)."""
        return None if self.ratio is None else max(1, int(n * (1 - self.ratio)))


def _spelled(value) -> str:
    """An option's value as a spec spells it (lists without spaces, so the label parses back)."""
    return str(value).replace(" ", "") if isinstance(value, (list, tuple)) else str(value)


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: a string option


def split_options(text: str) -> list[str]:
    """``"a=1,b=[1,2],c=x"`` -> ``["a=1", "b=[1,2]", "c=x"]``: commas inside brackets stay."""
    parts, depth, current = [], 0, []
    for ch in text:
        depth += (ch in "[(") - (ch in "])")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_press_spec(rest: str, where: str) -> PressSpec:
    """``"SnapKVPress@keep=0.25"`` (the part after ``kvpress:``) -> :class:`PressSpec`; needs no kvpress."""
    head, at, tail = rest.partition("@")
    if at:
        budget_text, _, opts = tail.partition(":")
    else:
        head, _, opts = rest.partition(":")
        budget_text = None
    names = tuple(n.strip() for n in head.split("/"))
    if not all(names):
        raise FIError(
            f"{where}: expected kvpress:NAME@BUDGET, e.g. kvpress:SnapKVPress@keep=0.25 "
            "(BUDGET: keep=X or remove=X, X a share of the prefix)"
        )
    options = []
    for part in split_options(opts):
        key, eq, value = part.partition("=")
        if not eq or not key.strip().isidentifier():
            raise FIError(f"{where}: expected options like window_size=32,kernel_size=7 after the budget")
        options.append((key.strip(), _value(value.strip())))
    if budget_text is None:
        return PressSpec(names, None, tuple(options))
    budget = press_budget(budget_text, where)
    return PressSpec(names, budget.removed_share, tuple(options), budget)


def press_parameters(cls) -> set[str]:
    """The arguments a press class's constructor takes (a dataclass's init fields, or ``__init__``'s:
    ``CriticalKVPress`` is not a dataclass)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def press_classes(kvpress) -> dict[str, type]:
    """Every press class kvpress exports, by name."""
    names = getattr(kvpress, "__all__", None) or dir(kvpress)
    found = {n: getattr(kvpress, n, None) for n in names}
    return {n: c for n, c in found.items() if isinstance(c, type) and issubclass(c, kvpress.BasePress)}


def make_press(spec: PressSpec, where: str = ""):
    """The kvpress press of ``spec`` (the innermost press gets the compression_ratio; each option goes to the
    innermost press that takes such an argument). Refuses unknown names and options in one line."""
    where = where or spec.label
    kvpress = require_kvpress(f"{where} needs")
    known = press_classes(kvpress)
    classes = []
    for name in spec.names:
        if name not in known:
            raise FIError(f"{where}: unknown kvpress press '{name}' (kvpress has {', '.join(sorted(known))})")
        classes.append(known[name])
    params = [press_parameters(c) for c in classes]
    inner = spec.names[-1]
    if spec.ratio is None and len(classes) == 1 and "compression_ratio" in params[-1]:
        raise FIError(
            f"{where}: give {inner}'s budget, kvpress:{'/'.join(spec.names)}@keep=X or @remove=X (X a share of "
            "the prefix; kvpress's compression_ratio is the share removed)"
        )
    if spec.ratio is not None and "compression_ratio" not in params[-1]:
        shown = ", ".join(sorted(params[-1] - set(WRAPS))) or "none"
        raise FIError(
            f"{where}: {inner} takes no compression_ratio (its arguments: {shown}); spell it without @BUDGET, "
            f"with its own arguments after a colon (kvpress:{inner}:key=value), or wrap a press that does: OUTER/INNER"
        )
    wraps = []
    for outer, p in zip(spec.names[:-1], params[:-1]):
        field = next((w for w in WRAPS if w in p), None)
        if field is None:
            raise FIError(f"{where}: {outer} does not wrap another press (it takes no 'press')")
        wraps.append(field)
    kwargs: list[dict] = [{} for _ in classes]
    if spec.ratio is not None:
        kwargs[-1]["compression_ratio"] = spec.ratio
    for key, value in spec.options:
        owner = next((i for i in reversed(range(len(classes))) if key in params[i]), None)
        if owner is None or key in (*WRAPS, "compression_ratio"):
            raise FIError(f"{where}: no press of {'/'.join(spec.names)} takes the option '{key}'")
        kwargs[owner][key] = value
    try:
        press = classes[-1](**kwargs[-1])
        for cls, field, kw in zip(reversed(classes[:-1]), reversed(wraps), reversed(kwargs[:-1])):
            press = cls(**{field: press}, **kw)
    except Exception as exc:  # kvpress validates with asserts and TypeErrors
        raise FIError(f"{where}: kvpress refused the press: {str(exc).strip() or type(exc).__name__}") from None
    return press
