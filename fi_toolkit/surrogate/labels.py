"""The label factory (``fi labels``): Forward Influence per (layer, KV head, position) at several compression
points of many documents, the training signal of the FI-trained surrogate.

A **unit** is one slice of a text at one compression point ``p`` (:class:`LabelUnit`, named
``<slice>@p<p>``): the slice's prefix ``[0, p)`` is traced, then the Fisher estimate of every
(layer, KV head, position)'s FI (:func:`fi_toolkit.fit.rows.fit_rows`, the rows ``fi fit-data`` writes) is
computed on the near and the far chunk after ``p``. Its table ``labels.parquet`` holds one row per
(layer, KV head, candidate position ``j`` in ``[sinks, p - w)``): ``document, point, layer, head, position,
fi_near, fi_far, fi`` (``fi``: their mean, ``fi fit-data``'s target), and with ``features`` the compression-time
features too. Units are written as they finish, atomically, resumed and shared among torchrun ranks by
:class:`~fi_toolkit.runs.resumable.ResumableRun` (no combined table: a corpus's rows are the units', read in
order by :func:`read_labels`). The manifest records the corpus (package, version, title, sha256 of every
text) and the throughput: labels per second, and per core.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.runs.settings import RunSettings, check_type, run_settings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.surrogate.label_settings import CorpusSettings, LabelSettings

if TYPE_CHECKING:
    import pandas as pd

    from fi_toolkit.documents import Document

TABLE = "labels"
TOKENS = "tokens"  # per unit: the slice's token ids (position, token)
SUFFIX = ".parquet"
COMMAND = "labels"

# progress(unit name, done, total): the unit's label draws (total: 2 chunks x samples)
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class LabelUnit:
    """One slice at one compression point: a work unit of the factory."""

    doc: Document
    point: int

    @property
    def name(self) -> str:
        return f"{self.doc.name}@p{self.point}"

    @property
    def sha256(self) -> str:
        return self.doc.sha256

    def __len__(self) -> int:  # the unit's cost: the forward and backward passes grow with p
        return self.point


def slice_key(unit: str) -> str:
    """The slice of a unit's key (``<slice>_p<point>``, :class:`LabelUnit`'s name made file-safe): what the
    units of one slice share."""
    return unit.rsplit("_p", 1)[0]


def label_units(docs: Sequence[Document], settings: LabelSettings) -> list[LabelUnit]:
    """Every document (slice) at every compression point, in document order."""
    return [LabelUnit(doc, p) for doc in docs for p in settings.points]


def corpus_texts(texts: list[tuple[str, str, str]], corpus: CorpusSettings) -> tuple[list, dict | None]:
    """The texts to label, ``(name, text, source)``, and what the manifest records of the corpus: ``texts``
    (documents the user named), else the corpus's (the committed manifest unless ``corpus.corpus`` names one);
    both when both are given. Reads the archives and checks every checksum; imports nothing heavy."""
    from fi_toolkit.surrogate.corpus import MANIFEST, load_manifest, read_corpus

    path = corpus.corpus or (None if texts else MANIFEST)
    if path is None:
        return list(texts), None
    manifest = load_manifest(path)
    record = {
        "manifest": str(path),
        "archives": [
            {"package": p.requirement, "archive": p.archive, "sha256": p.sha256} for p in manifest.packages.values()
        ],
        "texts": [
            {"title": t.title, "kind": t.kind, "sha256": t.sha256} for t in manifest.texts if t.kind in corpus.kinds
        ],
    }
    return list(texts) + read_corpus(manifest, corpus.archives, corpus.kinds), record


def slice_documents(docs: Sequence[Document], settings: LabelSettings) -> list[Document]:
    """Every document cut into at most ``settings.slices`` slices of ``settings.slice_tokens()`` tokens
    (:func:`fi_toolkit.surrogate.corpus.slices`), in rounds: every document's first slice, then every second one...,
    so a run stopped early (or the first units of a finished one) spans every text and kind of the corpus."""
    from itertools import zip_longest

    from fi_toolkit.surrogate.corpus import slices

    per_doc = [slices(doc, settings.slice_tokens(), settings.slices) for doc in docs]
    return [s for rnd in zip_longest(*per_doc) for s in rnd if s is not None]


def run_labels(
    lm,
    docs: Sequence[Document],
    settings: LabelSettings,
    run: RunSettings | Path | str,
    *,
    signals: SignalConfig | None = None,
    corpus: dict | None = None,
    progress: Progress | None = None,
) -> dict | None:
    """Label every document at every point of ``settings`` into the run directory ``run`` -> its manifest
    (rank 0; None on the other ranks of a torchrun).

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        docs: the slices to label, each ``settings.slice_tokens()`` tokens long at least
            (:func:`fi_toolkit.surrogate.corpus.slices`).
        settings: points, chunks and draws (:class:`~fi_toolkit.surrogate.label_settings.LabelSettings`).
        run: the run directory, or :class:`~fi_toolkit.runs.settings.RunSettings` (resume, overwrite).
        signals: the signal options (the observation window bounds the candidates; the features use them all).
        corpus: what the manifest records of the corpus the slices come from (packages, texts), if any.
        progress: called after each label draw of a unit.
    """
    from fi_toolkit.runs.execute import execute_run
    from fi_toolkit.runs.resumable import ResumableRun

    signals = check_type("signals", signals or SignalConfig(), SignalConfig).check()
    settings = check_type("settings", settings, LabelSettings).check(signals.window)
    where = run_settings(run).check()
    docs = list(docs)
    if not docs:
        raise FIError("no document to label", parameter="docs")
    for doc in docs:
        doc.require(settings.slice_tokens(), f"labels at p = {max(settings.points):,} up to the far chunk's end")
    described = {
        "model": lm.describe(),
        "labels": asdict(settings),
        "signals": asdict(signals),
        "documents": [{"name": d.name, "sha256": d.sha256, "tokens": len(d)} for d in docs],
    }
    resumable = ResumableRun(where.out, COMMAND, described, where.resume, where.overwrite, suffix=SUFFIX)
    units = label_units(docs, settings)
    compute = _computer(lm, settings, signals, progress)
    extra = {"corpus": corpus} if corpus else {}
    written = execute_run(
        lm,
        resumable,
        units,
        compute,
        lambda tables: {},
        lambda tables: {**extra, **_throughput(resumable)},
        merge=False,
    )
    if written is None:  # not rank 0 of a torchrun: rank 0 writes the manifest
        return None
    return json.loads((resumable.out / "manifest.json").read_text())


def _computer(lm, settings: LabelSettings, signals: SignalConfig, progress: Progress | None):
    """``compute(unit) -> {"labels": rows}`` for :meth:`ResumableRun.run`."""
    import pandas as pd

    from fi_toolkit.fit.rows import fit_rows
    from fi_toolkit.probe.experiment import trace_document

    def compute(unit: LabelUnit) -> dict:
        trace = trace_document(lm, unit.doc, unit.point, signals)
        done = [0]

        def advance(n: int) -> None:
            done[0] += n
            progress(unit.name, done[0], settings.samples)

        rows = fit_rows(
            lm.model,
            unit.doc,
            trace,
            settings.chunks(unit.point),
            settings.sinks,
            settings.samples,
            settings.seed,
            on_progress=advance if progress else None,
            chunk_columns=("fi_near", "fi_far"),
            features=settings.features,
        )
        rows.insert(1, "point", unit.point)
        # the slice's tokens: what a trainer feeds the model to get the hidden states the labels belong to
        tokens = pd.DataFrame({"position": range(len(unit.doc)), "token": unit.doc.ids.numpy()})
        return {TABLE: rows, TOKENS: tokens}

    return compute


def _throughput(run) -> dict:
    """Labels per second of unit time, and per core (each unit ran on one rank with this many threads), from
    the units' own records: the factory's measured speed, whatever share of it this session computed."""
    import torch

    done = [json.loads(f.read_text()) for f in sorted((run.path / "per_document").glob("*/done.json"))]
    labels = sum(d["tables"][TABLE]["rows"] for d in done)
    seconds = sum(d.get("computed_by", {}).get("seconds", 0.0) for d in done)
    cores = torch.get_num_threads()
    per_s = labels / seconds if seconds else None
    return {
        "throughput": {
            "labels": labels,
            "unit_seconds": round(seconds, 2),
            "labels_per_s": round(per_s, 1) if per_s else None,
            "threads_per_rank": cores,
            "labels_per_core_s": round(per_s / cores, 1) if per_s else None,
        }
    }


def finished_units(run_dir: Path | str) -> list[str]:
    """The unit keys of a finished ``fi labels`` run, in its manifest's order; of a run still going (or
    stopped), the units finished so far, by name (a learning curve can start before the corpus is done)."""
    run_dir = Path(run_dir)
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
    except FileNotFoundError:
        return _units_so_far(run_dir)
    except (OSError, ValueError) as e:
        raise FIError(f"'{run_dir}/manifest.json' is not readable JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("command") != COMMAND:
        got = manifest.get("command") if isinstance(manifest, dict) else None
        raise FIError(f"'{run_dir}' is a run of fi {got}, not of fi labels")
    return [u["unit"] for u in manifest["units"]]


def _units_so_far(run_dir: Path) -> list[str]:
    try:
        saved = json.loads((run_dir / "settings.json").read_text())
    except (OSError, ValueError):
        raise FIError(f"'{run_dir}' holds no fi labels run (no manifest.json, no settings.json)") from None
    if not isinstance(saved, dict) or saved.get("command") != COMMAND:
        raise FIError(f"'{run_dir}' is not a run of fi labels")
    units = sorted(p.parent.name for p in (run_dir / "per_document").glob("*/done.json"))
    if not units:
        raise FIError(f"'{run_dir}' holds no finished unit yet")
    return units


def read_unit(run_dir: Path | str, unit: str, table: str = TABLE) -> pd.DataFrame:
    """Table ``table`` (``labels`` or ``tokens``) of one unit, checked against the sha256 its ``done.json``
    recorded (a damaged or missing file is refused in one line: ``--resume`` recomputes it)."""
    import hashlib

    import pandas as pd

    folder = Path(run_dir) / "per_document" / unit
    f = folder / f"{table}{SUFFIX}"
    try:
        want = json.loads((folder / "done.json").read_text())["tables"][table]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        raise FIError(f"'{folder}' records no {table} table: run fi labels again, resuming it") from None
    if not f.is_file() or hashlib.sha256(f.read_bytes()).hexdigest() != want:
        raise FIError(f"'{f}' is missing or differs from what was written: run fi labels again, resuming it")
    return pd.read_parquet(f)


def read_labels(run_dir: Path | str) -> pd.DataFrame:
    """Every unit's rows of a finished ``fi labels`` run, in the manifest's unit order, each checked against
    the checksum its ``done.json`` recorded (:func:`read_unit`)."""
    import pandas as pd

    return pd.concat([read_unit(run_dir, u) for u in finished_units(run_dir)], ignore_index=True)
