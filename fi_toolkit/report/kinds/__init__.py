"""The run kinds ``fi report`` reads, one module each: its tables, titles, caption, lead table, headline,
figures (:class:`~fi_toolkit.report.kinds.base.RunKind`). :data:`KINDS` is the registry the report dispatches
through; a new kind is a module with a ``KIND`` and a line here."""

from __future__ import annotations

from fi_toolkit.report.kinds import correlate, eval_tasks, eval_text, field, lmeval, nearfar, probe
from fi_toolkit.report.kinds.base import LeadTable, RunKind

__all__ = ["KINDS", "LeadTable", "RunKind", "kind_of", "manifest_kind"]

# In report order of the cross-run table's parts: eval-tasks before lm-eval.
KINDS: dict[str, RunKind] = {
    k.name: k
    for k in (probe.KIND, correlate.KIND, nearfar.KIND, eval_text.KIND, eval_tasks.KIND, field.KIND, lmeval.KIND)
}


def kind_of(name: str) -> RunKind:
    """The run kind called ``name`` (a run's ``kind``: ``probe``, ``eval-text``, ``lm-eval``, ...)."""
    return KINDS[name]


def manifest_kind(command, settings) -> str:
    """The kind a manifest's ``command`` names: for a command that writes several kinds (``fi eval``), the one its
    ``settings.kind`` names; else the command itself, which is a kind's name where :func:`reads_manifest`."""
    if isinstance(settings, dict):
        for kind in KINDS.values():
            if (
                kind.settings_kind is not None
                and kind.command == command
                and settings.get("kind") == kind.settings_kind
            ):
                return kind.name
    return command


def reads_manifest(name) -> bool:
    """Whether ``name`` is a kind read from a run's ``manifest.json`` (lm-eval output has none)."""
    return name in KINDS and KINDS[name].command is not None
