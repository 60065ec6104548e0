"""``fi eval``: the compressor on trial while the model decodes (a thin shell over :mod:`fi_toolkit.evaluation`).

Two kinds of run, one command: documents (teacher-forced replay of the document or of the model's own
continuation, ``--future``, plus free generation) or ``--task`` (generated long-context tasks answered
greedily). Lists are comma-separated. The options are generated from
:class:`~fi_toolkit.evaluation.settings.EvalOptions`' fields, which become a
:class:`~fi_toolkit.evaluation.settings.TextEvalSettings` or a
:class:`~fi_toolkit.evaluation.settings.TaskEvalSettings` (checked on construction, before the model loads),
:func:`fi_toolkit.evaluation.run_eval` computes, and this module prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer
from rich.table import Table

from fi_toolkit.cli.options import _progress, check_document_lengths, err, out, settings_options, unit_progress
from fi_toolkit.cli.study import _read_documents
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.settings import EvalOptions, TaskEvalSettings, TextEvalSettings
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.report.numbers import (
    accuracy_text,
    fraction_text,
    kl_text,
    mean_kl_text,
    mean_tokens_text,
    signed_text,
    spearman_text,
)
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig


@settings_options()
def eval_(
    documents: List[str] = typer.Argument(
        None, help="Text/JSONL files or bundled names (default: alice); not with --task."
    ),
    options: EvalOptions = EvalOptions(),
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    run: RunSettings = RunSettings(Path("runs/eval")),
):
    """Replay KL, top-1 agreement, ΔNLL and free-generation agreement on text, or task accuracy, per policy and
    budget."""
    model.check()
    if options.tasks is not None and documents:
        raise FIError("give documents or --task, not both")
    if options.tasks is not None and options.unit_policies:
        raise FIError("--unit-policies splits text documents; a task run's unit is already one sample")
    settings = options.settings(signals)
    texts = None if isinstance(settings, TaskEvalSettings) else _read_documents(documents)
    if texts is not None:
        needed = settings.document_tokens()
        reads = f"--prompt {needed:,}" if settings.future.generated else f"the replay's length {needed:,} (--length)"
        check_document_lengths(model, texts, needed, reads)
    run.check("eval")
    from fi_toolkit.documents import tokenize_texts
    from fi_toolkit.evaluation.run import run_eval

    lm = model.load()
    docs = None if texts is None else tokenize_texts(texts, lm.tokenizer, max_tokens=settings.document_tokens())
    with _progress() as bar:
        tables = run_eval(lm, docs, settings, run, progress=unit_progress(bar, "eval"))
    if tables is None:  # a rank other than 0 of a sharded run: rank 0 reports
        return
    if texts is None:
        _report_tasks(tables, run)
    else:
        _report_text(tables, len(docs), settings, run)


def _report_text(tables, n_docs: int, settings: TextEvalSettings, run: RunSettings) -> None:
    """The replay table, the noise-floor warning and where the tables are."""
    from fi_toolkit.cli.console import print_warning
    from fi_toolkit.report.noise import replay_noise_warning

    _print_text(tables, n_docs, settings)
    print_warning(replay_noise_warning(tables["replays"]))
    err.print(
        f"results: {run.out}/ (replay_summary.csv, replays.csv, segments.csv, positions.csv, manifest.json)",
        markup=False,
        highlight=False,
    )


def _report_tasks(tables, run: RunSettings) -> None:
    """The accuracy table, does replay KL predict it, and where the tables are."""
    _print_tasks(tables)
    err.print(
        f"results: {run.out}/ (task_summary.csv, answers.csv, kl_accuracy.csv, manifest.json)",
        markup=False,
        highlight=False,
    )


def _print_text(tables, n_docs: int, settings: TextEvalSettings) -> None:
    """The replay table; ``settings``: the run's (or anything with its prompt, interval, future and total())."""
    s = tables["replay_summary"]
    t = Table(
        title=f"replay over {n_docs} document(s), {settings.future.label}, prompt {settings.prompt}, "
        f"{settings.total()} tokens, compressing every {settings.interval}"
    )
    ci = s["mean_kl_low"].notna().any()
    for c in ("policy", "keep", "mean KL" + (" [95% CI]" if ci else ""), "top-1", "ΔNLL", "1st diff", "kept"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    for _, r in s.iterrows():
        first = r["free_first_divergence"]  # NaN with --free-tokens 0: nothing was generated
        t.add_row(
            r["policy"] + (" (oracle)" if r.get("oracle", False) else ""),
            r["budget"].removeprefix("keep="),
            _mean_kl_cell(r, ci),
            fraction_text(r["top1_agreement"]),
            signed_text(r["delta_nll"], 4),
            mean_tokens_text(first),
            fraction_text(r["kept_share"]),
        )
    out.print(t)
    out.print(
        "1st diff: tokens of free greedy generation before the first that differs from the full cache's "
        "(mean over documents; empty with --free-tokens 0 and for an oracle); kept: mean share of the entries each "
        "position attends to; ≤X (noise floor): a mean KL no larger than the full-cache replay's own, float "
        "rounding; (oracle): sees the future text, a bound for the policies, not one of them"
    )


def _mean_kl_cell(r, ci: bool) -> str:
    """The row's mean KL cell (:func:`~fi_toolkit.report.numbers.mean_kl_text`: at or below the noise floor, the
    full-cache replay's |mean KL|, it reads ``≤floor (noise floor)``); its CI only where the table has any (``ci``)."""
    low = r["mean_kl_low"] if ci else float("nan")
    return mean_kl_text(r["mean_kl"], low, r["mean_kl_high"], r.get("noise_floor", float("nan")))


def _print_tasks(tables) -> None:
    s = tables["task_summary"]
    t = Table(title="task accuracy (exact match, greedy; 95% CI over samples)")
    for c in ("task", "context", "protocol", "policy", "budget", "accuracy [95% CI]", "full", "answer KL"):
        t.add_column(c, justify="left" if c in ("task", "protocol", "policy", "budget") else "right")
    for _, r in s.iterrows():
        t.add_row(
            SHORT_TASKS.get(r["task"], r["task"]),
            str(r["context"]),
            r["protocol"].removeprefix("question-"),
            r["policy"],
            r["budget"].removeprefix("keep="),
            accuracy_text(r["accuracy"], r["accuracy_low"], r["accuracy_high"]),
            accuracy_text(r["full_accuracy"]),
            kl_text(r["answer_kl"]),
        )
    out.print(t)
    k = tables["kl_accuracy"]
    for _, r in k.iterrows():
        rho = spearman_text(r["rho"], r["ci_low"], r["ci_high"])
        out.print(f"{r['comparison']}: {rho} over {r['cells']} cells")


SHORT_TASKS = {"multikey_needle": "niah", "variable_tracking": "vartrack"}


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_)
