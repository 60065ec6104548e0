"""The ``fi fit-data`` and ``fi fit`` runs: :func:`run_fit_data` computes a policy's training rows
(:func:`fi_toolkit.fit.rows.fit_rows` per document) and writes ``fit_rows.parquet`` and ``manifest.json``
when given where; :func:`run_fit` reads such runs, fits a ridge score
(:func:`~fi_toolkit.fit.ridge.fit_policy`) or a LambdaRank model
(:func:`~fi_toolkit.fit.lambdarank.learn_policy`) and writes the policy JSON when given where.

From the command line: ``fi fit-data`` and ``fi fit`` parse their options into a
:class:`~fi_toolkit.fit.settings.FitDataSettings` or :class:`~fi_toolkit.fit.settings.FitSettings`,
call these functions and print what they return. The module imports nothing heavy itself (pandas, torch and
LightGBM are imported where the work starts), so ``fi fit`` answers a missing run directory or an unwritable
``--out`` at once.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.fit.settings import FitDataSettings, FitSettings
from fi_toolkit.probe.chunks import check_chunks
from fi_toolkit.runs import results
from fi_toolkit.runs.settings import RunSettings, check_type

if TYPE_CHECKING:
    import pandas as pd

    from fi_toolkit.documents import Document

ROWS = "fit_rows.parquet"
# the settings every run given to one fit must share (they define the features and the target)
SHARED = ("model", "signals", "prefix", "chunks", "sinks", "samples")
SIGNAL_KEYS = ("window", "top_k", "pool_kernel", "tau", "entropy_of", "final_norm")

# progress(document, stage, done, total): stage "trace" (total None) or "fisher FI" (done of total label draws)
Progress = Callable[[str, str, int, "int | None"], None]


def run_fit_data(
    lm,
    docs: Sequence[Document],
    settings: FitDataSettings,
    run: RunSettings | Path | str | None = None,
    *,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """The training rows of every document -> one table, ``L * H_kv * (p - w - sinks)`` rows per document
    (columns ``document, layer, head, position, fi`` and one per feature: :func:`~fi_toolkit.fit.rows.fit_rows`).

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        docs: the documents; each must reach ``settings.document_tokens()`` tokens.
        settings: what to compute (:class:`~fi_toolkit.fit.settings.FitDataSettings`).
        run: the run directory for ``fit_rows.parquet`` and ``manifest.json`` (what :func:`run_fit` reads), or a
            :class:`~fi_toolkit.runs.settings.RunSettings` (``overwrite`` replaces a run there, the old one kept
            whole until the new one is complete; fit data does not resume). None: nothing is written.
        progress: called as each document is traced and as its label draws are done.
    """
    check_type("settings", settings, FitDataSettings)
    run = _run_settings(run)
    if not docs:
        raise FIError("no document given", parameter="docs")
    import pandas as pd

    from fi_toolkit.probe.experiment import max_context

    t0, docs = time.perf_counter(), list(docs)
    for doc in docs:  # every document before the first trace: a short one answers at once
        check_chunks(settings.chunks, settings.prefix, len(doc), max_context(lm))
    rows = pd.concat([_rows_of(lm, doc, settings, progress) for doc in docs], ignore_index=True)
    if run is not None:
        _write_fit_data(run, rows, _fit_data_manifest(lm, docs, settings, time.perf_counter() - t0))
    return rows


def _run_settings(run) -> RunSettings | None:
    """``run`` as checked :class:`RunSettings` (a path is one without overwrite), its directory free for results."""
    if run is None:
        return None
    run = RunSettings(Path(run)) if isinstance(run, (str, Path)) else check_type("run", run, RunSettings)
    run.check()
    if run.resume:
        raise FIError("fit data does not resume: run it again, or pass overwrite to replace it", parameter="resume")
    results.check_results_dir(run.out, run.overwrite)
    return run


def _rows_of(lm, doc: Document, settings: FitDataSettings, progress: Progress | None) -> pd.DataFrame:
    """One document's rows: its trace at ``p``, then the Fisher FI of every (layer, KV head, position)."""
    from fi_toolkit.fit.rows import fit_rows
    from fi_toolkit.probe.experiment import trace_document

    if progress:
        progress(doc.name, "trace", 0, None)
    trace = trace_document(lm, doc, settings.prefix, settings.signals)
    done = [0]

    def advance(n: int) -> None:
        done[0] += n
        progress(doc.name, "fisher FI", done[0], settings.samples)

    if progress:
        progress(doc.name, "fisher FI", 0, settings.samples)
    s = settings
    return fit_rows(
        lm.model, doc, trace, s.chunks, s.sinks, s.samples, s.seed, on_progress=advance if progress else None
    )


