"""What a task run of ``fi eval`` generates and how it answers: :class:`TaskSettings`, the object
``fi eval --task`` builds and :func:`fi_toolkit.evaluation.run_eval_tasks` takes (its text twin is
:class:`fi_toolkit.evaluation.replay_runs.TextSetting`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from fi_toolkit.errors import FIError
from fi_toolkit.runs.settings import check_int, check_type

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
