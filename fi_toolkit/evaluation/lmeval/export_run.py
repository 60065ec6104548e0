"""The ``fi tasks export`` run: :func:`run_task_export` writes the toolkit's long-context tasks as lm-eval tasks
(:func:`fi_toolkit.evaluation.lmeval.export.export_tasks`), staged beside the directory and swapped in, so an
interrupted export leaves the directory as it was.

From the command line: ``fi tasks export`` parses its options into a
:class:`~fi_toolkit.evaluation.lmeval.export_settings.TaskExportSettings`, checks ``--out``, loads the model's
tokenizer, calls :func:`run_task_export` and prints the YAML paths.
"""

from __future__ import annotations

from pathlib import Path

from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.lmeval.export import export_tasks
from fi_toolkit.evaluation.lmeval.export_settings import TaskExportSettings
from fi_toolkit.runs import results
from fi_toolkit.runs.settings import check_type


def run_task_export(lm, settings: TaskExportSettings, out_dir: Path | str, overwrite: bool = False) -> list[Path]:
    """Every task of ``settings`` into ``out_dir`` (its other files stay), prompts sized with ``lm``'s tokenizer
    -> the YAML paths in ``out_dir`` (run them with ``lm-eval --include_path OUT_DIR``)."""
    check_type("settings", settings, TaskExportSettings)
    out_dir = Path(out_dir)
    settings.check_out(out_dir, overwrite)
    if lm.tokenizer is None:
        raise FIError(f"model {lm.name} has no tokenizer to size the prompts with")
    with results.staged_dir(out_dir) as staging:
        yamls = export_tasks(
            out_dir,
            lm.tokenizer,
            list(settings.tasks),
            settings.context,
            settings.samples,
            settings.seed,
            settings.max_gen_toks,
            lm.config,
            staging=staging,
        )
    return [out_dir / path.name for path in yamls]