def _fit_data_manifest(lm, docs: list[Document], settings: FitDataSettings, seconds: float) -> dict:
    """What :func:`run_fit` checks runs by (:data:`SHARED`) and records of the documents, with the run's argv,
    time and versions."""
    cfg = lm.config
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return {
        "command": "fit-data",
        "argv": sys.argv,
        "seconds": round(seconds, 2),
        "model": {**lm.describe(), "name": lm.name, "head_dim": head_dim},
        "signals": dict(settings.signals.__dict__),
        "prefix": settings.prefix,
        "chunks": [c.label for c in settings.chunks],
        "sinks": settings.sinks,
        "samples": settings.samples,
        "seed": settings.seed,
        "documents": [{"name": d.name, "source": d.source, "sha256": d.sha256} for d in docs],
        "versions": results.versions(),
    }


def _write_fit_data(run: RunSettings, rows: pd.DataFrame, manifest: dict) -> None:
    """``fit_rows.parquet`` and ``manifest.json`` into ``run.out``, staged beside it and swapped in whole."""
    out_path = results.check_results_dir(run.out, run.overwrite)  # again: another run may have written there
    with results.staged_dir(out_path, replaced=results.result_entry) as stage:  # old results whole or new ones
        results.write_table(stage / ROWS, rows)
        results.write_json(stage / "manifest.json", manifest)


def run_fit(
    settings: FitSettings,
    runs: Sequence[Path | str] | Path | str,
    out_file: Path | str | None = None,
    *,
    overwrite: bool = False,
) -> dict:
    """Fit a policy to the rows of ``runs`` -> its record, what the policy JSON holds (``features``, the fit,
    ``rows``, ``documents``, ``cross_validation``: leave-one-document-out within-head Spearman with FI of its
    score beside SnapKV's and InfoKV's, and the model, signals and settings of the runs).

    Args:
        settings: the learner and what it fits (:class:`~fi_toolkit.fit.settings.FitSettings`).
        runs: ``fi fit-data`` run directories (:func:`run_fit_data`'s), made with the same settings; their
            documents are pooled, each at most once, and at least two remain after ``settings.exclude``.
        out_file: the ``.json`` file to write (``fitted:path=FILE`` or ``learned:path=FILE`` reads it), written
            whole or not at all; None: nothing is written.
        overwrite: replace ``out_file`` if it exists.
    """
    check_type("settings", settings, FitSettings)
    runs = _run_paths(runs)
    if out_file is not None:
        out_file = _check_out_file(Path(out_file), overwrite)
    for r in runs:  # what the paths alone decide, before pandas is imported to read them
        if not r.is_dir():
            raise FIError(f"'{r}' is not a run directory")
        if not (r / ROWS).is_file() or not (r / "manifest.json").is_file():
            raise FIError(f"'{r}' holds no per-token FI per layer and KV head ({ROWS}): make it with fi fit-data")
    rows, meta = _pooled(runs, [_read_run(r) for r in runs], settings.exclude)
    record = _fitted(rows, settings, meta)
    if out_file is not None:
        from fi_toolkit.fit.ridge import policy_json

        results.atomic_write_text(out_file, policy_json(record))
    return record


def _run_paths(runs) -> list[Path]:
    """``runs`` as a list of paths (one path alone is a list of one)."""
    if isinstance(runs, (str, Path)):
        runs = [runs]
    if not isinstance(runs, Sequence) or not runs:
        raise FIError(f"runs must list fi fit-data run directories, got {runs!r}", parameter="runs")
    return [Path(check_type("runs", r, str, Path)) for r in runs]


def _check_out_file(out_file: Path, overwrite: bool) -> Path:
    """A ``.json`` file that can be written, and not one already there unless ``overwrite``."""
    if out_file.suffix != ".json":
        raise FIError(f"out_file must end in .json, got '{out_file}'", parameter="out_file")
    results.check_out_path(out_file, want_dir=False, option="out_file")
    if out_file.exists() and not check_type("overwrite", overwrite, bool):
        raise FIError(
            f"out_file '{out_file}' exists; choose another file or pass overwrite", parameter=("out_file", "overwrite")
        )
    return out_file


