"""``fi fit-data`` and ``fi fit``: learn a policy from Forward Influence (:mod:`fi_toolkit.fit`).

``fi fit-data DOCS --chunk A:B --out RUN`` writes ``RUN/fit_rows.parquet`` (per document, layer, KV head
and candidate position: the compression-time features and the Fisher estimate of FI) and
``RUN/manifest.json``; ``fi fit RUN... --out policy.json`` fits a ridge score (or a LambdaRank model) on the
rows of every run, cross-validated leaving one document out, and writes the JSON ``fitted:path=policy.json``
(``learned:path=``) reads.

Each command parses its options into settings (:class:`~fi_toolkit.fit.settings.FitDataSettings`,
:class:`~fi_toolkit.fit.settings.FitSettings`, which check them), calls one run function
(:func:`~fi_toolkit.fit.run.run_fit_data`, :func:`~fi_toolkit.fit.run.run_fit`) and prints.
Their options are generated from those settings (built without a default object: they check themselves), the
model's and the signals', and :class:`~fi_toolkit.runs.settings.OutDirSettings` /
:class:`~fi_toolkit.runs.settings.OutFileSettings` (``--out``, ``--overwrite``).
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from fi_toolkit.cli.options import _progress, check_document_lengths, chunk_ending, err, out, settings_options
from fi_toolkit.cli.study import _read_documents
from fi_toolkit.fit.run import ROWS, run_fit, run_fit_data
from fi_toolkit.fit.settings import FitDataSettings, FitSettings
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.report.numbers import signed_text, significant
from fi_toolkit.runs.settings import OutDirSettings, OutFileSettings, RunSettings
from fi_toolkit.signals.config import SignalConfig


@settings_options(output={"out_dir": "Run directory for fit_rows.parquet and manifest.json."})
def fit_data(
    documents: List[str] = typer.Argument(None, help="Text/JSONL files or bundled names (default: alice)."),
    *,
    settings: FitDataSettings,
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    output: OutDirSettings,
):
    """Training rows for fi fit: compression-time features and per-(layer, KV head) Fisher FI of every position."""
    from fi_toolkit.runs import results

    model.check()
    texts = _read_documents(documents)
    needed = settings.document_tokens()
    check_document_lengths(model, texts, needed, chunk_ending(settings.chunks, needed, f"token {needed:,}"))
    results.check_results_dir(output.out_dir, output.overwrite)
    # every check above imports nothing heavy (usage errors answer at once); the work below does
    from fi_toolkit.documents import tokenize_texts

    lm = model.load()
    docs = tokenize_texts(texts, lm.tokenizer, max_tokens=settings.document_tokens())
    run = RunSettings(output.out_dir, overwrite=output.overwrite)
    with _progress() as bar:
        rows = run_fit_data(lm, docs, settings, run, progress=_bars(bar))
    err.print(
        f"wrote {len(rows):,} rows ({len(docs)} document(s)) to {output.out_dir}/{ROWS}", markup=False, highlight=False
    )


def _bars(bar):
    """``run_fit_data``'s progress as one bar per document: its trace, then its label draws."""
    tasks: dict = {}

    def progress(name: str, stage: str, done: int, total: int | None) -> None:
        if name not in tasks:
            tasks[name] = bar.add_task(f"{stage} {name}", total=total)
        bar.update(tasks[name], description=f"{stage} {name}", completed=done, total=total)

    return progress


@settings_options(output={"out_file": "The fitted policy JSON to write."})
def fit(
    runs: List[Path] = typer.Argument(..., help="Run directories of fi fit-data (their documents are pooled)."),
    *,
    settings: FitSettings,
    output: OutFileSettings,
):
    """Fit a linear score of compression-time signals to per-(layer, KV head) FI; cross-validated leaving one document
    out."""
    record = run_fit(settings, runs, output.out_file, overwrite=output.overwrite)
    names = settings.features
    if settings.learner == "lambdarank":
        header = (
            f"learned a LambdaRank model on {len(names)} feature(s), {record['rows']:,} rows of "
            f"{len(record['documents'])} documents ({record['rounds']} rounds, one query group per "
            f"{'KV head' if settings.group == 'head' else 'layer'})"
        )
        weights = [
            f"{n:18s} gain {significant(g, 4)}"
            for n, g in sorted(record["importance_gain"].items(), key=lambda t: -t[1])
        ]
        _print_fit(header, weights, "learned", record, output.out_file)
        return
    header = (
        f"fitted {len(names)} feature(s) on {record['rows']:,} rows of {len(record['documents'])} documents "
        f"(target {settings.target}, ridge {significant(settings.ridge)})"
    )
    weights = [
        f"{n:18s} {signed_text(c, 4)}" for n, c in sorted(zip(names, record["coefficients"]), key=lambda t: -abs(t[1]))
    ]
    _print_fit(header, weights, "fitted", record, output.out_file)


def _print_fit(header: str, weights: list[str], own: str, record: dict, out_file: Path) -> None:
    """What fi fit prints for either learner: the header, one line per feature, the leave-one-document-out
    Spearman of its own score (``own``: fitted or learned) beside SnapKV's and InfoKV's, and the file written."""
    out.print(header)
    for line in weights:
        out.print(f"  {line}")
    fmt = {k: signed_text(v) for k, v in record["cross_validation"]["mean"].items()}
    out.print(
        f"leave-one-document-out mean within-head Spearman with FI: {own} {fmt[f'spearman_{own}']}, "
        f"snapkv {fmt['spearman_snapkv']}, infokv {fmt['spearman_infokv']}"
    )
    if "layer_spearman_learned" in fmt:  # a per-layer ranker: how it ranks across the heads of a layer
        out.print(
            f"leave-one-document-out mean within-layer Spearman with FI (all KV heads): {own} "
            f"{fmt['layer_spearman_learned']}, h2o {fmt.get('layer_spearman_h2o', 'n/a')}"
        )
    err.print(f"wrote {out_file}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``fit-data`` and ``fit`` to ``app``."""
    app.command("fit-data")(fit_data)
    app.command()(fit)
