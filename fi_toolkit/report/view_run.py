"""The ``fi view`` run: :func:`run_view` traces one document to the compression point, estimates each prefix
token's Forward Influence on the chunk (Fisher), marks what each policy evicts and writes the page.

From the command line: ``fi view`` parses its options into a
:class:`~fi_toolkit.report.view_settings.ViewSettings`, loads the model and the document, calls :func:`run_view`
and prints where the page went.
"""

from __future__ import annotations

from pathlib import Path

from fi_toolkit.documents import Document
from fi_toolkit.probe.chunks import check_chunks
from fi_toolkit.probe.experiment import max_context, trace_document
from fi_toolkit.report.token_page import ViewData, view_data, write_view
from fi_toolkit.report.view_settings import ViewSettings
from fi_toolkit.runs.settings import check_type


def run_view(lm, doc: Document, settings: ViewSettings, out: Path | str | None = None) -> ViewData:
    """The page's data for ``doc`` (tokenised, at least to the chunk's end) under ``settings`` ->
    :class:`~fi_toolkit.report.token_page.ViewData`; written as one standalone HTML page to ``out`` (atomically)
    when given. The chunk is checked against the document's length and the model's context first."""
    check_type("settings", settings, ViewSettings)
    check_chunks([settings.chunk], settings.prefix, len(doc), max_context(lm))
    trace = trace_document(lm, doc, settings.prefix, settings.signals.check())
    data = view_data(lm, doc, trace, list(settings.policies), settings.chunk, settings.samples, settings.seed)
    if out is not None:
        write_view(Path(out), data)
    return data
