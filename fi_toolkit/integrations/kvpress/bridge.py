"""Any kvpress press as an eviction: ``--select kvpress:NAME@BUDGET`` (docs/method.md, "Budgets").

kvpress (NVIDIA/kvpress, the ``kvpress`` extra) compresses the cache in forward hooks during the prefill, and
some presses after it (KVzip and KVgrad replay the context, KVCompose rebuilds the cache). :func:`run_press` runs
the press on the prefix ``[0, p)`` through kvpress's own hooks (``with press(model)``, one prefill from an empty
cache, as kvpress's pipeline does) and reads, per layer and KV head, which prefix positions the cache it leaves
holds (:mod:`~fi_toolkit.integrations.kvpress.tracking`: followed through kvpress's own indices, never found by
comparing keys), less the entries the press masks per head (``module.masked_key_indices``: AdaKV and its kin,
KVzip, DMS), which gives keep maps whose heads keep different counts (``KeepMap.uneven``; the probe masks per
head). A press whose cache holds keys or values it computed is refused in one line: it is not an eviction; so is
one that cannot run here (:mod:`~fi_toolkit.integrations.kvpress.failures` says why).

``BUDGET`` is ``keep=X`` or ``remove=X``, a share of the prefix, given to kvpress as its ``compression_ratio``
(the share *removed*): ``kvpress:TOVAPress@keep=0.25`` (``compression_ratio=0.75``) keeps ``int(p * 0.25)``
entries per head (kvpress's own count), like ``policy:NAME@keep=0.25`` up to rounding.
Spelling: :mod:`~fi_toolkit.integrations.kvpress.spec`. :class:`PressPolicy` is a press as a decode-loop
policy (``fi eval``), :func:`press_policy` its entry point.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from fi_toolkit.errors import FIError
from fi_toolkit.eviction import KeepMap
from fi_toolkit.integrations.kvpress.failures import failure_reason
from fi_toolkit.integrations.kvpress.spec import (  # noqa: F401  (importable from the bridge too)
    KVPRESS_INSTALL,
    PressSpec,
    make_press,
    parse_press_spec,
    require_kvpress,
)
from fi_toolkit.integrations.kvpress.tracking import Positions, followed_slots
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.policies.base import Policy


@dataclass
class PressRun:
    """What a press did to the prefix: the keep map, and for the checks kvpress's compressed cache and, per
    layer, its slots as prefix positions in kvpress's own order (``order[l]``: ``[Hkv, k_l]``; None where the
    cache still holds every entry in order, and masks, if any, decide)."""

    keep_map: KeepMap
    cache: DynamicCache
    order: list[torch.Tensor | None]


def _layer_kept(layer: int, cache_layer, module, tracker: Positions, n: int, label: str):
    """Kept prefix positions of one layer, per head (sorted), the cache's slots in kvpress's order (None if
    untouched), and whether the press removed anything: the positions the tracker followed into the cache
    the press left, less the entries it masks per head (``module.masked_key_indices``)."""
    slots = followed_slots(tracker, cache_layer.keys, cache_layer.values, label)
    hidden = torch.zeros(slots.shape, dtype=torch.bool)
    masked = getattr(module, "masked_key_indices", None)
    if masked is not None:  # AdaKV-style: entries masked per head during attention
        batch, head, seq = masked
        hidden[head[batch == 0].cpu(), seq[batch == 0].cpu()] = True
    kept = [torch.sort(row[~gone]).values for row, gone in zip(slots, hidden)]
    untouched = slots.shape[1] == n and torch.equal(slots, torch.arange(n).expand_as(slots))
    return kept, (None if untouched else slots), not untouched or bool(hidden.any())


def restore(model, attention: list) -> None:
    """Undo what ``press(model)`` leaves on the model: AdaKV's per-head masks (they would act on every
    later forward) and the ``rotary_emb`` kvpress attaches to each attention module (the project's
    architecture check refuses attention modules with parts it does not know)."""
    for module in attention:
        module.masked_key_indices = None
        if "rotary_emb" in module._modules and module._modules["rotary_emb"] is model.base_model.rotary_emb:
            del module._modules["rotary_emb"]


def _needs_eager(exc: BaseException) -> bool:
    """kvpress asserts this when a press scores with the attention weights (``ObservedAttentionPress``)."""
    return isinstance(exc, AssertionError) and "attn_implementation" in str(exc) and "not supported" not in str(exc)


@contextmanager
def _offline():
    """Nothing downloads at run time (README): while a press runs, the Hugging Face Hub is offline, so a press
    that needs weights or data it cannot find locally fails at once instead of retrying a network."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - transformers depends on it
        yield
        return
    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous


