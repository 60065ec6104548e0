"""``fi tasks export``: the toolkit's long-context tasks as lm-eval tasks (JSONL + YAML;
:func:`fi_toolkit.evaluation.lmeval.export.export_tasks`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fi_toolkit.cli.options import out
from fi_toolkit.model.settings import DEFAULT_MODEL


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
        from fi_toolkit.errors import FIError
        from fi_toolkit.evaluation.settings import DEFAULT_TASKS
        from fi_toolkit.runs import results

        names = [t.strip() for t in task.split(",") if t.strip()]
        unknown = [t for t in names if t not in DEFAULT_TASKS]
        if not names or unknown:
            raise FIError(f"--task: unknown task {', '.join(unknown) or '(none)'} (tasks: {', '.join(DEFAULT_TASKS)})")
        twice = [t for i, t in enumerate(names) if t in names[:i]]
        if twice:
            raise FIError(f"--task names '{twice[0]}' twice: give each task once")
        for flag, value, minimum in (
            ("--context", context, 1),
            ("--samples", samples, 1),
            ("--max-gen-toks", max_gen_toks, 1),
            ("--seed", seed, 0),
        ):
            if value < minimum:
                raise FIError(f"{flag} must be >= {minimum}, got {value}")
        results.check_out_path(out_dir, option="--out")
        if out_dir.is_dir():  # the export is staged beside it, then swapped in
            results.check_stageable(out_dir, option="--out")
        files = ["fi_scoring.py", *(f"fi_{t}.{ext}" for t in names for ext in ("jsonl", "yaml"))]
        held = [f for f in files if (out_dir / f).exists()]
        if held and not overwrite:
            raise FIError(f"--out '{out_dir}' already holds {held[0]}; choose another directory or pass --overwrite")
        # every check above imports nothing heavy (usage errors answer at once); the export does
        from fi_toolkit.evaluation.lmeval.export import export_tasks
        from fi_toolkit.model.loading import load_model

        lm = load_model(model, device=device)
        if lm.tokenizer is None:
            raise FIError(f"model {model} has no tokenizer to size the prompts with")
        with results.staged_dir(out_dir) as staging:  # other files in --out stay
            yamls = export_tasks(
                out_dir, lm.tokenizer, names, context, samples, seed, max_gen_toks, lm.config, staging=staging
            )
        for path in yamls:
            out.print(str(out_dir / path.name), markup=False, highlight=False)

    app.add_typer(tasks_app, name="tasks")
