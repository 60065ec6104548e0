"""``fi field``: the field map, every named policy and press placed against the FI ceiling in one resumable run.

The options become a :class:`~fi_toolkit.evaluation.field_settings.FieldSettings` (checked on construction,
before the model loads), :func:`fi_toolkit.evaluation.field.run_field` computes, and this module prints."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from fi_toolkit.cli.options import _progress, check_document_lengths, err, out, settings_options, unit_progress
from fi_toolkit.cli.study import _read_documents
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig


@settings_options()
def field(
    documents: List[str] = typer.Argument(None, help="Text/JSONL files or bundled names (at least one)."),
    policy: List[str] = typer.Option(
        None,
        "--policy",
        "-p",
        help="A method to place, as fi eval --policy spells it, without a budget (repeatable): a project policy "
        "(snapkv, infokv:alpha=0.5, adaptive(infokv), fitted:path=FILE) or a press (kvpress:SnapKVPress, "
        "kvpress:AdaKVPress/SnapKVPress). Default: every project policy of the registry and, where kvpress is "
        "installed, every press it exports that takes a compression ratio (those that cannot run here are "
        "listed in refused.csv). The anchors, random positions with sinks kept and the FI oracle, are always "
        "measured.",
    ),
    budget: List[str] = typer.Option(
        ["keep=0.25"],
        "--budget",
        "-b",
        help="A budget, a share of the prefix: keep=X or remove=X (a bare X is keep=X), 0 < X < 1 (repeatable).",
    ),
    prefix: int = typer.Option(1024, help="Compression point p (and the replay's prompt)."),
    distances: str = typer.Option("0,256", help="Chunk starts as distances from p, comma-separated (near, far)."),
    chunk_len: int = typer.Option(128, help="Tokens per chunk."),
    sinks: int = typer.Option(4, help="The random anchor never picks the first N positions."),
    seeds: int = typer.Option(3, help="Random anchor sets per budget (seeds 0..N-1), averaged per document."),
    replay: bool = typer.Option(
        False, "--replay/--no-replay", help="Also the replay KL in decoding, as fi eval measures it (costly)."
    ),
    interval: int = typer.Option(256, help="--replay: compress back to the budget every INTERVAL tokens."),
    length: Optional[int] = typer.Option(
        None, help="--replay: tokens in all, the prompt p included (default: the far chunk's end)."
    ),
    resamples: int = typer.Option(2000, help="Bootstrap resamples of each headroom CI (0: none)."),
    task: Optional[str] = typer.Option(
        None,
        help="Also the accuracy of every method on these generated tasks, comma-separated (passkey, "
        "multikey_needle, variable_tracking), answered as fi eval --task answers them, compressing every "
        "--interval tokens.",
    ),
    task_context: str = typer.Option("1024", help="--task: prompt lengths in tokens, comma-separated."),
    task_samples: int = typer.Option(4, help="--task: samples per task and prompt length (seeds 0..N-1)."),
    max_new: int = typer.Option(12, help="--task: greedy tokens each answer may take."),
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    batch_size: Optional[int] = typer.Option(
        None, help="Evictions per batched forward (default: 1 on CPU, 8 on CUDA)."
    ),
    run: RunSettings = RunSettings(Path("runs/field")),
):
    """Place each policy and press on the documents at the budgets: prefill FI near and far, the share of the
    headroom closed (random positions with sinks kept = 0, the FI oracle = 1) with bootstrap CIs, replay KL in
    decoding (--replay), seconds per compression; a leaderboard and paired tests over documents."""
    from fi_toolkit.evaluation.field_settings import FieldSettings

    model.check()
    if not documents:
        raise FIError("give at least one document (a text or JSONL file, or a bundled name like alice)")
    settings = FieldSettings(
        methods=policy or None,
        budgets=budget,
        prefix=prefix,
        distances=distances,
        chunk_len=chunk_len,
        sinks=sinks,
        seeds=seeds,
        replay=replay,
        interval=interval,
        length=length,
        resamples=resamples,
        signals=signals,
        batch_size=batch_size,
        tasks=None if task is None else _tasks(task, task_context, task_samples, max_new),
    )
    texts = _read_documents(documents)
    if not texts:
        raise FIError("the documents given hold no text")
    needed, far = settings.document_tokens(), settings.chunks[-1]
    reads = f"the farthest chunk {far.label}" if needed == far.end else f"the replay's --length {needed:,}"
    check_document_lengths(model, texts, needed, reads)
    run.check("field")
    from fi_toolkit.documents import tokenize_texts
    from fi_toolkit.evaluation.field import run_field

    lm = model.load()
    docs = tokenize_texts(texts, lm.tokenizer, max_tokens=settings.document_tokens())
    with _progress() as bar:
        tables = run_field(lm, docs, settings, run, progress=unit_progress(bar, "field"))
    if tables is None:  # a rank other than 0 of a sharded run: rank 0 reports
        return
    _print_leaderboard(tables, len(docs), prefix)
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


def _tasks(task: str, contexts: str, samples: int, max_new: int):
    """``--task`` and its options -> the :class:`~fi_toolkit.evaluation.settings.TaskSettings` (question-agnostic,
    as fi eval's default: the compression never sees the question)."""
    from fi_toolkit.cli.eval import int_list
    from fi_toolkit.evaluation.settings import TaskSettings, split_list

    names, lengths = tuple(split_list(task, "--task")), tuple(int_list(contexts, "--task-context"))
    return TaskSettings(names, lengths, samples, max_new=max_new)


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
        heads = []
        for c in chunks:
            h = r.get(f"headroom_{c}")
            heads.append("" if h is None or h != h else f"{h:.2f} {r[f'headroom_ci_{c}']}")
        kl = r.get("replay_kl")
        t.add_row(
            r["budget"],
            r["method"] + (" (anchor)" if r["kind"] == "anchor" else ""),
            *[f"{r[f'fi_{c}']:.4f}" for c in chunks],
            *heads,
            "" if kl is None or kl != kl else f"{kl:.4g}",
            *([_accuracy(r)] if tasks else []),
            f"{r['compress_seconds']:.3f}",
        )
    out.print(t)


def _accuracy(row) -> str:
    a = row.get("accuracy")
    return "" if a is None or a != a else f"{a:.2f} (full {row['full_accuracy']:.2f})"


def register(app: typer.Typer) -> None:
    """Add ``field`` to ``app``."""
    app.command()(field)
