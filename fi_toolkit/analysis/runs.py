"""Resumable result directories: one set of tables per document, written as each document finishes.

Layout of a run directory::

    settings.json                 what the run computes (checked on --resume)
    per_document/<doc>/<table>.csv
    per_document/<doc>/done.json  written last: a document without it is recomputed
    <table>.csv                   every document's rows, concatenated from the files above
    manifest.json                 settings, model, documents, timing, versions (written at the end)

Every file is written atomically (temporary file + rename), so a run stopped at any moment (Ctrl-C,
kill) leaves each finished document's tables intact and readable. The combined tables are always
built from the per-document files, so a resumed run and an uninterrupted one give identical tables.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from .. import results
from ..errors import FIError

SETTINGS = "settings.json"
PER_DOCUMENT = "per_document"


def document_keys(names: Sequence[str]) -> list[str]:
    """File-safe, unique directory names for documents (``a/b c`` -> ``a_b_c``; repeats get ``-2``...)."""
    keys, seen = [], {}
    for name in names:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "document"
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return keys


def _flatten(obj, path: str = "") -> dict:
    """``{"a": [{"b": 1}]}`` -> ``{"a[0].b": 1}``: settings as leaf paths, so differences name the leaf."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flatten(val, f"{path}.{key}" if path else key).items()}
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return {k: v for i, val in enumerate(obj) for k, v in _flatten(val, f"{path}[{i}]").items()}
    return {path: obj}


def _differences(saved: dict, now: dict) -> list[str]:
    a, b = _flatten(saved), _flatten(now)
    return [f"{key}: {json.dumps(a.get(key), default=str)} then, {json.dumps(b.get(key), default=str)} now"
            for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


class ResumableRun:
    """A run directory for ``command`` with ``settings`` (a JSON-able dict of everything that changes results)."""

    def __init__(self, out_dir: Path, command: str, settings: dict, resume: bool = False, overwrite: bool = False):
        self.path = Path(out_dir)
        self.command = command
        self.settings = json.loads(json.dumps(settings, default=str))  # normalised as it will be read back
        if self.path.exists() and not self.path.is_dir():
            raise FIError(f"--out '{self.path}' exists and is not a directory")
        saved_file = self.path / SETTINGS
        if saved_file.exists() and not resume and not overwrite:
            raise FIError(f"'{self.path}' already holds a run; pass --resume to continue it or --overwrite to replace it")
        if saved_file.exists() and resume:
            try:
                saved = json.loads(saved_file.read_text())
            except json.JSONDecodeError:
                raise FIError(f"'{saved_file}' is not valid JSON; cannot resume this run") from None
            if saved.get("command") != command:
                raise FIError(f"cannot resume: '{self.path}' holds a '{saved.get('command')}' run, not '{command}'")
            diff = _differences(saved.get("settings", {}), self.settings)
            if diff:
                more = f"; and {len(diff) - 4} more" if len(diff) > 4 else ""
                raise FIError(f"cannot resume '{self.path}' with different settings ({'; '.join(diff[:4])}{more}); "
                              "use the original settings, a new --out, or --overwrite")
        if saved_file.exists() and overwrite and not resume:
            shutil.rmtree(self.path / PER_DOCUMENT, ignore_errors=True)
            for f in self.path.glob("*.csv"):
                f.unlink()
            (self.path / "manifest.json").unlink(missing_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)
        results.write_json(saved_file, {"command": command, "settings": self.settings})

    def doc_dir(self, key: str) -> Path:
        return self.path / PER_DOCUMENT / key

    def is_done(self, key: str) -> bool:
        return (self.doc_dir(key) / "done.json").exists()

    def save(self, key: str, tables: dict[str, pd.DataFrame], info: dict | None = None) -> None:
        for name, table in tables.items():
            results.write_table(self.doc_dir(key) / f"{name}.csv", table)
        results.write_json(self.doc_dir(key) / "done.json", {"tables": sorted(tables), "finished": results.now(), **(info or {})})

    def load(self, keys: Sequence[str], name: str) -> pd.DataFrame:
        return pd.concat([read_table(self.doc_dir(k) / f"{name}.csv") for k in keys], ignore_index=True)

    def run(
        self, documents: Sequence, compute: Callable[[object], dict[str, pd.DataFrame]],
        on_skip: Callable[[object], None] | None = None,
    ) -> dict[str, pd.DataFrame]:
        """``compute(doc)`` for every unfinished document, saving each as it finishes; -> combined tables."""
        keys = document_keys([d.name for d in documents])
        names: list[str] = []
        for key, doc in zip(keys, documents):
            if self.is_done(key):
                if on_skip:
                    on_skip(doc)
            else:
                self.save(key, compute(doc), {"document": doc.name})
            names = json.loads((self.doc_dir(key) / "done.json").read_text())["tables"]
        combined = {name: self.load(keys, name) for name in names}
        for name, table in combined.items():
            results.write_table(self.path / f"{name}.csv", table)
        return combined


def read_table(path: Path) -> pd.DataFrame:
    """A result CSV, floats read back exactly (pandas >= 3 parses floats round-trip by default);
    only empty cells are missing values, so a token spelled "NA" or "null" stays text."""
    return pd.read_csv(path, keep_default_na=False, na_values=[""])
