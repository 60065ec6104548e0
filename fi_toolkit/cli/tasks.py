"""``fi tasks export``: the toolkit's long-context tasks as lm-eval tasks (JSONL + YAML). Parses its options into
a :class:`~fi_toolkit.evaluation.lmeval.export_settings.TaskExportSettings`, loads the model (its tokenizer sizes
the prompts), calls :func:`~fi_toolkit.evaluation.lmeval.export_run.run_task_export`.

Its options are generated from ``TaskExportSettings`` (built without a default object: it checks itself),
:class:`~fi_toolkit.model.settings.ModelSettings` and :class:`~fi_toolkit.runs.settings.OutDirSettings`. Of the
model's options only ``--model`` is shown, and ``--device``, kept out of ``--help`` as before: the export reads
the tokenizer and the config, so where the weights go and in which dtype is not the user's concern (the
defaults, as ``load_model``'s). ``ModelSettings`` rather than a dataclass of its own: one ``--model`` help and
one model check for every command.
"""

from __future__ import annotations

import typer

from fi_toolkit.cli.options import HIDDEN, out, settings_options
from fi_toolkit.evaluation.lmeval.export_settings import TaskExportSettings
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.runs.settings import OutDirSettings


@settings_options(
    model={"device": HIDDEN, "device_map": None, "dtype": None, "upcast": None},
    output={
        "out_dir": "Directory for the JSONL files, the task YAMLs and fi_scoring.py.",
        "overwrite": "Replace task files already in --out (other files stay).",
    },
)
def export(*, settings: TaskExportSettings, model: ModelSettings = ModelSettings(), output: OutDirSettings):
    """Write lm-eval tasks fi_passkey, fi_multikey_needle, ... (run with lm-eval --include_path OUT)."""
    settings.check_out(output.out_dir, output.overwrite)
    model.check()  # a --model directory without a model, before torch loads
    # every check above imports nothing heavy (usage errors answer at once); the export does
    from fi_toolkit.evaluation.lmeval.export_run import run_task_export

    for path in run_task_export(model.load(), settings, output.out_dir, output.overwrite):
        out.print(str(path), markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``tasks export`` to ``app``."""
    tasks_app = typer.Typer(
        help="The toolkit's long-context tasks (passkey, needle) for other harnesses.", no_args_is_help=True
    )
    tasks_app.command("export")(export)
    app.add_typer(tasks_app, name="tasks")
