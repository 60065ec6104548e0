"""Resumable result directories: one set of tables per document, written as each document finishes.

Layout of a run directory::

    settings.json                 what the run computes (checked on --resume)
    per_document/<doc>/<table>.csv
    per_document/<doc>/done.json  written last: the unit's settings (this document's, plus the run's),
                                  and per table its row count and the sha256 of the CSV bytes
    <table>.csv                   every document's rows, concatenated from the files above
    unit_log/<session>.rank<r>.jsonl  one line per unit computed: which rank, which session, how long
    manifest.json                 settings, model, documents, timing, versions, the unit log (written at the end)

Every file is written atomically (temporary file + rename), so a run stopped at any moment (Ctrl-C,
kill) leaves each finished document's tables intact and readable. The combined tables are always
built from the per-document files, so a resumed run and an uninterrupted one give identical tables.

``--resume`` trusts nothing it finds: a unit whose done.json is unreadable, whose settings differ
from this run's, or whose CSV is missing, empty or altered (row count or checksum) is **recomputed**,
with one ``note:`` line on stderr naming the problem. A settings.json that is not a run's settings
is refused with one line (``--overwrite`` starts over). Nothing is created before the first document
finishes, so a run that fails on bad input leaves no directory and no settings.json behind.

Under ``torchrun`` the units are shared among the ranks (:mod:`fi_toolkit.runs.distributed`):
rank 0 checks what is finished, writes settings.json and broadcasts the plan; every rank computes and
saves its own units (the same atomic per-unit files); after a barrier rank 0 checks every unit and
writes the combined tables and the manifest, byte for byte what one process would have written. A
rank that dies loses only the unit it was computing; ``--resume`` with any world size computes only
what is missing, and after an elastic restart (``torchrun --max-restarts``) the run resumes by itself.

``--overwrite`` of a directory that holds results never touches them while it computes: the new run is
an ordinary run directory of its own, ``.<name>.overwrite`` beside ``--out`` (:func:`overwrite_staging`;
a fixed name, so every rank writes into the same one and a later ``--resume`` finds it). Only when its
combined tables, summaries and manifest are written does it become ``--out``, by renames
(:meth:`ResumableRun.finish`, rank 0; :func:`fi_toolkit.runs.results.swap_in`, the same swap as
``fi report``'s): at every moment ``--out`` is the old run whole or the new one whole, and files of the
user's own in ``--out`` stay. An interrupted overwrite leaves ``--out`` as it was, byte for byte, and
its staging directory behind: ``--resume`` (same settings as the overwrite) continues it, computing only
its missing units, and swaps it in at the end; ``--overwrite`` starts it over; a run with neither is
refused with one line naming it. Deleting the staging directory abandons the overwrite.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from fi_toolkit.errors import FIError
from fi_toolkit.runs import distributed, results
from fi_toolkit.runs.run_dir import (  # noqa: F401  (the run directory's checks: light, for the CLI)
    DONE,
    PER_DOCUMENT,
    SETTINGS,
    _read_settings,
    check_run_dir,
    interrupted_overwrite,
    overwrite_staging,
    written_world_sizes,
)
from fi_toolkit.runs.units import MAX_UNIT_SIZE, check_unit_size  # noqa: F401  (importable here too)

UNIT_LOG = "unit_log"
SHOWN_DIFFERENCES = 8  # nested differences shown in a refusal; top-level ones are always all shown


def document_keys(names: Sequence[str]) -> list[str]:
    """File-safe, unique directory names for documents (``a/b c`` -> ``a_b_c``; repeats get ``-2``...)."""
    keys, seen = [], {}
    for name in names:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "document"
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return keys


@dataclass(frozen=True)
class Part:
    """Part ``index`` (from 0) of ``count`` of a document: a work unit below the document, for
    studies whose documents are too few to keep every rank busy. Named ``<document>.part<i>of<n>``, so
    every part has its own directory, done.json and unit-log lines; the parts' tables, concatenated in
    order, are the document's."""

    doc: object
    index: int
    count: int

    @property
    def name(self) -> str:
        return f"{self.doc.name}.part{self.index + 1}of{self.count}"

    @property
    def sha256(self) -> str | None:
        return getattr(self.doc, "sha256", None)

    def __len__(self) -> int:
        return len(self.doc)


