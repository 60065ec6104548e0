"""Analyses over Forward Influence: correlations with the signals, near/far set comparisons, token classes.

Every function returns tidy pandas DataFrames; :mod:`.study` runs them over many documents,
resumably, into a result directory that :mod:`fi_toolkit.report` turns into a report.

The names below are imported on first access (PEP 562, as the package root does), so importing a light
submodule (:mod:`.nearfar_spec`, :mod:`.study_options`: what the command line checks first) loads no
pandas, scipy or torch.
"""

from __future__ import annotations

import importlib
import sys
import types

# public name -> the module that defines it
_EXPORTS = {
    "correlate_document": "correlation",
    "correlate_signals": "correlation",
    "summarize_correlations": "correlation",
    "add_relative_columns": "nearfar",
    "nearfar_chunks": "nearfar",
    "nearfar_document": "nearfar",
    "paired_tests": "nearfar",
    "summarize_nearfar": "nearfar",
    "token_class_summary": "nearfar",
    "candidate_positions": "per_token",
    "parse_candidates": "per_token",
    "per_token_fi": "per_token",
    "METHODS": "statistics",
    "correlation": "statistics",
    "run_correlate": "study",
    "run_nearfar": "study",
    "CorrelateSettings": "correlate_settings",
    "NearfarSettings": "nearfar_settings",
    "FUNCTION_WORDS": "token_classes",
    "token_class": "token_classes",
    "ResumableRun": "fi_toolkit.runs.resumable",
    "read_table": "fi_toolkit.runs.resumable",
}

__all__ = [
    "CorrelateSettings",
    "FUNCTION_WORDS",
    "METHODS",
    "NearfarSettings",
    "ResumableRun",
    "add_relative_columns",
    "candidate_positions",
    "correlate_document",
    "correlate_signals",
    "correlation",
    "nearfar_chunks",
    "nearfar_document",
    "paired_tests",
    "parse_candidates",
    "per_token_fi",
    "read_table",
    "run_correlate",
    "run_nearfar",
    "summarize_correlations",
    "summarize_nearfar",
    "token_class",
    "token_class_summary",
]


def __getattr__(name: str):
    """Import a public name's module on first access and cache the name here (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    path = module if module.startswith("fi_toolkit.") else f"{__name__}.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """A submodule named like a public name (``correlation``, the module, and ``correlation``, the function of
    :mod:`.statistics`) never hides the name when it is imported: the name stays what it was before."""

    def __setattr__(self, name: str, value) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
