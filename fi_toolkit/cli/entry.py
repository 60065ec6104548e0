"""The ``fi`` console script and ``python -m fi_toolkit``: :func:`fi_toolkit.cli.app.main` behind a guard.

The app's modules take a moment to import; Ctrl-C during that moment (or between the import and the
app's own handler) is the same one line and exit 130 as Ctrl-C later, never a traceback. This module
imports nothing at module level but the two constants, so the guard is in place before anything slow runs.
"""

from __future__ import annotations

import sys

from fi_toolkit.cli import INTERRUPTED, INTERRUPTED_LINE


def main() -> None:
    """Run ``fi``: exit 130 with one line on Ctrl-C at any moment, imports included."""
    try:
        from fi_toolkit.cli.app import main as run_app

        run_app()
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED_LINE + "\n")
        sys.stderr.flush()
        sys.exit(INTERRUPTED)


if __name__ == "__main__":
    main()
