"""The ``fi probe`` run: :func:`run_probe` measures Forward Influence of the settings' selections on every
document (:func:`fi_toolkit.probe.experiment.probe_document` per document), under torchrun each rank its
share of the documents, and writes ``fi.csv``, ``headroom.csv`` and ``manifest.json`` when given where.

From the command line: ``fi probe`` parses its options into a
:class:`~fi_toolkit.studies.probe_settings.ProbeSettings`, loads the model and the documents, calls
:func:`run_probe` and prints its tables.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from fi_toolkit.compress.future import generated_document
from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import check_chunks
from fi_toolkit.probe.experiment import max_context, probe_document, trace_document
from fi_toolkit.probe.headroom import headroom_table, with_oracle_seeds
from fi_toolkit.probe.noise_floor import CONTROL_LABELS, noise_floor
from fi_toolkit.probe.selections import trace_scorer
from fi_toolkit.runs import results
from fi_toolkit.runs.distributed import World, assign, current
from fi_toolkit.runs.settings import RunSettings, check_type
from fi_toolkit.studies.probe_settings import ProbeSettings, probe_dir

# progress(document, stage, done, total): stage "generate", "trace" or "probe"; total None while unknown
Progress = Callable[[str, str, int, "int | None"], None]


@dataclass
class ProbeResults:
    """What :func:`run_probe` measured: ``fi``, one row per document x eviction x chunk (the noise controls'
    rows first, as :func:`~fi_toolkit.probe.experiment.fi_table`; each FI oracle also at label seed 1, its own
    noise, :func:`~fi_toolkit.probe.headroom.with_oracle_seeds`); ``headroom``, each selection's share of the
    random-to-oracle gap where an FI oracle and random sets were measured beside other selections at one
    budget (:func:`~fi_toolkit.probe.headroom.headroom_table`), else None; ``out``, the results directory
    written, or None."""

    fi: pd.DataFrame
    headroom: pd.DataFrame | None = None
    out: Path | None = None


def run_probe(
    lm,
    docs: Sequence[Document],
    settings: ProbeSettings,
    run: RunSettings | None = None,
    *,
    new_dir_in: Path | None = None,
    progress: Progress | None = None,
) -> ProbeResults | None:
    """Forward Influence of every selection of ``settings`` on every document -> :class:`ProbeResults`.

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        docs: the documents; each must reach ``settings.document_tokens()`` tokens (longer ones are probed
            the same: only ``[0, last chunk end)`` is read).
        settings: what to measure (:class:`~fi_toolkit.studies.probe_settings.ProbeSettings`).
        run: where to write ``fi.csv``, ``headroom.csv`` and ``manifest.json`` (``run.overwrite`` replaces a
            run there, the old one kept whole until the new one is complete; a probe does not resume).
            None: nothing is written, unless ``new_dir_in``.
        new_dir_in: write into a fresh ``<new_dir_in>/probe-<time>-<random>``, made when the results are
            written (``fi probe`` without ``--out``: ``runs``). Not with ``run``.
        progress: called as documents are generated, traced and probed.

    Returns:
        The tables and where they were written; under torchrun rank 0 returns them, the others None.
    """
    check_type("settings", settings, ProbeSettings)
    if run is not None:
        probe_dir(run)
        if new_dir_in is not None:
            raise FIError("give run or new_dir_in, not both", parameter=("run", "new_dir_in"))
    if not docs:
        raise FIError("no document given", parameter="docs")
    started, t0 = results.now(), time.perf_counter()
    docs = list(docs)
    world, mine = _my_documents(docs)  # under torchrun: this rank's share (all of them in one process)
    _continue_documents(lm, docs, mine, settings, progress)
    parts = [(i, docs[i], _probe_one(lm, docs[i], settings, progress)) for i in mine]
    gathered = world.gather(parts)
    if gathered is None:  # a rank other than 0: its tables went to rank 0, which writes and reports
        return None
    parts = sorted((part for rank in gathered for part in rank), key=lambda part: part[0])
    docs = [d for _, d, _ in parts]
    table = pd.concat([t for _, _, t in parts], ignore_index=True)
    headroom = headroom_table(table)
    measured = ProbeResults(table, headroom if len(headroom) else None)
    if run is not None or new_dir_in is not None:
        manifest = _manifest(lm, docs, settings, table, started, time.perf_counter() - t0, world)
        measured.out = _write(measured, manifest, run, new_dir_in)
    return measured


def _my_documents(docs: list[Document]) -> tuple[World, list[int]]:
    """(world, indices of the documents this rank computes): all of them in one process; under torchrun
    a share balanced by token count (:func:`fi_toolkit.runs.distributed.assign`), an idle rank says so."""
    world = current()
    owner = assign([len(d) for d in docs], world.size)
    mine = [i for i, r in enumerate(owner) if r == world.rank]
    if world.sharded and not mine:
        print(
            f"note: rank {world.rank} of {world.size} has no document to compute ({len(docs)} document(s) for "
            f"{world.size} ranks); it waits for the others",
            file=sys.stderr,
        )
    return world, mine


def _continue_documents(lm, docs: list[Document], mine: list[int], settings: ProbeSettings, progress) -> None:
    """With a generated future, replace this rank's documents by their first ``p`` tokens and the model's
    continuation (in place); then every chunk must fit each document this rank probes."""
    p, fut, chunks = settings.prefix, settings.future, settings.chunks
    if fut.generated:
        check_chunks(chunks, p, p + fut.tokens, max_context(lm))
        for i in mine:
            if progress:
                progress(docs[i].name, "generate", 0, None)
            docs[i] = generated_document(lm, docs[i], p, fut)
    for i in mine if fut.generated else range(len(docs)):  # generated futures exist on their own rank only
        check_chunks(chunks, p, len(docs[i]), max_context(lm))


def _probe_one(lm, doc: Document, settings: ProbeSettings, progress) -> pd.DataFrame:
    """One document's FI table: its trace, then every selection (and the noise controls) on every chunk."""
    if progress:
        progress(doc.name, "trace", 0, None)
    trace = trace_document(lm, doc, settings.prefix, settings.signals, trace_scorer(settings.selections))
    selections = with_oracle_seeds(settings.selections)  # each FI oracle at a second label seed: its own noise
    total, done = len(selections) + len(CONTROL_LABELS), [0]

    def advance(n: int) -> None:
        done[0] += n
        progress(doc.name, "probe", done[0], total)

    if progress:
        progress(doc.name, "probe", 0, total)
    return probe_document(
        lm,
        doc,
        settings.chunks,
        selections,
        prefix=settings.prefix,
        sinks=settings.sinks,
        config=settings.signals,
        batch_size=settings.batch_size,
        trace=trace,
        on_progress=advance if progress else None,
    )


