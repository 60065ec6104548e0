"""What every ``fi`` command prints besides its tables: the noise-floor warning, one line on stderr."""

from __future__ import annotations

from fi_toolkit.cli.options import err


def print_warning(warning: str | None) -> None:
    """Print ``warning`` (one line from :mod:`fi_toolkit.probe.noise_floor`, or None for nothing) on stderr."""
    if warning:
        err.print(warning, markup=False, highlight=False)
