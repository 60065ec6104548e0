"""Every press of the installed kvpress, tried through the bridge: measured (its keep map) or refused with the
reason, one line each. A study over many presses resolves them with :func:`resolve_presses`, which skips a
press that cannot run here and lists why, instead of stopping the rest.

:func:`press_survey` gives each press class a spec (:func:`survey_spec`: ``NAME@remove=R`` for a press that
takes a ``compression_ratio``, ``NAME/SnapKVPress@remove=R`` for one that wraps a ``ScorerPress``) and runs it on one
prefix; ``docs/gen_kvpress_presses.py`` writes the table of the documentation from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.eviction import KeepMap
from fi_toolkit.integrations.kvpress.bridge import run_press
from fi_toolkit.integrations.kvpress.spec import (
    make_press,
    parse_press_spec,
    press_classes,
    press_parameters,
    require_kvpress,
)

INNER = "SnapKVPress"  # the ScorerPress a wrapper wraps in the survey (the one the project checks bit for bit)
OWN_BUDGET = {  # presses without a compression_ratio: the arguments the survey gives them so that they remove entries
    "SimLayerKVPress": "lazy_threshold=0.5,n_recent=60,n_initial=4",  # lazy layers keep 4 sinks + 60 recent
    "DMSPress": "threshold=0.002,sliding_window_size=64",  # SnapKV scores below 0.002 outside the last 64
    "DuoAttentionPress": "head_compression_ratio=0.5,on_the_fly_scoring=True",  # half the heads stream
    "ThinKPress": "key_channel_compression_ratio=0.5",  # half the key channels
}


@dataclass
class PressOutcome:
    """One press class: the spec tried, and either its keep map's mean kept count or why it is refused."""

    name: str
    kind: str
    spec: str | None
    kept: float | None = None
    reason: str = ""
    keep_map: KeepMap | None = field(default=None, repr=False)
    decoding: str = ""  # what fi eval does with it: at every interval, the prompt only, or its inner press

    @property
    def measured(self) -> bool:
        return self.keep_map is not None


def press_kind(cls, kvpress) -> str:
    """How a press class compresses, in a few words (the table's grouping)."""
    params = press_parameters(cls)
    if issubclass(cls, kvpress.DecodingPress):
        return "decoding"
    if "press" in params or "presses" in params or "prefilling_press" in params:
        return "wrapper"
    if issubclass(cls, kvpress.ScorerPress):
        return "scorer"
    if issubclass(cls, kvpress.KVzipPress):
        return "after the prefill"
    return "other"


def decoding_use(cls, kvpress) -> str:
    """What ``fi eval --policy kvpress:NAME --interval N`` does with a press class: a ``ScorerPress`` compresses
    the prompt and every interval with its own ``compress`` (:mod:`fi_toolkit.integrations.kvpress.decoding`);
    kvpress's decoding presses are that, for their inner press; any other compresses the prompt only."""
    if issubclass(cls, kvpress.DecodingPress):
        return "its inner press, at every interval"
    if issubclass(cls, kvpress.ScorerPress) and cls is not kvpress.ScorerPress:
        return "the prompt, then every interval"
    return "the prompt only"


def survey_spec(name: str, cls, kvpress, ratio: float, layers: int) -> tuple[str | None, str]:
    """The spec the survey runs for a press class, or None and the reason it has none."""
    params = press_parameters(cls)
    if cls in (kvpress.BasePress, kvpress.ScorerPress):
        return None, "a base class: no press of its own"
    if issubclass(cls, kvpress.DecodingPress):
        return None, (
            "compresses while decoding only (every compression_interval tokens), never at the prefill; "
            "fi eval --policy kvpress:INNER --interval N applies INNER's score at every interval"
        )
    if "presses" in params:
        return None, "chains a list of presses; a spec names one press per level: measure each press"
    if "prefilling_press" in params:
        return None, "pairs a prefill press with a DecodingPress: its prefill half is that press, measured alone"
    if name in OWN_BUDGET:
        return f"{name}/{INNER}:{OWN_BUDGET[name]}" if "press" in params else f"{name}:{OWN_BUDGET[name]}", ""
    if "press" in params:
        spec = f"{name}/{INNER}@{Budget('remove', ratio).label}"
        if "compression_ratios" in params:  # one ratio per layer, alternating around the ratio
            low, high = max(0.05, ratio - 0.2), min(0.95, ratio + 0.2)
            spec += f":compression_ratios=[{','.join(f'{(low, high)[i % 2]:g}' for i in range(layers))}]"
        return spec, ""
    if name in OWN_BUDGET:
        return f"{name}:{OWN_BUDGET[name]}", ""
    if "compression_ratio" not in params:
        return f"{name}", ""
    return f"{name}@{Budget('remove', ratio).label}", ""


def resolve_presses(
    specs: Sequence[str], model, ids: torch.Tensor, prefix_len: int
) -> tuple[dict[str, KeepMap], dict[str, str]]:
    """``kvpress:`` specs (``NAME@B[:...]``, with or without the prefix) -> (keep maps of those that ran,
    ``{spec: reason}`` of those refused). One press that cannot run never stops the others."""
    kept, refused = {}, {}
    for spec in specs:
        rest = spec[len("kvpress:") :] if spec.startswith("kvpress:") else spec
        try:
            press = make_press(parse_press_spec(rest, spec), spec)
            kept[spec] = run_press(press, model, ids, prefix_len, spec).keep_map
        except FIError as exc:
            text = str(exc)
            refused[spec] = text[len(spec) + 2 :] if text.startswith(f"{spec}: ") else text
    return kept, refused


def press_survey(model, ids: torch.Tensor, prefix_len: int, ratio: float = 0.75) -> list[PressOutcome]:
    """Every press class of the installed kvpress on ``ids[:prefix_len]`` at ``ratio`` (kvpress's
    compression_ratio), sorted by name."""
    kvpress = require_kvpress()
    layers = model.config.num_hidden_layers
    out = []
    for name, cls in sorted(press_classes(kvpress).items()):
        spec, reason = survey_spec(name, cls, kvpress, ratio, layers)
        outcome = PressOutcome(name, press_kind(cls, kvpress), spec, reason=reason)
        outcome.decoding = decoding_use(cls, kvpress)
        if spec is not None:
            kept, refused = resolve_presses([spec], model, ids, prefix_len)
            if spec in kept:
                outcome.keep_map = kept[spec]
                outcome.kept = float(kept[spec].n_kept(prefix_len))
            else:
                outcome.reason = refused[spec]
        out.append(outcome)
    return out
