"""Documents: text files, JSONL (one ``text`` field per line) and the bundled samples -> token ids."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fi_toolkit.errors import FIError

if TYPE_CHECKING:  # torch is imported by whoever tokenises; reading a document's text needs none of it
    import torch

BUNDLED = {
    "alice": "alice29.txt",
    "hamlet": "hamlet_gut.txt",
    "lcet10": "lcet10.txt",
    "botchan": "botchan.txt",
    "paradise_regained": "paradise_regained_gut.txt",
}
DEFAULT_DOCUMENT = "alice"
# Tokenising a 400 KB book to use its first few thousand tokens is wasted work: cut the text to
# this many characters per requested token first (English BPE averages ~4 characters per token).
_CHARS_PER_TOKEN_BOUND = 12
# A document is read whole into memory; past this it is a mistake (a disk image, a device), not a text.
# The largest bundled book is ~0.4 MiB and a 1M-token context ~4 MiB of text: 256 MiB leaves room for a
# JSONL of many long documents while a typo cannot fill the memory.
MAX_DOCUMENT_BYTES = 256 * 2**20


@dataclass
class Document:
    """One document: its text, token ids (1-D LongTensor) and where it came from."""

    name: str
    text: str
    ids: torch.Tensor
    source: str
    sha256: str = field(default="")

    def __post_init__(self):
        if not self.sha256:
            self.sha256 = hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def __len__(self) -> int:
        return int(self.ids.numel())

    def require(self, n_tokens: int, what: str) -> None:
        """Fail with one clear line when the document is shorter than ``what`` needs."""
        if n_tokens > len(self):
            raise FIError(f"document '{self.name}' has {len(self):,} tokens but {what} needs {n_tokens:,}")


def bundled_path(name: str) -> Path:
    return Path(__file__).parent / "data" / BUNDLED[name]


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def check_document_file(path: Path) -> os.stat_result:
    """Refuse in one line, before anything is opened, what is not a regular file of at most
    ``MAX_DOCUMENT_BYTES`` (``/dev/zero`` would fill the memory, a FIFO without a writer would wait forever)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise FIError(f"cannot read '{path}': {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise FIError(f"'{path}' is a directory, not a document")
    if not stat.S_ISREG(info.st_mode):
        raise FIError(f"'{path}' is {_file_kind(info.st_mode)}, not a document: give a text or JSONL file")
    if info.st_size > MAX_DOCUMENT_BYTES:
        raise FIError(
            f"'{path}' is {info.st_size / 2**20:,.0f} MiB; a document file holds at most "
            f"{MAX_DOCUMENT_BYTES // 2**20} MiB (split it into several files)"
        )
    return info


def _read_text(path: Path) -> str:
    """The UTF-8 text of a regular file (:func:`check_document_file`); never more than the bound is read,
    even if the file grows meanwhile."""
    check_document_file(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise FIError(f"cannot read '{path}': {exc.strerror}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise FIError(
            f"'{path}' grew past {MAX_DOCUMENT_BYTES // 2**20} MiB while it was read; a document file "
            f"holds at most {MAX_DOCUMENT_BYTES // 2**20} MiB"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise FIError(f"'{path}' is not UTF-8 text") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as Path.read_text reads


def read_texts(spec: str | None) -> list[tuple[str, str, str]]:
    """(name, text, source) for a path (.txt or .jsonl), a bundled name, or None (the default).

    A path must be a regular file of at most ``MAX_DOCUMENT_BYTES`` (256 MiB), checked before it is
    opened. Empty documents are refused here, before any model is loaded."""
    texts = _read_texts(spec)
    for name, text, source in texts:
        if not text.strip():
            raise FIError(f"document '{name}' ({source}) is empty")
    return texts


def _read_texts(spec: str | None) -> list[tuple[str, str, str]]:
    if spec is None:
        spec = DEFAULT_DOCUMENT
    path = Path(spec)
    if not path.exists():
        key = spec.removeprefix("bundled:")
        if key in BUNDLED:
            return [(key, _read_text(bundled_path(key)), f"bundled:{key}")]
        raise FIError(f"document not found: '{spec}' (bundled documents: {', '.join(BUNDLED)})")
    if path.suffix == ".jsonl":
        texts = []
        for lineno, line in enumerate(_read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if not isinstance(record, dict) or "text" not in record:
                raise FIError(f"{path}:{lineno}: expected a JSON object with a 'text' field")
            text, name = record["text"], record.get("id", f"{path.stem}#{lineno}")
            if not isinstance(text, str):  # never str(): null would become the document "None"
                raise FIError(f"{path}:{lineno}: 'text' must be a string")
            if isinstance(name, bool) or not isinstance(name, (str, int)):
                raise FIError(f"{path}:{lineno}: 'id' must be a string or an integer")
            texts.append((str(name), text, f"{path}:{lineno}"))
        if not texts:
            raise FIError(f"'{path}' holds no documents")
        return texts
    return [(path.stem, _read_text(path), str(path))]


def tokenize(tokenizer, text: str, max_tokens: int | None = None) -> torch.Tensor:
    if max_tokens is not None:
        text = text[: max_tokens * _CHARS_PER_TOKEN_BOUND]
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    return ids[:max_tokens] if max_tokens is not None else ids


def tokenize_texts(texts: list[tuple[str, str, str]], tokenizer, max_tokens: int | None = None) -> list[Document]:
    """Documents from ``read_texts`` output; empty documents are an error."""
    docs = []
    for name, text, source in texts:
        if not text.strip():
            raise FIError(f"document '{name}' ({source}) is empty")
        ids = tokenize(tokenizer, text, max_tokens)
        if ids.numel() == 0:
            raise FIError(f"document '{name}' ({source}) has no tokens")
        docs.append(Document(name=name, text=text, ids=ids, source=source))
    return docs


SPECIAL_TOKENS = 2  # a tokenizer may add a BOS and an EOS; every other token covers at least one byte of the text


def check_lengths(texts: list[tuple[str, str, str]], needed: int, what: str, count=None) -> None:
    """Refuse, before any model loads, a document of ``texts`` (``read_texts`` output) too short for ``what``,
    which needs its first ``needed`` tokens: one line naming the document and its length.

    ``count``: ``text -> its number of tokens`` under the model's tokenizer
    (:meth:`~fi_toolkit.model.settings.ModelSettings.token_counter`), given the text :func:`tokenize` would
    (cut to ``needed`` tokens' worth of characters). It may differ from the loaded tokenizer's by the
    special tokens only, so a document within :data:`SPECIAL_TOKENS` of ``needed`` is left to the exact check
    after tokenising. Without ``count``: the bound every tokenizer keeps, a token per byte plus the special
    tokens."""
    for name, text, _source in texts:
        cut = text[: needed * _CHARS_PER_TOKEN_BOUND]
        if count is not None:
            n = count(cut)
            if needed > n + SPECIAL_TOKENS:
                raise FIError(f"{what} ends past the end of document '{name}' ({n:,} tokens)")
            continue
        size = len(cut.encode("utf-8"))
        if needed > size + SPECIAL_TOKENS:
            raise FIError(
                f"{what} ends past the end of document '{name}' (at most {size + SPECIAL_TOKENS:,} tokens: "
                f"{size:,} bytes of text)"
            )


def load_documents(spec: str | None, tokenizer, max_tokens: int | None = None) -> list[Document]:
    """Read and tokenise every document behind ``spec`` (a path, a bundled name, or None)."""
    return tokenize_texts(read_texts(spec), tokenizer, max_tokens)


def load_document(spec: str | None, tokenizer, max_tokens: int | None = None) -> Document:
    """The first (for .txt: the only) document behind ``spec``."""
    return load_documents(spec, tokenizer, max_tokens)[0]
