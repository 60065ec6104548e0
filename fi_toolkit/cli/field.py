"""``fi field``: the field map, every named policy and press placed against the FI ceiling in one resumable run
(a thin shell over :func:`fi_toolkit.evaluation.field.run_field`; the methods and budgets are parsed by
:mod:`fi_toolkit.studies.field_spec` before the model loads)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from fi_toolkit.cli.options import (
    _progress,
    check_prefix,
    check_resamples,
    check_sinks,
    err,
    out,
    settings_options,
    unit_progress,
)
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
    from fi_toolkit.studies.field_spec import check_methods, default_methods, parse_budgets, parse_methods
    from fi_toolkit.studies.nearfar_spec import nearfar_chunks, parse_distances

    model.check()
    config = signals.check()
    if not documents:
        raise FIError("give at least one document (a text or JSONL file, or a bundled name like alice)")
    budgets = parse_budgets(budget)
    methods = parse_methods(policy) if policy else default_methods()
    chunks = nearfar_chunks(prefix, parse_distances(distances), chunk_len)
    check_prefix(prefix, config.window)
    check_sinks(sinks, prefix, config.window)
    if not 1 <= seeds <= 1000:
        raise FIError(f"--seeds must lie in [1, 1000], got {seeds}")
    if batch_size is not None and batch_size < 1:
        raise FIError(f"--batch-size must be >= 1, got {batch_size}")
    check_resamples(resamples)
    check_methods(methods, budgets, prefix, config.window, sinks)
    setting = None
    if replay:
        from fi_toolkit.compress.future import DOCUMENT
        from fi_toolkit.evaluation.replay_runs import TextSetting

        if interval < 1:
            raise FIError(f"--interval must be >= 1, got {interval}")
        setting = TextSetting(prefix, length or chunks[-1].end, interval, DOCUMENT, 0)
        setting.check()
        _check_replay_budgets(methods, budgets, config, setting)
    elif length is not None:
        raise FIError("--length sets the replay: it goes with --replay")
    texts = _read_documents(documents)
    if not texts:
        raise FIError("the documents given hold no text")
    run.check("field")
    from fi_toolkit.documents import tokenize_texts
    from fi_toolkit.evaluation.field import run_field

    lm = model.load()
    need = max(chunks[-1].end, setting.total() if setting else 0)
    docs = tokenize_texts(texts, lm.tokenizer, max_tokens=need)
    with _progress() as bar:
        tables = run_field(
            lm,
            docs,
            run,
            methods,
            budgets,
            prefix,
            chunks,
            sinks,
            seeds,
            config,
            setting,
            batch_size,
            presses=not policy,
            n_resamples=resamples,
            progress=unit_progress(bar, "field"),
        )
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
        "refused.csv, manifest.json)",
        markup=False,
        highlight=False,
    )


def _check_replay_budgets(methods, budgets, config, setting) -> None:
    """Every method's replay policy resolves and its budget can work on the replay (before the model loads)."""
    from fi_toolkit.compress.decoder import check_budget
    from fi_toolkit.studies.field_spec import replay_policy

    for m in methods:
        for b in budgets:
            p = replay_policy(m, b, config)
            try:
                check_budget(p, setting.prompt, setting.total() - setting.prompt, p.compress_prompt)
            except FIError as exc:
                raise FIError(f"--policy {m.name} --budget {b.label}: {exc}") from None


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
    cols += ["replay KL", "s/compression"]
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
            f"{r['compress_seconds']:.3f}",
        )
    out.print(t)


def register(app: typer.Typer) -> None:
    """Add ``field`` to ``app``."""
    app.command()(field)
