"""Whole studies over several documents, resumable: ``fi correlate`` and ``fi nearfar`` in one call each.

Each document is traced once, measured, and its tables saved before the next one starts
(:class:`~fi_toolkit.runs.resumable.ResumableRun`); the cross-document summaries are recomputed
from the saved per-document tables at the end.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.model.loading import dtype_name
from fi_toolkit.probe.chunks import Chunk, check_chunks
from fi_toolkit.probe.experiment import max_context, trace_document
from fi_toolkit.probe.forward_influence import chunk_reference
from fi_toolkit.probe.noise_floor import CONTROL_LABELS, flag_below_noise_floor, noise_floor
from fi_toolkit.runs import results
from fi_toolkit.runs.resumable import (
    ResumableRun,
    check_unit_size,
    document_keys,
    last_document,
    part_slice,
    split_units,
)
from fi_toolkit.runs.settings import RunSettings, run_settings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.agreement import summarize_agreement
from fi_toolkit.studies.correlation import assemble_parts, correlate_document, summarize_correlations
from fi_toolkit.studies.nearfar import (
    add_relative_columns,
    count_sets,
    nearfar_chunks,
    nearfar_document,
    paired_tests,
    summarize_nearfar,
    token_class_summary,
)
from fi_toolkit.studies.study_options import check_estimator, check_unit_candidates, parse_candidates

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


def _manifest(lm, run: ResumableRun, started: str, seconds: float, keys: list[str], extra: dict) -> dict:
    units = run.units(keys)
    return {
        "command": run.command,
        "started": started,
        "finished": results.now(),
        "seconds": round(seconds, 2),
        "settings": run.settings,
        "computed_this_session": [u["document"] for u in units if u.get("session") == run.session],
        "model": lm.describe(),
        "versions": results.versions(),
        **extra,
        "world_size": run.world.size,
        "timing": run.timing,
        "units": units,
        "unit_log": run.unit_log(),
    }


def execute_run(
    lm,
    run: ResumableRun,
    units,
    compute,
    summaries: Callable[[dict], dict],
    extra: Callable[[dict], dict],
    costs=None,
    assemble=None,
) -> dict | None:
    """Run every unit (document or task sample), write the summaries, then the manifest with
    ``extra(tables)`` in it (the studies: each document's noise floor).

    Under torchrun the units are shared among the ranks (``costs`` balance them, default token counts);
    rank 0 writes the summaries and the manifest and returns the tables, the other ranks None.
    ``assemble(doc, parts)``: the units are parts of documents, joined per document at the merge.
    """
    started, t0 = results.now(), time.perf_counter()
    tables = run.run(units, compute, costs=costs, assemble=assemble)
    if tables is None:  # not rank 0 of a sharded run: its units are saved, rank 0 merges
        return None
    t1 = time.perf_counter()
    for name, table in summaries(tables).items():
        results.write_table(run.path / f"{name}.csv", table)
        tables[name] = table
    run.timing["summaries_s"] = round(time.perf_counter() - t1, 3)
    keys = document_keys([u.name for u in units])
    results.write_json(
        run.path / "manifest.json", _manifest(lm, run, started, time.perf_counter() - t0, keys, extra(tables))
    )
    run.finish()  # --overwrite: the new run, complete, replaces the old one only now
    return tables


def _floors(controls: str) -> Callable[[dict], dict]:
    """The manifest's noise floor per document, from the table named ``controls`` (its control rows)."""
    return lambda tables: {"noise_floor": noise_floor(tables[controls])}


def run_correlate(
    lm,
    docs,
    out_dir: Path | RunSettings,
    prefix: int,
    chunks: Sequence[Chunk],
    candidates: str = "sample:256",
    sinks: int = 4,
    seed: int = 0,
    n_resamples: int = 1000,
    config: SignalConfig = SignalConfig(),
    batch_size: int | None = None,
    block: int = 512,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    estimator: str = "exact",
    samples: int = 16,
    validate: int = 0,
    unit_candidates: int = 0,
) -> dict[str, pd.DataFrame]:
    """Per-token FI and correlations for every document -> ``tokens``, ``correlations``, ``correlation_summary``.

    ``out_dir``: the results directory, or a :class:`~fi_toolkit.runs.settings.RunSettings` (what
    ``fi correlate`` passes; then not ``resume``/``overwrite``); ``config``: the signal settings.

    ``estimator="fisher"``: the gradient estimate at every position of ``[sinks, p - w)``
    (``candidates`` unused), ``samples`` label draws; ``validate = N`` adds exact leave-one-out FI at
    N entropy-stratified positions and the tables ``validation``, ``agreement``, ``agreement_summary``.

    ``unit_candidates = n > 0`` (exact only) splits every document into blocks of ``n`` candidates,
    each a unit of its own; the coefficients are computed when the blocks are joined, and
    the tables are the same as an unsplit run's.
    """
    kind, n_wanted = parse_candidates(candidates)
    config.check()
    if sinks < 0 or n_resamples < 0 or seed < 0 or (batch_size is not None and batch_size < 1):
        raise FIError(
            "sinks, seed and n_resamples must be >= 0 and batch_size >= 1",
            parameter=("sinks", "seed", "n_resamples", "batch_size"),
        )
    if sinks >= prefix - config.window:
        raise FIError(
            f"sinks {sinks} leaves no candidates: the scored prefix [0, {prefix - config.window}) "
            f"has {prefix - config.window} positions",
            parameter="sinks",
        )
    check_estimator(estimator, samples, validate, prefix - config.window - sinks)
    check_unit_candidates(unit_candidates, estimator)
    settings = {
        **_describe(lm, docs, prefix, chunks, config),
        "candidates": candidates,
        "sinks": sinks,
        "seed": seed,
        "n_resamples": n_resamples,
    }
    if estimator != "exact":  # exact runs keep the settings they always had, so their --resume still matches
        settings.update(candidates="all", estimator=estimator, samples=samples, validate=validate)
    if unit_candidates:
        settings["unit_candidates"] = unit_candidates
    n_candidates = min(prefix - config.window - sinks, n_wanted or prefix)
    units, costs = split_units(docs, n_candidates, unit_candidates)
    where = run_settings(out_dir, resume, overwrite).check()
    run = ResumableRun(where.out, "correlate", settings, where.resume, where.overwrite)
    setup = _document_setup(lm, prefix, config, chunks, block, bool(unit_candidates))

    def compute(unit):
        doc, (trace, reference) = setup(unit)
        if estimator == "fisher":
            total = samples + (validate + len(CONTROL_LABELS) if validate else 0)
        else:
            total = len(range(n_candidates)[part_slice(unit, unit_candidates)])
            total += len(CONTROL_LABELS) if getattr(unit, "index", 0) == 0 else 0
        done = [0]

        def tick(n):
            done[0] += n
            if progress:
                progress(unit.name, done[0], total)

        return correlate_document(
            lm.model,
            doc,
            trace,
            chunks,
            candidates,
            sinks,
            seed,
            n_resamples,
            batch_size,
            block,
            _token_text(lm),
            tick,
            estimator,
            samples,
            validate,
            part_slice(unit, unit_candidates) if unit_candidates else None,
            reference,
        )

    def summaries(tables):
        out = {"correlation_summary": summarize_correlations(tables["correlations"])}
        if "agreement" in tables:
            out["agreement_summary"] = summarize_agreement(tables["agreement"])
        return out

    def assemble(doc, parts):
        return assemble_parts(doc.name, parts, chunks, prefix, n_resamples, seed, kind)

    return execute_run(
        lm, run, units, compute, summaries, _floors("controls"), costs, assemble if unit_candidates else None
    )


def run_nearfar(
    lm,
    docs,
    out_dir: Path | RunSettings,
    prefix: int,
    distances: Sequence[int],
    chunk_len: int,
    budget: str = "remove=0.1",
    seeds: int = 3,
    sinks: Sequence[int] = (4, 0),
    config: SignalConfig = SignalConfig(),
    batch_size: int | None = None,
    block: int = 512,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    unit_sets: int = 0,
    selections: Sequence[str] = (),
) -> dict[str, pd.DataFrame]:
    """Near/far set analysis for every document -> ``nearfar``, ``token_classes`` and their summaries/tests.

    ``selections``: ``--select`` specs measured beside the study's sets (``kvpress:NAME@RATIO``,
    ``policy:NAME@BUDGET``), each resolved once per document (:func:`nearfar_document`).

    ``out_dir``: the results directory or a :class:`~fi_toolkit.runs.settings.RunSettings` (as in
    :func:`run_correlate`).

    ``unit_sets = n > 0`` splits every document into parts of ``n`` sets (the controls go with the
    first), each a unit of its own: torchrun's ranks then share documents when they are few.
    Consecutive parts of one document on one rank share its trace and reference run; the tables are
    the same as an unsplit run's.
    """
    chunks = nearfar_chunks(prefix, distances, chunk_len)
    config.check()
    if (batch_size is not None and batch_size < 1) or any(s < 0 for s in sinks):
        raise FIError("batch_size must be >= 1 and sink counts >= 0", parameter="batch_size")
    check_unit_size(unit_sets, "unit_sets")
    settings = {
        **_describe(lm, docs, prefix, chunks, config),
        "distances": sorted(distances),
        "chunk_len": chunk_len,
        "budget": Budget.parse(budget).label,
        "seeds": seeds,
        "sinks": list(sinks),
    }
    if selections:  # runs without them keep the settings they always had, so their --resume still matches
        settings["selections"] = list(selections)
    n_sets = count_sets(budget, seeds, sinks, selections)
    units, costs = split_units(docs, n_sets, unit_sets)
    if unit_sets:  # unsplit runs keep the settings they always had, so their --resume still matches
        settings["unit_sets"] = unit_sets
    where = run_settings(out_dir, resume, overwrite).check()
    run = ResumableRun(where.out, "nearfar", settings, where.resume, where.overwrite)
    setup = _document_setup(lm, prefix, config, chunks, block, bool(unit_sets))

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
            trace,
            chunks,
            budget,
            seeds,
            tuple(sinks),
            batch_size,
            block,
            _token_text(lm),
            tick,
            part_slice(unit, unit_sets),
            reference,
            selections,
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

    return execute_run(lm, run, units, compute, summaries, _floors("nearfar"), costs, assemble if unit_sets else None)


def _document_setup(lm, prefix: int, config: SignalConfig, chunks: Sequence[Chunk], block: int, split: bool):
    """``setup(unit) -> (document, (trace, reference run))``. Parts of one document that follow each other
    on a rank share its trace and reference run (:func:`last_document`); whole documents are traced as
    before, and their reference is made inside the probe."""

    def make(doc):
        trace = trace_document(lm, doc, prefix, config)
        return trace, chunk_reference(lm.model, trace, doc.ids, chunks, block) if split else None

    return last_document(make, keep=split)
