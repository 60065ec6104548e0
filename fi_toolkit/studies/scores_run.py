"""The ``fi scores`` run: :func:`run_scores` traces each document's prefix and tabulates its per-token signals
(:meth:`fi_toolkit.signals.trace.Trace.token_table`, with the token text), optionally per-token FI of every
prefix position on future chunks (the Fisher estimate, :func:`fi_toolkit.probe.estimator.fisher_fi`, or exact
leave-one-out FI, :func:`fi_toolkit.studies.per_token.per_token_fi`), and writes the table when told where.

From the command line: ``fi scores`` parses its options into a
:class:`~fi_toolkit.studies.scores_settings.ScoresSettings`, checks ``--out``
(:func:`~fi_toolkit.studies.scores_settings.scores_file`), loads the model and the document, calls
:func:`run_scores` and prints a summary of the signals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
import torch

from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import check_chunks
from fi_toolkit.probe.experiment import max_context, trace_document
from fi_toolkit.runs.distributed import World, current
from fi_toolkit.runs.results import write_table
from fi_toolkit.runs.settings import RunSettings, check_type
from fi_toolkit.signals.trace import Trace
from fi_toolkit.studies.scores_settings import ScoresSettings, scores_file

# progress(document, stage): stage "trace", then "FI (fisher)" or "FI (exact)" where FI is measured
Progress = Callable[[str, str], None]


def idle_rank(settings: ScoresSettings, world: World | None = None) -> World | None:
    """This process's :class:`~fi_toolkit.runs.distributed.World` where it has nothing to compute, else None:
    under torchrun every rank but 0 is idle, unless exact per-token FI splits the prefix positions among the
    ranks (the signals and the Fisher estimate are one pass each, on rank 0)."""
    world = world or current()
    shared_positions = bool(settings.fi_chunks) and settings.estimator == "exact"
    return world if world.sharded and not world.main and not shared_positions else None


def run_scores(
    lm,
    docs: Document | Sequence[Document],
    settings: ScoresSettings,
    run: RunSettings | Path | str | None = None,
    *,
    progress: Progress | None = None,
) -> pd.DataFrame | None:
    """Per-token signals (and FI) of each document's prefix -> one table.

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        docs: a document or several, each of at least ``settings.document_tokens()`` tokens (longer ones give
            the same rows: only ``[0, last chunk end)`` is read).
        settings: what to compute (:class:`~fi_toolkit.studies.scores_settings.ScoresSettings`).
        run: the ``.csv`` or ``.parquet`` file to write (a path, or a
            :class:`~fi_toolkit.runs.settings.RunSettings` whose ``overwrite`` replaces it), checked before
            anything is computed; None: nothing is written.
        progress: called as each document is traced and its FI measured.

    Returns:
        One row per document x prefix position ``[0, prefix)``: ``document``, ``position``, H (``entropy``,
        under both conventions too), mean A, D, E and S (``infokv``; NaN in the window), ``in_window``, the
        token text, per-layer D, E and A; with ``fi_chunks`` also ``fi_estimator``, ``fi_<chunk>`` and (fisher)
        ``fi_se_<chunk>``, in nats. Under torchrun rank 0 returns
        it, the others None (with exact FI each rank measured one block of the positions).
    """
    check_type("settings", settings, ScoresSettings)
    run = None if run is None else scores_file(run)
    docs = [docs] if isinstance(docs, Document) else list(docs)
    if not docs:
        raise FIError("no document given", parameter="docs")
    world = current()
    if idle_rank(settings, world) is not None:
        return None
    tables = [_score_one(lm, doc, settings, world, progress) for doc in docs]
    if not world.main:  # its blocks of positions went to rank 0, which writes the table
        return None
    table = tables[0] if len(tables) == 1 else pd.concat(tables, ignore_index=True)
    if run is not None:
        write_table(run.out, table)
    return table


def _score_one(lm, doc: Document, settings: ScoresSettings, world: World, progress) -> pd.DataFrame:
    """One document's table: its trace's token table, then the FI columns where asked."""
    p = settings.prefix
    if progress:
        progress(doc.name, "trace")
    trace = trace_document(lm, doc, p, settings.signals)
    table = trace.token_table([lm.tokenizer.decode([int(i)]) for i in doc.ids[:p]])
    table.insert(0, "document", doc.name)
    if settings.fi_chunks:
        check_chunks(settings.fi_chunks, p, len(doc), max_context(lm))
        if progress:
            progress(doc.name, f"FI ({settings.estimator})")
        _add_fi_columns(lm, doc, trace, table, settings, world)
    return table


def _add_fi_columns(lm, doc: Document, trace: Trace, table, settings: ScoresSettings, world: World) -> None:
    """Per-token FI of every prefix position as columns ``fi_<chunk>`` (fisher: ``fi_se_<chunk>`` too), in place.

    Exact FI under torchrun: every rank measures one contiguous block of the positions (equal counts: each
    costs one forward over the chunks) and rank 0 gathers them in order; the other ranks add nothing."""
    chunks = settings.fi_chunks
    if settings.estimator == "fisher":
        from fi_toolkit.probe.estimator import fisher_fi

        est = fisher_fi(lm.model, trace, doc.ids, chunks, settings.samples, settings.seed)
        fi, se = est.fi, est.se
    else:
        from fi_toolkit.studies.per_token import per_token_fi

        block = torch.arange(trace.prefix_len).tensor_split(world.size)[world.rank]
        result = per_token_fi(lm.model, trace, doc.ids, block, chunks, controls=False)
        blocks = world.gather(result.fi().double())
        if blocks is None:
            return
        fi, se = torch.cat(blocks), None
    table.insert(table.columns.get_loc("in_window"), "fi_estimator", settings.estimator)
    for k, c in enumerate(chunks):
        table[f"fi_{c.label}"] = fi[:, k].numpy()
        if se is not None:
            table[f"fi_se_{c.label}"] = se[:, k].numpy()
