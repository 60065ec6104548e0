"""What ``fi report`` can refuse from its arguments and the paths alone, before pandas or matplotlib is
imported: the formats, each result directory's kind (a finished run, an unfinished one, lm-eval output
or none) and a directory given twice. :mod:`fi_toolkit.report.export` reads and checks the contents."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.runs.results import held_command

FORMATS = ("html", "md", "csv", "json")
READS = "fi report reads the result directories of fi probe, correlate, nearfar, eval and field, and lm-eval output"


def parse_formats(text: str) -> list[str]:
    """``"html,md"`` -> ``["html", "md"]``: the report formats ``--format`` names.

    Args:
        text: comma-separated formats, any of :data:`FORMATS` (``html``, ``md``, ``csv``, ``json``).

    Returns:
        The formats, lower-cased, in order.

    Raises:
        FIError: an unknown format, or none.
    """
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise FIError(f"invalid format '{text}': choose from {','.join(FORMATS)}", parameter={"format": "formats"})
    return formats


def not_a_run(path: Path) -> FIError:
    """The refusal of a directory that holds neither a run's manifest.json nor lm-eval's results."""
    return FIError(f"'{path}' holds no finished result (no manifest.json, no lm-eval results_*.json); {READS}")


def check_run_dirs(paths: Sequence[Path], resume: str = "resume=True") -> None:
    """Refuse, from the paths alone: none given, a missing path, a file, one directory given twice, an
    unfinished run (settings.json without manifest.json: the message says to rerun it with ``resume``,
    how the caller spells resuming) and a directory holding no result."""
    if not paths:
        raise FIError("no result directory given: fi report RUN_DIR [RUN_DIR ...]")
    seen: dict[Path, Path] = {}
    for path in map(Path, paths):
        if not path.exists():
            raise FIError(f"'{path}' does not exist; {READS}")
        if not path.is_dir():
            raise FIError(f"'{path}' is a file, not a result directory; {READS}")
        same = seen.get(path.resolve())
        if same is not None:
            raise FIError(f"'{path}' and '{same}' are the same directory: give each result directory once")
        seen[path.resolve()] = path
        if (path / "manifest.json").is_file():
            continue
        kind = held_command(path)
        if kind is not None:
            raise FIError(
                f"'{path}' holds an unfinished fi {kind} run (no manifest.json yet): finish it by running the "
                f"same fi {kind} command again with {resume}, then report it"
            )
        if not any(path.rglob("results_*.json")) and not any(path.rglob("samples_*.jsonl")):
            raise not_a_run(path)
