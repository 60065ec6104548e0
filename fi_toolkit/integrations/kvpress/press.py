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
from fi_toolkit.eviction import KeepMap, gather_layer  # noqa: E402
from fi_toolkit.model.architectures import decoder_parts  # noqa: E402
from fi_toolkit.model.compat import cache_keyword  # noqa: E402
from fi_toolkit.policies import InfoKV  # noqa: E402
from fi_toolkit.signals.config import SignalConfig  # noqa: E402
from fi_toolkit.signals.trace import tracker_trace  # noqa: E402
from fi_toolkit.signals.tracker import SignalTracker  # noqa: E402


@dataclass
class InfoKVPress(BasePress):
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


__all__ = ["InfoKVPress", "KVPRESS_INSTALL", "PressSpec", "make_press", "parse_press_spec", "run_press"]
