"""What ``fi labels`` computes (:class:`LabelSettings`) and from which texts (:class:`CorpusSettings`).

Each field carries its command-line flag and help (:func:`fi_toolkit.runs.settings.option`), from which
:func:`fi_toolkit.cli.options.settings_options` generates the command's options. Imports nothing heavy: the
command line builds and checks these before the model loads.

Why these defaults: the label factory's product is the training signal of a surrogate that scores cache
entries at compression points it has not seen, so every document is labelled at several points ``p``
(default 512 and 1,024 tokens into its slice) against a near chunk right after ``p`` (``0:128``) and a far
one (``256:384``), the shape of the field map's near and far cells. One label draw per chunk (the Fisher
estimator's samples, :mod:`fi_toolkit.probe.estimator`) and many slices: measured (docs/results/surrogate.md,
"Draws against documents"), a unit with one draw costs about half a unit with four (the trace is shared), and at
equal CPU twice the texts with one draw rank FI at least as well as half of them with four (offline Spearman 0.716
against 0.711); a new document teaches the surrogate more than a redrawn label.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, List

from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk, parse_chunk
from fi_toolkit.probe.estimator_options import check_samples
from fi_toolkit.runs.settings import check_int, check_type, first_repeat, option
from fi_toolkit.surrogate.corpus import KINDS  # the corpus module is light: stdlib and errors at import


@dataclass(frozen=True)
class LabelSettings:
    """``fi labels``' options, checked by :meth:`check` (one :class:`~fi_toolkit.errors.FIError` line naming
    the parameter).

    ``points``: the compression points ``p`` labelled in every slice; ``near``/``far``: the future chunks,
    as token offsets after ``p`` (``near="0:128"`` at ``p = 512`` is the chunk ``512:640``); ``samples``:
    label draws per chunk; ``seed``: of the draws (the same for every unit, as ``fi fit-data``'s);
    ``sinks``: first positions left out of the rows; ``slices``: at most this many slices per text;
    ``features``: add ``fi fit-data``'s feature columns (the compression-time signals) to the rows.
    """

    OPTION_ORDER: ClassVar[tuple[str, ...]] = (
        "points",
        "near",
        "far",
        "samples",
        "seed",
        "sinks",
        "slices",
        "features",
    )

    points: tuple[int, ...] = field(
        default=(512, 1024),
        metadata=option("--point", help="Compression point p within each slice (repeatable).", cli_type=List[int]),
    )
    near: str = field(default="0:128", metadata=option("--near", help="Near chunk as offsets after p, A:B."))
    far: str = field(default="256:384", metadata=option("--far", help="Far chunk as offsets after p, A:B."))
    samples: int = field(default=1, metadata=option("--samples", help="Label draws of the Fisher estimator per chunk."))
    seed: int = field(default=0, metadata=option("--seed", help="Seed of the label draws."))
    sinks: int = field(default=0, metadata=option("--sinks", help="Leave the first N positions out of the rows."))
    slices: int = field(
        default=4, metadata=option("--slices", help="At most this many slices per text, spread over it.")
    )
    features: bool = field(
        default=False,
        metadata=option("--features/--no-features", help="Add fi fit-data's feature columns to the rows."),
    )

    def __post_init__(self):
        if isinstance(self.points, list):
            object.__setattr__(self, "points", tuple(self.points))

    def check(self, window: int) -> LabelSettings:
        """Every field, against the observation ``window`` (a point must lie above it with one candidate)."""
        check_type("points", self.points, tuple)
        if not self.points:
            raise FIError("no compression point given: pass at least one in points", parameter="points")
        for p in self.points:
            check_int("points", p, window + 1)
        repeat = first_repeat(self.points)
        if repeat:
            raise FIError(f"compression point {repeat[0]} is given twice", parameter="points")
        near, far = self.offsets()
        if near == far:
            raise FIError(f"the near and far chunks are the same ({self.near})", parameter=("near", "far"))
        check_samples(check_int("samples", self.samples, 1))
        check_int("seed", self.seed, 0)
        if not 0 <= check_int("sinks", self.sinks) < min(self.points) - window:
            raise FIError(f"sinks must lie in [0, {min(self.points) - window}), got {self.sinks}", parameter="sinks")
        check_int("slices", self.slices, 1)
        check_type("features", self.features, bool)
        return self

    def offsets(self) -> tuple[Chunk, Chunk]:
        """``near`` and ``far`` parsed (offsets after ``p``)."""
        return (
            parse_chunk(check_type("near", self.near, str)),
            parse_chunk(check_type("far", self.far, str)),
        )

    def chunks(self, p: int) -> tuple[Chunk, Chunk]:
        """The near and far chunks of compression point ``p``, in positions of the slice."""
        return tuple(Chunk(p + c.start, p + c.end) for c in self.offsets())

    def slice_tokens(self) -> int:
        """Tokens each slice holds: up to the far chunk's end at the last point."""
        return max(self.points) + max(c.end for c in self.offsets())


@dataclass(frozen=True)
class CorpusSettings:
    """Which corpus texts ``fi labels`` reads: ``corpus``, a manifest (:mod:`fi_toolkit.surrogate.corpus`;
    None: the documents named on the command line only), ``archives``, where ``make corpus`` put the
    packages' archives, and the ``kinds`` of text taken."""

    corpus: Path | None = field(
        default=None,
        metadata=option("--corpus", help="Corpus manifest (fi_toolkit/surrogate/corpus.json) to label."),
    )
    archives: Path = field(
        default=Path(".cache/corpus"), metadata=option("--archives", help="Where `make corpus` put the archives.")
    )
    kinds: tuple[str, ...] = field(
        default=KINDS,
        metadata=option(
            "--kind", help="Kind of corpus text to take: prose, verse, dialogue, code (repeatable).", cli_type=List[str]
        ),
    )

    def __post_init__(self):
        for name in ("corpus", "archives"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Path(getattr(self, name)))
        if isinstance(self.kinds, list):
            object.__setattr__(self, "kinds", tuple(self.kinds))

    def check(self) -> CorpusSettings:
        check_type("corpus", self.corpus, Path, optional=True)
        check_type("archives", self.archives, Path)
        check_type("kinds", self.kinds, tuple)
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise FIError(
                f"unknown kind {unknown[0] if unknown else '(none)'}: a kind is one of {', '.join(KINDS)}",
                parameter="kinds",
            )
        return self
