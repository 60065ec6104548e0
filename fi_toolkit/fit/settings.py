"""What ``fi fit-data`` and ``fi fit`` do: :class:`FitDataSettings` (the training rows' target and candidates),
which :func:`fi_toolkit.fit.run.run_fit_data` takes, and :class:`FitSettings` (the learner and what it
fits), which :func:`fi_toolkit.fit.run.run_fit` takes. Imports nothing heavy (no torch, no pandas): the
command line builds them, and so refuses bad options, before the model loads or a run is read.
:func:`check_fit_options` checks the options of a ridge fit (features, target, ridge penalty) the same way,
without numpy or torch (:mod:`fi_toolkit.fit.ridge` fits).

The settings hold what is computed, not the documents or the runs: those are the run functions' other
arguments, so one settings object makes rows of any documents, or fits any runs.

Each field that is an option carries its flag and help (:func:`fi_toolkit.runs.settings.option`), from which
:func:`fi_toolkit.cli.options.settings_options` generates the commands' options; a field is named as the
library's messages name it (``chunks``, flag ``--chunk``), so the command line names the flag in them. The
commands build these without a default object (``cls(**options)``): they check themselves on construction.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import ClassVar, List, Optional, Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.policies.learned.features import EXTRA, check_feature_names, check_features
from fi_toolkit.policies.learned.fitted import FEATURES
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator_options import DEFAULT_SAMPLES, check_samples
from fi_toolkit.probe.selections import compression_point
from fi_toolkit.runs.settings import check_int, check_type, option
from fi_toolkit.signals.config import SignalConfig

LEARNERS = ("ridge", "lambdarank")
DEFAULT_TARGET = "rank"
DEFAULT_RIDGE = 1e-3
GROUPS = ("head", "layer")  # the lambdarank learner's query groups: per (document, layer, KV head) or per layer
DEFAULT_GROUP = "head"
TARGETS = ("rank", "log")
DEFAULT_FEATURES = tuple(FEATURES)  # every feature, at a prefill and while decoding
DECODING_FEATURES = tuple(f for f in FEATURES if f != "entropy_next")  # without the other convention's H


def check_fit_options(features: Sequence[str], target: str, penalty: float) -> None:
    """Refuse an unknown, missing or repeated feature, an unknown target, or a penalty that is not a finite
    number >= 0 (FIError naming the parameter)."""
    check_feature_names(features, FEATURES)
    if target not in TARGETS:
        raise FIError(f"target must be one of {', '.join(TARGETS)}, got '{target}'", parameter="target")
    ok = isinstance(penalty, (int, float)) and not isinstance(penalty, bool) and math.isfinite(penalty)
    if not (ok and penalty >= 0):
        raise FIError(f"penalty must be a finite number >= 0, got {penalty}", parameter={"penalty": "ridge"})


@dataclass(frozen=True)
class FitDataSettings:
    """``fi fit-data``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line naming
    the parameter; the command line names its flag).

    ``chunks``: future chunks ``START:END`` (strings or :class:`~fi_toolkit.probe.chunks.Chunk`) whose mean
    Fisher FI is the target; ``prefix``: the compression point ``p`` (default the smallest chunk start);
    ``sinks``: the first positions left out of the rows (default 0: the fitted policy ranks them too);
    ``samples``: label draws of the Fisher estimator per chunk; ``seed``: of the label draws; ``signals``:
    the signal options (they define the features). After construction ``chunks`` is a tuple of parsed chunks
    and ``prefix`` an int.
    """

    chunks: Sequence[Chunk | str] = field(
        metadata=option(
            "--chunk",
            "-c",
            help="Future chunk START:END of the FI target (repeatable: the mean over chunks).",
            cli_type=List[str],
        )
    )
    prefix: int | None = field(
        default=None, metadata=option("--prefix", help="Compression point p (default: smallest chunk start).")
    )
    sinks: int = field(
        default=0,
        metadata=option(
            "--sinks", help="Leave the first N positions out of the rows (the policy ranks them too: default 0)."
        ),
    )
    samples: int = field(
        default=DEFAULT_SAMPLES, metadata=option("--samples", help="Label draws of the Fisher estimator per chunk.")
    )
    seed: int = field(default=0, metadata=option("--seed", help="Seed of the label draws."))
    signals: SignalConfig = field(default_factory=SignalConfig)  # the command's signal options, built beside

    def __post_init__(self):
        chunks, p, config = compression_point(self.chunks, self.prefix, self.signals)
        window = config.window
        if not 0 <= check_int("sinks", self.sinks) < p - window:  # rows hold [sinks, p - w): at least one
            raise FIError(f"sinks must lie in [0, {p - window}), got {self.sinks}", parameter="sinks")
        check_samples(check_int("samples", self.samples, 1))
        check_int("seed", self.seed, 0)
        object.__setattr__(self, "chunks", chunks)
        object.__setattr__(self, "prefix", p)

    def document_tokens(self) -> int:
        """The tokens each document needs: the end of the last chunk."""
        return max(c.end for c in self.chunks)


@dataclass(frozen=True)
class FitSettings:
    """``fi fit``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line naming the
    parameter; the command line names its flag).

    ``learner``: ``ridge`` (a linear score of standardised features, ``fitted:path=FILE``) or ``lambdarank``
    (LightGBM LambdaRank on within-head FI ranks, ``learned:path=FILE``); ``features``: a list or a
    comma-separated string of feature names, ``decoding`` (every feature a decoding compression can compute),
    or None (every feature); the lambdarank learner adds :data:`~fi_toolkit.policies.learned.features.EXTRA` to
    ``decoding`` and None; ``target`` (ridge only): ``rank`` (within-head rank of FI, the default) or ``log``
    (log FI); ``ridge`` (ridge only): the penalty lambda, times the number of rows, on the standardised
    coefficients (default 1e-3); ``exclude``: documents whose rows are left out, to test the policy on them;
    ``group`` (lambdarank only): the query group, ``head`` (one per document, layer and KV head: scores rank
    within a head, the default) or ``layer`` (one per document and layer: scores rank over all the layer's KV
    heads, for ``learned:heads=global``, which shares a layer's budget over its heads by them).

    After construction ``features`` and ``exclude`` are tuples of names and ``ridge`` a float; an option that
    does not go with the learner stays None (ridge: ``target`` becomes ``rank`` and ``ridge`` 1e-3 when not
    given; lambdarank: ``group`` becomes ``head``), so building the object again from its fields gives the same
    object.
    """

    OPTION_ORDER: ClassVar[tuple[str, ...]] = ("features", "target", "ridge", "exclude", "learner", "group")

    learner: str = field(
        default="ridge",
        metadata=option(
            "--learner",
            help="'ridge' (a linear score, fitted:path=FILE) or 'lambdarank' (LightGBM LambdaRank on within-head FI "
            "ranks, learned:path=FILE; its features add depth, kv_head, keydiff, vnorm, wo_vnorm and acc_wo_vnorm).",
        ),
    )
    features: Sequence[str] | str | None = field(
        default=None,
        metadata=option(
            "--features",
            help="Comma-separated features (default: all of them; 'decoding': all that a decoding compression can "
            "compute).",
            cli_type=Optional[str],
        ),
    )
    target: str | None = field(
        default=None,
        metadata=option(
            "--target",
            help=f"'rank' (within-head rank of FI) or 'log' (log FI); ridge only (default: {DEFAULT_TARGET}).",
        ),
    )
    ridge: float | None = field(
        default=None,
        metadata=option(
            "--ridge",
            help="Ridge penalty lambda (times the number of rows) on the standardised coefficients; ridge only "
            f"(default: {DEFAULT_RIDGE:g}).",
        ),
    )
    exclude: Sequence[str] = field(
        default=(),
        metadata=option(
            "--exclude",
            help="Leave this document's rows out (repeatable), to test the policy on it.",
            cli_type=List[str],
        ),
    )
    group: str | None = field(
        default=None,
        metadata=option(
            "--group",
            help="lambdarank only: the query group, 'head' (rank within each KV head; default) or 'layer' (rank over "
            "all KV heads of a layer, for learned:heads=global, which shares a layer's budget over its heads).",
        ),
    )

    def __post_init__(self):
        learner = check_type("learner", self.learner, str)
        if learner not in LEARNERS:
            raise FIError(f"learner must be ridge or lambdarank, got '{learner}'", parameter="learner")
        names = self._feature_names(learner)
        if learner == "ridge":
            check_feature_names(names, FEATURES)
            target, penalty = self._linear_options()
            if self.group is not None:
                raise FIError("group goes with learner 'lambdarank', not 'ridge'", parameter=("group", "learner"))
            group = None
        else:
            check_features(names)
            group = DEFAULT_GROUP if self.group is None else check_type("group", self.group, str)
            if group not in GROUPS:
                raise FIError(f"group must be head or layer, got '{group}'", parameter="group")
            given = [n for n in ("target", "ridge") if getattr(self, n) is not None]
            if given:
                raise FIError(
                    f"{' and '.join(given)} go{'es' if len(given) == 1 else ''} with learner 'ridge', not 'lambdarank'",
                    parameter=(*given, "learner"),
                )
            target, penalty = None, None
        if isinstance(self.exclude, str) or not isinstance(self.exclude, Sequence):
            raise FIError(f"exclude must be a list of document names, got {self.exclude!r}", parameter="exclude")
        exclude = tuple(check_type("exclude", d, str) for d in self.exclude)
        parsed = (("features", names), ("target", target), ("ridge", penalty), ("exclude", exclude), ("group", group))
        for name, value in parsed:
            object.__setattr__(self, name, value)

    def _feature_names(self, learner: str) -> tuple[str, ...]:
        """The features as a tuple of names: None and ``decoding`` name sets, a string is comma-separated."""
        features = self.features
        extra = tuple(EXTRA) if learner == "lambdarank" else ()
        if features is None or (isinstance(features, str) and features.strip() == "decoding"):
            return (DECODING_FEATURES if features else DEFAULT_FEATURES) + extra
        if isinstance(features, str):
            return tuple(f.strip() for f in features.split(","))
        if not isinstance(features, Sequence):
            raise FIError(f"features must be a list of names or a string, got {features!r}", parameter="features")
        return tuple(check_type("features", f, str) for f in features)

    def _linear_options(self) -> tuple[str, float]:
        """(target, ridge penalty) of the linear fit, defaults filled in; the penalty a float, as the CLI's."""
        target = DEFAULT_TARGET if self.target is None else check_type("target", self.target, str)
        if target not in TARGETS:
            raise FIError(f"target must be one of {', '.join(TARGETS)}, got '{target}'", parameter="target")
        penalty = DEFAULT_RIDGE if self.ridge is None else self.ridge
        real = isinstance(penalty, numbers.Real) and not isinstance(penalty, bool)
        if not (real and math.isfinite(penalty) and penalty >= 0):
            raise FIError(f"ridge must be a finite number >= 0, got {penalty}", parameter="ridge")
        return target, float(penalty)
