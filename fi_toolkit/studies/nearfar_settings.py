"""What ``fi nearfar`` measures: :class:`NearfarSettings`, the object the command line builds and
:func:`fi_toolkit.studies.study.run_nearfar` takes. Imports nothing heavy (no torch, no pandas): the command
line builds it, and so refuses bad options, before the model loads.

The settings hold what is measured (the compression point, the chunks' distances and length, the sets' budget
and seeds, sink protection, the signal options, the batch size, the work units, extra selections), not the
documents: the model and the documents are the run function's other arguments. The budget's messages name it
as ``--budget B``, as :class:`~fi_toolkit.field.settings.FieldSettings`' do. Each field that is an
option carries its flag and help (:func:`fi_toolkit.runs.settings.option`), from which
:func:`fi_toolkit.cli.options.settings_options` generates ``fi nearfar``'s options (``selections`` is not one).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.selections import check_prefix, check_selections, check_sinks, parse_selections
from fi_toolkit.runs.settings import check_int, check_type, option
from fi_toolkit.runs.units import check_unit_size
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.nearfar_spec import nearfar_chunks, nearfar_selections, parse_distances


@dataclass(frozen=True)
class NearfarSettings:
    """``fi nearfar``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line naming
    the parameter; the command line names its flag).

    ``prefix``: the compression point ``p``; ``distances``: chunk starts from ``p`` (``"0,256"`` or ints; the
    default spelled as the option's), each chunk ``chunk_len`` tokens; ``budget``: the size of every set
    (``remove=0.1``, a share of ``[0, p)``, or a count); ``seeds``: random sets (seeds ``0..N-1``); ``sinks``: the
    first positions no set selects; ``with_unprotected``: also measure every set without sink protection (when
    ``sinks > 0``); ``signals``: the signal options; ``batch_size``: evictions per batched forward (None: 1 on CPU,
    8 on CUDA); ``unit_sets``: work units of N sets (0: one unit per document), the same tables; ``selections``:
    ``--select`` specs measured beside the study's sets (``kvpress:NAME@BUDGET``, ``policy:NAME@BUDGET``; not an
    option of ``fi nearfar``).

    After construction ``distances`` and ``selections`` are tuples and ``budget`` a
    :class:`~fi_toolkit.budget.Budget`.
    """

    prefix: int = field(default=1024, metadata=option("--prefix", help="Compression point p."))
    distances: Sequence[int] | str = field(
        default="0,256,512,1024",
        metadata=option("--distances", help="Chunk starts as distances from p, comma-separated.", cli_type=str),
    )
    chunk_len: int = field(default=256, metadata=option("--chunk-len", help="Tokens per chunk."))
    budget: Budget | str = field(
        default="remove=0.1",
        metadata=option(
            "--budget",
            "-b",
            help="Set size, one budget for every set: remove=X or keep=X, a share of the prefix [0, p) (0.1) or a "
            "token count (100).",
            cli_type=str,
        ),
    )
    seeds: int = field(default=3, metadata=option("--seeds", help="Random sets (seeds 0..N-1)."))
    sinks: int = field(
        default=4, metadata=option("--sinks", help="Sink protection: the first N positions are never selected.")
    )
    with_unprotected: bool = field(
        default=True,
        metadata=option("--with-unprotected/--protected-only", help="Also measure every set without sink protection."),
    )
    signals: SignalConfig = field(default_factory=SignalConfig)
    batch_size: int | None = field(
        default=None,
        metadata=option("--batch-size", help="Evictions per batched forward (default: 1 on CPU, 8 on CUDA)."),
    )
    unit_sets: int = field(
        default=0,
        metadata=option(
            "--unit-sets",
            help="Split each document into work units of N sets (0: one unit per document), so torchrun's ranks "
            "share documents when they are few; same tables.",
        ),
    )
    selections: Sequence[str] = ()

    def __post_init__(self):
        distances = parse_distances(self.distances) if isinstance(self.distances, str) else self.distances
        if not isinstance(distances, Sequence):
            raise FIError(f"distances must be a list of whole numbers, got {distances!r}", parameter="distances")
        distances = tuple(check_int("distances", d) for d in distances)
        nearfar_chunks(check_int("prefix", self.prefix), distances, check_int("chunk_len", self.chunk_len))
        check_type("budget", self.budget, Budget, str)
        spelled = self.budget if isinstance(self.budget, str) else self.budget.label
        budget = Budget.parse(self.budget, "--budget")
        specs = nearfar_selections(budget, check_int("seeds", self.seeds))
        check_type("signals", self.signals, SignalConfig)
        config = self.signals.check()
        check_prefix(self.prefix, config.window)
        check_sinks(check_int("sinks", self.sinks), self.prefix, config.window)
        sets = [replace(s, source=f"--budget {spelled}") for s in parse_selections(specs)]
        check_selections(sets, self.prefix, config.window, self.sinks)
        check_type("with_unprotected", self.with_unprotected, bool)
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, 1)
        check_unit_size(check_int("unit_sets", self.unit_sets), "unit_sets")
        if isinstance(self.selections, str) or not isinstance(self.selections, Sequence):
            raise FIError(f"selections must be a list of specs, got {self.selections!r}", parameter="selections")
        selections = tuple(check_type("selections", s, str) for s in self.selections)
        parse_selections(selections)
        for name, value in (("distances", distances), ("budget", budget), ("selections", selections)):
            object.__setattr__(self, name, value)

    @property
    def chunks(self) -> list[Chunk]:
        """The chunks: ``chunk_len`` tokens at each distance from ``p``, nearest first."""
        return nearfar_chunks(self.prefix, self.distances, self.chunk_len)

    @property
    def sink_options(self) -> tuple[int, ...]:
        """The sink counts every set is measured with: ``(sinks, 0)`` with ``with_unprotected``, else ``(sinks,)``."""
        return (self.sinks, 0) if self.with_unprotected and self.sinks > 0 else (self.sinks,)

    def document_tokens(self) -> int:
        """The tokens each document needs: the far chunk's end."""
        return self.chunks[-1].end
