"""What ``fi eval`` measures: :class:`TextEvalSettings` (replays of documents) and :class:`TaskEvalSettings`
(generated long-context tasks), the objects the command line builds and :func:`fi_toolkit.evaluation.run_eval`
takes; :class:`TaskSettings`, the tasks a task run generates and how it answers.

One class per kind of run, not one with fields that only one kind reads: a text run's prompt, length, future,
free generation and work units mean nothing to a task run, whose samples, contexts and protocols mean
nothing to a text run. Both hold the policies x budgets, the compression interval, the bootstrap and the
signal options, and are checked on construction (one :class:`~fi_toolkit.errors.FIError` line; the command
line names its flags). The policies' and budgets' messages name them as ``--policy NAME`` and ``--budget``,
as the policy registry spells them.

``fi eval``'s options are the fields of :class:`EvalOptions`, the command line's spelling of both kinds of run
(comma-separated lists; ``tasks`` None: a text run), which :meth:`EvalOptions.settings` turns into one or the
other: the settings themselves are built only once the kind of run is known, so a task run is never checked
as a text run.

Imports nothing heavy at module level (no torch, no pandas): the command line builds the settings, and so
refuses bad options, before the model loads (checking each budget against the replay imports the decoder).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Sequence

from fi_toolkit.budget import Budget
from fi_toolkit.compress.future import DOCUMENT, Future, parse_future
from fi_toolkit.errors import FIError
from fi_toolkit.policies.registry import policy_help
from fi_toolkit.runs.settings import check_int, check_resamples, check_type, first_repeat, option
from fi_toolkit.runs.units import check_unit_size
from fi_toolkit.signals.config import SignalConfig

MAX_SAMPLES = 1000  # per task and context: more is a typo, not a study (every sample is built up front)
DEFAULT_TASKS = ("passkey", "multikey_needle", "variable_tracking")
DEFAULT_CONTEXTS = (
    1024,
)  # where SmolLM2-135M solves passkey and multi-key needle best (analyses/results/eval/task_lengths.csv)


@dataclass(frozen=True)
class TaskSettings:
    """``tasks`` (names or aliases: niah, vartrack) at every prompt length of ``contexts`` (tokens),
    ``samples`` per task and context (seeds ``0..samples-1``), answered under each of ``protocols``
    (question-agnostic, question-aware) with at most ``max_new`` greedy tokens. Lists become tuples."""

    tasks: tuple[str, ...] = DEFAULT_TASKS
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    samples: int = 10
    protocols: tuple[str, ...] = ("question-agnostic",)
    max_new: int = 12

    def __post_init__(self):
        for name in ("tasks", "contexts", "protocols"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def check(self) -> TaskSettings:
        """Refuse unknown tasks and protocols, contexts below 1 token, ``samples`` outside ``[1, MAX_SAMPLES]``
        and ``max_new < 1`` (one line each) -> the settings with task aliases resolved."""
        from fi_toolkit.evaluation.task_runs import check_protocols, task_name

        for name in ("tasks", "contexts", "protocols"):
            check_type(name, getattr(self, name), tuple)
            if not getattr(self, name):
                raise FIError(f"{name} lists nothing", parameter=name)
        tasks = tuple(task_name(check_type("tasks", t, str)) for t in self.tasks)
        for i, task in enumerate(tasks):  # aliases compared after resolving: niah is multikey_needle
            if task in tasks[:i] and self.tasks[i] != self.tasks[tasks.index(task)]:
                raise FIError(
                    f"tasks names one task twice: '{self.tasks[tasks.index(task)]}' and '{self.tasks[i]}' "
                    f"are both {task}",
                    parameter="tasks",
                )
        for c in self.contexts:
            check_int("contexts", c, 1)
        protocols = tuple(check_protocols([check_type("protocols", p, str) for p in self.protocols]))
        for name, items in (("tasks", tasks), ("contexts", self.contexts), ("protocols", protocols)):
            if len(set(items)) != len(items):
                raise FIError(f"{name} lists an item twice: {', '.join(map(str, items))}", parameter=name)
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or not 1 <= self.samples <= MAX_SAMPLES:
            raise FIError(f"samples must lie in [1, {MAX_SAMPLES:,}], got {self.samples}", parameter="samples")
        check_int("max_new", self.max_new, 1)
        return replace(self, tasks=tasks, protocols=protocols)

    def units(self, tokenizer, model_config=None) -> list:
        """Every (task, context, seed) sample: :func:`fi_toolkit.evaluation.task_runs.make_units`."""
        from fi_toolkit.evaluation.task_runs import make_units

        return make_units(list(self.tasks), list(self.contexts), self.samples, tokenizer, model_config)


DEFAULT_POLICIES = ("infokv", "snapkv", "pyramidkv", "streaming", "h2o", "knorm", "random")
DEFAULT_BUDGETS = ("keep=0.1", "keep=0.25", "keep=0.5")


def split_list(text: str, name: str) -> list[str]:
    """``a,b,c`` -> items; an empty item (``a,,b``, a trailing comma) or an empty list is refused. ``name``: the
    parameter the list is (the command line names its flag)."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise FIError(f"{name} must be a comma-separated list without empty items, got '{text}'", parameter=name)
    if len(set(items)) != len(items):
        raise FIError(f"{name} lists an item twice: '{text}'", parameter=name)
    return items


