"""How ``fi generate`` generates: :class:`GenerateSettings`, the object the command line builds and
:func:`fi_toolkit.compress.generate_run.run_generate` takes. Imports nothing heavy (no torch): the command
line builds it, and so refuses bad options, before the model loads (a kvpress policy imports kvpress to
check its press).

The settings hold how to generate (the policy at its budget, the compression interval, the sampling, the chat
template, the signal options), not the prompt: the model and the prompt are the run function's other
arguments, so one settings object generates from any prompt. Each field carries its command-line flag and
help (:func:`fi_toolkit.runs.settings.option`), from which ``fi generate``'s options are generated; where the
prompt comes from (:class:`PromptFile`) and how the text prints (:class:`TextOutput`) are the command's own
small groups.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from fi_toolkit.budget import Budget
from fi_toolkit.policies.registry import policy_help
from fi_toolkit.runs.settings import check_int, check_number, check_type, option
from fi_toolkit.signals.config import SignalConfig

FULL_CACHE = ("none", "full")  # policy spellings of the uncompressed cache


@dataclass(frozen=True)
class GenerateSettings:
    """``fi generate``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line; the
    command line names its flags; a policy's messages name it ``--policy NAME``, as the policy registry
    spells it).

    ``policy``: ``NAME[:key=value,...]`` as the registry spells it (:func:`fi_toolkit.policies.registry.resolve`;
    not an oracle that sees the future), or ``none``/``full``/None for the full cache; ``budget``: entries kept
    per layer and head, window included (``keep=X`` or ``remove=X``, a bare X is keep=X; a share of the tokens
    it may compress at each compression or a count); ``interval``: compress back to the budget every
    ``interval`` generated tokens; ``max_new``: at most this many new tokens; ``compress_prompt``: whether the
    prompt is compressible (None: the policy's own; RPC keeps it); ``temperature`` (0: greedy), ``top_p`` and
    ``seed``: the sampling; ``chat``: wrap the prompt in the model's chat template when it has one;
    ``signals``: the signal options (``window``, ``alpha``, ``tau`` and ``top_k`` are the policy's defaults;
    its own options override them).

    After construction ``budget`` is a :class:`~fi_toolkit.budget.Budget`, :meth:`make_policy` the resolved
    policy and :attr:`label` its label.
    """

    policy: str | None = field(
        default="infokv",
        metadata=option(
            "--policy",
            "-p",
            help=policy_help(oracles=False)
            + "; or none (full cache). infokv:alpha=0.5,top_k=64 overrides --alpha, --top-k, ... and a budget "
            "spelled with the name, infokv@keep=0.1, overrides --budget. Not fi-oracle: an oracle that sees the "
            "future text (fi eval on documents).",
            cli_type=str,
        ),
    )
    budget: Budget | str = field(
        default="keep=0.25",
        metadata=option(
            "--budget",
            "-b",
            help="Entries kept per layer and head, window included: keep=X or remove=X (a bare X is keep=X), X a "
            "share of the tokens it may compress at each compression (0.25) or a count (512).",
            cli_type=str,
        ),
    )
    interval: int = field(
        default=1024, metadata=option(help="Compress back to the budget every INTERVAL generated tokens.")
    )
    max_new: int = field(default=256, metadata=option("--max-new", help="Maximum number of new tokens."))
    compress_prompt: bool | None = field(
        default=None,
        metadata=option(
            "--compress-prompt/--keep-prompt",
            help="Whether the prompt is compressible (default: the policy's; RPC keeps it).",
        ),
    )
    temperature: float = field(default=0.0, metadata=option(help="0 = greedy; otherwise sampling temperature."))
    top_p: float = field(default=1.0, metadata=option("--top-p", help="Nucleus sampling threshold."))
    seed: int = field(default=0, metadata=option(help="Sampling seed."))
    chat: bool = field(
        default=True,
        metadata=option("--chat/--raw", help="Wrap the prompt in the model's chat template (when it has one)."),
    )
    signals: SignalConfig = field(default_factory=SignalConfig)
    _resolved: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_number("temperature", self.temperature)
        check_number("top_p", self.top_p)
        check_type("signals", self.signals, SignalConfig)
        s = self.signals.check()
        check_int("interval", self.interval, 1)
        check_int("max_new", self.max_new, 1)
        check_type("compress_prompt", self.compress_prompt, bool, optional=True)
        check_int("seed", self.seed)
        check_type("chat", self.chat, bool)
        check_type("policy", self.policy, str, optional=True)
        resolved = None
        if not self.full_cache:
            from fi_toolkit.policies.registry import resolve

            where = f"--policy {self.policy}"
            resolved = resolve(self.policy, self.budget, s.window, where=where, alpha=s.alpha, tau=s.tau, top_k=s.top_k)
        budget = Budget.parse(self.budget) if resolved is None else resolved.budget  # a budget spelled @B wins
        object.__setattr__(self, "budget", budget)
        object.__setattr__(self, "_resolved", resolved)

    @property
    def full_cache(self) -> bool:
        """Whether no policy compresses the cache (``policy`` none, full or None)."""
        return self.policy is None or self.policy.strip().lower() in FULL_CACHE

    @property
    def label(self) -> str:
        """The policy's label (``snapkv@keep=0.25``), or ``full cache``."""
        return "full cache" if self._resolved is None else self._resolved.label

    def make_policy(self):
        """The policy, fresh (a copy: a generation may leave state in its policy, the settings stay as built),
        or None for the full cache."""
        return copy.deepcopy(self._resolved)


@dataclass(frozen=True)
class PromptFile:
    """Where ``fi generate`` reads its prompt when it is not the command's argument: ``file``, a text file
    (None: the argument). Apart from :class:`GenerateSettings`, which holds how to generate from any prompt."""

    file: Path | None = field(default=None, metadata=option("--file", "-f", help="Read the prompt from a text file."))


@dataclass(frozen=True)
class TextOutput:
    """How ``fi generate`` prints the text: ``stream``, as it is generated (else all at the end). A group of its
    own, after the model's options, where the command has always listed it."""

    stream: bool = field(default=True, metadata=option("--stream/--no-stream", help="Stream text as it is generated."))
