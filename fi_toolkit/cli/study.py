"""``fi correlate``, ``fi nearfar`` and ``fi report``: the studies on the command line.

``fi correlate`` -> :func:`fi_toolkit.studies.run_correlate`; ``fi nearfar`` ->
:func:`fi_toolkit.studies.run_nearfar`; ``fi report`` -> :func:`fi_toolkit.report.build_report`.
Both studies write one set of tables per document as it finishes; ``--resume`` continues a stopped
run and refuses different settings.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer

from fi_toolkit.cli.options import (
    _progress,
    check_prefix,
    check_resamples,
    check_selections,
    check_sinks,
    distinct_texts,
    err,
    out,
    settings_options,
    unit_progress,
)
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig

DocsArg = typer.Argument(None, help="Text/JSONL files or bundled names (default: alice).")
BatchOpt = typer.Option(None, help="Evictions per batched forward (default: 1 on CPU, 8 on CUDA).")


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
    chunk: List[str] = typer.Option(..., "--chunk", "-c", help="Future chunk START:END (repeatable)."),
    prefix: Optional[int] = typer.Option(None, help="Compression point p (default: smallest chunk start)."),
    candidates: Optional[str] = typer.Option(
        None,
        help="'all', 'sample:N' (N uniform positions; all of them when N is at least their number) or 'stratified:N' "
        "(by entropy, reweighted); default sample:256. --estimator exact only.",
    ),
    estimator: Optional[str] = typer.Option(
        None,
        help="'exact' (leave-one-out FI of the candidates, the default) or 'fisher' (the gradient estimate at every "
        "position of [sinks, p - w) in one pass; docs/method.md, 'Gradient estimator').",
    ),
    samples: Optional[int] = typer.Option(
        None, help="--estimator fisher: label draws per chunk (default 16); more draws, smaller standard error."
    ),
    validate: Optional[int] = typer.Option(
        None,
        help="--estimator fisher: also measure exact FI at N entropy-stratified positions and report the agreement "
        "(Spearman, Pearson, top-10 percent overlap, bootstrap CIs).",
    ),
    sinks: int = typer.Option(4, help="First N positions are never candidates."),
    seed: int = typer.Option(0, help="Seed of the candidate sample and the bootstrap."),
    resamples: int = typer.Option(1000, help="Bootstrap resamples per coefficient (0: no intervals)."),
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    batch_size: Optional[int] = BatchOpt,
    run: RunSettings = RunSettings(Path("runs/correlate")),
    unit_candidates: int = typer.Option(
        0,
        "--unit-candidates",
        help="Split each document into work units of N candidates (exact FI; 0: one "
        "unit per document), so torchrun's ranks share documents; same tables.",
    ),
):
    """Per-token (leave-one-out) FI of candidate positions, correlated with H, A, D, E, S (and per layer)."""
    from fi_toolkit.probe.chunks import check_chunks, parse_chunk
    from fi_toolkit.studies.study_options import check_unit_candidates, parse_candidates

    model.check()
    chunks = [parse_chunk(c) for c in chunk]
    p = prefix if prefix is not None else min(c.start for c in chunks)
    config = signals.check()
    check_chunks(chunks, p, float("inf"), None)  # chunk starts vs p now; lengths once the documents are read
    check_prefix(p, config.window)
    scored = check_sinks(sinks, p, config.window)
    estimator, candidates, samples, validate = _estimator_options(
        estimator, candidates, samples, validate, batch_size, scored - sinks
    )
    parse_candidates(candidates)
    check_unit_candidates(unit_candidates, estimator)
    check_resamples(resamples)
    if batch_size is not None and batch_size < 1:
        raise FIError(f"--batch-size must be >= 1, got {batch_size}")
    if seed < 0:
        raise FIError(f"--seed must be >= 0, got {seed}")
    texts = _read_documents(documents)
    run.check("correlate")
    # every check above imports nothing heavy (usage errors answer at once); the study does
    from fi_toolkit.cli.console import print_warning
    from fi_toolkit.probe.noise_floor import noise_floor, noise_warning
    from fi_toolkit.studies import run_correlate

    docs, tables = _run_study(
        "correlate",
        model,
        texts,
        max(c.end for c in chunks),
        lambda lm, docs, progress: run_correlate(
            lm,
            docs,
            run,
            p,
            chunks,
            candidates,
            sinks,
            seed,
            resamples,
            config,
            batch_size,
            progress=progress,
            estimator=estimator,
            samples=samples,
            validate=validate,
            unit_candidates=unit_candidates,
        ),
    )
    if tables is None:  # a rank other than 0 of a sharded run: rank 0 reports
        return
    s = tables["correlation_summary"]
    s = s[(s["scope"] == "mean") & (s["method"] == "spearman")]
    pivot = s.pivot_table(index="signal", columns="chunk", values="rho_mean", sort=False)
    out.print(f"Spearman rho of per-token FI with each signal (mean over {len(docs)} document(s)), p={p}")
    out.print(pivot.to_string(float_format=lambda v: f"{v:+.3f}"))
    if "agreement_summary" in tables:
        a = tables["agreement_summary"]
        out.print(
            f"agreement of the fisher estimate with exact FI on {validate} validated positions per document "
            "(mean over documents)"
        )
        out.print(
            a.pivot_table(index="metric", columns="chunk", values="value_mean", sort=False).to_string(
                float_format=lambda v: f"{v:+.3f}"
            )
        )
    print_warning(noise_warning(tables["tokens"], noise_floor(tables["controls"])))
    extra = ", agreement.csv, validation.csv" if "agreement" in tables else ""
    err.print(
        f"results: {run.out}/ (correlations.csv, correlation_summary.csv, tokens.csv, controls.csv{extra}, "
        "manifest.json)",
        markup=False,
        highlight=False,
    )


def _estimator_options(estimator, candidates, samples, validate, batch_size, n_candidates: int):
    """Resolve ``--estimator`` and the options that go with it; refuse any option the estimator would ignore."""
    from fi_toolkit.probe.estimator_options import DEFAULT_SAMPLES
    from fi_toolkit.studies.study_options import check_estimator

    estimator = (estimator or "exact").strip().lower()
    if estimator == "fisher":
        if candidates is not None:
            raise FIError(
                "--candidates goes with --estimator exact: --estimator fisher covers every position of "
                "[sinks, p - w) (use --validate N for exact FI at N of them)"
            )
        if batch_size is not None and not validate:
            raise FIError("--batch-size sets the batches of exact FI: with --estimator fisher it needs --validate N")
    elif samples is not None or validate is not None:
        raise FIError("--samples and --validate go with --estimator fisher")
    samples = DEFAULT_SAMPLES if samples is None else samples
    validate = 0 if validate is None else validate
    check_estimator(estimator, samples, validate, n_candidates)
    return estimator, candidates or "sample:256", samples, validate


@settings_options()
def nearfar(
    documents: List[str] = DocsArg,
    prefix: int = typer.Option(1024, help="Compression point p."),
    distances: str = typer.Option("0,256,512,1024", help="Chunk starts as distances from p, comma-separated."),
    chunk_len: int = typer.Option(256, help="Tokens per chunk."),
    budget: str = typer.Option(
        "remove=0.1",
        "--budget",
        "-b",
        help="Set size, one budget for every set: remove=X or keep=X, a share of the prefix "
        "[0, p) (0.1) or a token count (100).",
    ),
    seeds: int = typer.Option(3, help="Random sets (seeds 0..N-1)."),
    sinks: int = typer.Option(4, help="Sink protection: the first N positions are never selected."),
    no_sink_runs: bool = typer.Option(
        True, "--with-unprotected/--protected-only", help="Also measure every set without sink protection."
    ),
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    batch_size: Optional[int] = BatchOpt,
    run: RunSettings = RunSettings(Path("runs/nearfar")),
    unit_sets: int = typer.Option(
        0,
        "--unit-sets",
        help="Split each document into work units of N sets (0: one unit per document), "
        "so torchrun's ranks share documents when they are few; same tables.",
    ),
):
    """Equal-size sets by entropy/attention/distance/InfoKV/random: FI on chunks at increasing distance from p."""
    from fi_toolkit.budget import Budget
    from fi_toolkit.probe.selections import parse_selections
    from fi_toolkit.runs.units import check_unit_size
    from fi_toolkit.studies.nearfar_spec import nearfar_chunks, nearfar_selections, parse_distances

    model.check()
    dist = parse_distances(distances)
    chunks = nearfar_chunks(prefix, dist, chunk_len)
    Budget.parse(budget, "--budget")
    nearfar_selections(budget, seeds)
    config = signals.check()
    check_prefix(prefix, config.window)
    check_sinks(sinks, prefix, config.window)
    sets = [replace(s, source=f"--budget {budget}") for s in parse_selections(nearfar_selections(budget, seeds))]
    check_selections(sets, prefix, config.window, sinks)
    if batch_size is not None and batch_size < 1:
        raise FIError(f"--batch-size must be >= 1, got {batch_size}")
    sink_options = (sinks, 0) if no_sink_runs and sinks > 0 else (sinks,)
    check_unit_size(unit_sets, "--unit-sets")
    texts = _read_documents(documents)
    run.check("nearfar")
    # every check above imports nothing heavy (usage errors answer at once); the study does
    from fi_toolkit.cli.console import print_warning
    from fi_toolkit.probe.noise_floor import noise_warning
    from fi_toolkit.studies import run_nearfar

    docs, tables = _run_study(
        "nearfar",
        model,
        texts,
        max(c.end for c in chunks),
        lambda lm, docs, progress: run_nearfar(
            lm,
            docs,
            run,
            prefix,
            dist,
            chunk_len,
            budget,
            seeds,
            sink_options,
            config,
            batch_size,
            progress=progress,
            unit_sets=unit_sets,
        ),
    )
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
    s = _whole_sinks(tables["nearfar_summary"])
    for metric, label in (("fi_mean", "FI (nats)"), ("fi_share_near_mean", "FI / nearest-chunk FI")):
        pivot = s.pivot_table(index=["sinks", "selector"], columns="distance_from_p", values=metric, sort=False)
        out.print(f"{label}, mean over {n_docs} document(s); columns: chunk start - p")
        out.print(pivot.to_string(float_format=lambda v: f"{v:.5f}"))
    t = _whole_sinks(tables["nearfar_tests"])
    t = t[t["metric"].isin(["fi", "fi_share_near"])]
    out.print("entropy > attention across documents (one-sided Wilcoxon signed-rank):")
    out.print(t[["sinks", "distance_from_p", "metric", "a_wins", "n_documents", "wilcoxon_p"]].to_string(index=False))


def report(
    runs: List[Path] = typer.Argument(
        ...,
        help="Result directories of fi correlate / fi nearfar / fi eval, or lm-eval output directories (fi lm-eval).",
    ),
    formats: str = typer.Option("html,md,csv,json", "--format", "-f", help="Any of html,md,csv,json."),
    out_dir: Path = typer.Option(Path("report"), "--out", "-o", help="Report directory."),
    overwrite: bool = typer.Option(False, help="Replace a report (or other results) already in --out."),
):
    """Turn result directories into a self-contained HTML page, Markdown, and CSV/JSON tables."""
    from fi_toolkit.report.preflight import check_run_dirs, parse_formats
    from fi_toolkit.runs import results

    chosen = parse_formats(formats)
    check_run_dirs(runs, resume="--resume")
    results.check_out_path(out_dir)
    # every check above imports nothing heavy (usage errors answer at once); reading the runs does
    from fi_toolkit.report import build_report

    written = build_report(runs, out_dir, chosen, overwrite=overwrite)
    for path in written:
        if path.suffix in (".html", ".md", ".json"):
            err.print(f"wrote {path}", markup=False, highlight=False)
    if "csv" in formats:
        err.print(
            f"wrote {sum(p.suffix == '.csv' for p in written)} CSV table(s) under {out_dir}/tables/",
            markup=False,
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    """Add ``correlate``, ``nearfar`` and ``report`` to ``app``."""
    app.command()(correlate)
    app.command()(nearfar)
    app.command()(report)
