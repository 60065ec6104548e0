"""Result directories: tidy CSV tables and a JSON manifest, written atomically.

Every file (and every copy) is written to a temporary sibling and renamed into place, so an
interrupted run never leaves a half-written table, and results already on disk are only replaced by
complete ones. A directory that already holds results is never written into without --overwrite.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from fi_toolkit.errors import FIError

if TYPE_CHECKING:  # checking an output path needs no pandas; writing a table is handed one
    import pandas as pd


def _umask_mode(path: str) -> None:
    """mkstemp creates files 0600; give results the mode an ordinary open() would (0666 & ~umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _atomic(path: Path, fill) -> None:
    """``fill(tmp)`` writes a temporary sibling of ``path``, which is then renamed into place.

    The temporary file is removed whatever goes wrong (an error, Ctrl-C), so nothing half-written stays.
    """
    path = Path(path)
    make_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        _umask_mode(tmp)
        fill(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    def fill(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    _atomic(path, fill)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    def fill(tmp):
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    _atomic(path, fill)


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` byte for byte through a temporary sibling: ``dst`` is the old file or the whole new
    one."""
    _atomic(dst, lambda tmp: shutil.copyfile(src, tmp))


def write_table(path: Path, df: pd.DataFrame) -> None:
    """CSV (or Parquet for a ``.parquet`` path), atomically."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            _atomic(path, lambda tmp: df.to_parquet(tmp, index=False))
        except ImportError:
            raise FIError("writing Parquet needs pyarrow: pip install pyarrow (or write .csv)") from None
        return
    atomic_write_text(path, df.to_csv(index=False))


def write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str, allow_nan=False) + "\n")


def check_out_path(path: Path, want_dir: bool = True, option: str = "out_dir") -> Path:
    """Refuse with one line a path that cannot be written: one under a regular file, a file where a
    directory is wanted (``want_dir``) or a directory where a file is wanted. Creates nothing."""
    path = Path(path)
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            raise FIError(
                f"{option} '{path}' lies under '{parent}', which is a file, not a directory", parameter=option
            )
    if want_dir and path.exists() and not path.is_dir():
        raise FIError(f"{option} '{path}' is a file, not a directory", parameter=option)
    if not want_dir and path.is_dir():
        raise FIError(f"{option} '{path}' is a directory; name a file", parameter=option)
    check_writable(path, option)
    return path


def check_writable(path: Path, option: str = "out_dir") -> None:
    """Prove that ``path`` can be created or replaced: a directory made and removed at once in the nearest
    existing directory at or above it (``path`` itself when it is a directory). A real attempt, not
    ``os.access``: it answers for root, read-only mounts and ``/proc`` alike. Leaves nothing behind."""
    path = Path(path)
    where = next((p for p in (path, *path.parents) if p.is_dir()), Path("."))
    reason = _cannot_make_dir_in(where)
    if reason:
        raise FIError(
            f"{option} '{path}' cannot be written: no directory can be created in '{where}': {reason}",
            parameter=option,
        )


def check_stageable(path: Path, option: str = "out_dir") -> None:
    """For an existing directory ``path`` that a new output will replace by renames (:func:`staged_dir`,
    :func:`swap_in`): prove that the directory above it takes the new output's staging directory."""
    parent = Path(os.path.realpath(path)).parent
    reason = _cannot_make_dir_in(parent)
    if reason:
        raise FIError(
            f"{option} '{path}' cannot be replaced: its new contents are written beside it first, and '{parent}' "
            f"cannot be written: {reason}",
            parameter=option,
        )


def _cannot_make_dir_in(where: Path) -> str | None:
    """Why a directory cannot be made (and removed) in ``where``; None when it can."""
    # Ctrl-C is held back while the probe exists (delivered right after), so it never leaves one behind
    blocked = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fi-writable-", dir=where))
    except OSError as exc:
        said = exc.strerror or type(exc).__name__
        if exc.errno in (errno.ENOENT, errno.ENOTDIR) and os.path.isdir(where):  # /proc, /sys: mkdir says ENOENT
            return f"it exists, but its file system refuses new entries (mkdir answers '{said}')"
        return said
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return None


def make_dir(path: Path) -> Path:
    """``mkdir -p`` with a one-line error instead of a traceback."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise FIError(f"cannot create directory '{path}': a file of that name exists") from None
    except NotADirectoryError:
        check_out_path(path, option="directory")
        raise FIError(f"cannot create directory '{path}'") from None
    except OSError as exc:
        raise FIError(f"cannot create directory '{path}': {exc.strerror}") from None
    return path


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where the file system allows one (no bytes copied), else a copy with its metadata."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _carry(src: Path, dst: Path) -> None:
    """``src`` (a file, a link or a directory tree) to ``dst`` without touching ``src``."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(src), str(dst))


@contextmanager
def staged_dir(out: Path, replaced=lambda name: False):
    """A temporary directory beside ``out`` for a command to write its whole output into; on success it
    becomes ``out`` by renames (:func:`swap_in`), so an interrupted run leaves the old ``out`` whole or the new
    one whole. On any error or Ctrl-C before the swap, the temporary directory is removed and ``out`` is
    untouched."""
    out = Path(os.path.realpath(out))  # a link to a directory: the directory is replaced, the link stays
    make_dir(out.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it 0700; an ordinary mkdir would not
        yield staging
        swap_in(staging, out, replaced)
    finally:
        if os.path.lexists(staging):
            shutil.rmtree(staging, ignore_errors=True)


def swap_in(staging: Path, out: Path, replaced=lambda name: False) -> None:
    """Make the directory ``staging`` (a sibling of ``out``, holding a command's complete new output) become
    ``out`` by renames: ``out`` is the old directory whole or the new one whole at every moment.

    Entries of an existing ``out`` that ``staging`` does not hold and ``replaced(name)`` does not claim (the
    user's own files, another command's results) are carried into ``staging`` first (hard links: the old
    directory is not touched). Then the old directory is renamed aside, ``staging`` renamed into place and
    the old one removed; Ctrl-C between the two renames puts the old one back. On an error or Ctrl-C before
    the swap, what was carried is taken out of ``staging`` again, so ``staging`` holds only its own files
    (a resumable run continues in it). A link ``out`` to a directory stays; the directory it names is replaced
    (``staging`` lies beside that directory)."""
    staging, out = Path(staging), Path(os.path.realpath(out))
    aside, carried = None, []
    try:
        if out.is_dir():
            shutil.copymode(out, staging)
            for item in sorted(out.iterdir()):
                if not replaced(item.name) and not os.path.lexists(staging / item.name):
                    carried.append(staging / item.name)
                    _carry(item, staging / item.name)
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, aside)  # onto the empty directory just made
        os.replace(staging, out)
    except BaseException:
        if aside is not None and not out.exists():
            os.replace(aside, out)  # interrupted between the renames: the old output back
        for entry in carried if os.path.isdir(staging) else []:
            remove_tree(entry)
        raise
    finally:
        if aside is not None and os.path.lexists(aside):
            shutil.rmtree(aside, ignore_errors=True)


def remove_tree(entry: Path) -> None:
    """Remove a file, a link or a directory tree, whichever ``entry`` is (nothing if it does not exist)."""
    entry = Path(entry)
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    elif os.path.lexists(entry):
        entry.unlink()


# What a results directory of any ``fi`` command holds (run tables, per-document units, reports).
RESULT_FILES = ("manifest.json", "settings.json", "report.html", "report.md", "report.json")
RESULT_DIRS = ("per_document", "unit_log", "tables", "figures")


def result_entry(name: str) -> bool:
    """Whether an entry of an --out directory is a result of a ``fi`` command (what --overwrite replaces)."""
    return name in RESULT_FILES or name in RESULT_DIRS or Path(name).suffix in (".csv", ".parquet")


def held_results(path: Path) -> list[str]:
    """Names of the results already in directory ``path`` (empty when it holds none or does not exist)."""
    path = Path(path)
    if not path.is_dir():
        return []
    found = [n for n in RESULT_FILES + RESULT_DIRS if (path / n).exists()]
    return found + sorted(f.name for f in path.iterdir() if f.suffix in (".csv", ".parquet") and f.is_file())


def held_command(path: Path) -> str | None:
    """The command whose run is in ``path``: from settings.json, else manifest.json; None if unreadable or absent."""
    for name in ("settings.json", "manifest.json"):
        try:
            data = json.loads((Path(path) / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("command"), str):
            return data["command"]
    return None


def clear_results(path: Path) -> None:
    """Remove the results of any ``fi`` command from ``path`` (for --overwrite); other files stay."""
    path = Path(path)
    for name in RESULT_DIRS:
        shutil.rmtree(path / name, ignore_errors=True)
    for name in held_results(path):
        if (path / name).is_file():
            (path / name).unlink()


def check_results_dir(path: Path, overwrite: bool = False) -> Path:
    """An --out directory a new run may write into: not under a file, not a file, holding no results unless
    ``overwrite``, and (when it exists) in a directory that takes the staged new output. Creates nothing (a
    run creates it when it writes its first result)."""
    path = check_out_path(path)
    found = held_results(path)
    if found and not overwrite:
        kind = held_command(path)
        what = f"a '{kind}' run" if kind else ", ".join(found[:4])
        raise FIError(
            f"'{path}' already holds results ({what}); choose another out_dir or pass overwrite",
            parameter=("out_dir", "overwrite"),
        )
    if path.is_dir():  # the new results are staged beside it (staged_dir)
        check_stageable(path)
    return path


def new_default_dir(kind: str, root: Path = Path("runs"), tries: int = 20) -> Path:
    """Create and return a fresh ``runs/<kind>-<time>-<random>``: two runs started in the same second
    never share it (``mkdir`` without ``exist_ok`` either creates it or fails, and we try another name)."""
    make_dir(root)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for _ in range(tries):
        path = Path(root) / f"{kind}-{stamp}-{secrets.token_hex(2)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FIError(f"cannot create a fresh results directory under '{root}'")  # pragma: no cover


def versions() -> dict:
    from importlib.metadata import version

    import numpy
    import pandas as pd
    import scipy
    import torch
    import transformers

    return {
        "fi_toolkit": version("fi_toolkit"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "pandas": pd.__version__,
    }


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
