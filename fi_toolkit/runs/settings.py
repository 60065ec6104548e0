"""Settings objects: small frozen dataclasses that the ``fi`` commands and the Python API share.

A field that is a command-line option says so in its ``metadata`` (:func:`option`: flags and help,
written once); :func:`fi_toolkit.cli.options.settings_options` expands such a dataclass into typer
options and hands the command one built object. Every settings object has ``check()``, which raises
:class:`~fi_toolkit.errors.FIError` with one line naming the option. This module also holds
:class:`RunSettings` (a result directory: ``--out``, ``--resume``, ``--overwrite``) and the checks the
settings modules share. It imports nothing heavy, so the CLI can read it while parsing.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from fi_toolkit.errors import FIError


def option(*flags: str, help: str, cli_type: type | None = None) -> dict:
    """A field's command-line option as ``metadata``: its ``flags`` (default ``--field-name``, a bool
    ``--x/--no-x``), its ``help``, and ``cli_type`` where the option's type is narrower than the field's."""
    return {"flags": flags, "help": help, "cli_type": cli_type}


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number (not a bool, not a float) in ``[minimum, maximum]``; ``name``: the parameter's."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise FIError(f"{name} must be a whole number, got {value!r}", parameter=name)
    if minimum is not None and value < minimum:
        raise FIError(f"{name} must be >= {minimum}, got {value}", parameter=name)
    if maximum is not None and value > maximum:
        raise FIError(f"{name} must be at most {maximum:,}, got {value}", parameter=name)
    return value


def check_number(name: str, value, finite: bool = True) -> float:
    """A real number (int or float, not a bool), finite unless ``finite=False``: typer parses 'nan' and 'inf'."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FIError(f"{name} must be a number, got {value!r}", parameter=name)
    if finite and not math.isfinite(value):
        raise FIError(f"{name} must be a finite number, got {value}", parameter=name)
    return value


MAX_RESAMPLES = 100_000  # bootstrap resamples: more is a typo (each resample stores an index per observation)


def check_resamples(resamples, name: str = "resamples") -> int:
    """Bootstrap resamples: a whole number in ``[0, MAX_RESAMPLES]``."""
    if isinstance(resamples, bool) or not isinstance(resamples, numbers.Integral):
        raise FIError(f"{name} must be a whole number, got {resamples!r}", parameter=name)
    if not 0 <= resamples <= MAX_RESAMPLES:
        raise FIError(f"{name} must lie in [0, {MAX_RESAMPLES:,}], got {resamples}", parameter=name)
    return resamples


def check_type(name: str, value, *types: type, optional: bool = False):
    """``value`` is one of ``types`` (or None where ``optional``); bools are refused where a number is wanted."""
    if value is None and optional:
        return value
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        wanted = " or ".join(t.__name__ for t in types) + (" or None" if optional else "")
        raise FIError(f"{name} must be a {wanted}, got {value!r}", parameter=name)
    return value


@dataclass(frozen=True)
class RunSettings:
    """Where a resumable run (``fi correlate``, ``fi nearfar``, ``fi eval``) writes its results.

    ``out``: the results directory; ``resume``: continue a stopped run of the same command there;
    ``overwrite``: replace what is there (the new run is computed beside it and swapped in when complete;
    ``resume`` finishes an interrupted overwrite). A string ``out`` becomes a :class:`~pathlib.Path`.
    """

    out: Path = field(default=Path("runs"), metadata=option("--out", "-o", help="Results directory."))
    resume: bool = field(
        default=False,
        metadata=option(
            "--resume/--no-resume",
            help="Continue a stopped run of the same command in --out, or an interrupted --overwrite of it: skip "
            "finished documents (same settings only; a finished document that fails its checks is recomputed).",
        ),
    )
    overwrite: bool = field(
        default=False,
        metadata=option(
            "--overwrite/--no-overwrite",
            help="Replace the results already in --out; the new run is computed beside it (.NAME.overwrite) and "
            "replaces the old one only when complete, so an interrupted overwrite leaves them whole.",
        ),
    )

    def __post_init__(self):
        if isinstance(self.out, str):
            object.__setattr__(self, "out", Path(self.out))

    def check(self, command: str | None = None) -> RunSettings:
        """Types, and ``--resume`` with ``--overwrite`` refused; with ``command``, the checks of ``--out``
        that need no settings (:func:`fi_toolkit.runs.run_dir.check_run_dir`)."""
        check_type("out", self.out, Path)
        check_type("resume", self.resume, bool)
        check_type("overwrite", self.overwrite, bool)
        if command is not None:
            from fi_toolkit.runs.run_dir import check_run_dir

            try:
                check_run_dir(self.out, command, self.resume, self.overwrite)
            except FIError as exc:  # check_run_dir's parameter is out_dir: here it is this object's out
                raise exc.about({"out_dir": "out"}) from None
        elif self.resume and self.overwrite:
            raise FIError(
                "resume and overwrite contradict each other: resume continues the run in out, "
                "overwrite replaces it; pass one",
                parameter=("resume", "overwrite", "out"),
            )
        return self


@dataclass(frozen=True)
class OutDirSettings:
    """Where a command that writes once, with no ``--resume`` (``fi fit-data``, ``fi fit-surrogate``,
    ``fi tasks export``), writes: the directory ``out_dir`` (required), and ``overwrite`` to replace what is there.

    Not :class:`RunSettings` (a resumable run's, whose field is ``out``): the field is named ``out_dir`` as the
    library's checks name it (``results.check_results_dir``), so their messages name ``--out`` on the command line
    with no table of aliases. The checks are the run functions'. A string ``out_dir`` becomes a Path.
    """

    out_dir: Path = field(metadata=option("--out", "-o", help="Results directory."))
    overwrite: bool = field(
        default=False, metadata=option("--overwrite/--no-overwrite", help="Replace the results already in --out.")
    )

    def __post_init__(self):
        if isinstance(self.out_dir, str):
            object.__setattr__(self, "out_dir", Path(self.out_dir))


@dataclass(frozen=True)
class OutFileSettings:
    """Where a command that writes one file (``fi fit``, ``fi view``) writes: ``out_file`` (required unless the
    command's default object names one), and ``overwrite`` to replace it. The field is named ``out_file`` as the
    library's checks name it (``fit.run.run_fit``), for the reason :class:`OutDirSettings` gives."""

    out_file: Path = field(metadata=option("--out", "-o", help="The file to write."))
    overwrite: bool = field(
        default=False, metadata=option("--overwrite/--no-overwrite", help="Replace --out if it exists.")
    )

    def __post_init__(self):
        if isinstance(self.out_file, str):
            object.__setattr__(self, "out_file", Path(self.out_file))


def run_settings(out_dir: Path | str | RunSettings, resume: bool = False, overwrite: bool = False) -> RunSettings:
    """The library entry points take ``RunSettings`` or, as before, ``out_dir`` with ``resume``/``overwrite``."""
    if isinstance(out_dir, RunSettings):
        if resume or overwrite:
            raise FIError("give resume and overwrite in the RunSettings, not beside it")
        return out_dir
    return RunSettings(out_dir, resume, overwrite)


def first_repeat(items, key=lambda item: item):
    """The first pair ``(earlier, later)`` of ``items`` with equal ``key``, or None."""
    seen: dict = {}
    for item in items:
        k = key(item)
        if k in seen:
            return seen[k], item
        seen[k] = item
    return None
