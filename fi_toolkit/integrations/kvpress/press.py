"""InfoKV as a kvpress press (the ``kvpress`` extra: ``pip install 'fi_toolkit[kvpress]'``).

```python
from kvpress import KVPressTextGenerationPipeline
from fi_toolkit.integrations.kvpress.press import InfoKVPress
from fi_toolkit.model.loading import load_model

lm = load_model("smollm2-135m")
pipe = KVPressTextGenerationPipeline(model=lm.model, tokenizer=lm.tokenizer)
press = InfoKVPress(compression_ratio=0.75, alpha=0.9, tau=1.0, top_k=256)
answer = pipe(context, question=question, press=press)["answer"]
```

Any other project policy, the learned one included, is a press the same way:
``PolicyPress(compression_ratio=0.75, policy="learned:path=model.json")``.

The bridge the other way (any kvpress press measured by ``fi probe``) is
:mod:`fi_toolkit.integrations.kvpress.bridge`; its names are re-exported here.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from fi_toolkit.integrations.kvpress.bridge import (
    KVPRESS_INSTALL,
    PressSpec,
    make_press,
    parse_press_spec,
    require_kvpress,
    restore,
    run_press,
)

require_kvpress("fi_toolkit.integrations.kvpress.press needs", ImportError)  # one line saying how to install it

from kvpress import BasePress  # noqa: E402
from kvpress.utils import compute_n_kept  # noqa: E402

from fi_toolkit.budget import Budget  # noqa: E402
from fi_toolkit.errors import FIError  # noqa: E402
from fi_toolkit.eviction import KeepMap, gather_layer  # noqa: E402
from fi_toolkit.model.architectures import decoder_parts  # noqa: E402
from fi_toolkit.model.compat import cache_keyword  # noqa: E402
from fi_toolkit.policies import InfoKV, Policy  # noqa: E402
from fi_toolkit.policies.registry import resolve  # noqa: E402
from fi_toolkit.signals.config import SignalConfig, signal_config_for  # noqa: E402
from fi_toolkit.signals.trace import tracker_trace  # noqa: E402
from fi_toolkit.signals.tracker import SignalTracker  # noqa: E402


class _CompressAtPrefillEnd:
    """What :class:`InfoKVPress` and :class:`PolicyPress` share: kvpress's press contract (``with press(model):``,
    hooks removed in ``finally``) around a project policy that compresses **once, at the end of the prefill
    forward**, from the project's :class:`SignalTracker` entered when the prefill starts. A subclass gives
    ``compression_ratio``, ``config`` (the signals' :class:`SignalConfig`) and ``policy(n)``. A keep map whose KV
    heads keep different counts is left in the cache and its evicted entries masked as kvpress's ``AdaKVPress``
    masks them (``module.masked_key_indices``, which kvpress's attention patch hides while decoding); an even one
    is gathered in place."""

    def policy(self, n: int) -> Policy:  # pragma: no cover - abstract
        raise NotImplementedError

    @contextmanager
    def __call__(self, model):
        base = model.base_model
        keyword = cache_keyword(base)
        state: dict = {}

        def start(_module, args, kwargs):  # a prefill from an empty cache: track its signals
            ids = kwargs.get("input_ids", args[0] if args else None)
            embeds = kwargs.get("inputs_embeds")
            n = (ids if ids is not None else embeds).shape[1]
            cache = kwargs.get(keyword)
            if self.compression_ratio > 0 and cache is not None and cache.get_seq_length() == 0:
                tracker = SignalTracker(self.config, n, accumulate=True)  # accumulate: the Trace's H2O column
                hooks = ExitStack()
                hooks.enter_context(tracker(model))  # left in `finish`, or in the `finally` below
                state.update(n=n, cache=cache, tracker=tracker, hooks=hooks)

        def finish(_module, _args, _kwargs, output):  # the prefill has passed the last layer: compress
            tracker = state.pop("tracker", None)
            if tracker is None:
                return output
            with state.pop("hooks"):  # the tracker's hooks go once the prefill's signals are recorded
                tracker.record(output.last_hidden_state[0])
            n, cache = state.pop("n"), state.pop("cache")
            self.keep_map = self.policy(n).keep_map(tracker_trace(tracker, cache))
            if self.keep_map.uneven:  # kvpress's head-wise budgets: mask, do not gather
                for attention, masked in zip(base.layers, evicted_indices(self.keep_map, n)):
                    attention.self_attn.masked_key_indices = masked
                return output
            for layer, keep in zip(cache.layers, self.keep_map.keep):
                layer.keys, layer.values = gather_layer(layer.keys, layer.values, keep)
            return output

        restore(model, [layer.self_attn for layer in base.layers])  # what earlier kvpress presses left on it
        decoder_parts(model)  # refuses a model the signals cannot be traced on, before any forward
        hooks = [
            base.register_forward_pre_hook(start, with_kwargs=True),
            base.register_forward_hook(finish, with_kwargs=True),
        ]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
            hooks = state.pop("hooks", None)
            if hooks is not None:  # a forward that failed half-way
                hooks.close()
            state.clear()


@dataclass
class InfoKVPress(_CompressAtPrefillEnd, BasePress):
    """InfoKV (arXiv 2606.26875) behind kvpress's press contract: the project's signals and the project's
    policy, not a copy of them.

    InfoKV's score needs the top-k entropy ``H`` (from the LM head over the final hidden state) and
    ``D^(l) = 1 - cos(h^(l), h^(L))``: neither exists before the prefill has passed the last layer, so
    this press cannot compress layer by layer as kvpress's ``ScorerPress`` does. It compresses **once, at
    the end of the same prefill forward** (no second pass): the project's :class:`SignalTracker` is
    entered (``with tracker(model)``) when kvpress's prefill starts, so that its hooks record ``h^(l)``,
    ``h^(L)`` and the last ``window_size`` queries of every layer while the prefill runs; a forward hook
    on the model's decoder stack then records the final hidden states, leaves the tracker's block
    (removing its hooks), builds the :class:`Trace` (:func:`tracker_trace`, as ``trace_prefix`` does), asks
    :class:`~fi_toolkit.policies.InfoKV` for its
    keep map and gathers every layer of kvpress's cache in place. Within that forward no layer reads
    an earlier layer's cache, so the cache it leaves is the one a per-layer press would; the cost over
    a plain prefill is the streamed LM head for ``H``: 1.3x a plain prefill on the CPU
    (``benchmarks/bench_kvpress.py``, README "kvpress").

    ``compression_ratio`` is kvpress's (the share removed); the press keeps kvpress's count,
    ``max(1, int(n * (1 - compression_ratio)))`` per layer and KV head, the window included.
    ``alpha=1`` is SnapKV's scoring exactly (``SnapKVPress(window_size=32, kernel_size=7)``).
    It compresses the prefill (kvpress's pipeline); kvpress's ``DecodingPress`` wraps ``ScorerPress``
    scorers only, which this press is not. ``keep_map`` holds what the last prefill kept.
    """

    compression_ratio: float = 0.0
    alpha: float = 0.9
    tau: float = 1.0
    top_k: int = 256
    window_size: int = 32
    kernel_size: int = 7  # the pool kernel of window attention (SnapKV's)
    entropy_of: str = "produced"  # which distribution's entropy H_i is (docs/method.md, "Which entropy")

    def __post_init__(self):
        if not 0.0 <= self.compression_ratio < 1.0:
            raise ValueError(f"compression_ratio must lie in [0, 1), got {self.compression_ratio}")
        self.config = SignalConfig(
            top_k=self.top_k,
            window=self.window_size,
            pool_kernel=self.kernel_size,
            tau=self.tau,
            alpha=self.alpha,
            entropy_of=self.entropy_of,
        )
        self.config.validate()
        self.keep_map: KeepMap | None = None

    def policy(self, n: int) -> InfoKV:
        """The project's InfoKV policy for a prefill of ``n`` tokens (kvpress's kept count)."""
        return InfoKV(
            budget=Budget("keep", compute_n_kept(n, self.compression_ratio)),
            window=self.window_size,
            alpha=self.alpha,
            tau=self.tau,
            top_k=self.top_k,
        )


@dataclass
class PolicyPress(_CompressAtPrefillEnd, BasePress):
    """Any project policy behind kvpress's press contract, spelled as ``fi eval --policy`` spells it without a
    budget (``"h2o"``, ``"infokv:alpha=0.5"``, ``"learned:path=model.json"``, ``"learned:path=m.json,heads=global"``),
    compressing once at the end of kvpress's prefill as :class:`InfoKVPress` does, from the same signals.

    ``compression_ratio`` is kvpress's (the share removed): the policy keeps kvpress's count,
    ``max(1, int(n * (1 - compression_ratio)))`` per KV head (per layer in all, for budgets shared over heads), the
    window included. ``window_size`` and ``top_k`` are the signals' (the policy's own window must agree). A policy
    that sees the future (the FI oracle) or one that is not the project's (``kvpress:...``) is refused. Keep maps
    whose heads keep different counts are masked as kvpress's ``AdaKVPress`` masks them. It compresses the
    prefill (kvpress's pipeline); ``keep_map`` holds what the last prefill kept.
    """

    compression_ratio: float = 0.0
    policy_spec: str = "infokv"
    window_size: int = 32
    top_k: int = 256

    def __post_init__(self):
        if not 0.0 <= self.compression_ratio < 1.0:
            raise ValueError(f"compression_ratio must lie in [0, 1), got {self.compression_ratio}")
        if self.policy_spec.strip().lower().startswith("kvpress:"):
            raise FIError(f"PolicyPress wraps the project's policies; {self.policy_spec} is a kvpress press already")
        example = self._resolve(None)  # an unknown name or option is refused now, in one line
        self.config = signal_config_for(example, window=self.window_size, top_k=self.top_k)
        self.keep_map: KeepMap | None = None

    def _resolve(self, budget) -> Policy:
        where = f"PolicyPress policy {self.policy_spec}"
        return resolve(self.policy_spec, budget, self.window_size, where=where, top_k=self.top_k)

    def policy(self, n: int) -> Policy:
        """The project policy for a prefill of ``n`` tokens (kvpress's kept count)."""
        return self._resolve(Budget("keep", compute_n_kept(n, self.compression_ratio)))


def evicted_indices(keep_map: KeepMap, n: int) -> list[tuple]:
    """Per layer, kvpress's ``masked_key_indices`` (``AdaKVPress``'s convention, batch 1): the ``(batch, head,
    position)`` index tensors of the entries of ``n`` that ``keep_map`` does not keep there (:meth:`KeepMap.visible`,
    exact for uneven maps)."""
    import torch

    out = []
    for hidden in ~keep_map.visible(n):
        heads, positions = torch.nonzero(hidden, as_tuple=True)
        out.append((torch.zeros_like(heads), heads, positions))
    return out


__all__ = ["InfoKVPress", "PolicyPress", "KVPRESS_INSTALL", "PressSpec", "make_press", "parse_press_spec", "run_press"]
