"""Analyses over Forward Influence: correlations with the signals, near/far set comparisons, token classes.

Every function returns tidy pandas DataFrames; :mod:`.study` runs them over many documents,
resumably, into a result directory that :mod:`fi_toolkit.report` turns into a report.
"""

from .correlation import (METHODS, candidate_positions, correlate_document, correlate_signals, correlation,
                          parse_candidates, per_token_fi, summarize_correlations)
from .nearfar import (add_relative_columns, nearfar_chunks, nearfar_document, paired_tests, summarize_nearfar,
                      token_class_summary)
from .runs import ResumableRun, read_table
from .study import run_correlate, run_nearfar
from .token_classes import FUNCTION_WORDS, token_class

__all__ = [
    "FUNCTION_WORDS", "METHODS", "ResumableRun", "add_relative_columns", "candidate_positions", "correlate_document",
    "correlate_signals", "correlation", "nearfar_chunks", "nearfar_document", "paired_tests", "parse_candidates",
    "per_token_fi", "read_table", "run_correlate", "run_nearfar", "summarize_correlations", "summarize_nearfar",
    "token_class", "token_class_summary",
]