def _read_run(path: Path) -> tuple[dict, pd.DataFrame]:
    """(manifest, rows) of a ``fi fit-data`` run; one line for anything else."""
    import pandas as pd

    manifest_file, rows_file = path / "manifest.json", path / ROWS
    try:
        manifest = json.loads(manifest_file.read_text())
        rows = pd.read_parquet(rows_file)
    except Exception as exc:  # a damaged file, whatever the reader says
        raise FIError(f"'{path}': cannot read its fit data ({type(exc).__name__}: {exc})") from None
    if not isinstance(manifest, dict) or manifest.get("command") != "fit-data" or "fi" not in rows.columns:
        raise FIError(f"'{path}' holds no per-token FI per layer and KV head ({ROWS}): make it with fi fit-data")
    missing = [k for k in (*SHARED, "documents") if k not in manifest]
    if missing:
        raise FIError(
            f"'{path}': its manifest.json lacks '{missing[0]}' (made by another version? run fi fit-data again)"
        )
    _check_manifest_types(path, manifest)
    return manifest, rows


def _check_manifest_types(path: Path, manifest: dict) -> None:
    """The fields :func:`run_fit` reads, of the types :func:`run_fit_data` writes (one line naming the first
    that is not)."""

    def whole(v):
        return isinstance(v, int) and not isinstance(v, bool)

    signals, docs = manifest["signals"], manifest["documents"]
    checks = (
        ("model", isinstance(manifest["model"], dict), "an object"),
        ("signals", isinstance(signals, dict) and all(k in signals for k in SIGNAL_KEYS), "an object of the signals"),
        ("prefix", whole(manifest["prefix"]), "a whole number"),
        ("sinks", whole(manifest["sinks"]), "a whole number"),
        ("samples", whole(manifest["samples"]), "a whole number"),
        ("chunks", isinstance(manifest["chunks"], list), "a list"),
        (
            "documents",
            isinstance(docs, list) and all(isinstance(d, dict) and isinstance(d.get("name"), str) for d in docs),
            "a list of objects with a 'name'",
        ),
    )
    for key, ok, want in checks:
        if not ok:
            raise FIError(f"'{path}': its manifest.json's '{key}' must be {want} (damaged? run fi fit-data again)")


def _pooled(runs: list[Path], loaded: list[tuple[dict, pd.DataFrame]], exclude: tuple[str, ...]):
    """(rows of every run less the excluded documents, the record's ``model``, ``signals`` and ``fitted_on``):
    the runs must share :data:`SHARED` (one fit, one setting) and name each document once."""
    import pandas as pd

    first = loaded[0][0]
    for path, (manifest, _) in zip(runs[1:], loaded[1:]):
        for key in SHARED:
            if manifest.get(key) != first.get(key):
                raise FIError(f"'{path}' was made with other {key} than '{runs[0]}': one fit needs one setting")
    rows = pd.concat([r for _, r in loaded], ignore_index=True)
    unknown = [d for d in exclude if d not in set(rows["document"])]
    if unknown:
        raise FIError(
            f"exclude '{unknown[0]}': no such document in the runs ({', '.join(dict.fromkeys(rows['document']))})",
            parameter="exclude",
        )
    rows = rows[~rows["document"].isin(exclude)].reset_index(drop=True)
    if rows.duplicated(["document", "layer", "head", "position"]).any():
        raise FIError("a document appears in more than one run: give each document once")
    fitted_on = {
        "runs": [str(r) for r in runs],
        **{k: first[k] for k in ("prefix", "chunks", "sinks", "samples")},
        "documents": [d for m, _ in loaded for d in m["documents"] if d["name"] not in exclude],
    }
    return rows, {
        "model": first["model"],
        "signals": {k: first["signals"][k] for k in SIGNAL_KEYS},
        "fitted_on": fitted_on,
    }


def _fitted(rows: pd.DataFrame, settings: FitSettings, meta: dict) -> dict:
    """The learner's record: the ridge fit (:func:`~fi_toolkit.fit.ridge.fit_policy`) or the LambdaRank model
    (:func:`~fi_toolkit.fit.lambdarank.learn_policy`)."""
    if settings.learner == "lambdarank":
        from fi_toolkit.fit.lambdarank import learn_policy

        return learn_policy(rows, list(settings.features), meta, group=settings.group)
    from fi_toolkit.fit import ridge

    return ridge.fit_policy(rows, list(settings.features), settings.target, settings.ridge, meta)