def _manifest(lm, docs, settings: ProbeSettings, table, started: str, seconds: float, world: World) -> dict:
    return {
        "command": "probe",
        "argv": sys.argv,
        "started": started,
        "finished": results.now(),
        "seconds": round(seconds, 2),
        "model": {**lm.describe(), "name": lm.name},
        "noise_floor": noise_floor(table),
        "documents": [{"name": d.name, "source": d.source, "sha256": d.sha256, "tokens_used": len(d)} for d in docs],
        "prefix": settings.prefix,
        "future": settings.future.label,
        "chunks": [c.label for c in settings.chunks],
        "selections": [s.label for s in settings.selections],
        "sinks": settings.sinks,
        "batch_size": settings.batch_size,
        "signals": dict(settings.signals.__dict__),
        "versions": results.versions(),
        "world_size": world.size,
    }


def _write(measured: ProbeResults, manifest: dict, run: RunSettings | None, new_dir_in: Path | None) -> Path:
    """``fi.csv``, ``headroom.csv`` (when measured) and ``manifest.json`` into ``run.out``, staged beside it
    and swapped in whole, or into a fresh directory under ``new_dir_in`` -> the directory."""
    if run is None:
        out_path = results.new_default_dir("probe", new_dir_in)
    else:  # checked again: another run may have written there meanwhile
        out_path = results.check_results_dir(run.out, run.overwrite)
    with results.staged_dir(out_path, replaced=results.result_entry) as stage:  # old results whole or new ones
        results.write_table(stage / "fi.csv", measured.fi)
        if measured.headroom is not None:
            results.write_table(stage / "headroom.csv", measured.headroom)
        results.write_json(stage / "manifest.json", manifest)
    return out_path
