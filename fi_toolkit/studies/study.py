"""Whole studies over several documents, resumable: ``fi correlate`` and ``fi nearfar`` in one call each,
:func:`run_correlate` taking a :class:`~fi_toolkit.studies.correlate_settings.CorrelateSettings` and
:func:`run_nearfar` a :class:`~fi_toolkit.studies.nearfar_settings.NearfarSettings` (the objects the command
line builds from its options).

Each document is traced once, measured, and its tables saved before the next one starts
(:class:`~fi_toolkit.runs.resumable.ResumableRun`); the cross-document summaries are recomputed
from the saved per-document tables at the end.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.model.loading import dtype_name
from fi_toolkit.probe.chunks import Chunk, check_chunks
from fi_toolkit.probe.estimator_options import DEFAULT_SAMPLES
from fi_toolkit.probe.experiment import max_context, trace_document
from fi_toolkit.probe.forward_influence import chunk_reference
from fi_toolkit.probe.noise_floor import CONTROL_LABELS, flag_below_noise_floor, noise_floor
from fi_toolkit.runs.execute import execute_run
from fi_toolkit.runs.resumable import (
    ResumableRun,
    last_document,
    part_slice,
    split_units,
)
from fi_toolkit.runs.settings import RunSettings, check_type, run_settings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.agreement import summarize_agreement
from fi_toolkit.studies.correlate_settings import CorrelateSettings
from fi_toolkit.studies.correlation import assemble_parts, correlate_document, summarize_correlations
from fi_toolkit.studies.nearfar import (
    add_relative_columns,
    count_sets,
    nearfar_document,
    paired_tests,
    summarize_nearfar,
    token_class_summary,
)
from fi_toolkit.studies.nearfar_settings import NearfarSettings
from fi_toolkit.studies.study_options import parse_candidates

Progress = Callable[[str, int, int], None]  # (document name, done, total) after each batch


def _token_text(lm) -> Callable[[int], str] | None:
    if lm.tokenizer is None:
        return None
    return lambda i: lm.tokenizer.decode([int(i)])


def _describe(lm, docs, prefix: int, chunks: Sequence[Chunk], config: SignalConfig) -> dict:
    for doc in docs:
        check_chunks(chunks, prefix, len(doc), max_context(lm))
    if prefix <= config.window:
        raise FIError(f"prefix of {prefix} tokens leaves nothing to score with a window of {config.window}")
    return {
        "model": lm.name,
        "dtype": dtype_name(lm.dtype),
        "compute_dtype": dtype_name(lm.compute_dtype),
        "documents": [{"name": d.name, "sha256": d.sha256, "tokens": len(d)} for d in docs],
        "prefix": prefix,
        "chunks": [c.label for c in chunks],
        "signals": asdict(config),
    }


def _floors(controls: str) -> Callable[[dict], dict]:
    """The manifest's noise floor per document, from the table named ``controls`` (its control rows)."""
    return lambda tables: {"noise_floor": noise_floor(tables[controls])}


def run_correlate(
    lm,
    docs: Sequence[Document],
    settings: CorrelateSettings,
    run: RunSettings | Path | str,
    *,
    block: int = 512,
    progress: Progress | None = None,
) -> dict[str, pd.DataFrame] | None:
    """Per-token FI and correlations for every document -> ``tokens``, ``correlations``, ``correlation_summary``,
    ``controls`` (with ``settings.validate``: also ``validation``, ``agreement``, ``agreement_summary``).

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        docs: the documents; each must reach ``settings.document_tokens()`` tokens.
        settings: what to measure (:class:`~fi_toolkit.studies.correlate_settings.CorrelateSettings`). With
            ``estimator="fisher"`` the gradient estimate at every position of ``[sinks, p - w)``; with
            ``unit_candidates = n > 0`` (exact only) every document is split into blocks of ``n`` candidates,
            each a unit of its own, the coefficients computed when the blocks are joined (the same tables as
            an unsplit run's).
        run: the results directory, or a :class:`~fi_toolkit.runs.settings.RunSettings` (resume, overwrite).
        block: query positions per block of the continuation forward.
        progress: ``progress(unit, done, total)`` after each batch.

    Returns:
        The tables; under torchrun the units are shared among the ranks, rank 0 returns the tables, the
        others None.
    """
    check_type("settings", settings, CorrelateSettings)
    s, config, prefix, chunks = settings, settings.signals, settings.prefix, settings.chunks
    exact = s.estimator == "exact"
    candidates = s.candidates if exact else "all"
    kind, n_wanted = parse_candidates(candidates)
    samples = s.samples if s.samples is not None else DEFAULT_SAMPLES
    validate = s.validate or 0
    described = {
        **_describe(lm, docs, prefix, chunks, config),
        "candidates": candidates,
        "sinks": s.sinks,
        "seed": s.seed,
        "n_resamples": s.resamples,
    }
    if not exact:  # exact runs keep the settings they always had, so their --resume still matches
        described.update(candidates="all", estimator=s.estimator, samples=samples, validate=validate)
    if s.unit_candidates:
        described["unit_candidates"] = s.unit_candidates
    n_candidates = min(prefix - config.window - s.sinks, n_wanted or prefix)
    units, costs = split_units(docs, n_candidates, s.unit_candidates)
    where = run_settings(run).check()
    resumable = ResumableRun(where.out, "correlate", described, where.resume, where.overwrite)
    setup = _document_setup(lm, prefix, config, chunks, block, bool(s.unit_candidates))

    def compute(unit):
        doc, (trace, reference) = setup(unit)
        if not exact:
            total = samples + (validate + len(CONTROL_LABELS) if validate else 0)
        else:
            total = len(range(n_candidates)[part_slice(unit, s.unit_candidates)])
            total += len(CONTROL_LABELS) if getattr(unit, "index", 0) == 0 else 0
        done = [0]

        def tick(n):
            done[0] += n
            if progress:
                progress(unit.name, done[0], total)

        return correlate_document(
            lm.model,
            doc,
            trace=trace,
            chunks=chunks,
            candidates=candidates,
            sinks=s.sinks,
            seed=s.seed,
            n_resamples=s.resamples,
            batch_size=s.batch_size,
            block=block,
            token_text=_token_text(lm),
            on_progress=tick,
            estimator=s.estimator,
            samples=samples,
            validate=validate,
            part=part_slice(unit, s.unit_candidates) if s.unit_candidates else None,
            reference=reference,
        )

    def summaries(tables):
        out = {"correlation_summary": summarize_correlations(tables["correlations"])}
        if "agreement" in tables:
            out["agreement_summary"] = summarize_agreement(tables["agreement"])
        return out

    def assemble(doc, parts):
        return assemble_parts(doc.name, parts, chunks, prefix, s.resamples, s.seed, kind)

    joined = assemble if s.unit_candidates else None
    return execute_run(lm, resumable, units, compute, summaries, _floors("controls"), costs, joined)