@contextmanager
def _attention(model, implementation: str | None):
    previous = model.config._attn_implementation
    if implementation is None or implementation == previous:
        yield
        return
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@dataclass(frozen=True)
class PressSelection:
    """A probe selection ``kvpress:NAME@BUDGET``: what the press keeps of a prefix (:func:`run_press`)."""

    spec: PressSpec

    @property
    def label(self) -> str:
        return self.spec.label

    def n_kept(self, n: int) -> int | None:
        return self.spec.n_kept(n)

    def keep_map(self, model, ids, p: int, where: str = "") -> KeepMap:
        """What the press keeps of the prefix ``ids[:p]``, labelled :attr:`label`, its ``selector`` the press
        and its ``budget`` as spelled (``keep=0.25``)."""
        spec = self.spec
        keep_map = run_press(make_press(spec, where or spec.label), model, ids, p, spec.label).keep_map
        budget = "the press's own" if spec.ratio is None else spec.spelled.label
        keep_map.meta.update(selector=f"kvpress:{'/'.join(spec.names)}", budget=budget)
        return keep_map


@torch.no_grad()
def run_press(press, model, ids: torch.Tensor, prefix_len: int, label: str = "kvpress") -> PressRun:
    """Prefill ``ids[:prefix_len]`` under ``press`` (kvpress's own hooks) -> :class:`PressRun`. A press that
    scores with the attention weights gets eager attention for its prefill (as kvpress asks)."""
    kvpress = require_kvpress()
    if isinstance(press, kvpress.DecodingPress):
        raise FIError(
            f"{label}: a {type(press).__name__} compresses while decoding only (every compression_interval "
            "tokens); a probe measures what a press removes at the prefill: run its inner press, or "
            "evaluate kvpress:INNER with an interval, which compresses with it at every interval"
        )
    try:
        return _run_press(press, model, ids, prefix_len, label, None)
    except _EagerNeeded:
        return _run_press(press, model, ids, prefix_len, label, "eager")


class _EagerNeeded(Exception):
    pass


def _run_press(press, model, ids: torch.Tensor, prefix_len: int, label: str, implementation: str | None) -> PressRun:
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    attention = [layer.self_attn for layer in model.base_model.layers]
    restore(model, attention)  # what an earlier press left on the model
    tracker = Positions()

    def prefill_cache(module, _args, kwargs, output):  # before the press's hook: the uncompressed prefix
        layer = cache.layers[module.layer_idx]
        if tracker.positions(layer.keys) is None and layer.keys.dim() == 4 and layer.keys.shape[2] == prefix_len:
            tracker.register(layer.keys)
            tracker.register(layer.values)
        return output

    hooks = [module.register_forward_hook(prefill_cache, with_kwargs=True) for module in attention]
    try:
        with _offline(), _attention(model, implementation), tracker:
            with press(model):
                model.base_model(
                    input_ids=ids[:prefix_len].to(device)[None],
                    position_ids=torch.arange(prefix_len, device=device)[None],
                    use_cache=True,
                    **cache_kwargs(model.base_model, cache),
                )
        layers = [
            _layer_kept(i, cache.layers[i], module, tracker, prefix_len, label) for i, module in enumerate(attention)
        ]
    except FIError:
        raise
    except Exception as exc:  # a press that needs what this run does not give it (a download, data, ...)
        if _needs_eager(exc) and implementation is None:
            raise _EagerNeeded from None
        raise FIError(f"{label}: {failure_reason(exc)}") from None
    finally:
        for h in hooks:
            h.remove()
        restore(model, attention)
    if not any(compressed for _, _, compressed in layers):
        raise FIError(
            f"{label}: the press removed nothing from the prefix's cache in any of {len(attention)} layers; the "
            "bridge measures what a press removes at the prefill"
        )
    keep_map = KeepMap.from_heads(
        label, [kept for kept, _, _ in layers], {"selector": label.split("@")[0], "budget": None}
    )
    return PressRun(keep_map, cache, [order for _, order, _ in layers])


