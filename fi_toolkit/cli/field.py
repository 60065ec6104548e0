"""``fi field``: the field map, every named policy and press placed against the FI ceiling in one resumable run.

The options are generated from the fields of :class:`~fi_toolkit.field.settings.FieldSettings` and of
its ``--task`` group :class:`~fi_toolkit.field.settings.FieldTasks`, and build the settings (checked on
construction, before the command runs and the model loads); :func:`fi_toolkit.field.run.run_field`
computes, and this module prints."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer
from rich.table import Table

from fi_toolkit.cli.options import _progress, check_document_lengths, err, out, settings_options, unit_progress
from fi_toolkit.cli.study import _read_documents
from fi_toolkit.errors import FIError
from fi_toolkit.field.settings import FieldSettings, FieldTasks
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.report.numbers import accuracy_with_full, field_fi_text, headroom_with_ci, replay_kl_text, seconds_text
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig


@settings_options()
def field(
    documents: List[str] = typer.Argument(None, help="Text/JSONL files or bundled names (at least one)."),
    *,
    settings: FieldSettings,
    tasks: FieldTasks = FieldTasks(),
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    run: RunSettings = RunSettings(Path("runs/field")),
):
    """Place each policy and press on the documents at the budgets: prefill FI near and far, the share of the
    headroom closed (random positions with sinks kept = 0, the FI oracle = 1) with bootstrap CIs, replay KL in
    decoding (--replay), seconds per compression; a leaderboard and paired tests over documents."""
    model.check()
    if not documents:
        raise FIError("give at least one document (a text or JSONL file, or a bundled name like alice)")
    texts = _read_documents(documents)
    if not texts:
        raise FIError("the documents given hold no text")
    needed, far = settings.document_tokens(), settings.chunks[-1]
    reads = f"the farthest chunk {far.label}" if needed == far.end else f"the replay's --length {needed:,}"
    check_document_lengths(model, texts, needed, reads)
    run.check("field")
    from fi_toolkit.documents import tokenize_texts
    from fi_toolkit.field.run import run_field

    lm = model.load()
    docs = tokenize_texts(texts, lm.tokenizer, max_tokens=needed)
    with _progress() as bar:
        tables = run_field(lm, docs, settings, run, progress=unit_progress(bar, "field"))
    if tables is None:  # a rank other than 0 of a sharded run: rank 0 reports
        return
    _print_leaderboard(tables, len(docs), settings.prefix)
    refused = tables.get("refused")
    if refused is not None and len(refused):
        err.print(
            f"note: {refused['method'].nunique()} method(s) refused in some cell (reasons: {run.out}/refused.csv)",
            markup=False,
            highlight=False,
        )
    err.print(
        f"results: {run.out}/ (leaderboard.csv, leaderboard.json, headroom.csv, tests.csv, fi.csv, replays.csv, "
        + ("answers.csv, task_summary.csv, " if settings.tasks is not None else "")
        + "refused.csv, manifest.json)",
        markup=False,
        highlight=False,
    )


def _print_leaderboard(tables, n_docs: int, prefix: int) -> None:
    board = tables.get("leaderboard")
    if board is None or board.empty:
        out.print("no cell was measured (every method was refused: see refused.csv)")
        return
    chunks = [c.removeprefix("fi_") for c in board.columns if c.startswith("fi_")]
    t = Table(
        title=f"field map, p={prefix}, {n_docs} document(s): FI (nats) and headroom (0 = random positions with "
        "sinks kept, 1 = the FI oracle that saw the chunk) [95 % CI over documents]"
    )
    cols = ["budget", "method"] + [f"FI {c}" for c in chunks] + [f"headroom {c}" for c in chunks]
    tasks = "accuracy" in board
    cols += ["replay KL"] + (["accuracy"] if tasks else []) + ["s/compression"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("budget", "method") else "right")
    for _, r in board.iterrows():
        heads = [headroom_with_ci(r.get(f"headroom_{c}"), r.get(f"headroom_ci_{c}")) for c in chunks]
        t.add_row(
            r["budget"],
            r["method"] + (" (anchor)" if r["kind"] == "anchor" else ""),
            *[field_fi_text(r[f"fi_{c}"]) for c in chunks],
            *heads,
            replay_kl_text(r.get("replay_kl")),
            *([accuracy_with_full(r.get("accuracy"), r.get("full_accuracy"))] if tasks else []),
            seconds_text(r["compress_seconds"], 3, unit=False),
        )
    out.print(t)


def register(app: typer.Typer) -> None:
    """Add ``field`` to ``app``."""
    app.command()(field)
