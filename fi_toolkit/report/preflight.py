"""What ``fi report`` can refuse from its arguments and the paths alone, before pandas or matplotlib is
imported: the formats, each result directory's kind (a finished run, an unfinished one, lm-eval output
or none), a directory given twice, and an ``--out`` that is (or lies in) one of them or holds files of its
own. :mod:`fi_toolkit.report.export` reads and checks the contents."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.runs import results
from fi_toolkit.runs.results import held_command

FORMATS = ("html", "md", "csv", "json")
READS = "fi report reads the result directories of fi probe, correlate, nearfar, eval and field, and lm-eval output"
REPORT_MARK = "fi-report.json"  # written into every report directory: it was fi report, and when
REPORT_FILES = ("report.html", "report.md", "report.json")
REPORT_DIRS = ("tables", "figures", "views")


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


def report_entry(name: str) -> bool:
    """Whether an entry of a report directory is the report's (a new report replaces it; others are kept)."""
    return name in REPORT_FILES or name in REPORT_DIRS or name == REPORT_MARK


def is_report(path: Path) -> bool:
    """Whether directory ``path`` holds a report: its mark, one of its pages, or nothing but a report's
    entries (a report written before the mark, as ``--format csv``: ``tables/`` alone)."""
    names = [e.name for e in Path(path).iterdir()]
    return bool(names) and (
        REPORT_MARK in names or any(n in REPORT_FILES for n in names) or all(report_entry(n) for n in names)
    )


def check_report_out(out_dir: Path, run_dirs: Sequence[Path], overwrite: bool = False) -> Path:
    """Refuse, from the paths alone, an ``out_dir`` the report of ``run_dirs`` may not be written to: one that
    cannot be written, one of the result directories or a directory inside one, a report or other results
    without ``overwrite``, and a directory of other files: without ``overwrite`` (the report's files would
    land among them), and even with it where it holds a ``tables``/``figures``/``views`` of its own (the
    report's would replace it). Creates nothing.

    Returns:
        ``out_dir`` as a :class:`~pathlib.Path`.
    """
    out = results.check_out_path(Path(out_dir))
    where = out.resolve()
    for run in map(Path, run_dirs):
        inside = run.resolve()
        if where == inside:
            raise FIError(
                f"out_dir '{out}' is the result directory '{run}'; choose another out_dir", parameter="out_dir"
            )
        if inside in where.parents:
            raise FIError(
                f"out_dir '{out}' lies inside the result directory '{run}'; choose an out_dir outside it",
                parameter="out_dir",
            )
    if not out.is_dir() or not any(out.iterdir()) or is_report(out) or held_command(out) is not None:
        return results.check_results_dir(out, overwrite)  # a report or a run: replaced only with overwrite
    names = sorted(e.name for e in out.iterdir())
    own = [n for n in names if n in REPORT_DIRS]
    if own:
        raise FIError(
            f"out_dir '{out}' holds a '{own[0]}' directory that fi report did not write (there is no report in "
            f"'{out}'); the report's own '{own[0]}' would replace it: choose another out_dir",
            parameter="out_dir",
        )
    if not overwrite:
        listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise FIError(
            f"out_dir '{out}' holds {len(names):,} entr{'y' if len(names) == 1 else 'ies'} that fi report did not "
            f"write ({listed}); choose a new or empty out_dir, or pass overwrite to write the report beside them",
            parameter=("out_dir", "overwrite"),
        )
    results.check_stageable(out)  # the report is staged beside it, then swapped in with these entries kept
    return out
