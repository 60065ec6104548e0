"""A results directory's ``--out`` checks, which need no settings and no heavy import (the CLI runs them
before the model loads): results already there need ``--overwrite`` or, for a stopped run of the same
command, ``--resume``; an interrupted ``--overwrite`` is found by its staging directory. The resumable run
itself is :mod:`fi_toolkit.runs.resumable`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fi_toolkit.errors import FIError
from fi_toolkit.runs import distributed, results

SETTINGS = "settings.json"
PER_DOCUMENT = "per_document"
DONE = "done.json"


def _read_settings(saved_file: Path) -> dict:
    try:
        saved = json.loads(saved_file.read_text())
    except (ValueError, OSError):
        saved = None
    if not (
        isinstance(saved, dict) and isinstance(saved.get("command"), str) and isinstance(saved.get("settings"), dict)
    ):
        raise FIError(
            f"cannot resume: '{saved_file}' is not a run's settings (a JSON object with 'command' "
            "and 'settings'); pass overwrite to start over",
            parameter="overwrite",
        )
    return saved


def overwrite_staging(out_dir: Path) -> Path:
    """Where ``--overwrite`` of run directory ``out_dir`` computes its new run: ``.<name>.overwrite`` beside it.
    One fixed name, so every rank of a torchrun launch and a later ``--resume`` find the same directory. A link
    ``out_dir`` is followed: the directory it names is the one replaced."""
    out_dir = Path(os.path.realpath(out_dir))
    return out_dir.parent / f".{out_dir.name}.overwrite"


def interrupted_overwrite(out_dir: Path) -> Path | None:
    """The staging directory of an interrupted ``--overwrite`` of ``out_dir`` (one holding a run's files), or None."""
    staging = overwrite_staging(out_dir)
    return staging if results.held_results(staging) else None


def check_run_dir(out_dir: Path, command: str, resume: bool = False, overwrite: bool = False) -> Path:
    """The checks of ``--out`` that need no settings (the CLI runs them before loading the model).

    A directory holding results of any kind needs ``--overwrite``, or ``--resume`` for a stopped run
    of the same ``command``; ``--resume`` and ``--overwrite`` together are refused. An interrupted
    ``--overwrite`` (its staging directory, :func:`overwrite_staging`) is continued by ``--resume``, started
    over by ``--overwrite``, and refused otherwise. ``--overwrite`` of a directory holding results needs
    the directory above it writable (the new run is staged there).
    """
    path = results.check_out_path(out_dir)
    if resume and overwrite:
        raise FIError(
            "resume and overwrite contradict each other: resume continues the run in out_dir, "
            "overwrite replaces it; pass one",
            parameter=("resume", "overwrite", "out_dir"),
        )
    staging = interrupted_overwrite(path)
    if overwrite:
        if results.held_results(path):
            results.check_stageable(path)  # the new run is staged beside it
        return path
    if staging is not None and not resume:
        raise FIError(
            f"'{staging}' holds an interrupted overwrite of '{path}' (whose results are intact); pass resume "
            "to finish it or overwrite to start it over",
            parameter=("resume", "overwrite"),
        )
    where = staging or path  # --resume of an interrupted overwrite continues in its staging directory
    found = results.held_results(where)
    if not found:
        return path
    holder = results.held_command(where)
    if not resume:
        what = f"a '{holder}' run" if holder else ", ".join(found[:4])
        sizes = sorted(written_world_sizes(path) - {distributed.from_env().size})
        if holder == command and sizes:
            raise FIError(
                f"'{path}' already holds results (a '{holder}' run computed with world size "
                f"{' and '.join(map(str, sizes))}, this run has {distributed.from_env().size}); pass resume "
                "to continue it with any world size or overwrite to replace it",
                parameter=("resume", "overwrite"),
            )
        hint = (
            "pass resume to continue it or overwrite to replace it"
            if holder == command
            else "choose another out_dir or pass overwrite to replace it"
        )
        raise FIError(f"'{path}' already holds results ({what}); {hint}", parameter=("resume", "overwrite", "out_dir"))
    if (where / SETTINGS).exists():
        holder = _read_settings(where / SETTINGS)["command"]
    if holder is not None and holder != command:
        raise FIError(
            f"cannot resume: '{where}' holds a '{holder}' run, not '{command}' (resume only continues the same "
            "command)",
            parameter="resume",
        )
    if holder is None and not (where / PER_DOCUMENT).is_dir():
        raise FIError(
            f"cannot resume: '{where}' holds other results ({', '.join(found[:4])}), not a stopped run; "
            "choose another out_dir or pass overwrite",
            parameter=("out_dir", "overwrite"),
        )
    return path


def written_world_sizes(path: Path) -> set[int]:
    """The world sizes that computed the finished units in run directory ``path`` (as their done.json say)."""
    sizes = set()
    for done in Path(path).glob(f"{PER_DOCUMENT}/*/{DONE}"):
        try:
            size = json.loads(done.read_text())["computed_by"]["world_size"]
        except (ValueError, OSError, KeyError, TypeError):
            continue
        if isinstance(size, int):
            sizes.add(size)
    return sizes