def press_policy(name: str, budget, window: int | None = None, where: str = ""):
    """``kvpress:NAME[:key=value,...]`` (a method's spelling without its budget, as the registry passes it on) ->
    a :class:`PressPolicy` with ``budget``."""
    from fi_toolkit.budget import Budget

    where = where or f"policy {name}"
    rest = name.strip()[len("kvpress:") :]
    press_name, _, opts = rest.partition(":")  # (the registry took a budget spelled @BUDGET off already)
    spec = parse_press_spec(f"{press_name}@remove=0.5" + (f":{opts}" if opts else ""), where)
    press = make_press(spec, where)  # validate the name and options now (and that kvpress is installed)
    decodes = isinstance(press, require_kvpress().ScorerPress)
    return PressPolicy(budget=Budget.parse(budget or "keep=0.25"), window=window or 32, spec=spec, decodes=decodes)


@dataclass
class PressPolicy(Policy):
    """A kvpress press as a compression policy (``fi eval``, ``fi generate``).

    At the prompt's compression the press runs its own prefill of the prompt's tokens through kvpress's hooks
    (:func:`run_press`; one extra forward per prompt), and its keep map is gathered from the decoder's cache;
    the budget's removed share of the prompt is the press's ``compression_ratio`` (kvpress's count of it).
    A ``ScorerPress`` (``decodes``) then compresses back to the budget at every ``--interval`` of the decode
    loop with its own ``compress`` on what kvpress's ``DecodingPress`` gives it: the attention inputs of the
    rows decoded since the last compression (at most ``hidden_buffer``), the layer's keys and values
    (:func:`~fi_toolkit.integrations.kvpress.decoding.decoding_keep_map`, which says where the conventions
    differ). Other presses (AdaKV-style masks, KVzip, wrappers that need the whole prompt's hidden states)
    compress the prompt only (``prefill_only``), as kvpress applies them."""

    spec: PressSpec | None = None
    decodes: bool = False
    hidden_buffer: int = 256  # kvpress's DecodingPress default (hidden_states_buffer_size)
    no_layer_weight = "keeps what kvpress decides (for adaptive budgets wrap the press: kvpress:AdaKVPress/NAME)"

    def __post_init__(self):
        super().__post_init__()
        self.name = self.spec.label.split("@")[0]  # kvpress:NAME, as result tables name a policy
        self.prefill_only = not self.decodes
        self.needs_signals = self.decodes  # the tracker buffers the rows a decoding compression scores with
        if not self.decodes:
            self.hidden_buffer = 0

    @property
    def label(self) -> str:
        return f"{self.name}@{self.budget.label}"

    def keep_map(self, signals) -> KeepMap:
        s = signals
        if s.inputs is not None and any(h is not None for h in s.inputs):  # rows decoded since a compression
            if s.dead is not None and any(s.dead_in(layer) is not None for layer in range(s.num_layers)):
                raise FIError(
                    f"{self.name}: kvpress's decoding compression scores a dense cache; this one holds the "
                    "masked pads of an uneven keep map"
                )
            from fi_toolkit.integrations.kvpress.decoding import decoding_keep_map

            k = self.kept_total(s.seen, max(s.protected))
            keep_map = decoding_keep_map(require_kvpress(), make_press(self.spec), s, k, self.label)
        else:
            keep_map = self._prompt_keep_map(s)
        keep_map.meta.update(selector=f"policy:{self.name}", budget=self.budget.label, policy=self.name)
        return keep_map

    def _prompt_keep_map(self, s) -> KeepMap:
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
        spec = dataclasses.replace(self.spec, ratio=ratio, budget=None)
        # a masked press (AdaKV-style) keeps different counts per KV head: the decoder holds its map padded and
        # hides the pads per head (compress/decoder.py)
        keep_map = run_press(make_press(spec), s.model, s.tokens, n, self.label).keep_map
        keep_map.keep = [k.to(s.keys[0].device) for k in keep_map.keep]
        return keep_map
