"""Result directories: tidy CSV tables and a JSON manifest, written atomically.

Every file is written to a temporary sibling and renamed into place, so an interrupted run never
leaves a half-written table, and results already on disk are only replaced by complete ones.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .errors import FIError


def _umask_mode(path: str) -> None:
    """mkstemp creates files 0600; give results the mode an ordinary open() would (0666 & ~umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        _umask_mode(tmp)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_table(path: Path, df: pd.DataFrame) -> None:
    """CSV (or Parquet for a ``.parquet`` path), atomically."""
    path = Path(path)
    if path.suffix == ".parquet":
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        _umask_mode(tmp)
        try:
            df.to_parquet(tmp, index=False)
            os.replace(tmp, path)
        except ImportError:
            os.unlink(tmp)
            raise FIError("writing Parquet needs pyarrow: pip install pyarrow (or write .csv)") from None
        return
    atomic_write_text(path, df.to_csv(index=False))


def write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str, allow_nan=False) + "\n")


def prepare_out_dir(path: Path, overwrite: bool = False) -> Path:
    """Refuse to mix a new run into a directory that already holds one (unless ``overwrite``)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FIError(f"--out '{path}' exists and is not a directory")
    if (path / "manifest.json").exists() and not overwrite:
        raise FIError(f"'{path}' already holds results; choose another --out or pass --overwrite")
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_out_dir(kind: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{kind}-{stamp}"


def versions() -> dict:
    import numpy
    import scipy
    import torch
    import transformers

    from . import __version__

    return {
        "fi_toolkit": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "pandas": pd.__version__,
    }


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