def run_nearfar(
    lm,
    docs: Sequence[Document],
    settings: NearfarSettings,
    run: RunSettings | Path | str,
    *,
    block: int = 512,
    progress: Progress | None = None,
) -> dict[str, pd.DataFrame] | None:
    """Near/far set analysis for every document -> ``nearfar``, ``token_classes`` and their summaries/tests.

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        docs: the documents; each must reach ``settings.document_tokens()`` tokens.
        settings: what to measure (:class:`~fi_toolkit.studies.nearfar_settings.NearfarSettings`). Its
            ``selections`` are measured beside the study's sets, each resolved once per document
            (:func:`nearfar_document`); ``unit_sets = n > 0`` splits every document into parts of ``n`` sets
            (the controls go with the first), each a unit of its own, so torchrun's ranks share documents
            when they are few: consecutive parts of one document on one rank share its trace and reference
            run, and the tables are the same as an unsplit run's.
        run: the results directory, or a :class:`~fi_toolkit.runs.settings.RunSettings` (resume, overwrite).
        block: query positions per block of the continuation forward.
        progress: ``progress(unit, done, 0)`` after each batch.

    Returns:
        The tables; under torchrun the units are shared among the ranks, rank 0 returns the tables, the
        others None.
    """
    check_type("settings", settings, NearfarSettings)
    s, config, prefix, chunks = settings, settings.signals, settings.prefix, settings.chunks
    sinks = s.sink_options
    described = {
        **_describe(lm, docs, prefix, chunks, config),
        "distances": sorted(s.distances),
        "chunk_len": s.chunk_len,
        "budget": s.budget.label,
        "seeds": s.seeds,
        "sinks": list(sinks),
    }
    if s.selections:  # runs without them keep the settings they always had, so their --resume still matches
        described["selections"] = list(s.selections)
    n_sets = count_sets(s.budget, s.seeds, sinks, s.selections)
    units, costs = split_units(docs, n_sets, s.unit_sets)
    if s.unit_sets:  # unsplit runs keep the settings they always had, so their --resume still matches
        described["unit_sets"] = s.unit_sets
    where = run_settings(run).check()
    resumable = ResumableRun(where.out, "nearfar", described, where.resume, where.overwrite)
    setup = _document_setup(lm, prefix, config, chunks, block, bool(s.unit_sets))

    def compute(unit):
        doc, (trace, reference) = setup(unit)
        done = [0]

        def tick(n):
            done[0] += n
            if progress:
                progress(unit.name, done[0], 0)

        return nearfar_document(
            lm.model,
            doc,
            trace=trace,
            chunks=chunks,
            budget=s.budget,
            seeds=s.seeds,
            sink_options=sinks,
            batch_size=s.batch_size,
            block=block,
            token_text=_token_text(lm),
            on_progress=tick,
            sets=part_slice(unit, s.unit_sets),
            reference=reference,
            selections=s.selections,
        )

    def summaries(tables):
        nf = add_relative_columns(tables["nearfar"])
        return {
            "nearfar": nf,
            "nearfar_summary": summarize_nearfar(nf),
            "nearfar_tests": paired_tests(nf),
            "token_class_summary": token_class_summary(tables["token_classes"]),
        }

    def assemble(doc, parts):
        return {"nearfar": flag_below_noise_floor(parts["nearfar"]), "token_classes": parts["token_classes"]}

    joined = assemble if s.unit_sets else None
    return execute_run(lm, resumable, units, compute, summaries, _floors("nearfar"), costs, joined)


def _document_setup(lm, prefix: int, config: SignalConfig, chunks: Sequence[Chunk], block: int, split: bool):
    """``setup(unit) -> (document, (trace, reference run))``. Parts of one document that follow each other
    on a rank share its trace and reference run (:func:`last_document`); whole documents are traced as
    before, and their reference is made inside the probe."""

    def make(doc):
        trace = trace_document(lm, doc, prefix, config)
        return trace, chunk_reference(lm.model, trace, doc.ids, chunks, block) if split else None

    return last_document(make, keep=split)
