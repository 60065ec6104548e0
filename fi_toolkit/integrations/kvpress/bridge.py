"""Any kvpress press as an eviction: ``--select kvpress:NAME@RATIO`` (docs/method.md, "Budgets").

kvpress (NVIDIA/kvpress, the ``kvpress`` extra) compresses the cache in a forward hook on every
attention layer during the prefill. :func:`run_press` runs the press on the prefix ``[0, p)``
through kvpress's own hooks (``with press(model)``, one prefill from an empty cache, as kvpress's
pipeline does) and records, per layer, which prefix positions the press kept:

* presses that evict by gathering the cache (every ``ScorerPress``: SnapKV, TOVA, StreamingLLM,
  ExpectedAttention, KNorm, ...): while the press's ``compress`` runs, a torch function mode follows
  the original keys tensor through ``gather``/``index_select`` (and ``contiguous``/``clone``) and
  carries each entry's position along, so the positions come from the index kvpress used, never
  from comparing keys;
* presses that keep the cache and mask entries per head during attention (``AdaKVPress`` and its
  kin set ``module.masked_key_indices``): the complement of the masked entries, per head, which
  gives keep maps whose heads keep different counts (``KeepMap.uneven``; the probe masks per head).

A press that rewrites the kept keys (merging, re-rotation) is refused in one line: it is not an
eviction. ``RATIO`` is kvpress's ``compression_ratio``, the share *removed*: ``kvpress:TOVAPress@0.75``
keeps ``int(p * 0.25)`` entries per head (kvpress's own count), like ``policy:NAME@keep=0.25``
up to rounding. ``NAME`` is a press class exported by kvpress; ``OUTER/INNER`` wraps one press in
another that takes a ``press`` (``AdaKVPress/SnapKVPress``); options after a second colon set the
presses' fields: ``kvpress:SnapKVPress@0.75:window_size=32,kernel_size=7``.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from transformers import DynamicCache

from fi_toolkit.errors import FIError
from fi_toolkit.eviction import KeepMap
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.policies.base import Policy

KVPRESS_INSTALL = "pip install 'fi_toolkit[kvpress]'"


def require_kvpress(what: str = "kvpress presses need", error: type[Exception] = FIError):
    """The ``kvpress`` module, or one line (an ``error``) saying how to install it; ``what`` names what
    the user wrote (``--policy kvpress:TOVAPress needs``, ``--select kvpress:SnapKVPress@0.5 needs``)."""
    try:
        import kvpress
    except Exception as exc:  # not installed, or it cannot load under these versions
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise error(f"{what} the kvpress extra ({reason}); install it with: {KVPRESS_INSTALL}") from None
    return kvpress


@dataclass(frozen=True)
class PressSpec:
    """A parsed ``NAME@RATIO[:key=value,...]``: press class names (outermost first), ratio, options."""

    names: tuple[str, ...]
    ratio: float
    options: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        return f"kvpress:{'/'.join(self.names)}@{self.ratio:g}" + (f":{opts}" if opts else "")

    def n_kept(self, n: int) -> int:
        """Entries per head a ``ScorerPress`` keeps out of ``n`` (kvpress's ``compute_n_kept``: truncation)."""
        return max(1, int(n * (1 - self.ratio)))

    def keep_map(self, model, ids: torch.Tensor, p: int, where: str = "") -> KeepMap:
        """What the press keeps of the prefix ``ids[:p]`` (a probe selection; :func:`run_press`), labelled
        :attr:`label`, its ``selector`` the press and its ``budget`` kvpress's ``compression_ratio``."""
        keep_map = run_press(make_press(self, where or self.label), model, ids, p, self.label).keep_map
        keep_map.meta.update(selector=f"kvpress:{'/'.join(self.names)}", budget=f"compression_ratio={self.ratio:g}")
        return keep_map


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: a string option


def parse_press_spec(rest: str, where: str) -> PressSpec:
    """``"SnapKVPress@0.75"`` (the part after ``kvpress:``) -> :class:`PressSpec`; needs no kvpress."""
    name, at, tail = rest.partition("@")
    names = tuple(n.strip() for n in name.split("/"))
    if not at or not all(names):
        raise FIError(
            f"{where}: expected kvpress:NAME@RATIO, e.g. kvpress:SnapKVPress@0.75 "
            "(RATIO is kvpress's compression_ratio, the share removed)"
        )
    ratio_text, _, opts = tail.partition(":")
    try:
        ratio = float(ratio_text)
    except ValueError:
        raise FIError(
            f"{where}: the ratio '{ratio_text}' is not a number (kvpress's compression_ratio, "
            "the share removed, in (0, 1))"
        ) from None
    if not 0.0 < ratio < 1.0:  # also refuses NaN
        raise FIError(
            f"{where}: the ratio {ratio_text} must lie in (0, 1) (kvpress's compression_ratio: "
            "the share removed; 0 removes nothing)"
        )
    options = []
    for part in filter(None, (p.strip() for p in opts.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip().isidentifier():
            raise FIError(f"{where}: expected options like window_size=32,kernel_size=7 after the ratio")
        options.append((key.strip(), _value(value.strip())))
    return PressSpec(names, ratio, tuple(options))


def make_press(spec: PressSpec, where: str = ""):
    """The kvpress press of ``spec`` (the innermost press gets the ratio; each option goes to the innermost
    press that has such a field). Refuses unknown names and options in one line."""
    where = where or spec.label
    kvpress = require_kvpress(f"{where} needs")
    classes = []
    for name in spec.names:
        cls = getattr(kvpress, name, None)
        if not (isinstance(cls, type) and issubclass(cls, kvpress.BasePress)):
            known = sorted(n for n in dir(kvpress) if n.endswith("Press") and isinstance(getattr(kvpress, n), type))
            raise FIError(f"{where}: unknown kvpress press '{name}' (kvpress has {', '.join(known)})")
        classes.append(cls)
    fields = [{f.name for f in dataclasses.fields(c)} if dataclasses.is_dataclass(c) else set() for c in classes]
    if "compression_ratio" not in fields[-1]:
        raise FIError(
            f"{where}: {spec.names[-1]} takes no compression_ratio; give a press that does, or wrap one: OUTER/INNER"
        )
    for outer, f in zip(spec.names[:-1], fields[:-1]):
        if "press" not in f:
            raise FIError(f"{where}: {outer} does not wrap another press (it has no 'press' field)")
    kwargs: list[dict] = [{} for _ in classes]
    kwargs[-1]["compression_ratio"] = spec.ratio
    for key, value in spec.options:
        owner = next((i for i in reversed(range(len(classes))) if key in fields[i]), None)
        if owner is None or key in ("press", "compression_ratio"):
            raise FIError(f"{where}: no press of {'/'.join(spec.names)} takes the option '{key}'")
        kwargs[owner][key] = value
    try:
        press = classes[-1](**kwargs[-1])
        for cls, kw in zip(reversed(classes[:-1]), reversed(kwargs[:-1])):
            press = cls(press=press, **kw)
    except Exception as exc:  # kvpress validates with asserts and TypeErrors
        raise FIError(f"{where}: kvpress refused the press: {str(exc).strip() or type(exc).__name__}") from None
    return press


class _Positions(TorchFunctionMode):
    """Follows tensors derived from ``keys [B, Hkv, n, d]`` by selecting along the sequence axis,
    carrying each entry's original position (``[B, Hkv, m]``) with it."""

    def __init__(self, keys: torch.Tensor):
        super().__init__()
        b, h, n, _ = keys.shape
        self.tracked = {id(keys): (keys, torch.arange(n, device=keys.device).expand(b, h, n))}

    def positions(self, tensor) -> torch.Tensor | None:
        entry = self.tracked.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        pos = self.positions(args[0]) if args else None
        if pos is None or not isinstance(out, torch.Tensor):
            return out
        name = getattr(func, "__name__", "")
        if name in ("contiguous", "clone", "detach"):
            self.tracked[id(out)] = (out, pos)
        elif name in ("gather", "index_select"):
            dim = args[1] if len(args) > 1 else kwargs["dim"]
            index = args[2] if len(args) > 2 else kwargs["index"]
            if dim in (2, -2) and name == "gather" and index.dim() == 4 and bool((index == index[..., :1]).all()):
                self.tracked[id(out)] = (out, pos.gather(2, index[..., 0]))
            elif dim in (2, -2) and name == "index_select":
                self.tracked[id(out)] = (out, pos.index_select(2, index))
        return out


@dataclass
class PressRun:
    """What a press did to the prefix: the keep map, and for the checks kvpress's compressed cache and,
    for gathering presses, the slots in kvpress's own order (``order[l]``: ``[Hkv, k_l]``, None for a
    masking press)."""

    keep_map: KeepMap
    cache: DynamicCache
    order: list[torch.Tensor | None]


def _kept(module, keys: torch.Tensor, new_keys: torch.Tensor, tracker: _Positions, label: str):
    """Kept positions of one layer -> (per-head sorted 1-D tensors, kvpress's order or None)."""
    if keys.shape[0] != 1:
        raise FIError(f"{label}: the bridge runs one sequence at a time")
    masked = getattr(module, "masked_key_indices", None)
    if new_keys is keys and masked is not None:  # AdaKV-style: everything stays, some entries masked per head
        batch, head, seq = masked
        hidden = torch.zeros(keys.shape[1], keys.shape[2], dtype=torch.bool)
        hidden[head[batch == 0].cpu(), seq[batch == 0].cpu()] = True
        return [torch.nonzero(~row).flatten() for row in hidden], None
    pos = tracker.positions(new_keys)
    if pos is None:
        if new_keys is keys:  # nothing evicted in this layer
            return [torch.arange(keys.shape[2])] * keys.shape[1], None
        raise FIError(
            f"{label}: the press changes the kept keys (it merges, re-rotates or rebuilds them), "
            "so what it keeps is not a set of prefix entries; it cannot be measured as an eviction"
        )
    order = pos[0].cpu()
    heads = [torch.sort(row).values for row in order]
    if any(bool((h[1:] == h[:-1]).any()) for h in heads):
        raise FIError(f"{label}: the press keeps some entry twice, so what it keeps is not a set of prefix entries")
    return heads, order


def restore(model, attention: list) -> None:
    """Undo what ``press(model)`` leaves on the model: AdaKV's per-head masks (they would act on every
    later forward) and the ``rotary_emb`` kvpress attaches to each attention module (the project's
    architecture check refuses attention modules with parts it does not know)."""
    for module in attention:
        module.masked_key_indices = None
        if "rotary_emb" in module._modules and module._modules["rotary_emb"] is model.base_model.rotary_emb:
            del module._modules["rotary_emb"]


@torch.no_grad()
def run_press(press, model, ids: torch.Tensor, prefix_len: int, label: str = "kvpress") -> PressRun:
    """Prefill ``ids[:prefix_len]`` under ``press`` (kvpress's own hooks) -> :class:`PressRun`."""
    require_kvpress()
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    kept: dict[int, tuple] = {}
    attention = [layer.self_attn for layer in model.base_model.layers]
    original = press.compress

    def compress(module, hidden_states, keys, values, attentions, kwargs):
        module.masked_key_indices = None
        with _Positions(keys) as tracker:
            new_keys, new_values = original(module, hidden_states, keys, values, attentions, kwargs)
        kept[module.layer_idx] = _kept(module, keys, new_keys, tracker, label)
        return new_keys, new_values

    press.compress = compress  # the hook calls self.compress: this instance's, for this run only
    try:
        with press(model):
            model.base_model(
                input_ids=ids[:prefix_len].to(device)[None],
                position_ids=torch.arange(prefix_len, device=device)[None],
                use_cache=True,
                **cache_kwargs(model.base_model, cache),
            )
    except FIError:
        raise
    except Exception as exc:  # a press that needs what this run does not give it (eager attention, data, ...)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FIError(f"{label}: kvpress failed on the prefix ({type(exc).__name__}: {reason})") from None
    finally:
        del press.compress
        restore(model, attention)
    if len(kept) != len(attention):
        raise FIError(
            f"{label}: the press compressed {len(kept)} of {len(attention)} layers; the bridge "
            "measures presses that compress every layer at the prefill"
        )
    layers = [kept[i] for i in range(len(attention))]
    keep_map = KeepMap.from_heads(
        label, [heads for heads, _ in layers], {"selector": label.split("@")[0], "budget": None}
    )
    return PressRun(keep_map, cache, [order for _, order in layers])


def press_policy(name: str, budget, window: int | None = None, where: str = ""):
    """``fi eval --policy kvpress:NAME[:key=value,...]`` -> a :class:`PressPolicy` with the eval's budget."""
    from fi_toolkit.budget import Budget

    where = where or f"policy {name}"
    rest = name.strip()[len("kvpress:") :]
    press_name, _, opts = rest.partition(":")
    if "@" in press_name:
        raise FIError(
            f"{where}: give the budget with the budget argument (kvpress:NAME, without @RATIO)",
            parameter={"the budget argument": "budget"},
        )
    spec = parse_press_spec(f"{press_name}@0.5" + (f":{opts}" if opts else ""), where)
    make_press(spec, where)  # validate the name and options now (and that kvpress is installed)
    return PressPolicy(budget=Budget.parse(budget or "keep=0.25"), window=window or 32, spec=spec)


@dataclass
class PressPolicy(Policy):
    """A kvpress press as a compression policy (``fi eval``, ``fi generate``): at the prompt's compression
    the press runs its own prefill of the prompt's tokens through kvpress's hooks (:func:`run_press`;
    one extra forward per prompt) and its keep map is gathered from the decoder's cache. kvpress applies
    such presses during the prefill only, so the cache is never compressed again while decoding
    (``prefill_only``: ``--interval`` does not apply to it). The budget's removed share of the prompt
    is the press's ``compression_ratio``; the press keeps kvpress's count of it."""

    spec: PressSpec | None = None
    prefill_only = True
    needs_signals = False
    no_layer_weight = "keeps what kvpress decides (for adaptive budgets wrap the press: kvpress:AdaKVPress/NAME)"

    def __post_init__(self):
        super().__post_init__()
        self.name = self.spec.label.split("@")[0]  # kvpress:NAME, as result tables name a policy

    @property
    def label(self) -> str:
        return f"{self.name}@{self.budget.label}"

    def keep_map(self, signals) -> KeepMap:
        s = signals
        n = s.seen
        if (
            s.tokens is None
            or s.model is None
            or any(not torch.equal(pos, torch.arange(n, device=pos.device).expand_as(pos)) for pos in s.positions)
        ):
            raise FIError(f"{self.name}: a kvpress press compresses a prompt right after its prefill only")
        ratio = self.budget.compression_ratio(n)
        if not 0.0 < ratio < 1.0:
            raise FIError(
                f"{self.name}: budget {self.budget.label} of {n} tokens is a compression_ratio of "
                f"{ratio:g}; kvpress needs one in (0, 1)"
            )
        spec = dataclasses.replace(self.spec, ratio=ratio)
        keep_map = run_press(make_press(spec), s.model, s.tokens, n, self.label).keep_map
        if keep_map.uneven:
            raise FIError(
                f"{self.name} keeps different counts per KV head (AdaKV-style): `fi probe` measures "
                "it (masked per head); compressed decoding needs a dense cache and cannot run it"
            )
        keep_map.keep = [k.to(s.keys[0].device) for k in keep_map.keep]
        keep_map.meta.update(selector=f"policy:{self.name}", budget=self.budget.label, policy=self.name)
        return keep_map
