"""Reports of analysis result directories: seaborn figures and HTML/Markdown/CSV/JSON export.

The names are imported on first use (PEP 562): :mod:`.preflight` checks ``fi report``'s arguments
without loading pandas or matplotlib."""

from fi_toolkit.lazy import lazy_exports

_EXPORTS = {
    "FORMATS": "fi_toolkit.report.preflight",
    "parse_formats": "fi_toolkit.report.preflight",
    "build_report": "fi_toolkit.report.export",
    "load_run": "fi_toolkit.report.export",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
