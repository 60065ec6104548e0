"""Future chunks ``C = [l_c, r_c)``: the positions whose next-token distributions Forward Influence
compares (docs/method.md, "Forward Influence": ``p <= l_c < r_c <= N``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fi_toolkit.errors import FIError


@dataclass(frozen=True)
class Chunk:
    """A future chunk ``[start, end)`` of positions whose next-token distributions are compared."""

    start: int
    end: int

    @property
    def label(self) -> str:
        return f"{self.start}:{self.end}"

    def __len__(self) -> int:
        return self.end - self.start


def parse_chunk(spec: str) -> Chunk:
    """``"2048:4096"`` -> ``Chunk(2048, 4096)`` with a clear error for anything else.

    Args:
        spec: ``"START:END"``, two integers with ``0 <= START < END``.

    Returns:
        The :class:`Chunk` ``[START, END)``.

    Raises:
        FIError: anything else, in one line naming the spec.
    """
    parts = spec.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start, end = int(parts[0]), int(parts[1])
    except ValueError:
        raise FIError(f"invalid chunk '{spec}': expected START:END with integers, e.g. 2048:4096") from None
    if start < 0:
        raise FIError(f"invalid chunk '{spec}': start must be >= 0")
    if start >= end:
        raise FIError(f"invalid chunk '{spec}': start must be smaller than end (l_c < r_c)")
    return Chunk(start, end)


def parse_chunks(chunks, parameter: str = "chunks") -> tuple[Chunk, ...]:
    """A list of chunks (each a :class:`Chunk` or a ``START:END`` string) -> a tuple of :class:`Chunk`; a bare
    string or chunk, or anything but a sequence, is refused in one line naming ``parameter`` (settings take lists)."""
    from fi_toolkit.runs.settings import check_type

    if isinstance(chunks, (str, Chunk)) or not isinstance(chunks, Sequence):
        raise FIError(f"{parameter} must be a list of START:END chunks, got {chunks!r}", parameter=parameter)
    return tuple(c if isinstance(c, Chunk) else parse_chunk(check_type(parameter, c, str)) for c in chunks)


def check_chunks(chunks: Sequence[Chunk], prefix_len: int, doc_len: int, max_context: int | None) -> None:
    """``p <= l_c < r_c <= N`` for every chunk, and within the model's context."""
    if not chunks:
        raise FIError("no chunk given: pass at least one START:END in chunks", parameter="chunks")
    seen: set[Chunk] = set()
    for c in chunks:
        if c in seen:
            raise FIError(f"chunk {c.label} is given twice")
        seen.add(c)
        if c.start < prefix_len:
            raise FIError(f"chunk {c.label} starts before the compression point p={prefix_len}")
        if c.end > doc_len:
            raise FIError(f"chunk {c.label} ends past the document's end ({doc_len:,} tokens)")
        if max_context is not None and c.end > max_context:
            raise FIError(f"chunk {c.label} ends past the model's context of {max_context:,} tokens")
