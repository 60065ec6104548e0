"""``fi view``: a page that shows why policies evict what they evict. Parses its options into a
:class:`~fi_toolkit.report.view_settings.ViewSettings`, loads the model and the document, calls
:func:`~fi_toolkit.report.view_run.run_view`. Its options are generated from ``ViewSettings`` (built without a
default object: it checks itself), the model's, the signals' and
:class:`~fi_toolkit.runs.settings.OutFileSettings` (``--out``, ``--overwrite``).

Every option is checked before the model loads (one line, exit 2); so is the chunk against the document's
length (counted with the model's tokenizer.json, else bounded by its bytes), and again once the loaded
tokenizer has tokenised it (before any estimate runs); the page is written atomically.
"""

from __future__ import annotations

from pathlib import Path

import typer

from fi_toolkit.cli.options import _progress, check_document_lengths, err, settings_options
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.report.view_settings import ViewSettings
from fi_toolkit.runs.settings import OutFileSettings
from fi_toolkit.signals.config import SignalConfig


@settings_options(output={"out_file": "The page (.html)."})
def view(
    document: str = typer.Argument(..., help="Text/JSONL file or bundled name (a JSONL file: its first document)."),
    *,
    settings: ViewSettings,
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    output: OutFileSettings = OutFileSettings(Path("view.html")),
):
    """Write one standalone HTML page: every prefix token shaded by its estimated FI (or H, A, D, S), each
    policy's evictions marked, a token's numbers on hover (docs/guides/view.md)."""
    from fi_toolkit.documents import read_texts
    from fi_toolkit.runs import results

    model.check()
    out_file, overwrite = output.out_file, output.overwrite
    if out_file.suffix.lower() not in (".html", ".htm"):
        raise FIError(f"--out must end in .html, got '{out_file}'")
    results.check_out_path(out_file, want_dir=False, option="out_file")
    if out_file.exists() and not overwrite:
        raise FIError(f"--out '{out_file}' exists; choose another file or pass --overwrite")
    name, text, source = read_texts(document)[0]
    check_document_lengths(model, [(name, text, source)], settings.chunk.end, f"chunk {settings.chunk.label}")
    # every check above imports nothing heavy (usage errors answer at once); the work below does
    from fi_toolkit.documents import tokenize_texts
    from fi_toolkit.report.numbers import kib_text
    from fi_toolkit.report.view_run import run_view

    lm = model.load()
    doc = tokenize_texts([(name, text, source)], lm.tokenizer, max_tokens=settings.chunk.end)[0]
    with _progress() as bar:
        bar.add_task(f"trace and estimate FI on {settings.chunk.label}: {doc.name}", total=None)
        run_view(lm, doc, settings, out_file)
    err.print(
        f"wrote {out_file} ({kib_text(out_file.stat().st_size)}, {settings.prefix:,} tokens, "
        f"{len(settings.policies)} polic{'y' if len(settings.policies) == 1 else 'ies'})",
        markup=False,
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("view")(view)
