"""kvpress presses in the policy registry (:mod:`fi_toolkit.policies.registry`), under the prefix ``kvpress:``.

The registry finds this provider through the entry point ``kvpress`` of the group ``fi_toolkit.policies``
(pyproject.toml), so no command imports the integration: a name that starts with ``kvpress:`` asks for it.
This module imports neither torch nor kvpress (listing the registry for a help text costs nothing); resolving a
press imports :mod:`fi_toolkit.integrations.kvpress.bridge` (torch) and kvpress, and says in one line how to
install the extra where it is missing.

* ``--policy kvpress:NAME[:key=value,...]``: :func:`~fi_toolkit.integrations.kvpress.bridge.press_policy`, a
  :class:`~fi_toolkit.integrations.kvpress.bridge.PressPolicy` with the run's budget as its compression ratio;
* ``--select kvpress:NAME@B[:key=value,...]`` (``B``: ``keep=X`` or ``remove=X``, a share): a
  :class:`~fi_toolkit.integrations.kvpress.bridge.PressSpec`, what the press keeps of a probe's prefix.
"""

from __future__ import annotations

from fi_toolkit.policies.registry import PRESS, Entry

PREFIX = "kvpress"


class KvpressProvider:
    """The registry's provider of kvpress presses (the registry's ``Provider`` protocol)."""

    prefix = PREFIX

    def entries(self) -> list[Entry]:
        """One family: every press class kvpress exports (listing them would import kvpress and torch)."""
        return [
            Entry(
                name=f"{PREFIX}:NAME",
                kind=PRESS,
                summary="a kvpress press (the kvpress extra; NAME: a press class kvpress exports, OUTER/INNER wraps "
                "one; options: its fields): its compression_ratio of the prompt at the prefill, then its own score "
                "at every interval while decoding (docs/guides/kvpress.md)",
                spelling=f"{PREFIX}:NAME[:key=value,...]",
                selection=f"{PREFIX}:NAME@B[:key=value,...]",
            )
        ]

    def budget(self, text: str, where: str):
        """A budget spelled with a press's name: ``keep=X`` or ``remove=X`` (a bare number is refused naming both:
        kvpress's compression_ratio is the share removed, a bare budget the share kept)."""
        from fi_toolkit.budget import Budget, press_budget

        return press_budget(text, where) if "=" not in text else Budget.parse(text, where)

    def resolve(self, text: str, budget, window: int | None, where: str):
        """``kvpress:NAME[:key=value,...]`` -> a press policy with ``budget``."""
        from fi_toolkit.integrations.kvpress.bridge import press_policy

        return press_policy(text, budget, window, where)

    def selection(self, text: str, where: str):
        """``kvpress:NAME@B[:key=value,...]`` -> its checked :class:`PressSelection` (kvpress must be installed)."""
        from fi_toolkit.integrations.kvpress.bridge import PressSelection, make_press, parse_press_spec

        press = parse_press_spec(text.strip()[len(PREFIX) + 1 :], where)
        make_press(press, where)  # validate the press now (and that kvpress is installed)
        return PressSelection(press)

    def catalog(self, ratio: float, layers: int) -> list[tuple[str, str | None, str]]:
        """Every press class of the installed kvpress: ``(name, spec at ratio or None, reason)``, the spec the
        press survey tries (:func:`~fi_toolkit.integrations.kvpress.catalog.survey_spec`: a wrapper wraps
        ``SnapKVPress``); one line how to install kvpress where it is missing."""
        from fi_toolkit.integrations.kvpress.catalog import survey_spec
        from fi_toolkit.integrations.kvpress.spec import press_classes, require_kvpress

        kvpress = require_kvpress("the presses of the field map need")
        return [
            (name, *survey_spec(name, cls, kvpress, ratio, layers))
            for name, cls in sorted(press_classes(kvpress).items())
        ]


PROVIDER = KvpressProvider()
