"""Run the ``fi`` command line in-process, as a user would from a shell (shared by the CLI tests)."""

from __future__ import annotations

import sys

import pytest

from fi_toolkit.cli import app as cli


def run_cli(args, capsys):
    """``fi ARGS`` through ``cli.main`` -> (exit status, stdout, stderr)."""
    sys_argv, sys.argv = sys.argv, ["fi", *args]
    try:
        with pytest.raises(SystemExit) as exc:
            cli.main()
    finally:
        sys.argv = sys_argv
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err
