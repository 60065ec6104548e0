"""Analyses over Forward Influence: correlations with the signals, near/far set comparisons, token classes.

Every function returns tidy pandas DataFrames; :mod:`.study` runs them over many documents,
resumably, into a result directory that :mod:`fi_toolkit.report` turns into a report.
"""

from fi_toolkit.analysis.correlation import correlate_document, correlate_signals, summarize_correlations
from fi_toolkit.analysis.nearfar import (
    add_relative_columns,
    nearfar_chunks,
    nearfar_document,
    paired_tests,
    summarize_nearfar,
    token_class_summary,
)
from fi_toolkit.analysis.per_token import candidate_positions, parse_candidates, per_token_fi
from fi_toolkit.analysis.statistics import METHODS, correlation
from fi_toolkit.analysis.study import run_correlate, run_nearfar
from fi_toolkit.analysis.token_classes import FUNCTION_WORDS, token_class
from fi_toolkit.runs.resumable import ResumableRun, read_table

__all__ = [
    "FUNCTION_WORDS", "METHODS", "ResumableRun", "add_relative_columns", "candidate_positions", "correlate_document",
    "correlate_signals", "correlation", "nearfar_chunks", "nearfar_document", "paired_tests", "parse_candidates",
    "per_token_fi", "read_table", "run_correlate", "run_nearfar", "summarize_correlations", "summarize_nearfar",
    "token_class", "token_class_summary",
]
