"""``TextSetting``: the lengths of a text replay (prompt, future, interval, free tokens), checked without torch
so that ``fi eval`` refuses bad lengths before the model loads."""

from __future__ import annotations

from dataclasses import dataclass

from fi_toolkit.compress.future import DOCUMENT, Future
from fi_toolkit.errors import FIError


@dataclass(frozen=True)
class TextSetting:
    """``prompt`` tokens, then the future up to ``length`` tokens in all (a generated future: ``prompt``
    + its tokens), compressing every ``interval`` fed tokens; ``free_tokens`` of free generation."""

    prompt: int = 1024
    length: int = 2048
    interval: int = 256
    future: Future = DOCUMENT
    free_tokens: int = 64

    def total(self) -> int:
        return self.prompt + self.future.tokens if self.future.generated else self.length

    def check(self) -> None:
        if self.prompt < 1:
            raise FIError(f"prompt must be >= 1 tokens, got {self.prompt}", parameter="prompt")
        if self.interval < 1:
            raise FIError(f"interval must be >= 1 fed tokens, got {self.interval}", parameter="interval")
        if self.free_tokens < 0:
            raise FIError(f"free_tokens must be >= 0, got {self.free_tokens}", parameter="free_tokens")
        if self.total() <= self.prompt:
            raise FIError(
                f"length {self.length} leaves nothing after the {self.prompt}-token prompt", parameter="length"
            )
