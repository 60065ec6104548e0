"""Where the model goes (``--device``, ``--device-map``), parsed and checked without torch, so the command
line refuses a bad placement before anything heavy is imported (:mod:`fi_toolkit.model.loading` places it)."""

from __future__ import annotations

import json
from pathlib import Path

from fi_toolkit.errors import FIError

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_device_map(spec: str | dict | None) -> str | dict | None:
    """``--device-map``: accelerate's strategy (auto, balanced, balanced_low_0, sequential), a JSON
    object ``{module: device}`` or the path of a JSON file holding one; None stays None."""
    if spec is None or isinstance(spec, dict):
        return spec
    if spec in DEVICE_MAP_STRATEGIES:
        return spec
    text = spec
    if not spec.lstrip().startswith(("{", "[")):
        try:
            text = Path(spec).read_text()
        except OSError:
            raise FIError(
                f"device_map '{spec}' is neither {', '.join(DEVICE_MAP_STRATEGIES)}, a JSON object "
                "nor a readable JSON file",
                parameter="device_map",
            ) from None
    try:
        device_map = json.loads(text)
    except ValueError as exc:
        raise FIError(
            f"device_map '{spec}' is not valid JSON: {exc.msg} (line {exc.lineno})", parameter="device_map"
        ) from None
    if (
        not isinstance(device_map, dict)
        or not device_map
        or not all(isinstance(k, str) and isinstance(v, (str, int)) for k, v in device_map.items())
    ):
        raise FIError(
            f"device_map '{spec}' must map module names to devices, e.g. "
            '{"model.embed_tokens": 0, "model.layers.0": 0, ..., "lm_head": 1}',
            parameter="device_map",
        )
    return device_map


def check_placement(device: str | None, device_map: str | dict | None) -> str | dict | None:
    """``--device`` and ``--device-map`` both say where the model goes: refused together; -> the parsed map."""
    if device is not None and device_map is not None:
        raise FIError(
            "device_map places the model's layers across devices; it does not go with device (give one)",
            parameter=("device_map", "device"),
        )
    return parse_device_map(device_map)