def int_list(text: str, name: str, minimum: int = 1) -> list[int]:
    """``1024,2048`` -> whole numbers, each at least ``minimum`` (:func:`split_list`'s checks first)."""
    values = []
    for item in split_list(text, name):
        try:
            value = int(item)
        except ValueError:
            raise FIError(f"{name} must list whole numbers, got '{item}' in '{text}'", parameter=name) from None
        if value < minimum:
            raise FIError(f"{name} values must be >= {minimum}, got {value}", parameter=name)
        values.append(value)
    return values


@contextmanager
def budget_from(name: str):
    """Errors raised within about a policy's ``budget`` argument (the registry's) are about ``name``, the
    settings' parameter the budgets come from (``budgets``), so the command line names that one's flag."""
    try:
        yield
    except FIError as exc:
        exc.parameters = {spelling: name if p == "budget" else p for spelling, p in exc.parameters.items()}
        raise


def make_policies(names: str, budgets: str, window: int, alpha: float, tau: float, top_k: int, future: bool = False):
    """``names`` (``infokv:alpha=0.5,tau=2,snapkv``) x ``budgets`` (``0.1,keep=0.25``) -> the policies, name by
    name, each at every budget (a name spelled with its own budget, ``snapkv@keep=0.25``, at that one alone);
    ``window`` and ``top_k`` are the run's (one prefill's signals serve every policy), ``alpha`` and ``tau`` the
    defaults. ``future``: a replay of known text, where the FI oracle may
    look ahead (refused otherwise, and with the prefill oracle's options). A budget or a policy given twice
    (the same class and options) is refused."""
    from fi_toolkit.policies.registry import parse_method, resolve, split_policies

    spelled = split_list(budgets, "budgets")
    parsed = [Budget.parse(b, "--budget") for b in spelled]
    pair = first_repeat(zip(spelled, parsed), key=lambda sb: sb[1])
    if pair:
        raise FIError(
            f"budgets gives one budget twice: '{pair[0][0]}' and '{pair[1][0]}' are both {pair[0][1].label}",
            parameter="budgets",
        )
    names = split_policies(names, "--policy")
    shared = dict(shared=("window", "top_k"), alpha=alpha, tau=tau, top_k=top_k, future=future)
    policies = []
    with budget_from("budgets"):
        for name in names:
            where = f"--policy {name}"
            method = parse_method(name, where, oracles=future)  # NAME@BUDGET: at its own budget alone
            at = parsed if method.budget is None else [method.budget]
            policies.append([resolve(method, b, window, where=where, **shared) for b in at])
    if future:
        from fi_toolkit.policies.fi_oracle import check_decoding_oracle

        for name, row in zip(names, policies):
            check_decoding_oracle(row[0], f"--policy {name}")
    pair = first_repeat(((n, p) for n, row in zip(names, policies) for p in row), key=lambda np: _policy_key(np[1]))
    if pair:
        raise FIError(
            f"policies gives one policy twice: '{pair[0][0]}' and '{pair[1][0]}' are the same policy "
            f"with the same options at {pair[0][1].budget.label}",
            parameter="policies",
        )
    return [p for row in policies for p in row]


