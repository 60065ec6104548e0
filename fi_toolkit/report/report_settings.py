"""What ``fi report`` writes: :class:`ReportSettings` (the formats) and :func:`report_dir`, the check of where
the report goes, beside :func:`fi_toolkit.report.export.build_report`, which takes both. Imports nothing heavy
(no pandas, no matplotlib): the command line builds and checks them before reading the runs.

The report's directory is a :class:`~fi_toolkit.runs.settings.RunSettings` (``out``, ``overwrite``), as every
command's results directory is; the formats are the one option of the report itself. Each field that is an
option carries its flag and help (:func:`fi_toolkit.runs.settings.option`), from which
:func:`fi_toolkit.cli.options.settings_options` generates ``fi report``'s options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.report.preflight import FORMATS, check_report_out, parse_formats
from fi_toolkit.runs.settings import RunSettings, check_type, option


@dataclass(frozen=True)
class ReportSettings:
    """``fi report``'s formats, checked on construction (one :class:`~fi_toolkit.errors.FIError` line naming
    ``formats``; the command line names its flag).

    ``formats``: any of :data:`~fi_toolkit.report.preflight.FORMATS`, comma-separated (``"html,md"``) or a
    list. After construction a tuple of lower-case formats, in order, so building the object again from its
    fields gives the same object.
    """

    formats: str | Sequence[str] = field(
        default=",".join(FORMATS),
        metadata=option("--format", "-f", help="Any of html,md,csv,json.", cli_type=str),
    )

    def __post_init__(self):
        text = self.formats
        if not isinstance(text, str):
            if not isinstance(text, Sequence):
                raise FIError(f"formats must be a str or a list of formats, got {text!r}", parameter="formats")
            text = ",".join(check_type("formats", f, str) for f in text)
        object.__setattr__(self, "formats", tuple(parse_formats(text)))


def report_dir(where: RunSettings, run_dirs: Sequence[Path]) -> RunSettings:
    """Where the report of ``run_dirs`` goes -> ``where``, checked from the paths alone
    (:func:`~fi_toolkit.report.preflight.check_report_out`: ``where.out`` not one of the result directories nor
    inside one, a report or other files there only with ``where.overwrite``); ``resume`` is refused (a report
    is written whole). Creates nothing. The messages about the directory name ``out``, the field that holds it."""
    check_type("where", where, RunSettings)
    if where.resume:
        raise FIError("a report does not resume: run it again, or pass overwrite to replace it", parameter="resume")
    try:
        check_report_out(where.out, run_dirs, where.overwrite)
    except FIError as exc:  # check_report_out's parameter is out_dir: here it is the RunSettings' out
        raise exc.about({"out_dir": "out"}) from None
    return where
