"""What ``fi tasks export`` writes: :class:`TaskExportSettings`, the object the command line builds and
:func:`fi_toolkit.evaluation.lmeval.export_run.run_task_export` takes. Imports nothing heavy (no torch, no
lm-eval): the command line builds it, and checks where it writes, before the model loads.

Each field carries its flag and help (:func:`fi_toolkit.runs.settings.option`), from which
:func:`fi_toolkit.cli.options.settings_options` generates the command's options; a field is named as the messages
name it (``tasks``, flag ``--task``). The command builds it without a default object: it checks itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.settings import DEFAULT_TASKS
from fi_toolkit.runs import results
from fi_toolkit.runs.settings import check_int, check_type, first_repeat, option

SCORING = "fi_scoring.py"  # the scoring functions every exported task's YAML names


@dataclass(frozen=True)
class TaskExportSettings:
    """``fi tasks export``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line
    naming the parameter; the command line names its flag).

    ``tasks``: comma-separated task names or a sequence of them (passkey, multikey_needle, variable_tracking),
    each once; ``context``: tokens per prompt, measured with the model's tokenizer; ``samples``: samples per
    task, seeds ``seed .. seed + samples - 1``; ``max_gen_toks``: the tokens each answer may take. After
    construction ``tasks`` is a tuple.
    """

    tasks: str | Sequence[str] = field(
        default="passkey,multikey_needle",
        metadata=option("--task", help="Comma-separated: passkey, multikey_needle, variable_tracking.", cli_type=str),
    )
    context: int = field(
        default=1024, metadata=option("--context", help="Tokens per prompt (measured with the model's tokenizer).")
    )
    samples: int = field(default=8, metadata=option("--samples", help="Samples per task (seeds SEED .. SEED + N - 1)."))
    seed: int = field(default=0, metadata=option("--seed", help="First seed."))
    max_gen_toks: int = field(default=16, metadata=option("--max-gen-toks", help="Tokens each answer may take."))

    def __post_init__(self):
        names = (
            self.tasks.split(",") if isinstance(self.tasks, str) else [check_type("tasks", t, str) for t in self.tasks]
        )
        names = tuple(t.strip() for t in names if t.strip())
        unknown = [t for t in names if t not in DEFAULT_TASKS]
        if not names or unknown:
            raise FIError(
                f"tasks: unknown task {', '.join(unknown) or '(none)'} (tasks: {', '.join(DEFAULT_TASKS)})",
                parameter="tasks",
            )
        pair = first_repeat(names)
        if pair:
            raise FIError(f"tasks names '{pair[0]}' twice: give each task once", parameter="tasks")
        for name, minimum in (("context", 1), ("samples", 1), ("max_gen_toks", 1), ("seed", 0)):
            check_int(name, getattr(self, name), minimum)
        object.__setattr__(self, "tasks", names)

    def files(self) -> list[str]:
        """The files an export writes into its directory: the scoring module, then per task its JSONL and YAML."""
        return [SCORING, *(f"fi_{t}.{ext}" for t in self.tasks for ext in ("jsonl", "yaml"))]

    def check_out(self, out_dir: Path, overwrite: bool = False) -> None:
        """``out_dir`` can take the export (it is staged beside the directory, then swapped in): not a file,
        writable, and holding none of :meth:`files` unless ``overwrite``. Other files in it stay."""
        out_dir = Path(out_dir)
        results.check_out_path(out_dir, option="out_dir")
        if out_dir.is_dir():
            results.check_stageable(out_dir, option="out_dir")
        held = [f for f in self.files() if (out_dir / f).exists()]
        if held and not overwrite:
            raise FIError(
                f"out_dir '{out_dir}' already holds {held[0]}; choose another directory or pass overwrite",
                parameter=("out_dir", "overwrite"),
            )
