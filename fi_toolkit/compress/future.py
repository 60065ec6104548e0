"""What a replay or a probe measures on after the prompt: the document's own next
tokens, or the model's own continuation of the prompt.

``generated:N`` is the greedy continuation with the full cache; ``generated:N@SEED`` samples it
(temperature 1, no top-p) from that seed. End-of-sequence tokens do not stop it: the continuation
always has ``N`` tokens, so every setting measures the same number of positions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fi_toolkit.errors import FIError

if TYPE_CHECKING:  # parsing a future needs no torch; generating one imports it
    import torch

_GENERATED = re.compile(r"^generated:(\d+)(?:@(\d+))?$")


@dataclass(frozen=True)
class Future:
    """``tokens``/``seed``: only for ``generated`` (``seed=None``: greedy)."""

    kind: str = "document"
    tokens: int | None = None
    seed: int | None = None

    @property
    def generated(self) -> bool:
        return self.kind == "generated"

    @property
    def label(self) -> str:
        if not self.generated:
            return "document"
        return f"generated:{self.tokens}" + (f"@{self.seed}" if self.seed is not None else "")


DOCUMENT = Future()


def parse_future(spec: str | None) -> Future:
    """``document`` (or None) or ``generated:N[@SEED]`` with ``N >= 1``."""
    text = (spec or "document").strip().lower()
    if text == "document":
        return DOCUMENT
    m = _GENERATED.match(text)
    if not m:
        raise FIError(
            f"future must be 'document' or 'generated:N[@SEED]' (N new tokens, SEED to sample), got '{spec}'",
            parameter="future",
        )
    n = int(m.group(1))
    if n < 1:
        raise FIError(f"future generated:{n} generates nothing: N must be >= 1", parameter="future")
    return Future("generated", n, None if m.group(2) is None else int(m.group(2)))


def continue_ids(model, prompt_ids: torch.Tensor, future: Future, prefill_chunk: int = 2048) -> torch.Tensor:
    """``prompt_ids`` followed by ``future.tokens`` tokens the model generates with its full cache (CPU ids)."""
    import torch

    from fi_toolkit.compress.decoder import generate

    if not future.generated:
        raise FIError("continue_ids needs a generated future")
    greedy = future.seed is None
    with torch.no_grad():
        result = generate(
            model,
            None,
            prompt_ids.flatten().long(),
            None,
            max_new_tokens=future.tokens,
            temperature=0.0 if greedy else 1.0,
            seed=0 if greedy else future.seed,
            eos_token_id=[],
            prefill_chunk=prefill_chunk,
        )
    return torch.cat([prompt_ids.flatten().long().cpu(), torch.tensor(result.tokens, dtype=torch.long)])


def generated_document(lm, doc, prefix: int, future: Future):
    """``doc`` cut at ``prefix`` tokens and continued by the model (``fi probe --future generated:N``)."""
    from fi_toolkit.documents import Document

    doc.require(prefix, f"the prompt of future {future.label}")
    ids = continue_ids(lm.model, doc.ids[:prefix], future)
    text = lm.tokenizer.decode(ids.tolist()) if lm.tokenizer is not None else " ".join(map(str, ids.tolist()))
    return Document(
        name=f"{doc.name}+{future.label}",
        text=text,
        ids=ids,
        source=f"{doc.source}, first {prefix} tokens, then {future.label} by the model",
    )
