"""What ``fi view`` shows: :class:`ViewSettings`, the object the command line builds and
:func:`fi_toolkit.report.view_run.run_view` takes. Imports nothing heavy (no torch, no pandas): the command line
builds it, and so refuses bad options, before the model loads.

The settings hold the page's policies, budget, compression point, chunk and Fisher estimate, not the document:
the model and the document are the run function's other arguments.

Each field that is an option carries its flag and help (:func:`fi_toolkit.runs.settings.option`), from which
:func:`fi_toolkit.cli.options.settings_options` generates ``fi view``'s options; a field is named as the messages
name it (``policies``, flag ``--policy``). ``--policy``'s help lists the registry's policies
(:func:`~fi_toolkit.policies.registry.policy_help`: the registry imports nothing heavy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.policies.registry import policy_help
from fi_toolkit.probe.chunks import Chunk, check_chunks, parse_chunk
from fi_toolkit.probe.estimator_options import check_samples
from fi_toolkit.probe.selections import check_prefix
from fi_toolkit.runs.settings import check_int, check_type, option
from fi_toolkit.signals.config import SignalConfig

DEFAULT_POLICIES = "infokv,snapkv"
DEFAULT_CHUNK_LEN = 256  # the chunk when none is given: [p, p + 256)
BOTH = ("policies", "budget")


@dataclass(frozen=True)
class ViewSettings:
    """``fi view``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line naming the
    parameter; the command line names its flag).

    ``policies``: comma-separated policy names (or a sequence of them), each at ``budget``, which must evict
    something from the prefix and fit its compressible tokens; the FI oracle is refused (it sees the chunk the
    page's shading is measured on). ``prefix``: the compression point ``p`` (the page shows ``[0, p)``);
    ``chunk``: the future chunk the Fisher FI is estimated on (default ``p:p+256``); ``samples`` and ``seed``:
    the estimate's label draws; ``signals``: the signal options. After construction ``policies`` is a tuple of
    resolved policies, ``budget`` a :class:`~fi_toolkit.budget.Budget` and ``chunk`` a
    :class:`~fi_toolkit.probe.chunks.Chunk`.
    """

    policies: str | Sequence[str] = field(
        default=DEFAULT_POLICIES,
        metadata=option(
            "--policy",
            "-p",
            help="Comma-separated policies, each "
            + policy_help(oracles=False)
            + ". The page marks, per token, the share of layers x KV heads that evicted it.",
            cli_type=str,
        ),
    )
    budget: str | Budget = field(
        default="keep=0.25",
        metadata=option(
            "--budget",
            "-b",
            help="One budget for every policy: keep=X or remove=X (a bare X is keep=X), a share of the prefix (0.25) "
            "or a count (512).",
            cli_type=str,
        ),
    )
    prefix: int = field(
        default=1024, metadata=option("--prefix", help="Compression point p: the page shows the prefix tokens [0, p).")
    )
    chunk: str | Chunk | None = field(
        default=None,
        metadata=option(
            "--chunk",
            "-c",
            help="Future chunk START:END that the estimated FI is measured on (default p:p+256).",
            cli_type=Optional[str],
        ),
    )
    samples: int = field(
        default=16,
        metadata=option("--samples", help="Label draws of the Fisher estimate (fi scores --estimator fisher)."),
    )
    seed: int = field(default=0, metadata=option("--seed", help="Seed of the label draws."))
    signals: SignalConfig = field(default_factory=SignalConfig)  # the command's signal options, built beside

    def __post_init__(self):
        check_type("signals", self.signals, SignalConfig)
        config = self.signals.check()
        check_int("prefix", self.prefix)
        check_prefix(self.prefix, config.window)
        chunk = self.chunk
        if chunk is None:
            chunk = f"{self.prefix}:{self.prefix + DEFAULT_CHUNK_LEN}"
        chunk = chunk if isinstance(chunk, Chunk) else parse_chunk(check_type("chunk", chunk, str))
        check_chunks([chunk], self.prefix, float("inf"), None)
        check_int("samples", self.samples)
        check_samples(self.samples)
        check_int("seed", self.seed, 0)
        try:
            budget = Budget.parse(self.budget)
        except FIError as exc:  # Budget.parse says "invalid budget: ..."; say it so that the CLI names its flag
            reason = str(exc).removeprefix("invalid budget: ")
            raise FIError(f"budget is invalid: {reason}", parameter="budget") from None
        policies = _policies(self.policies, budget, config, self.prefix)
        for name, value in (("chunk", chunk), ("budget", budget), ("policies", policies)):
            object.__setattr__(self, name, value)


def _policies(names: str | Sequence[str], budget: Budget, config: SignalConfig, prefix: int) -> tuple:
    """Each name resolved at ``budget`` on the trace's window; each must evict from the prefix and fit it."""
    from fi_toolkit.policies.registry import is_oracle, resolve, split_policies

    if not isinstance(names, str):
        names = ",".join(check_type("policies", n, str) for n in names)
    names = split_policies(check_type("policies", names, str), "policies")
    for name in names:
        if is_oracle(name):
            raise FIError(
                f"policies {name}: fi view marks what compression-time methods evict; the FI oracle sees the "
                f"future chunk that the page's FI shading is measured on (probe it with the selection "
                f"policy:{name.partition(':')[0]}@BUDGET)",
                parameter="policies",
            )
    shared = dict(shared=("window", "top_k"), alpha=config.alpha, tau=config.tau, top_k=config.top_k)
    policies = tuple(resolve(name, budget, config.window, **shared) for name in names)
    for policy in policies:
        try:
            kept = policy.tokens(prefix)
        except FIError as exc:
            raise FIError(f"policies {policy.name} with budget {budget.label}: {exc}", parameter=BOTH) from None
        if kept >= prefix:
            raise FIError(
                f"policies {policy.name} with budget {budget.label} keeps all {prefix:,} prefix tokens: "
                "nothing is evicted",
                parameter=BOTH,
            )
    return policies
