"""What differs between the supported transformers releases (5.2 to the latest 5.x), in one place.

- The cache keyword. transformers 5.2 names a forward's cache argument ``past_key_values``; later
  5.x releases name it ``cache``. Passing the wrong name does not fail: it vanishes into
  ``**kwargs`` and the cache stays empty. So the name is read once per model class from its forward
  signature, and every call site passes the cache through :func:`cache_kwargs`.
- The tokenizer of a GGUF file. transformers 5.2 builds the tokenizer of a llama-architecture GGUF
  with its SentencePiece (CodeLlama) converter even when the file holds a byte-level BPE vocabulary
  (``tokenizer.ggml.model = gpt2``, as the embedded SmolLM2 does): it prepends BOS although the file
  says ``add_bos_token = False``, names the BOS token as EOS, sets no pad token and decodes through
  SentencePiece steps. The same document then tokenizes one token longer and every FI shifts. Later
  5.x releases (5.24 checked) build a byte-level tokenizer that follows the file. So
  :func:`gguf_tokenizer` builds byte-level GGUF tokenizers itself, the way those releases do (its
  ``tokenizer.json`` is identical to 5.24's), under every supported release.
"""

from __future__ import annotations

import functools
import inspect
import mmap
import struct
from pathlib import Path

import torch

from fi_toolkit.errors import FIError

CACHE_KEYWORDS = ("cache", "past_key_values")  # newest first


@functools.cache
def _cache_keyword(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    for name in CACHE_KEYWORDS:
        if name in params:
            return name
    raise FIError(f"{cls.__name__}.forward takes no KV cache argument ({' or '.join(CACHE_KEYWORDS)})")


def cache_keyword(module: torch.nn.Module) -> str:
    """The name ``module.forward`` gives its KV cache argument."""
    return _cache_keyword(type(module))


def cache_kwargs(module: torch.nn.Module, cache) -> dict:
    """``{name: cache}`` for ``module(**...)``, with the name its transformers release uses."""
    return {cache_keyword(module): cache}


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_metadata(path: Path, prefix: str = "") -> dict:
    """A GGUF file's metadata keys that start with ``prefix``, as Python values (strings, numbers, lists).

    Read here (the header only, through mmap) because gguf's GGUFReader takes seconds over the
    100,000 strings of a vocabulary, and its API differs between gguf releases.
    """

    def string(pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", blob, pos)
        return blob[pos + 8 : pos + 8 + n].decode("utf-8"), pos + 8 + n

    def value(kind: int, pos: int):
        if kind == _GGUF_STRING:
            return string(pos)
        if kind == _GGUF_ARRAY:
            inner, n = struct.unpack_from("<IQ", blob, pos)
            pos, items = pos + 12, []
            for _ in range(n):
                item, pos = value(inner, pos)
                items.append(item)
            return items, pos
        return struct.unpack_from(_GGUF_SCALARS[kind], blob, pos)[0], pos + struct.calcsize(_GGUF_SCALARS[kind])

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        magic, version, _tensors, count = struct.unpack_from("<4sIQQ", blob, 0)
        if magic != b"GGUF" or version < 2:
            raise FIError(f"{path} is not a GGUF file of version 2 or later")
        meta, pos = {}, 24
        for _ in range(count):
            key, pos = string(pos)
            (kind,) = struct.unpack_from("<I", blob, pos)
            item, pos = value(kind, pos + 4)
            if key.startswith(prefix):
                meta[key] = item
    return meta


def _byte_level_tokenizer(meta: dict):
    """transformers' own recipe of later 5.x (``byte_level_tokenizer`` and ``add_gguf_special_tokens``)."""
    from tokenizers import AddedToken
    from transformers import GPT2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens = meta["tokenizer.ggml.tokens"]
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)
    }
    ids = {
        "bos_token": "bos_token_id",
        "eos_token": "eos_token_id",
        "unk_token": "unknown_token_id",
        "pad_token": "padding_token_id",
    }
    special = {
        name: tokens[meta[f"tokenizer.ggml.{key}"]] for name, key in ids.items() if f"tokenizer.ggml.{key}" in meta
    }
    tokenizer = GPT2Tokenizer(
        vocab=vocab,
        merges=[tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]],
        chat_template=meta.get("tokenizer.chat_template"),
        **special,
    )
    types = meta.get("tokenizer.ggml.token_type") or ()
    # 3 is CONTROL (special; one spelled outside the byte alphabet is a llama.cpp mislabel), 4 USER_DEFINED
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types) if k == 3 and set(t) <= alphabet],
        special_tokens=True,
    )
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == 4 and t in vocab]
    )
    return tokenizer


def gguf_tokenizer(path: Path):
    """The tokenizer of GGUF file ``path``: built here for a byte-level BPE vocabulary (see the module
    docstring: transformers 5.2 misbuilds it), else transformers' own."""
    meta = gguf_metadata(path, "tokenizer.")
    if meta.get("tokenizer.ggml.model") == "gpt2" and meta.get("tokenizer.ggml.add_bos_token") is not True:
        return _byte_level_tokenizer(meta)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
