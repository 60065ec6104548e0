"""What a run kind is to the report: :class:`RunKind`, the parts of one kind's section, and :class:`LeadTable`, the
answer its section leads with. The kinds themselves are the modules beside this one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import pandas as pd


@dataclass
class LeadTable:
    """``title``: what the cells are (unit, direction, over what); ``table``: cells as a reader sees them
    (``str``), ``table.attrs['numeric']`` the number columns; ``note``: one line under the table, or ''."""

    title: str
    table: pd.DataFrame
    note: str = ""


def _nothing(*_) -> dict:
    return {}


def _no_tables(_run: dict) -> list:
    return []


@dataclass(frozen=True)
class RunKind:
    """One run kind's part of ``fi report``: what it reads, and how its section reads.

    A run is :func:`fi_toolkit.report.export.load_run`'s dict (``tables``: name -> DataFrame, ``manifest``);
    ``figures`` returns ``(name, Figure or None)`` pairs, ``extra_tables`` ``(title, source, shown table)``
    triples (a table shown that is no file's whole), ``derived`` tables the report computes from the run's own
    (so runs written before them get them too)."""

    name: str  # what the report calls the kind (report.json's 'command'): 'probe', 'eval-text', 'lm-eval'
    title: str  # the heading of its section: the question the run answers
    tables: list[tuple[str, bool]]  # required tables, in display order; True: shown in HTML/Markdown
    table_titles: Mapping[str, str]  # what each shown table holds, with units
    caption: Callable[[dict], str]  # one line under the heading and every figure: model, documents, settings
    lead: Callable[[dict], LeadTable | None]  # the answer as one table, or None
    headline: Callable[[dict], list[str]]  # a few sentences of what the tables say (tables -> lines)
    figures: Callable[[dict, str], list[tuple[str, object]]]  # (tables, caption) -> (name, Figure or None)
    optional_tables: list[tuple[str, bool]] = field(default_factory=list)  # read when the run holds them
    shown_columns: Mapping[str, list[str]] = field(default_factory=dict)  # a shown table's columns, results first
    shown_rows: Mapping[str, Callable[[pd.DataFrame], pd.DataFrame]] = field(default_factory=dict)  # rows shown
    derived: Callable[[dict], dict[str, pd.DataFrame]] = _nothing  # tables -> tables computed from them
    extra_tables: Callable[[dict], list[tuple[str, str, pd.DataFrame]]] = _no_tables
    command: str | None = None  # the manifest's 'command' ('eval' for both eval kinds); None: no manifest
    settings_kind: str | None = None  # the manifest's 'settings.kind' where one command writes several kinds
    top_level_settings: tuple[str, ...] = ()  # settings its manifest keeps at the top level, not in 'settings'
    reads_directory: Callable[[Path], bool] | None = None  # a kind without a manifest: is ``path`` its output?
    load: Callable[[Path], dict] | None = None  # ... and reading that output into a run
    # The cross-run table (does replay KL predict accuracy?): the table of mean replay KL per policy and budget a
    # kind holds, and, for a kind of accuracy, (its runs' tables, the replay summary) -> Spearman across the cells
    replay_table: str | None = None
    versus_replay: Callable[[list[dict], pd.DataFrame], pd.DataFrame] | None = None
