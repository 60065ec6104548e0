"""What ``fi scores`` computes: :class:`ScoresSettings`, the object the command line builds and
:func:`fi_toolkit.studies.scores_run.run_scores` takes, and :func:`scores_file`, the check of where the table
goes. Imports nothing heavy (no torch, no pandas): the command line builds both, and so refuses bad options,
before the model loads.

Each field of :class:`ScoresSettings` that is an option carries its flag and help
(:func:`fi_toolkit.runs.settings.option`), from which :func:`fi_toolkit.cli.options.settings_options` generates
``fi scores``' options; where the table goes is the command's :class:`~fi_toolkit.runs.settings.RunSettings`.

It lives in ``studies/`` beside the run function, not in ``probe/``: exact per-token FI is
:func:`fi_toolkit.studies.per_token.per_token_fi`, and ``probe/`` sits below ``studies/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk, check_chunks, parse_chunks
from fi_toolkit.probe.estimator_options import DEFAULT_SAMPLES, ESTIMATORS, check_samples
from fi_toolkit.probe.selections import check_prefix
from fi_toolkit.runs.settings import RunSettings, check_int, check_type, option
from fi_toolkit.signals.config import SignalConfig

TABLE_SUFFIXES = (".csv", ".parquet")


@dataclass(frozen=True)
class ScoresSettings:
    """``fi scores``' options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line naming
    the parameter; the command line names its flag).

    ``prefix``: trace the first ``prefix`` tokens (the signals of ``[0, prefix)``, scored before the window);
    ``fi_chunks``: also per-token FI of every prefix position on each future chunk ``START:END`` (strings or
    :class:`~fi_toolkit.probe.chunks.Chunk`; none: the signals only); ``estimator`` (with ``fi_chunks``):
    ``fisher`` (the gradient estimate, the default) or ``exact`` (leave-one-out, one forward per position);
    ``samples`` and ``seed`` (fisher only): label draws per chunk (default 16) and their seed (default 0);
    ``signals``: the signal options.

    After construction ``fi_chunks`` is a tuple of parsed chunks and ``estimator`` lower case; an option
    that does not go with the estimator stays None (fisher: ``samples`` 16 and ``seed`` 0 unless given), so
    building the object again from its fields gives the same object.
    """

    prefix: int = field(default=2048, metadata=option("--prefix", help="Trace the first PREFIX tokens."))
    fi_chunks: Sequence[Chunk | str] = field(
        default=(),
        metadata=option(
            "--fi-chunk",
            help="Also per-token FI of every prefix position on this future chunk START:END (repeatable): columns "
            "fi_<chunk> (and fi_se_<chunk> for fisher).",
            cli_type=List[str],
        ),
    )
    estimator: str | None = field(
        default=None,
        metadata=option(
            "--estimator",
            help="With --fi-chunk: 'fisher' (the gradient estimate, the default here) or 'exact' (leave-one-out, one "
            "forward per position).",
        ),
    )
    samples: int | None = field(
        default=None, metadata=option("--samples", help="With --estimator fisher: label draws per chunk (default 16).")
    )
    seed: int | None = field(
        default=None, metadata=option("--seed", help="With --estimator fisher: seed of the label draws (default 0).")
    )
    signals: SignalConfig = field(default_factory=SignalConfig)

    def __post_init__(self):
        check_type("signals", self.signals, SignalConfig)
        config = self.signals.check()
        check_prefix(check_int("prefix", self.prefix), config.window)
        chunks = parse_chunks(self.fi_chunks, "fi_chunks")
        for name, value in zip(("fi_chunks", "estimator", "samples", "seed"), self._fi_options(chunks)):
            object.__setattr__(self, name, value)

    def _fi_options(self, chunks: tuple[Chunk, ...]) -> tuple:
        """(chunks, estimator, samples, seed) resolved; an option that would be ignored is refused."""
        for name in ("samples", "seed"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name))
        check_type("estimator", self.estimator, str, optional=True)
        if not chunks:
            if self.estimator is not None or self.samples is not None or self.seed is not None:
                raise FIError(
                    "estimator, samples and seed go with fi_chunks START:END",
                    parameter=("estimator", "samples", "seed", "fi_chunks"),
                )
            return (), None, None, None
        check_chunks(chunks, self.prefix, float("inf"), None)  # starts vs p now; lengths once the document is read
        estimator = (self.estimator or "fisher").strip().lower()
        if estimator not in ESTIMATORS:
            raise FIError(f"unknown estimator '{estimator}' (choose {' or '.join(ESTIMATORS)})", parameter="estimator")
        if estimator == "exact":
            if self.samples is not None or self.seed is not None:
                raise FIError("samples and seed go with estimator fisher", parameter=("samples", "seed", "estimator"))
            return chunks, estimator, None, None
        if self.seed is not None:
            check_int("seed", self.seed, 0)
        samples = check_samples(DEFAULT_SAMPLES if self.samples is None else self.samples)
        return chunks, estimator, samples, self.seed or 0

    def document_tokens(self) -> int:
        """The tokens the document needs: the prefix, or the end of the last FI chunk."""
        return max([self.prefix] + [c.end for c in self.fi_chunks])


def scores_file(run: RunSettings | Path | str) -> RunSettings:
    """Where the per-token table goes -> a :class:`~fi_toolkit.runs.settings.RunSettings` (``out``: a ``.csv``
    or ``.parquet`` file; ``overwrite``: replace it). Refused in one line: another suffix, a path that cannot
    be written, an existing file without ``overwrite``, ``resume`` (one table, written at the end). Creates
    nothing."""
    from fi_toolkit.runs.results import check_out_path

    run = run if isinstance(run, RunSettings) else RunSettings(check_type("run", run, str, Path))
    run.check()
    if run.resume:
        raise FIError("a scores table does not resume: run it again, or pass overwrite to replace it", "resume")
    if run.out.suffix not in TABLE_SUFFIXES:
        raise FIError(f"out must end in .csv or .parquet, got '{run.out}'", parameter="out")
    check_out_path(run.out, want_dir=False, option="out")
    if run.out.exists() and not run.overwrite:
        raise FIError(f"out '{run.out}' exists; choose another file or pass overwrite", parameter=("out", "overwrite"))
    return run
