"""``fi labels``: the label factory (:mod:`fi_toolkit.surrogate.labels`).

``fi labels [DOCS] --out RUN`` labels every slice of the corpus texts (default: the committed
``fi_toolkit/surrogate/corpus.json``, its archives fetched by ``make corpus``) or of the named documents at every
compression point: per (layer, KV head, position) Forward Influence on a near and a far chunk. Its options are
generated from :class:`~fi_toolkit.surrogate.label_settings.LabelSettings` and
:class:`~fi_toolkit.surrogate.label_settings.CorpusSettings`; ``--resume`` continues a stopped run, and under
``torchrun`` the units are shared among the ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from fi_toolkit.cli.options import _progress, check_document_lengths, err, out, settings_options, unit_progress
from fi_toolkit.cli.study import _read_documents
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.report.numbers import rate_text
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.surrogate.label_settings import CorpusSettings, LabelSettings


@settings_options()
def labels(
    documents: List[str] = typer.Argument(
        None, help="Text/JSONL files or bundled names to label (default: the corpus of --corpus, or the committed one)."
    ),
    labels: LabelSettings = LabelSettings(),
    corpus: CorpusSettings = CorpusSettings(),
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    run: RunSettings = RunSettings(out=Path("runs/labels")),
):
    """Forward Influence labels per (layer, KV head, position) at several compression points: the surrogate's data."""
    from fi_toolkit.surrogate.labels import corpus_texts, run_labels, slice_documents

    model.check()
    labels.check(signals.check().window)
    corpus.check()
    run.check("labels")
    texts, record = corpus_texts(_read_documents(documents) if documents else [], corpus)
    needed = labels.slice_tokens()
    p = max(labels.points)
    which, last = max(zip(("near", "far"), labels.chunks(p)), key=lambda t: t[1].end)
    check_document_lengths(model, texts, needed, f"--point {p}'s {which} chunk {last.label}")
    from fi_toolkit.documents import tokenize_texts

    lm = model.load()
    docs = slice_documents(tokenize_texts(texts, lm.tokenizer), labels)
    with _progress() as bar:
        manifest = run_labels(
            lm, docs, labels, run, signals=signals, corpus=record, progress=unit_progress(bar, "labels")
        )
    if manifest is None:  # a torchrun rank other than 0
        return
    t = manifest["throughput"]
    out.print(
        f"{len(manifest['units'])} unit(s) ({len(docs)} slice(s) x {len(labels.points)} point(s)), "
        f"{t['labels']:,} labels; {rate_text(t['labels_per_s'])} labels/s "
        f"({rate_text(t['labels_per_core_s'])} per core)"
    )
    err.print(f"wrote {run.out}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``labels`` to ``app``."""
    app.command()(labels)
