"""Which model to load and where: :class:`ModelSettings`, shared by every ``fi`` command that loads one and
by the Python API (``ModelSettings(...).load()``). Imports nothing heavy: the CLI reads it while parsing."""

from __future__ import annotations

from dataclasses import dataclass, field

from fi_toolkit.runs.settings import check_type, option

DEFAULT_MODEL = "smollm2-135m"  # the embedded default (fi_toolkit.model.loading.DEFAULT_MODEL)


@dataclass(frozen=True)
class ModelSettings:
    """``--model``, ``--device``, ``--device-map``, ``--dtype``, ``--upcast`` of
    :func:`~fi_toolkit.model.loading.load_model`.

    ``device_map`` is accelerate's strategy, a JSON object / file (a string) or a dict ``{module: device}``;
    it does not go with ``device``. The device and dtype names are checked when the model loads.
    """

    model: str = field(
        default=DEFAULT_MODEL,
        metadata=option("--model", "-m", help="smollm2-135m (embedded), a local directory or a HF id."),
    )
    device: str | None = field(
        default=None,
        metadata=option(
            "--device", help="cpu (the default), cuda, cuda:N or auto; under torchrun, cuda is cuda:LOCAL_RANK."
        ),
    )
    device_map: str | dict | None = field(
        default=None,
        metadata=option(
            "--device-map",
            cli_type=str,
            help="Place the layers of a model larger than one GPU across the visible GPUs (accelerate): auto, "
            "balanced, "
            "sequential, or a JSON object / JSON file {module: device}. Not with --device.",
        ),
    )
    dtype: str = field(
        default="float32",
        metadata=option(
            "--dtype", help="float32, bfloat16 or float16: how the weights are stored (signals and KL stay float32)."
        ),
    )
    upcast: bool = field(
        default=True,
        metadata=option(
            "--upcast/--no-upcast",
            help="With --dtype bfloat16/float16, compute in float32 (the default: per-token FI then ranks like "
            "float32). "
            "--no-upcast computes in the weights' dtype: faster, but its rounding (the control:reorder row) swamps "
            "per-token FI.",
        ),
    )

    def check(self) -> ModelSettings:
        """Types, the placement (``--device`` with ``--device-map`` refused, the map parsed) and a ``model``
        directory that holds no model (:func:`~fi_toolkit.model.files.check_model_dir`), before loading."""
        from fi_toolkit.model.files import check_model_dir

        self.placement()
        check_model_dir(self.model)
        return self

    def token_counter(self):
        """``text -> its number of tokens`` under this model's tokenizer, read from its ``tokenizer.json``
        without torch or transformers, or None where none is at hand
        (:func:`~fi_toolkit.model.files.token_counter`): documents are measured before the weights load."""
        from fi_toolkit.model.files import token_counter

        return token_counter(self.model)

    def placement(self) -> str | dict | None:
        """The parsed ``device_map`` (:func:`fi_toolkit.model.loading.check_placement`)."""
        from fi_toolkit.model.placement import check_placement

        check_type("model", self.model, str)
        check_type("device", self.device, str, optional=True)
        check_type("device_map", self.device_map, str, dict, optional=True)
        check_type("dtype", self.dtype, str)
        check_type("upcast", self.upcast, bool)
        return check_placement(self.device, self.device_map)

    def load(self, **kwargs):
        """:func:`fi_toolkit.model.loading.load_model` with these settings (``kwargs``: its other arguments)."""
        from fi_toolkit.model.loading import load_model

        return load_model(
            self.model, self.device, self.dtype, upcast=self.upcast, device_map=self.placement(), **kwargs
        )
