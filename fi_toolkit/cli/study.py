"""``fi correlate``, ``fi nearfar`` and ``fi report``: the studies on the command line.

Every option is a settings field (:func:`fi_toolkit.cli.options.settings_options`). ``fi correlate``: its
options become a :class:`~fi_toolkit.studies.correlate_settings.CorrelateSettings` (checked on construction,
before the model loads), :func:`fi_toolkit.studies.run_correlate` computes, and this module prints; ``fi
nearfar`` likewise with :class:`~fi_toolkit.studies.nearfar_settings.NearfarSettings` and
:func:`fi_toolkit.studies.run_nearfar`; ``fi report``: a
:class:`~fi_toolkit.report.report_settings.ReportSettings` (the formats) and a
:class:`~fi_toolkit.runs.settings.RunSettings` (``--out``, ``--overwrite``) ->
:func:`fi_toolkit.report.build_report`. Both studies write one set of tables per document as it finishes;
``--resume`` continues a stopped run and refuses different settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from fi_toolkit.cli.options import (
    _progress,
    check_document_lengths,
    chunk_ending,
    distinct_texts,
    err,
    out,
    settings_options,
    unit_progress,
)
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.report.report_settings import ReportSettings, report_dir
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.correlate_settings import CorrelateSettings
from fi_toolkit.studies.nearfar_settings import NearfarSettings

DocsArg = typer.Argument(None, help="Text/JSONL files or bundled names (default: alice).")


def _read_documents(specs):
    from fi_toolkit.documents import read_texts

    return distinct_texts([t for spec in (specs or [None]) for t in read_texts(spec)])


def _run_study(label: str, model: ModelSettings, texts, max_tokens: int, study):
    """Load the model, tokenise ``texts``, then ``study(lm, docs, progress)`` under a progress bar per document."""
    from fi_toolkit.documents import tokenize_texts

    lm = model.load()
    docs = tokenize_texts(texts, lm.tokenizer, max_tokens=max_tokens)
    with _progress() as bar:
        return docs, study(lm, docs, unit_progress(bar, label))


@settings_options()
def correlate(
    documents: List[str] = DocsArg,
    *,
    settings: CorrelateSettings,
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    run: RunSettings = RunSettings(Path("runs/correlate")),
):
    """Per-token (leave-one-out) FI of candidate positions, correlated with H, A, D, E, S (and per layer)."""
    model.check()
    texts = _read_documents(documents)
    needed = settings.document_tokens()
    check_document_lengths(model, texts, needed, chunk_ending(settings.chunks, needed, f"token {needed:,}"))
    run.check("correlate")
    # every check above imports nothing heavy (usage errors answer at once); the study does
    from fi_toolkit.cli.console import print_warning
    from fi_toolkit.report.noise import noise_warning
    from fi_toolkit.report.numbers import signed_text
    from fi_toolkit.studies.study import run_correlate

    study = lambda lm, docs, progress: run_correlate(lm, docs, settings, run, progress=progress)  # noqa: E731
    docs, tables = _run_study("correlate", model, texts, settings.document_tokens(), study)
    if tables is None:  # a rank other than 0 of a sharded run: rank 0 reports
        return
    s = tables["correlation_summary"]
    s = s[(s["scope"] == "mean") & (s["method"] == "spearman")]
    pivot = s.pivot_table(index="signal", columns="chunk", values="rho_mean", sort=False)
    out.print(f"Spearman rho of per-token FI with each signal (mean over {len(docs)} document(s)), p={settings.prefix}")
    out.print(pivot.to_string(float_format=signed_text))
    if "agreement_summary" in tables:
        a = tables["agreement_summary"]
        out.print(
            f"agreement of the fisher estimate with exact FI on {settings.validate} validated positions per document "
            "(mean over documents)"
        )
        out.print(
            a.pivot_table(index="metric", columns="chunk", values="value_mean", sort=False).to_string(
                float_format=signed_text
            )
        )
    print_warning(noise_warning(tables["tokens"], tables["controls"]))
    extra = ", agreement.csv, validation.csv" if "agreement" in tables else ""
    err.print(
        f"results: {run.out}/ (correlations.csv, correlation_summary.csv, tokens.csv, controls.csv{extra}, "
        "manifest.json)",
        markup=False,
        highlight=False,
    )


@settings_options()
def nearfar(
    documents: List[str] = DocsArg,
    *,
    settings: NearfarSettings,
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    run: RunSettings = RunSettings(Path("runs/nearfar")),
):
    """Equal-size sets by entropy/attention/distance/InfoKV/random: FI on chunks at increasing distance from p."""
    model.check()
    texts = _read_documents(documents)
    far = settings.chunks[-1]
    check_document_lengths(model, texts, far.end, f"the farthest chunk {far.label}")
    run.check("nearfar")
    # every check above imports nothing heavy (usage errors answer at once); the study does
    from fi_toolkit.cli.console import print_warning
    from fi_toolkit.report.noise import noise_warning
    from fi_toolkit.studies.study import run_nearfar

    study = lambda lm, docs, progress: run_nearfar(lm, docs, settings, run, progress=progress)  # noqa: E731
    docs, tables = _run_study("nearfar", model, texts, settings.document_tokens(), study)
    if tables is None:  # a rank other than 0 of a sharded run: rank 0 reports
        return
    _print_nearfar(tables, len(docs))
    print_warning(noise_warning(tables["nearfar"]))
    err.print(
        f"results: {run.out}/ (nearfar.csv, nearfar_summary.csv, nearfar_tests.csv, token_class_summary.csv)",
        markup=False,
        highlight=False,
    )


def _whole_sinks(table):
    """``table`` with its sink count as whole numbers (a mean or a merge may have made it float: "4.0")."""
    return table.assign(sinks=table["sinks"].round().astype("Int64")) if "sinks" in table else table


def _print_nearfar(tables, n_docs: int) -> None:
    """The summary's means and the paired tests, in the report's words and numbers (``n/a`` with its reason where
    a statistic is missing, never ``NaN``; column names as the report spells them)."""
    import pandas as pd

    from fi_toolkit.report.display import display_table, text_cells
    from fi_toolkit.report.numbers import number_text

    s = _whole_sinks(tables["nearfar_summary"])
    rows = pd.MultiIndex.from_frame(s[["sinks", "selector"]].drop_duplicates())  # a set with no value: n/a
    for metric, label in (("fi_mean", "FI (nats)"), ("fi_share_near_mean", "FI / nearest-chunk FI")):
        pivot = s.pivot_table(
            index=["sinks", "selector"], columns="distance_from_p", values=metric, sort=False, dropna=False
        ).reindex(rows)
        out.print(f"{label}, mean over {n_docs} document(s); columns: chunk start - p")
        out.print(pivot.to_string(float_format=number_text, na_rep="n/a"))
    t = _whole_sinks(tables["nearfar_tests"])
    t = t[t["metric"].isin(["fi", "fi_share_near"])]
    out.print("entropy > attention across documents (one-sided Wilcoxon signed-rank):")
    columns = ["sinks", "distance_from_p", "metric", "a_wins", "n_documents", "wilcoxon_p"]
    out.print(display_table(text_cells(t[columns])).to_string(index=False), soft_wrap=True)  # rows stay whole


@settings_options(
    where={
        "out": "Report directory.",
        "resume": None,  # a report is written whole
        "overwrite": "Replace a report (or other results) already in --out; in a directory of other files, write "
        "the report beside them.",
    }
)
def report(
    runs: List[Path] = typer.Argument(
        ...,
        help="Result directories of fi correlate / fi nearfar / fi eval, or lm-eval output directories (fi lm-eval).",
    ),
    *,
    settings: ReportSettings,
    where: RunSettings = RunSettings(Path("report")),
):
    """Turn result directories into a self-contained HTML page, Markdown, and CSV/JSON tables."""
    from fi_toolkit.report.preflight import REPORT_MARK, check_run_dirs

    check_run_dirs(runs, resume="--resume")
    report_dir(where, runs)
    # every check above imports nothing heavy (usage errors answer at once); reading the runs does
    from fi_toolkit.report import build_report

    written = build_report(runs, where.out, settings.formats, overwrite=where.overwrite)
    for path in written:
        if path.suffix in (".html", ".md", ".json") and path.name != REPORT_MARK:
            err.print(f"wrote {path}", markup=False, highlight=False)
    if "csv" in settings.formats:
        err.print(
            f"wrote {sum(p.suffix == '.csv' for p in written)} CSV table(s) under {where.out}/tables/",
            markup=False,
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    """Add ``correlate``, ``nearfar`` and ``report`` to ``app``."""
    app.command()(correlate)
    app.command()(nearfar)
    app.command()(report)
