"""What ``fi field`` places and where: :class:`FieldSettings`, the object the command line builds and
:func:`fi_toolkit.field.run.run_field` takes. Imports nothing heavy (no torch, no pandas): the command
line builds it, and so refuses bad options, before the model loads (with ``replay``, checking each policy's
budget on the replay imports the decoder).

The settings hold what is measured (methods, budgets, the compression point, the chunks, the anchors' seeds,
the replay, the bootstrap, the signal options, the batch size), not the documents: the model and the
documents are the run function's other arguments. The methods' and budgets' messages name them as
``--policy NAME`` and ``--budget B`` (:mod:`fi_toolkit.field.spec` spells them so).

Each field carries its command-line flag and help (:func:`fi_toolkit.runs.settings.option`), from which
``fi field``'s options are generated; its ``--task`` options are :class:`FieldTasks`' fields (the command line's
spelling of a :class:`~fi_toolkit.evaluation.settings.TaskSettings`), which ``FieldSettings`` accepts as its
``tasks``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.settings import TaskSettings, budget_from, int_list, split_list
from fi_toolkit.field.spec import (
    Method,
    anchors,
    check_methods,
    default_methods,
    parse_budgets,
    parse_methods,
    replay_policy,
)
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.selections import check_prefix, check_sinks
from fi_toolkit.runs.settings import check_int, check_resamples, check_type, option
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.nearfar_spec import nearfar_chunks, parse_distances

MAX_SEEDS = 1000  # random anchor sets per budget: more is a typo


@dataclass(frozen=True)
class FieldTasks:
    """``fi field``'s ``--task`` options as the command line spells them: ``tasks``, comma-separated (None: no
    tasks), at the comma-separated prompt lengths ``contexts``, ``samples`` per task and length, answers of at
    most ``max_new`` tokens. :meth:`task_settings` -> the :class:`~fi_toolkit.evaluation.settings.TaskSettings`
    (question-agnostic, as fi eval's default: the compression never sees the question). A group of its own:
    its flags (``--task-context``, ``--task-samples``) and defaults are not fi eval's."""

    tasks: str | None = field(
        default=None,
        metadata=option(
            "--task",
            help="Also the accuracy of every method on these generated tasks, comma-separated (passkey, "
            "multikey_needle, variable_tracking), answered as fi eval --task answers them, compressing every "
            "--interval tokens.",
        ),
    )
    contexts: str = field(
        default="1024", metadata=option("--task-context", help="--task: prompt lengths in tokens, comma-separated.")
    )
    samples: int = field(
        default=4,
        metadata=option("--task-samples", help="--task: samples per task and prompt length (seeds 0..N-1)."),
    )
    max_new: int = field(default=12, metadata=option(help="--task: greedy tokens each answer may take."))

    def task_settings(self) -> TaskSettings | None:
        """The tasks to answer, or None where ``tasks`` names none (lists split, contexts whole numbers)."""
        if self.tasks is None:
            return None
        names, lengths = tuple(split_list(self.tasks, "tasks")), tuple(int_list(self.contexts, "contexts"))
        return TaskSettings(names, lengths, self.samples, max_new=self.max_new)


@dataclass(frozen=True)
class FieldSettings:
    """``fi field``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line; the
    command line names its flags).

    ``methods``: policies and presses as ``--policy`` spells them (strings or
    :class:`~fi_toolkit.policies.method.Method`; one spelled with a budget is measured at that one alone); None: every
    project policy of the registry and every press the providers offer that takes a budget (``presses``). ``budgets``:
    shares of the prefix (``keep=0.25``). ``prefix``: the compression point ``p`` (and the replay's prompt).
    ``distances``: chunk starts from ``p`` (``"0,256"`` or ints), each chunk ``chunk_len`` tokens. ``sinks``: the random
    anchor never picks the first positions. ``seeds``: random anchor sets per budget. ``oracle``: the FI oracle anchor's
    options (``samples=4``; empty: fi-oracle's own). ``replay``: also the replay KL in
    decoding, compressing every ``interval`` tokens up to ``length`` tokens (default: the far chunk's end).
    ``resamples``: bootstrap resamples per headroom CI (0: none). ``signals``: the signal options; ``batch_size``:
    evictions per batched forward (None: 1 on CPU, 8 on CUDA). ``presses``: also every press the providers offer that
    takes a budget (None: when no methods are named). ``tasks``: also every method's accuracy on these generated tasks,
    answered as ``fi eval --task`` answers them, compressing every ``interval`` tokens (:mod:`fi_toolkit.field.tasks`; a
    :class:`FieldTasks`, the command line's spelling, is read first; None: no tasks). After construction ``methods``,
    ``budgets`` and ``distances`` are tuples of parsed values, ``presses`` a bool and ``tasks`` checked.
    """

    methods: Sequence[Method | str] | None = field(
        default=None,
        metadata=option(
            "--policy",
            "-p",
            help="A method to place, as fi eval --policy and fi probe --select spell it (repeatable): a project "
            "policy (snapkv, infokv:alpha=0.5, adaptive(infokv), fitted:path=FILE) or a press (kvpress:SnapKVPress, "
            "kvpress:AdaKVPress/SnapKVPress), measured at every --budget; with a budget of its own "
            "(snapkv@keep=0.25, one of the --budget values) at that one alone. Default: every project policy of the "
            "registry and, where kvpress is installed, every press it exports that takes a compression ratio (those "
            "that cannot run here are listed in refused.csv). The anchors, random positions with sinks kept and the "
            "FI oracle, are always measured.",
            cli_type=List[str],
        ),
    )
    budgets: Sequence[Budget | str] = field(
        default=("keep=0.25",),
        metadata=option(
            "--budget",
            "-b",
            help="A budget, a share of the prefix: keep=X or remove=X (a bare X is keep=X), 0 < X < 1 (repeatable).",
            cli_type=List[str],
        ),
    )
    prefix: int = field(default=1024, metadata=option(help="Compression point p (and the replay's prompt)."))
    distances: Sequence[int] | str = field(
        default="0,256",
        metadata=option(help="Chunk starts as distances from p, comma-separated (near, far).", cli_type=str),
    )
    chunk_len: int = field(default=128, metadata=option(help="Tokens per chunk."))
    sinks: int = field(default=4, metadata=option(help="The random anchor never picks the first N positions."))
    seeds: int = field(
        default=3, metadata=option(help="Random anchor sets per budget (seeds 0..N-1), averaged per document.")
    )
    oracle: str = field(
        default="",
        metadata=option(
            help="Options of the FI oracle anchor, as fi-oracle takes them (samples=4: 4 label draws instead of 16, "
            "faster and noisier; its noise shows in headroom_seed_sd). Default: fi-oracle's own."
        ),
    )
    replay: bool = field(
        default=False,
        metadata=option(
            "--replay/--no-replay", help="Also the replay KL in decoding, as fi eval measures it (costly)."
        ),
    )
    interval: int = field(
        default=256, metadata=option(help="--replay: compress back to the budget every INTERVAL tokens.")
    )
    length: int | None = field(
        default=None,
        metadata=option(help="--replay: tokens in all, the prompt p included (default: the far chunk's end)."),
    )
    resamples: int = field(default=2000, metadata=option(help="Bootstrap resamples of each headroom CI (0: none)."))
    signals: SignalConfig = field(default_factory=SignalConfig)
    batch_size: int | None = field(
        default=None, metadata=option(help="Evictions per batched forward (default: 1 on CPU, 8 on CUDA).")
    )
    presses: bool | None = None
    tasks: TaskSettings | FieldTasks | None = None

    def __post_init__(self):
        if isinstance(self.tasks, FieldTasks):  # the command line's --task options, read before the rest
            object.__setattr__(self, "tasks", self.tasks.task_settings())
        check_type("signals", self.signals, SignalConfig)
        config = self.signals.check()
        budgets = tuple(self._budgets())
        methods = tuple(self._methods(budgets))
        distances = parse_distances(self.distances) if isinstance(self.distances, str) else list(self.distances)
        for d in distances:
            check_int("distances", d)
        check_int("prefix", self.prefix)
        check_int("chunk_len", self.chunk_len)
        chunks = nearfar_chunks(self.prefix, distances, self.chunk_len)
        check_prefix(self.prefix, config.window)
        check_sinks(check_int("sinks", self.sinks), self.prefix, config.window)
        seeds = check_int("seeds", self.seeds)
        if not 1 <= seeds <= MAX_SEEDS:
            raise FIError(f"seeds must lie in [1, {MAX_SEEDS}], got {seeds}", parameter="seeds")
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, 1)
        check_resamples(self.resamples)
        with budget_from("budgets"):
            anchored = anchors(check_type("oracle", self.oracle, str))
            check_methods(methods, budgets, self.prefix, config.window, self.sinks, anchored)
        check_type("replay", self.replay, bool)
        if self.replay:
            check_int("interval", self.interval, 1)
            total = check_int("length", self.length) if self.length is not None else chunks[-1].end
            if total <= self.prefix:
                raise FIError(f"length {total} leaves nothing after the {self.prefix}-token prompt", parameter="length")
            with budget_from("budgets"):
                _check_replay_budgets(methods, budgets, config, self.prefix, total)
        elif self.length is not None:
            raise FIError("length sets the replay: it goes with replay", parameter=("length", "replay"))
        presses = self.methods is None if self.presses is None else check_type("presses", self.presses, bool)
        tasks = check_type("tasks", self.tasks, TaskSettings, optional=True)
        if tasks is not None:
            tasks = tasks.check()
            check_int("interval", self.interval, 1)
        parsed = (("methods", methods), ("budgets", budgets), ("distances", tuple(distances)), ("presses", presses))
        parsed += (("tasks", tasks),)
        for name, value in parsed:
            object.__setattr__(self, name, value)

    def _budgets(self) -> list[Budget]:
        if isinstance(self.budgets, (str, Budget)) or not isinstance(self.budgets, Sequence):
            raise FIError(f"budgets must be a list of budgets, got {self.budgets!r}", parameter="budgets")
        return parse_budgets([b if isinstance(b, str) else b.label for b in self.budgets])

    def _methods(self, budgets: Sequence[Budget]) -> list[Method]:
        if self.methods is None:
            return default_methods()
        if isinstance(self.methods, (str, Method)) or not isinstance(self.methods, Sequence):
            raise FIError(f"methods must be a list of names, got {self.methods!r}", parameter="methods")
        if not self.methods:
            raise FIError("methods lists nothing (None: every policy and press)", parameter="methods")
        given = [m if isinstance(m, Method) else check_type("methods", m, str) for m in self.methods]
        return parse_methods(given, budgets)

    @property
    def chunks(self) -> list[Chunk]:
        """The chunks: ``chunk_len`` tokens at each distance from ``p``, nearest first."""
        return nearfar_chunks(self.prefix, self.distances, self.chunk_len)

    def replay_length(self) -> int | None:
        """The replay's tokens in all, the prompt included (None: no replay)."""
        if not self.replay:
            return None
        return self.length if self.length is not None else self.chunks[-1].end

    def document_tokens(self) -> int:
        """The tokens each document needs: the far chunk's end, or the replay's length if longer."""
        return max(self.chunks[-1].end, self.replay_length() or 0)


def _check_replay_budgets(methods, budgets, config, prompt: int, total: int) -> None:
    """Every method's replay policy resolves and its budget can work on the replay (before the model loads)."""
    from fi_toolkit.compress.budget_check import check_budget

    for m in methods:
        for b in (b for b in budgets if m.runs_at(b)):
            p = replay_policy(m, b, config)
            try:
                check_budget(p, prompt, total - prompt, p.compress_prompt)
            except FIError as exc:
                raise FIError(f"method {m.name} at budget {b.label}: {exc}") from None
