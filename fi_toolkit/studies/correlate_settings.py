"""What ``fi correlate`` measures: :class:`CorrelateSettings`, the object the command line builds and
:func:`fi_toolkit.studies.study.run_correlate` takes. Imports nothing heavy (no torch, no pandas): the command
line builds it, and so refuses bad options, before the model loads.

The settings hold what is measured (chunks, the compression point, the candidates or the estimator, sinks, the
seed, the bootstrap, the signal options, the batch size, the work units), not the documents: the model and the
documents are the run function's other arguments, so one settings object studies any set of documents. Each
field that is an option carries its flag and help (:func:`fi_toolkit.runs.settings.option`), from which
:func:`fi_toolkit.cli.options.settings_options` generates ``fi correlate``'s options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator_options import DEFAULT_SAMPLES
from fi_toolkit.probe.selections import check_sinks, compression_point
from fi_toolkit.runs.settings import check_int, check_resamples, check_type, option
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.study_options import check_estimator, check_unit_candidates, parse_candidates

DEFAULT_CANDIDATES = "sample:256"


@dataclass(frozen=True)
class CorrelateSettings:
    """``fi correlate``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line naming
    the parameter; the command line names its flag).

    ``chunks``: future chunks ``START:END`` (strings or :class:`~fi_toolkit.probe.chunks.Chunk`); ``prefix``:
    the compression point ``p`` (default the smallest chunk start); ``candidates`` (exact only): ``all``,
    ``sample:N`` (uniform) or ``stratified:N`` (by entropy, reweighted), default ``sample:256``;
    ``estimator``: ``exact`` (leave-one-out FI of the candidates) or ``fisher`` (the gradient estimate at every
    position of ``[sinks, p - w)``); ``samples`` (fisher only): label draws per chunk, default 16;
    ``validate`` (fisher only): exact FI also at N entropy-stratified positions, default 0; ``sinks``: the
    first positions are never candidates; ``seed``: of the candidate sample and the bootstrap; ``resamples``:
    bootstrap resamples per coefficient (0: no intervals); ``signals``: the signal options; ``batch_size``:
    evictions per batched forward of exact FI (None: 1 on CPU, 8 on CUDA; with fisher it needs ``validate``);
    ``unit_candidates`` (exact only): work units of N candidates (0: one unit per document), the same tables.

    After construction ``chunks`` is a tuple of parsed chunks, ``prefix`` an int and ``estimator`` lower case;
    an option that does not go with the estimator stays None (exact: ``candidates`` becomes
    ``sample:256`` when not given; fisher: ``samples`` 16 and ``validate`` 0), so building the object again
    from its fields gives the same object.
    """

    chunks: Sequence[Chunk | str] = field(
        metadata=option("--chunk", "-c", help="Future chunk START:END (repeatable).", cli_type=List[str])
    )
    prefix: int | None = field(
        default=None, metadata=option("--prefix", help="Compression point p (default: smallest chunk start).")
    )
    candidates: str | None = field(
        default=None,
        metadata=option(
            "--candidates",
            help="'all', 'sample:N' (N uniform positions; all of them when N is at least their number) or "
            "'stratified:N' (by entropy, reweighted); default sample:256. --estimator exact only.",
        ),
    )
    estimator: str = field(
        default="exact",
        metadata=option(
            "--estimator",
            help="'exact' (leave-one-out FI of the candidates, the default) or 'fisher' (the gradient estimate at "
            "every position of [sinks, p - w) in one pass; docs/method.md, 'Gradient estimator').",
        ),
    )
    samples: int | None = field(
        default=None,
        metadata=option(
            "--samples",
            help="--estimator fisher: label draws per chunk (default 16); more draws, smaller standard error.",
        ),
    )
    validate: int | None = field(
        default=None,
        metadata=option(
            "--validate",
            help="--estimator fisher: also measure exact FI at N entropy-stratified positions and report the "
            "agreement (Spearman, Pearson, top-10 percent overlap, bootstrap CIs).",
        ),
    )
    sinks: int = field(default=4, metadata=option("--sinks", help="First N positions are never candidates."))
    seed: int = field(default=0, metadata=option("--seed", help="Seed of the candidate sample and the bootstrap."))
    resamples: int = field(
        default=1000, metadata=option("--resamples", help="Bootstrap resamples per coefficient (0: no intervals).")
    )
    signals: SignalConfig = field(default_factory=SignalConfig)
    batch_size: int | None = field(
        default=None,
        metadata=option("--batch-size", help="Evictions per batched forward (default: 1 on CPU, 8 on CUDA)."),
    )
    unit_candidates: int = field(
        default=0,
        metadata=option(
            "--unit-candidates",
            help="Split each document into work units of N candidates (exact FI; 0: one unit per document), so "
            "torchrun's ranks share documents; same tables.",
        ),
    )

    def __post_init__(self):
        chunks, p, config = compression_point(self.chunks, self.prefix, self.signals)
        scored = check_sinks(check_int("sinks", self.sinks), p, config.window)
        estimator, candidates, samples, validate = self._estimator_options(scored - self.sinks)
        check_unit_candidates(check_int("unit_candidates", self.unit_candidates), estimator)
        check_resamples(self.resamples)
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, 1)
        check_int("seed", self.seed, 0)
        parsed = (("chunks", chunks), ("prefix", p), ("estimator", estimator), ("candidates", candidates))
        for name, value in parsed + (("samples", samples), ("validate", validate)):
            object.__setattr__(self, name, value)

    def _estimator_options(self, n_candidates: int) -> tuple[str, str | None, int | None, int | None]:
        """(estimator, candidates, samples, validate) resolved; an option the estimator would ignore refused."""
        estimator = check_type("estimator", self.estimator, str).strip().lower()
        check_type("candidates", self.candidates, str, optional=True)
        for name in ("samples", "validate"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name))
        candidates, samples, validate = self.candidates, self.samples, self.validate
        if estimator == "fisher":
            if candidates is not None:
                raise FIError(
                    "candidates goes with estimator exact: estimator fisher covers every position of "
                    "[sinks, p - w) (use validate N for exact FI at N of them)",
                    parameter=("candidates", "estimator", "validate"),
                )
            if self.batch_size is not None and not validate:
                raise FIError(
                    "batch_size sets the batches of exact FI: with estimator fisher it needs validate N",
                    parameter=("batch_size", "estimator", "validate"),
                )
            samples = DEFAULT_SAMPLES if samples is None else samples
            validate = 0 if validate is None else validate
            check_estimator(estimator, samples, validate, n_candidates)
        else:
            if samples is not None or validate is not None:
                raise FIError(
                    "samples and validate go with estimator fisher", parameter=("samples", "validate", "estimator")
                )
            check_estimator(estimator, DEFAULT_SAMPLES, 0, n_candidates)
            candidates = DEFAULT_CANDIDATES if candidates is None else candidates
            parse_candidates(candidates)
        return estimator, candidates, samples, validate

    def document_tokens(self) -> int:
        """The tokens each document needs: the end of the last chunk."""
        return max(c.end for c in self.chunks)