def document_of(unit):
    """The document a work unit belongs to (a :class:`Part`'s, or the unit itself)."""
    return unit.doc if isinstance(unit, Part) else unit


def last_document(make: Callable[[object], object], keep: bool = True) -> Callable[[object], tuple]:
    """``setup(unit) -> (document, make(document))``. With ``keep``, ``make``'s result is kept for the next
    unit of the same document (a document's consecutive parts on one rank share its trace or prefill),
    one document at a time: the previous one is released before the next is made."""
    shared: dict = {}

    def setup(unit):
        doc = document_of(unit)
        if not keep:
            return doc, make(doc)
        if shared.get("doc") is not doc:
            shared.clear()
            shared.update(doc=doc, value=make(doc))
        return doc, shared["value"]

    return setup


def split_documents(documents: Sequence, parts: int) -> list[Part]:
    """Every document as ``parts`` consecutive :class:`Part` units."""
    return [Part(doc, i, parts) for doc in documents for i in range(parts)]


def split_units(docs: Sequence, items: int, per_part: int, setup: float = 4) -> tuple[list, list | None]:
    """The work units and their costs: the documents themselves (``per_part = 0``, costs: token counts),
    or each document in :class:`Part` s of ``per_part`` of its ``items`` (sets, candidates, policies).
    A part's cost counts forwards over the document: its items, plus ``setup`` in the first part (the
    trace or prefill, the reference run, the controls)."""
    if not per_part:
        return list(docs), None
    units = split_documents(docs, -(-items // per_part))
    costs = [len(u) * (len(range(items)[part_slice(u, per_part)]) + (setup if u.index == 0 else 0)) for u in units]
    return units, costs


def part_slice(unit, per_part: int) -> slice:
    """The items a unit computes: all of them for a document, block ``index`` of ``per_part`` for a :class:`Part`."""
    if not isinstance(unit, Part):
        return slice(None)
    return slice(unit.index * per_part, (unit.index + 1) * per_part)


def _flatten(obj, path: str = "") -> dict:
    """``{"a": [{"b": 1}]}`` -> ``{"a[0].b": 1}``: settings as leaf paths, so differences name the leaf."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flatten(val, f"{path}.{key}" if path else key).items()}
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return {k: v for i, val in enumerate(obj) for k, v in _flatten(val, f"{path}[{i}]").items()}
    return {path: obj}


_MISSING = object()


def _depth(key: str) -> int:
    return key.count(".") + key.count("[")


def _differences(saved: dict, now: dict) -> list[str]:
    """Differing leaves, top-level settings (prefix, chunks...) first, then nested ones by name."""
    a, b = _flatten(saved), _flatten(now)
    keys = sorted(
        (k for k in set(a) | set(b) if a.get(k, _MISSING) != b.get(k, _MISSING)), key=lambda k: (_depth(k), k)
    )
    return [f"{k}: {json.dumps(a.get(k), default=str)} then, {json.dumps(b.get(k), default=str)} now" for k in keys]


def _describe_differences(diff: list[str]) -> str:
    """Every top-level difference, then nested ones up to ``SHOWN_DIFFERENCES`` in all."""
    top = [d for d in diff if _depth(d.split(":", 1)[0]) == 0]
    shown = top + [d for d in diff if d not in top][: max(0, SHOWN_DIFFERENCES - len(top))]
    more = f"; and {len(diff) - len(shown)} more" if len(diff) > len(shown) else ""
    return "; ".join(shown) + more


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _stderr_note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def new_session() -> str:
    """A file-safe, sortable id of one launch (all ranks share rank 0's)."""
    return f"{datetime.now().strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


class ResumableRun:
    """A run directory for ``command`` with ``settings`` (a JSON-able dict of everything that changes results).

    The constructor only checks (:func:`check_run_dir`, and on ``--resume`` the saved settings); the
    directory and settings.json are written when the first document finishes (:meth:`run`).

    ``path`` is where the run writes: ``out_dir`` itself, or for ``--overwrite`` of a directory holding
    results (and ``--resume`` of such an overwrite, interrupted) its staging directory
    (:func:`overwrite_staging`); :meth:`finish` then makes it ``out_dir``. ``out`` is ``out_dir``.
    """

    def __init__(
        self,
        out_dir: Path,
        command: str,
        settings: dict,
        resume: bool = False,
        overwrite: bool = False,
        note: Callable[[str], None] = _stderr_note,
        world: distributed.World | None = None,
        suffix: str = ".csv",
    ):
        if suffix not in (".csv", ".parquet"):
            raise ValueError(f"a unit's tables are .csv or .parquet, not {suffix!r}")
        self.suffix = suffix  # .parquet: large numeric tables (the label factory's), read back exactly by pyarrow
        self.world = world or distributed.current()
        if self.world.restart > 0:  # torchrun --max-restarts: the restarted ranks continue what the first ones began
            resume, overwrite = True, False
        self.out = check_run_dir(out_dir, command, resume, overwrite)
        self.command, self.resume, self.overwrite, self.note = command, resume, overwrite, note
        self.settings = json.loads(json.dumps(settings, default=str))  # normalised as it will be read back
        self._started = False
        if overwrite:
            self.staged = bool(results.held_results(self.out))  # the old results stay until the new run is done
        else:
            self.staged = resume and interrupted_overwrite(self.out) is not None
        self.path = overwrite_staging(self.out) if self.staged else self.out
        if self.staged and resume and self.world.main:
            note(
                f"note: resuming the interrupted overwrite in '{self.path}'; '{self.out}' keeps its old results "
                "until it finishes"
            )
        saved_file = self.path / SETTINGS
        if resume and saved_file.exists():
            diff = _differences(_read_settings(saved_file)["settings"], self.settings)
            if diff:
                raise FIError(
                    f"cannot resume '{self.path}' with different settings ({_describe_differences(diff)}); "
                    "use the original settings, a new out, or overwrite",
                    parameter=("out", "overwrite"),
                )
        # settings.json missing but per_document/ present: each unit's own settings decide (see _problem)

    def _start(self) -> None:
        """Create the directory and write settings.json, once. ``--overwrite`` first removes the staging
        directory of an earlier, interrupted overwrite (it starts over), and clears ``out`` only when the
        run writes there itself (it held no results when the run was checked)."""
        if self._started:
            return
        if self.overwrite:
            results.remove_tree(overwrite_staging(self.out))
            if not self.staged:
                results.clear_results(self.path)
        self._created_dir = not self.path.exists()
        self._fresh_settings = not (self.path / SETTINGS).exists()
        results.make_dir(self.path)
        results.write_json(self.path / SETTINGS, {"command": self.command, "settings": self.settings})
        self._started = True

    def finish(self) -> Path:
        """After the run's last file (rank 0; the summaries and the manifest included): a staged run's
        directory becomes ``out`` by renames (:func:`~fi_toolkit.runs.results.swap_in`; the old results
        replaced, the user's other files in ``out`` kept), so ``out`` holds the old run whole or the new one
        whole at every moment. -> ``out``."""
        if self.staged and self.path != self.out:
            results.swap_in(self.path, self.out, replaced=results.result_entry)
            self.path = self.out
        return self.out

    def doc_dir(self, key: str) -> Path:
        return self.path / PER_DOCUMENT / key

    def unit_settings(self, doc) -> dict:
        """What one document's tables depend on: the run's settings with this document instead of the list."""
        unit = {k: v for k, v in self.settings.items() if k != "documents"}
        unit["document"] = {"name": doc.name, "sha256": getattr(doc, "sha256", None), "tokens": len(doc)}
        return json.loads(json.dumps(unit, default=str))

    def _problem(self, key: str, unit: dict) -> str | None:
        """Why the finished unit ``key`` cannot be reused (None: it can). Only called when done.json exists."""
        try:
            done = json.loads((self.doc_dir(key) / DONE).read_text())
        except (ValueError, OSError):
            return f"{DONE} is not valid JSON"
        tables = done.get("tables") if isinstance(done, dict) else None
        if (
            not isinstance(tables, dict)
            or not tables
            or not all(
                isinstance(t, dict) and isinstance(t.get("rows"), int) and isinstance(t.get("sha256"), str)
                for t in tables.values()
            )
        ):
            return f"{DONE} does not record its tables' row counts and checksums"
        if done.get("settings") != unit:
            diff = _differences(done.get("settings") if isinstance(done.get("settings"), dict) else {}, unit)
            return f"it was computed with different settings ({_describe_differences(diff)})"
        for name, info in tables.items():
            file = f"{name}{self.suffix}"
            f = self.doc_dir(key) / file
            if not f.is_file():
                return f"{file} is missing"
            if f.stat().st_size == 0:
                return f"{file} is empty"
            if _sha256(f) != info["sha256"]:
                try:
                    rows = len(self._read([f]))
                except Exception:  # noqa: BLE001 - any unreadable table is reported the same way
                    return f"{file} is unreadable"
                if rows != info["rows"]:
                    return f"{file} has {rows} rows, {info['rows']} were written"
                return f"{file} differs from what was written (sha256 mismatch)"
        return None

    def tables_of(self, key: str) -> list[str]:
        return list(json.loads((self.doc_dir(key) / DONE).read_text())["tables"])

    def save(self, key: str, tables: dict[str, pd.DataFrame], info: dict | None = None) -> None:
        self._start()
        record = {}
        for name, table in tables.items():
            f = self.doc_dir(key) / f"{name}{self.suffix}"
            results.write_table(f, table)
            record[name] = {"rows": len(table), "sha256": _sha256(f)}
        results.write_json(self.doc_dir(key) / DONE, {"tables": record, "finished": results.now(), **(info or {})})

    def load(self, keys: Sequence[str], name: str) -> pd.DataFrame:
        """Table ``name`` of the units ``keys``, concatenated as text and typed once (:func:`typed`), so a
        column's type is decided over all of them and every cell writes back as its unit wrote it."""
        return self._read([self.doc_dir(k) / f"{name}{self.suffix}" for k in keys])

    def _read(self, files: Sequence[Path]) -> pd.DataFrame:
        if self.suffix == ".csv":
            return read_tables(files)
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)

    def _assembled(self, keys: Sequence[str], documents: Sequence, assemble) -> dict[str, pd.DataFrame]:
        """Every document's tables from its parts' (``assemble(doc, {table: its parts' rows in order})``),
        then concatenated over documents; a part may lack a table its document has (the controls)."""
        groups: dict = {}
        for key, unit in zip(keys, documents):
            doc = document_of(unit)
            groups.setdefault(id(doc), (doc, []))[1].append(key)
        combined: dict[str, list] = {}
        for doc, part_keys in groups.values():
            held = {k: self.tables_of(k) for k in part_keys}
            names = dict.fromkeys(n for k in part_keys for n in held[k])
            parts = {n: self.load([k for k in part_keys if n in held[k]], n) for n in names}
            for name, table in assemble(doc, parts).items():  # through CSV, as a whole document's tables come
                combined.setdefault(name, []).append(io.StringIO(table.to_csv(index=False)))
        return {name: read_tables(tables) for name, tables in combined.items()}

    def _pending(self, keys: Sequence[str], documents: Sequence, on_skip) -> list[int]:
        """Indices of the units to compute; a finished unit that fails its checks is noted and unmarked."""
        todo = []
        for i, (key, doc) in enumerate(zip(keys, documents)):
            done_file = self.doc_dir(key) / DONE
            finished = done_file.exists() and not self.overwrite  # --overwrite: old units are cleared on start
            problem = self._problem(key, self.unit_settings(doc)) if finished else None
            if finished and problem is None:
                if on_skip:
                    on_skip(doc)
                continue
            if problem:
                self.note(f"note: {PER_DOCUMENT}/{key} ({doc.name}): {problem}; recomputing it")
                done_file.unlink()  # an interruption while recomputing leaves it unfinished, not stale
            todo.append(i)
        return todo

    def _compute(self, key: str, doc, compute) -> None:
        """Compute one unit, save it, and log who computed it (done.json and this rank's unit log)."""
        t0 = time.perf_counter()
        tables = compute(doc)
        by = {
            "rank": self.world.rank,
            "world_size": self.world.size,
            "session": self.session,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        self.save(key, tables, {"document": doc.name, "settings": self.unit_settings(doc), "computed_by": by})
        line = json.dumps({"unit": key, "document": doc.name, **by, "finished": results.now()}) + "\n"
        log = self.path / UNIT_LOG / f"{self.session}.rank{self.world.rank}.jsonl"
        results.make_dir(log.parent)
        with open(log, "a", encoding="utf-8") as fh:  # one file per rank and session: no two writers
            fh.write(line)
            fh.flush()

    def run(
        self,
        documents: Sequence,
        compute: Callable[[object], dict[str, pd.DataFrame]],
        on_skip: Callable[[object], None] | None = None,
        costs: Sequence[float] | None = None,
        assemble: Callable[[object, dict], dict] | None = None,
        merge: bool = True,
    ) -> dict[str, pd.DataFrame] | None:
        """``compute(doc)`` for every document not validly finished, saving each as it finishes; -> combined tables.

        Sharded (more than one rank): each rank computes its share (``costs``, default the token counts,
        balance it); rank 0 returns the combined tables, the other ranks None. ``assemble``: units are
        :class:`Part` s, and each document's tables are made from its parts' at the merge.

        The tables are written under :attr:`path`; rank 0 calls :meth:`finish` once it has written its
        last file there (a staged ``--overwrite`` becomes ``out`` only then). ``merge=False``: no combined
        tables are written (the units' own are the result: the label factory's) and ``{}`` is returned.
        """
        keys = document_keys([d.name for d in documents])
        if self.world.sharded:
            return self._run_sharded(keys, documents, compute, on_skip, costs, assemble, merge)
        self.session = new_session()
        t0 = time.perf_counter()
        try:
            for i in self._pending(keys, documents, on_skip):
                self._compute(keys[i], documents[i], compute)
            self._start()
            self.timing = {"units_s": round(time.perf_counter() - t0, 3), "wait_s": 0.0}
        except BaseException:
            self._remove_if_empty(keys)
            raise
        return self._merge(keys, documents, assemble, merge=merge)

    def _run_sharded(self, keys, documents, compute, on_skip, costs, assemble, merge=True):
        world = self.world
        world.barrier()  # every rank has checked --out before rank 0 writes into it
        plan = None
        if world.main:
            todo = self._pending(keys, documents, on_skip)
            self._start()
            plan = (todo, new_session(), str(self.path), self.staged)
        todo, self.session, path, self.staged = world.broadcast(plan)
        self.path = Path(path)  # every rank writes where rank 0 decided (out, or the overwrite's staging directory)
        self._started = True  # rank 0 made the directory (and cleared it for --overwrite)
        costs = [len(d) for d in documents] if costs is None else list(costs)
        groups = [id(document_of(d)) for d in documents]  # a document's parts share its trace: keep them together
        owner = distributed.assign([costs[i] for i in todo], world.size, [groups[i] for i in todo])
        mine = [i for i, r in zip(todo, owner) if r == world.rank]
        if not mine:
            self.note(
                f"note: rank {world.rank} of {world.size} has no unit to compute ({len(todo)} unit(s) to "
                f"compute for {world.size} ranks); it waits for the others"
            )
        t0 = time.perf_counter()
        for i in mine:
            self._compute(keys[i], documents[i], compute)
        t1 = time.perf_counter()
        world.barrier()
        t2 = time.perf_counter()
        self.timing = {"units_s": round(t1 - t0, 3), "wait_s": round(t2 - t1, 3)}
        if not world.main:
            return None
        missing = [
            d.name
            for k, d in zip(keys, documents)
            if not (self.doc_dir(k) / DONE).exists() or self._problem(k, self.unit_settings(d)) is not None
        ]
        if missing:
            raise FIError(
                f"{len(missing)} unit(s) unfinished after every rank was done ({', '.join(missing[:4])}); "
                "rerun with resume",
                parameter="resume",
            )
        return self._merge(keys, documents, assemble, t2, merge)

    def _merge(
        self, keys: Sequence[str], documents: Sequence, assemble=None, t0: float | None = None, merge: bool = True
    ) -> dict[str, pd.DataFrame]:
        """The combined tables from every unit's files (joined per document by ``assemble``, if given);
        ``timing["merge_s"]`` from ``t0`` (the checks of every unit after the barrier, for a sharded
        run) to the tables written."""
        t0 = time.perf_counter() if t0 is None else t0
        if not merge:
            self.timing["merge_s"] = round(time.perf_counter() - t0, 3)
            return {}
        if assemble is not None:
            combined = self._assembled(keys, documents, assemble)
        else:
            names = self.tables_of(keys[0]) if keys else []
            combined = {name: self.load(keys, name) for name in names}
        for name, table in combined.items():
            results.write_table(self.path / f"{name}{self.suffix}", table)
        self.timing["merge_s"] = round(time.perf_counter() - t0, 3)
        return combined

    def units(self, keys: Sequence[str]) -> list[dict]:
        """Who computed each finished unit, from its done.json: the manifest's ``units``."""
        out = []
        for key in keys:
            done = json.loads((self.doc_dir(key) / DONE).read_text())
            out.append({"unit": key, "document": done.get("document"), **(done.get("computed_by") or {})})
        return out

    def unit_log(self) -> list[dict]:
        """Every unit computed in this directory, by any rank of any session (a unit recomputed shows twice)."""
        lines = []
        for f in sorted((self.path / UNIT_LOG).glob("*.jsonl")):
            for line in f.read_text(encoding="utf-8").splitlines():
                try:
                    lines.append(json.loads(line))
                except ValueError:  # a line cut by a kill mid-write
                    continue
        return sorted(lines, key=lambda e: (str(e.get("finished")), str(e.get("session")), e.get("rank", 0)))

    def _remove_if_empty(self, keys: Sequence[str]) -> None:
        """A run that stops before any document is finished leaves nothing of its own behind."""
        if not self._started or any((self.doc_dir(k) / DONE).exists() for k in keys):
            return
        if (self.path / PER_DOCUMENT).is_dir() and not any((self.path / PER_DOCUMENT).glob(f"*/{DONE}")):
            shutil.rmtree(self.path / PER_DOCUMENT, ignore_errors=True)
            shutil.rmtree(self.path / UNIT_LOG, ignore_errors=True)
        if self._fresh_settings:
            (self.path / SETTINGS).unlink(missing_ok=True)
        if self._created_dir and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()


# pandas >= 3 parses floats round-trip by default (and deprecates asking); pandas 2's default parser
# can be one ulp off, which a table read and written twice (parts joined at the merge) would show
_EXACT_FLOATS = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}


# Identifiers and free text: text whatever they look like (a document named 007, an answer " 100.", a token " 3").
TEXT_COLUMNS = frozenset({"document", "selection", "selector", "policy", "task", "answer", "output", "token"})


def read_text_table(path) -> pd.DataFrame:
    """A result CSV (a path or a text buffer) with every cell exactly as written ("" for an empty cell)."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _guessed_table(path) -> pd.DataFrame:
    """pandas' guess of the columns' types; only empty cells are missing values, floats read exactly."""
    return pd.read_csv(path, keep_default_na=False, na_values=[""], **_EXACT_FLOATS)


def concat_text(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Text tables one after the other; a column a table lacks is empty ("") in its rows."""
    return pd.concat(tables, ignore_index=True).fillna("")


def _writes_back(column: pd.Series, cells: pd.Series) -> bool:
    """Whether ``column`` (a guess) writes every one of ``cells`` (its text) back as it was: floats as
    ``repr`` (an integer among floats, "10" for 10.0, is the same number), integers and booleans as
    ``str``, a missing value as "". A column of mixed kinds (text beside numbers) does not."""
    is_float = pd.api.types.is_float_dtype(column)
    if not (is_float or pd.api.types.is_integer_dtype(column) or pd.api.types.is_bool_dtype(column)):
        return all(isinstance(v, str) or v != v for v in column.tolist())  # text as read; NaN: ""
    values, cells = column.tolist(), cells.tolist()
    written = [repr(v) for v in values] if is_float else [str(v) for v in values]
    differ = np.flatnonzero(np.array(written, dtype=object) != np.array(cells, dtype=object))  # usually none
    for i in differ.tolist():
        value, cell = values[i], cells[i]
        if not ((value != value and cell == "") or (is_float and written[i] == cell + ".0")):
            return False
    return True


def typed(guess: pd.DataFrame, text: pd.DataFrame) -> pd.DataFrame:
    """``guess`` (pandas' reading of a table) with a column replaced by its ``text`` (the same table read
    as text) wherever the guessed numbers or booleans would not write back every cell as it was, and for
    every column of :data:`TEXT_COLUMNS`. So " 100." or "007" stays text, numbers stay numbers (read back
    exactly). Empty cells are missing values. Joined from parts, a column is decided once over them all."""
    guess = guess.copy()
    for i, name in enumerate(text.columns):
        cells = text.iloc[:, i]
        if name in TEXT_COLUMNS or not _writes_back(guess.iloc[:, i], cells):
            guess.isetitem(i, cells.mask(cells == ""))
    return guess


def read_tables(sources: Sequence) -> pd.DataFrame:
    """Result CSVs (paths or text buffers) one after the other, typed once over all of them (:func:`typed`)."""
    sources = [s.read() if hasattr(s, "read") else Path(s) for s in sources]  # a buffer is read twice below
    opened = [(lambda s=s: io.StringIO(s) if isinstance(s, str) else s) for s in sources]
    guessed, texts = [_guessed_table(o()) for o in opened], [read_text_table(o()) for o in opened]
    columns = list(dict.fromkeys(c for g in guessed for c in g.columns))
    held = [i for i, g in enumerate(guessed) if len(g)]
    if held and len(held) < len(guessed):  # a part with no rows has no types to give: it must not make ints text
        guessed, texts = [guessed[i] for i in held], [texts[i] for i in held]
    table = typed(pd.concat(guessed, ignore_index=True), concat_text(texts))
    return table if list(table.columns) == columns else table.reindex(columns=columns)


def read_table(path) -> pd.DataFrame:
    """A result CSV (a path or a text buffer), typed by :func:`typed`: numbers read back exactly, text
    that looks numeric (" 100.", "007") kept as written; only empty cells are missing values, so a token
    spelled "NA" or "null" stays text."""
    return read_tables([path])
