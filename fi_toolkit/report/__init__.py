"""Reports of analysis result directories: seaborn figures and HTML/Markdown/CSV/JSON export.

The names are imported on first use (PEP 562): :mod:`.preflight` checks ``fi report``'s arguments
without loading pandas or matplotlib."""

import importlib

_EXPORTS = {
    "FORMATS": "fi_toolkit.report.preflight",
    "parse_formats": "fi_toolkit.report.preflight",
    "build_report": "fi_toolkit.report.export",
    "load_run": "fi_toolkit.report.export",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fi_toolkit.report' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
