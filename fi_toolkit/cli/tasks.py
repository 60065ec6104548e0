"""``fi tasks export``: the toolkit's long-context tasks as lm-eval tasks (JSONL + YAML). Parses its options into
a :class:`~fi_toolkit.evaluation.lmeval.export_settings.TaskExportSettings`, loads the model (its tokenizer sizes
the prompts), calls :func:`~fi_toolkit.evaluation.lmeval.export_run.run_task_export`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fi_toolkit.cli.options import out
from fi_toolkit.model.settings import DEFAULT_MODEL, ModelSettings


def register(app: typer.Typer) -> None:
    tasks_app = typer.Typer(
        help="The toolkit's long-context tasks (passkey, needle) for other harnesses.", no_args_is_help=True
    )

    @tasks_app.command("export")
    def export(
        out_dir: Path = typer.Option(
            ..., "--out", "-o", help="Directory for the JSONL files, the task YAMLs and fi_scoring.py."
        ),
        task: str = typer.Option(
            "passkey,multikey_needle", "--task", help="Comma-separated: passkey, multikey_needle, variable_tracking."
        ),
        context: int = typer.Option(1024, help="Tokens per prompt (measured with the model's tokenizer)."),
        samples: int = typer.Option(8, help="Samples per task (seeds SEED .. SEED + N - 1)."),
        seed: int = typer.Option(0, help="First seed."),
        max_gen_toks: int = typer.Option(16, help="Tokens each answer may take."),
        model: str = typer.Option(
            DEFAULT_MODEL, "--model", "-m", help="smollm2-135m (embedded), a local directory or a HF id."
        ),
        device: Optional[str] = typer.Option(None, hidden=True),
        overwrite: bool = typer.Option(False, help="Replace task files already in --out (other files stay)."),
    ):
        """Write lm-eval tasks fi_passkey, fi_multikey_needle, ... (run with lm-eval --include_path OUT)."""
        from fi_toolkit.evaluation.lmeval.export_settings import TaskExportSettings

        settings = TaskExportSettings(task, context, samples, seed, max_gen_toks)
        settings.check_out(out_dir, overwrite)
        ModelSettings(model).check()  # a --model directory without a model, before torch loads
        # every check above imports nothing heavy (usage errors answer at once); the export does
        from fi_toolkit.evaluation.lmeval.export_run import run_task_export
        from fi_toolkit.model.loading import load_model

        for path in run_task_export(load_model(model, device=device), settings, out_dir, overwrite):
            out.print(str(path), markup=False, highlight=False)

    app.add_typer(tasks_app, name="tasks")