def _policy_key(policy):
    """What makes two parsed policies equal: their class and fields (options, budget, window), not their label."""
    return type(policy), repr(policy)


def _spelled(value, name: str, kind: type = str) -> str:
    """A comma-separated list as the command line spells it, from a string or a sequence of strings (or of
    ``kind``, spelled by its ``label``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, kind) or not isinstance(value, Sequence):
        raise FIError(f"{name} must be a list or a comma-separated string, got {value!r}", parameter=name)
    items = [v.label if isinstance(v, kind) and kind is not str else check_type(name, v, str) for v in value]
    return ",".join(items)


@dataclass(frozen=True)
class _PolicyRun:
    """What both kinds of run share: every policy of ``policies`` (names with options, as ``--policy`` spells
    them: a list or one comma-separated string) at every budget of ``budgets`` (``keep=X``, ``remove=X``, a
    bare X is keep=X; Budget objects or strings, or one comma-separated string), the full cache beside them;
    compression back to the budget every ``interval`` tokens; ``resamples`` bootstrap resamples per interval
    (0: none); ``signals``, the signal options (``window`` and ``top_k`` shared by every policy; ``alpha``
    and ``tau`` their defaults). After construction ``policies`` is a tuple of names, ``budgets`` a tuple of
    :class:`~fi_toolkit.budget.Budget`, and :meth:`policy_runs` the resolved policies."""

    policies: Sequence[str] | str = DEFAULT_POLICIES
    budgets: Sequence[Budget | str] | str = DEFAULT_BUDGETS
    interval: int = 256
    resamples: int = 1000
    signals: SignalConfig = field(default_factory=SignalConfig)
    _resolved: tuple = field(default=(), init=False, repr=False, compare=False)

    def _check_policies(self, future: bool) -> None:
        from fi_toolkit.policies.registry import split_policies

        check_type("signals", self.signals, SignalConfig)
        config = self.signals.check()
        names, budgets = _spelled(self.policies, "policies"), _spelled(self.budgets, "budgets", Budget)
        c = config
        resolved = make_policies(names, budgets, c.window, c.alpha, c.tau, c.top_k, future=future)
        check_int("interval", self.interval, 1)
        check_resamples(self.resamples)
        parsed = tuple(Budget.parse(b, "--budget") for b in split_list(budgets, "budgets"))
        object.__setattr__(self, "policies", tuple(split_policies(names, "--policy")))
        object.__setattr__(self, "budgets", parsed)
        object.__setattr__(self, "_resolved", tuple(resolved))

    def policy_runs(self) -> list:
        """The policies measured beside the full cache: each name at every budget, name by name (copies:
        a run may leave state in its policies, the settings stay as built)."""
        import copy

        return copy.deepcopy(list(self._resolved))


@dataclass(frozen=True)
class TextEvalSettings(_PolicyRun):
    """``fi eval DOCUMENTS``: teacher-forced replays of each document and free generation, per policy and budget.

    Besides the shared fields (:class:`_PolicyRun`): ``prompt`` tokens prefilled and compressed first;
    ``length``, tokens in all, the prompt included (None: 2048, or with a generated future ``prompt + N``;
    not with one); ``future``: ``document`` (its own next tokens) or ``generated:N[@SEED]`` (the model's
    continuation); ``free_tokens``: greedy tokens generated freely per policy (0: none); ``unit_policies``:
    work units of that many replays per document (0: one unit per document). The FI oracle (``fi-oracle``)
    may look ahead here. After construction ``future`` is a :class:`~fi_toolkit.compress.future.Future`.
    """

    prompt: int = 1024
    length: int | None = None
    future: Future | str = DOCUMENT
    free_tokens: int = 64
    unit_policies: int = 0

    def __post_init__(self):
        self._check_policies(future=True)
        check_unit_size(check_int("unit_policies", self.unit_policies), "unit_policies")
        future = (
            self.future if isinstance(self.future, Future) else parse_future(check_type("future", self.future, str))
        )
        if future.generated and self.length is not None:
            raise FIError(
                f"length and future {future.label} both set the length: give one", parameter=("length", "future")
            )
        object.__setattr__(self, "future", future)
        check_int("prompt", self.prompt)
        check_int("free_tokens", self.free_tokens)
        if self.length is not None:
            check_int("length", self.length)
        setting = self.text_setting()
        setting.check()
        from fi_toolkit.compress.budget_check import check_budget

        for p in self._resolved:
            check_budget(p, self.prompt, setting.total() - self.prompt, p.compress_prompt)

    def text_setting(self):
        """The prompt, length, interval, future and free tokens as the replays take them
        (:class:`~fi_toolkit.evaluation.replay_runs.TextSetting`)."""
        from fi_toolkit.evaluation.text_setting import TextSetting

        return TextSetting(self.prompt, self.length or 2048, self.interval, self.future, self.free_tokens)

    def document_tokens(self) -> int:
        """The tokens each document needs: the length, or the prompt with a generated future (the model
        continues it)."""
        return self.prompt if self.future.generated else self.length or 2048

    def total(self) -> int:
        """Tokens in all each replay reads, the prompt included: the length, or with a generated future the
        prompt and its N tokens."""
        return self.prompt + self.future.tokens if self.future.generated else self.length or 2048


@dataclass(frozen=True)
class TaskEvalSettings(_PolicyRun):
    """``fi eval --task``: generated task samples answered greedily, per policy and budget.

    Besides the shared fields (:class:`_PolicyRun`): ``tasks``, what is generated and how it is answered
    (:class:`TaskSettings`; after construction checked, aliases resolved). The FI oracle, which looks ahead
    at known text, is refused here; every budget must keep more than the signal window of the shortest
    context."""

    tasks: TaskSettings = field(default_factory=TaskSettings)

    def __post_init__(self):
        self._check_policies(future=False)
        tasks = check_type("tasks", self.tasks, TaskSettings).check()
        shortest = min(tasks.contexts)
        window = self.signals.window
        for p in self._resolved:  # the smallest prompt a compression can see: the context without the question
            if p.budget.kept(shortest) <= window and p.compress_prompt:
                raise FIError(
                    f"budget {p.budget.label} keeps {p.budget.kept(shortest)} of a {shortest}-token "
                    f"context, not above the window of {window}"
                )
        object.__setattr__(self, "tasks", tasks)


@dataclass(frozen=True)
class EvalOptions:
    """``fi eval``'s options as the command line spells them: each field's flag and help is its option's
    (:func:`~fi_toolkit.runs.settings.option`). Lists are comma-separated strings; ``tasks`` None is a text
    run (the fields marked Text), else a task run (those marked Tasks). Not checked on construction:
    :meth:`settings` builds (and so checks) the :class:`TextEvalSettings` or :class:`TaskEvalSettings`, the
    only kind the run reads."""

    policies: str = field(
        default=",".join(DEFAULT_POLICIES),
        metadata=option(
            "--policy",
            "-p",
            help="Comma-separated policies (the full cache is always measured beside them), each "
            + policy_help()
            + ". E.g. infokv:alpha=0.5,tau=2; --alpha/--tau set the defaults; --window and --top-k are shared by "
            "all. fi-oracle looks ahead: at each compression it keeps the entries with the highest estimated FI on "
            "the next INTERVAL tokens of the document (documents only, not --task; no free generation; marked "
            "oracle in the tables). A kvpress press takes the share --budget removes as its compression_ratio. A "
            "budget spelled with a name (snapkv@keep=0.25; a press's names its side, kvpress:SnapKVPress@keep=0.25) "
            "is that policy's alone: it runs at that budget instead of every --budget.",
        ),
    )
    budgets: str = field(
        default="0.1,0.25,0.5",
        metadata=option(
            "--budget",
            "-b",
            help="Comma-separated budgets: keep=X or remove=X (a bare X is keep=X), a share of what each "
            "compression may compress or a count.",
        ),
    )
    interval: int = field(
        default=256, metadata=option(help="Compress back to the budget every INTERVAL fed (or generated) tokens.")
    )
    prompt: int = field(default=1024, metadata=option(help="Text: prompt tokens (prefilled and compressed first)."))
    length: int | None = field(
        default=None,
        metadata=option(
            help="Text: tokens in all, prompt included (default: 2048; with --future generated:N it is prompt + N)."
        ),
    )
    future: str = field(
        default=DOCUMENT.label,
        metadata=option(
            help="Text: 'document' (its own next tokens) or 'generated:N' (the model's greedy continuation, N "
            "tokens) or 'generated:N@SEED' (sampled from SEED)."
        ),
    )
    free_tokens: int = field(
        default=64,
        metadata=option(
            help="Text: greedy tokens generated freely per policy, compared with the full cache's (0: skip)."
        ),
    )
    tasks: str | None = field(
        default=None,
        metadata=option(
            "--task",
            help="Comma-separated tasks instead of documents: passkey, multikey_needle (niah), variable_tracking "
            "(vartrack).",
        ),
    )
    contexts: str = field(
        default=",".join(map(str, DEFAULT_CONTEXTS)),
        metadata=option("--context", help="Tasks: comma-separated prompt lengths in tokens."),
    )
    samples: int = field(default=10, metadata=option(help="Tasks: samples per task and context (seeds 0..N-1)."))
    protocols: str = field(
        default="question-agnostic",
        metadata=option(
            "--protocol",
            help="Tasks: question-agnostic (compress the context, then ask) and/or question-aware.",
        ),
    )
    max_new: int = field(
        default=12, metadata=option(help="Tasks: greedy answer tokens at most (the first line is scored).")
    )
    resamples: int = field(default=1000, metadata=option(help="Bootstrap resamples per interval (0: none)."))
    unit_policies: int = field(
        default=0,
        metadata=option(
            help="Text: split each document into work units of N replays (the full cache and the policy x budget "
            "runs; 0: one unit per document), so torchrun's ranks share documents; same tables."
        ),
    )

    def settings(self, signals: SignalConfig | None = None) -> TextEvalSettings | TaskEvalSettings:
        """The run's settings, with ``signals`` (None: the defaults): a :class:`TaskEvalSettings` where
        ``tasks`` names some, else a :class:`TextEvalSettings`; each checks itself on construction."""
        common = dict(policies=self.policies, budgets=self.budgets, interval=self.interval, resamples=self.resamples)
        common["signals"] = SignalConfig() if signals is None else signals
        if self.tasks is None:
            text = dict(prompt=self.prompt, length=self.length, future=self.future, free_tokens=self.free_tokens)
            return TextEvalSettings(**common, **text, unit_policies=self.unit_policies)
        tasks = TaskSettings(
            tuple(split_list(self.tasks, "tasks")),
            tuple(int_list(self.contexts, "contexts")),
            self.samples,
            tuple(split_list(self.protocols, "protocols")),
            self.max_new,
        )
        return TaskEvalSettings(**common, tasks=tasks)
