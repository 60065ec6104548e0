"""The surrogate: a scorer trained on Forward Influence, in KVzap's form (arXiv 2601.07891, Jegou et al. 2026).

Per layer ``l``, a linear map or a two-layer MLP (``Linear -> GELU -> Linear``) from the layer's attention input
(the hidden state after the layer's input norm, ``[d]``) of a position to one score per KV head ``[Hkv]``;
higher = keep. The scores of a position depend on that position's hidden state only, so nothing from after it.

**Files** (a directory): ``config.json`` (kvpress's ``KVzapConfig``: ``model_type "kvzap"``, ``input_dim``,
``output_dim``, ``n_modules``, ``hidden_dim`` (null: linear), and what this project records of the training
under ``fi_toolkit``) and ``model.safetensors`` (``layers.<l>.weight``/``bias``, or ``layers.<l>.0.*`` and
``layers.<l>.2.*`` for the MLP): kvpress's ``KVzapModel.from_pretrained(DIR)`` loads it as it is. Reading uses
JSON and safetensors only (no pickle, no code), and a directory that is not such a model (missing or extra
tensors, wrong shapes, non-finite weights, a model of another size) is refused in one line.

**Policy** ``surrogate:path=DIR`` (without ``path=``: :data:`DEFAULT_MODEL`, the linear surrogate trained on the
label factory's corpus for the embedded SmolLM2, in a source checkout only) scores the cache by the attention inputs
of its tokens, each scored once, as it is fed: at a prompt's compression in the probe and ``fi field`` by the prefix
trace (:func:`~fi_toolkit.probe.selections.trace_scorer`), while decoding (``fi generate``, ``fi eval``,
``fi lm-eval``) by the decoder's tracker (:class:`~fi_toolkit.signals.tracker.SignalTracker`'s ``scorer``); a
compression then only ranks stored scores. Given signals without its scores, it runs one forward of the prompt's
tokens with hooks on every layer's attention input (the cost of a prefill). ``heads=global`` shares a layer's budget
over its KV heads by score (AdaKV's allocation, as ``learned:heads=global``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy

if TYPE_CHECKING:
    import torch

    from fi_toolkit.signals.policy_view import Signals

# the FI-trained linear surrogate of the embedded model (analyses/surrogate.py), present in a source checkout only
DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "analyses" / "results" / "surrogate" / "model"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
HEADS = ("uniform", "global")
MAX_CONFIG_BYTES = 1 << 20


@dataclass
class SurrogateModel:
    """The scorer: ``weights`` by kvpress's tensor names; ``hidden_dim`` None for the linear form."""

    input_dim: int
    output_dim: int
    n_modules: int
    hidden_dim: int | None
    weights: dict = field(repr=False)
    about: dict = field(default_factory=dict)
    digest: str = ""  # sha256 of the weights file read: two reads of one model score alike (Surrogate.scores)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        d, h, m = self.input_dim, self.output_dim, self.hidden_dim
        shapes = {}
        for i in range(self.n_modules):
            if m is None:
                shapes.update({f"layers.{i}.weight": (h, d), f"layers.{i}.bias": (h,)})
            else:
                shapes.update(
                    {
                        f"layers.{i}.0.weight": (m, d),
                        f"layers.{i}.0.bias": (m,),
                        f"layers.{i}.2.weight": (h, m),
                        f"layers.{i}.2.bias": (h,),
                    }
                )
        return shapes

    def score(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Scores ``[n, Hkv]`` of attention inputs ``x [n, d]`` at ``layer`` (float32)."""
        import torch

        w = self.weights
        x = x.float()
        if self.hidden_dim is None:
            return torch.nn.functional.linear(x, w[f"layers.{layer}.weight"], w[f"layers.{layer}.bias"])
        h = torch.nn.functional.linear(x, w[f"layers.{layer}.0.weight"], w[f"layers.{layer}.0.bias"])
        return torch.nn.functional.linear(
            torch.nn.functional.gelu(h), w[f"layers.{layer}.2.weight"], w[f"layers.{layer}.2.bias"]
        )

    def config(self) -> dict:
        """``config.json``: what kvpress's ``KVzapConfig`` reads, and this project's record of the training."""
        return {
            "architectures": ["KVzapModel"],
            "model_type": "kvzap",
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "n_modules": self.n_modules,
            "hidden_dim": self.hidden_dim,
            "fi_toolkit": self.about,
        }


def _dimension(config: dict, key: str, where: str, optional: bool = False) -> int | None:
    v = config.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1 << 20:
        raise FIError(f"{where}: config.json's {key} must be a positive whole number, got {v!r}")
    return v


def read_surrogate(path: str | Path) -> SurrogateModel:
    """The surrogate in directory ``path``, every tensor's name, shape and values checked (module docstring)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    where = f"surrogate '{path}'"
    folder = Path(path)
    if not folder.is_dir():
        raise FIError(f"{where} is not a directory (it holds config.json and model.safetensors)")
    try:
        text = (folder / CONFIG).read_bytes()
        if len(text) > MAX_CONFIG_BYTES:
            raise FIError(f"{where}: config.json is larger than a surrogate's config")
        config = json.loads(text)
    except FileNotFoundError:
        raise FIError(f"{where} holds no config.json") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise FIError(f"{where}: config.json is not readable JSON ({e})") from None
    if not isinstance(config, dict) or config.get("model_type") != "kvzap":
        raise FIError(f"{where}: config.json is not a KVzap model's (model_type must be 'kvzap')")
    model = SurrogateModel(
        _dimension(config, "input_dim", where),
        _dimension(config, "output_dim", where),
        _dimension(config, "n_modules", where),
        _dimension(config, "hidden_dim", where, optional=True),
        {},
        config.get("fi_toolkit") if isinstance(config.get("fi_toolkit"), dict) else {},
    )
    try:
        data = (folder / WEIGHTS).read_bytes()  # read once: parsed and hashed from the same bytes
        weights = load(data)
        model.digest = hashlib.sha256(data).hexdigest()
    except FileNotFoundError:
        raise FIError(f"{where} holds no model.safetensors") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise FIError(f"{where}: model.safetensors is not a safetensors file ({e})") from None
    want = model.expected_shapes()
    if set(weights) != set(want):
        odd = sorted(set(weights) ^ set(want))
        raise FIError(f"{where}: model.safetensors does not hold the tensors config.json describes ({odd[0]}, ...)")
    for name, t in weights.items():
        if tuple(t.shape) != want[name]:
            raise FIError(f"{where}: {name} has shape {tuple(t.shape)}, config.json says {want[name]}")
        if not t.is_floating_point() or not bool(t.isfinite().all()):
            raise FIError(f"{where}: {name} holds non-finite or non-float values")
    model.weights = {k: v.float() for k, v in weights.items()}
    return model


def write_surrogate(path: str | Path, model: SurrogateModel) -> Path:
    """``config.json`` and ``model.safetensors`` into directory ``path`` (created; each file atomic)."""
    from safetensors.torch import save

    from fi_toolkit.runs.results import atomic_write_bytes, atomic_write_text, make_dir

    folder = make_dir(Path(path))
    weights = {k: v.detach().float().contiguous() for k, v in sorted(model.weights.items())}
    # the bytes straight into the atomic write; "format": "pt" is the metadata transformers' loader needs
    atomic_write_bytes(folder / WEIGHTS, save(weights, metadata={"format": "pt"}))
    atomic_write_text(folder / CONFIG, json.dumps(model.config(), indent=2, sort_keys=True) + "\n")
    return folder


def attention_inputs(model, tokens: torch.Tensor, layers: list[int] | None = None) -> list[torch.Tensor]:
    """Per decoder layer, its attention module's input (after the input norm) ``[n, d]`` for ``tokens [n]``, from
    one forward without a cache; ``layers``: only these (the others' entries are None)."""
    import torch

    from fi_toolkit.model.architectures import decoder_parts

    blocks = decoder_parts(model)[0]
    wanted = set(range(len(blocks)) if layers is None else layers)
    seen: list = [None] * len(blocks)

    def hook(i):
        def capture(_module, args, kwargs):
            seen[i] = (args[0] if args else kwargs["hidden_states"])[0].detach()

        return capture

    handles = [
        b.self_attn.register_forward_pre_hook(hook(i), with_kwargs=True) for i, b in enumerate(blocks) if i in wanted
    ]
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            model.model(input_ids=tokens.to(device)[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return seen


@dataclass
class Surrogate(Policy):
    """Keep the entries whose tokens the surrogate scores highest (module docstring); ``path``: its directory.
    ``heads``: ``uniform`` (every KV head keeps the same count) or ``global`` (a layer's budget over its heads)."""

    path: str = ""
    heads: str = "uniform"

    name: ClassVar[str] = "surrogate"
    needs_model: ClassVar[bool] = True
    no_layer_weight: ClassVar[str] = "ranks by a learned score of hidden states, not a mass to share layer budgets by"

    def __post_init__(self):
        super().__post_init__()
        if not self.path:
            if not (DEFAULT_MODEL / CONFIG).is_file():
                raise FIError("surrogate needs its directory: surrogate:path=DIR (made by fi fit-surrogate)")
            self.path = str(DEFAULT_MODEL)
        if self.heads not in HEADS:
            raise FIError(f"heads must be uniform or global, got '{self.heads}'")
        self.model = read_surrogate(self.path)
        self.uneven_heads = self.heads == "global"
        self._table: tuple | None = None

    def _scores_by_position(self, s: Signals) -> list[torch.Tensor]:
        """Per layer ``[Hkv, seen]``: every fed token's scores, from one forward of ``s.tokens`` (kept for the
        layers of one compression)."""
        if s.tokens is None or s.model is None:
            raise FIError("surrogate: scoring needs the model and the tokens fed (a prompt's compression)")
        import torch

        tokens = s.tokens[: s.seen]
        if self._table is None or not torch.equal(self._table[0], tokens):
            m, heads = self.model, s.keys[0].shape[1]
            if m.n_modules != s.num_layers or m.output_dim != heads:
                raise FIError(
                    f"surrogate '{self.path}' scores {m.n_modules} layers x {m.output_dim} KV heads; this model has "
                    f"{s.num_layers} x {heads}"
                )
            inputs = attention_inputs(s.model, tokens)
            if inputs[0].shape[-1] != m.input_dim:
                raise FIError(
                    f"surrogate '{self.path}' reads hidden states of {m.input_dim}, not {inputs[0].shape[-1]}"
                )
            self._table = (tokens.clone(), [m.score(layer, x).t().contiguous() for layer, x in enumerate(inputs)])
        return self._table[1]

    @property
    def input_scorer(self) -> SurrogateModel:
        """What the decoder's tracker scores each fed row with (:class:`~fi_toolkit.signals.tracker.SignalTracker`)."""
        return self.model

    def _scored_by_me(self, s: Signals) -> bool:
        """Whether ``s.input_scores`` are this surrogate's: its model, or another read of the same weights."""
        by = s.scored_by
        return by is self.model or (isinstance(by, SurrogateModel) and by.digest == self.model.digest != "")

    def scores(self, s: Signals, layer: int) -> torch.Tensor:
        import torch

        if s.input_scores is not None and self._scored_by_me(s):  # scored as each token was fed (the decoder's
            return s.input_scores[layer]  # tracker, or the prefix trace): nothing to recompute
        table = self._scores_by_position(s)[layer].to(s.positions[layer].device)
        return torch.gather(table, 1, s.positions[layer].long())

    def keep_map(self, signals):
        """:meth:`Policy.keep_map`; with ``heads=global`` each layer's budget (the uniform ``k`` per head, times
        ``Hkv``) is shared over its heads by score (:func:`~fi_toolkit.policies.base.select_across_heads`)."""
        if self.heads != "global":
            return super().keep_map(signals)
        return self.keep_map_across_heads(signals)

    def scores_for_heads(self, s: Signals, layer: int, across_heads: bool) -> torch.Tensor:
        return self.scores(s, layer)
