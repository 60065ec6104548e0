"""``fi fit-data`` and ``fi fit``: learn a policy from Forward Influence (:mod:`fi_toolkit.studies.fit`).

``fi fit-data DOCS --chunk A:B --out RUN`` writes ``RUN/fit_rows.parquet`` (per document, layer, KV head
and candidate position: the compression-time features and the Fisher estimate of FI) and
``RUN/manifest.json``; ``fi fit RUN... --out policy.json`` fits a ridge score on the rows of every run,
cross-validated leaving one document out, and writes the JSON ``fitted:path=policy.json`` reads.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from fi_toolkit.cli.options import _progress, check_prefix, err, out, settings_options
from fi_toolkit.cli.study import _read_documents
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.signals.config import SignalConfig

ROWS = "fit_rows.parquet"
# the settings every run given to one fit must share (they define the features and the target)
SHARED = ("model", "signals", "prefix", "chunks", "sinks", "samples")


@settings_options()
def fit_data(
    documents: List[str] = typer.Argument(None, help="Text/JSONL files or bundled names (default: alice)."),
    chunk: List[str] = typer.Option(
        ..., "--chunk", "-c", help="Future chunk START:END of the FI target (repeatable: the mean over chunks)."
    ),
    prefix: Optional[int] = typer.Option(None, help="Compression point p (default: smallest chunk start)."),
    sinks: int = typer.Option(
        0, help="Leave the first N positions out of the rows (the policy ranks them too: default 0)."
    ),
    samples: int = typer.Option(16, help="Label draws of the Fisher estimator per chunk."),
    seed: int = typer.Option(0, help="Seed of the label draws."),
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Run directory for fit_rows.parquet and manifest.json."),
    overwrite: bool = typer.Option(False, help="Replace the results already in --out."),
):
    """Training rows for fi fit: compression-time features and per-(layer, KV head) Fisher FI of every position."""
    from fi_toolkit.probe.chunks import check_chunks, parse_chunk
    from fi_toolkit.probe.estimator_options import check_samples
    from fi_toolkit.runs import results

    model.check()
    config = signals.check()
    chunks = [parse_chunk(c) for c in chunk]
    p = prefix if prefix is not None else min(c.start for c in chunks)
    check_chunks(chunks, p, float("inf"), None)
    check_prefix(p, config.window)
    if not 0 <= sinks < p - config.window:
        raise FIError(f"--sinks must lie in [0, {p - config.window}), got {sinks}")
    check_samples(samples)
    if seed < 0:
        raise FIError(f"--seed must be >= 0, got {seed}")
    texts = _read_documents(documents)
    results.check_results_dir(out_dir, overwrite)
    # every check above imports nothing heavy (usage errors answer at once); the work below does
    import pandas as pd

    from fi_toolkit.documents import tokenize_texts
    from fi_toolkit.probe.experiment import max_context, trace_document
    from fi_toolkit.studies.fit import fit_rows

    t0 = time.perf_counter()
    lm = model.load()
    docs = tokenize_texts(texts, lm.tokenizer, max_tokens=max(c.end for c in chunks))
    for doc in docs:
        check_chunks(chunks, p, len(doc), max_context(lm))
    tables = []
    with _progress() as bar:
        for doc in docs:
            task = bar.add_task(f"trace {doc.name}", total=None)
            trace = trace_document(lm, doc, p, config)
            bar.update(task, description=f"fisher FI {doc.name}", total=samples, completed=0)
            tables.append(
                fit_rows(
                    lm.model,
                    doc,
                    trace,
                    chunks,
                    sinks,
                    samples,
                    seed,
                    on_progress=lambda n, task=task: bar.advance(task, n),
                )
            )
    table = pd.concat(tables, ignore_index=True)
    cfg = lm.config
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    manifest = {
        "command": "fit-data",
        "argv": sys.argv,
        "seconds": round(time.perf_counter() - t0, 2),
        "model": {**lm.describe(), "name": model.model, "head_dim": head_dim},
        "signals": dict(config.__dict__),
        "prefix": p,
        "chunks": [c.label for c in chunks],
        "sinks": sinks,
        "samples": samples,
        "seed": seed,
        "documents": [{"name": d.name, "source": d.source, "sha256": d.sha256} for d in docs],
        "versions": results.versions(),
    }
    out_path = results.check_results_dir(out_dir, overwrite)
    with results.staged_dir(out_path, replaced=results.result_entry) as stage:  # old results whole or new ones
        results.write_table(stage / ROWS, table)
        results.write_json(stage / "manifest.json", manifest)
    err.print(
        f"wrote {len(table):,} rows ({len(docs)} document(s)) to {out_path}/{ROWS}", markup=False, highlight=False
    )


def _read_run(path: Path):
    """(manifest, rows) of a ``fi fit-data`` run; one line for anything else."""
    import pandas as pd

    manifest_file, rows_file = path / "manifest.json", path / ROWS
    if not path.is_dir():
        raise FIError(f"'{path}' is not a run directory")
    if not rows_file.is_file() or not manifest_file.is_file():
        raise FIError(f"'{path}' holds no per-token FI per layer and KV head ({ROWS}): make it with fi fit-data")
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


SIGNAL_KEYS = ("window", "top_k", "pool_kernel", "tau", "entropy_of", "final_norm")


def _check_manifest_types(path: Path, manifest: dict) -> None:
    """The fields fi fit reads, of the types fi fit-data writes (one line naming the first that is not)."""

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


def fit(
    runs: List[Path] = typer.Argument(..., help="Run directories of fi fit-data (their documents are pooled)."),
    out_file: Path = typer.Option(..., "--out", "-o", help="The fitted policy JSON to write."),
    features: Optional[str] = typer.Option(
        None,
        help="Comma-separated features (default: all of them; 'decoding': all that a decoding compression can "
        "compute).",
    ),
    target: str = typer.Option("rank", help="'rank' (within-head rank of FI) or 'log' (log FI)."),
    ridge: float = typer.Option(
        1e-3, help="Ridge penalty lambda (times the number of rows) on the standardised coefficients."
    ),
    exclude: List[str] = typer.Option(
        None, "--exclude", help="Leave this document's rows out (repeatable), to test the policy on it."
    ),
    learner: str = typer.Option(
        "ridge",
        help="'ridge' (a linear score, fitted:path=FILE) or 'lambdarank' (LightGBM LambdaRank on within-head FI "
        "ranks, learned:path=FILE; its features add depth, kv_head, keydiff, vnorm, wo_vnorm and acc_wo_vnorm).",
    ),
    overwrite: bool = typer.Option(False, help="Replace --out if it exists."),
):
    """Fit a linear score of compression-time signals to per-(layer, KV head) FI; cross-validated leaving one document
    out."""
    from fi_toolkit.policies.learned import EXTRA
    from fi_toolkit.runs import results
    from fi_toolkit.studies.fit_options import DECODING_FEATURES, DEFAULT_FEATURES, check_fit_options

    if learner not in ("ridge", "lambdarank"):
        raise FIError(f"--learner must be ridge or lambdarank, got '{learner}'")
    extra = list(EXTRA) if learner == "lambdarank" else []
    if features is None or features.strip() == "decoding":
        names = list(DECODING_FEATURES if features else DEFAULT_FEATURES) + extra
    else:
        names = [f.strip() for f in features.split(",")]
    if learner == "ridge":
        check_fit_options(names, target, ridge)
    else:
        from fi_toolkit.policies.features import check_features

        check_features(names)
    if out_file.suffix != ".json":
        raise FIError(f"--out must end in .json, got '{out_file}'")
    results.check_out_path(out_file, want_dir=False)
    if out_file.exists() and not overwrite:
        raise FIError(f"--out '{out_file}' exists; choose another file or pass --overwrite")
    for r in runs:  # what the paths alone decide, before pandas is imported to read them
        if not r.is_dir():
            raise FIError(f"'{r}' is not a run directory")
        if not (r / ROWS).is_file() or not (r / "manifest.json").is_file():
            raise FIError(f"'{r}' holds no per-token FI per layer and KV head ({ROWS}): make it with fi fit-data")
    import pandas as pd

    from fi_toolkit.studies.fit import fit_policy, policy_json

    loaded = [_read_run(r) for r in runs]
    first = loaded[0][0]
    for path, (manifest, _) in zip(runs[1:], loaded[1:]):
        for key in SHARED:
            if manifest.get(key) != first.get(key):
                raise FIError(f"'{path}' was made with other {key} than '{runs[0]}': one fit needs one setting")
    rows = pd.concat([r for _, r in loaded], ignore_index=True)
    unknown = [d for d in exclude or [] if d not in set(rows["document"])]
    if unknown:
        raise FIError(
            f"--exclude '{unknown[0]}': no such document in the runs ({', '.join(dict.fromkeys(rows['document']))})"
        )
    rows = rows[~rows["document"].isin(exclude or [])].reset_index(drop=True)
    if rows.duplicated(["document", "layer", "head", "position"]).any():
        raise FIError("a document appears in more than one run: give each document once")
    signals = first["signals"]
    meta = {
        "model": first["model"],
        "signals": {k: signals[k] for k in SIGNAL_KEYS},
        "fitted_on": {
            "runs": [str(r) for r in runs],
            "prefix": first["prefix"],
            "chunks": first["chunks"],
            "sinks": first["sinks"],
            "samples": first["samples"],
            "documents": [d for m, _ in loaded for d in m["documents"] if d["name"] not in (exclude or [])],
        },
    }
    if learner == "lambdarank":
        from fi_toolkit.studies.learned import learn_policy

        record = learn_policy(rows, names, meta)
        results.atomic_write_text(out_file, policy_json(record))
        header = (
            f"learned a LambdaRank model on {len(names)} feature(s), {record['rows']:,} rows of "
            f"{len(record['documents'])} documents ({record['rounds']} rounds)"
        )
        weights = [f"{n:18s} gain {g:.4g}" for n, g in sorted(record["importance_gain"].items(), key=lambda t: -t[1])]
        _print_fit(header, weights, "learned", record, out_file)
        return
    record = fit_policy(rows, names, target, ridge, meta)
    results.atomic_write_text(out_file, policy_json(record))
    header = (
        f"fitted {len(names)} feature(s) on {record['rows']:,} rows of {len(record['documents'])} documents "
        f"(target {target}, ridge {ridge:g})"
    )
    weights = [f"{n:18s} {c:+.4f}" for n, c in sorted(zip(names, record["coefficients"]), key=lambda t: -abs(t[1]))]
    _print_fit(header, weights, "fitted", record, out_file)


def _print_fit(header: str, weights: list[str], own: str, record: dict, out_file: Path) -> None:
    """What fi fit prints for either learner: the header, one line per feature, the leave-one-document-out
    Spearman of its own score (``own``: fitted or learned) beside SnapKV's and InfoKV's, and the file written."""
    out.print(header)
    for line in weights:
        out.print(f"  {line}")
    fmt = {k: "n/a" if v is None else f"{v:+.3f}" for k, v in record["cross_validation"]["mean"].items()}
    out.print(
        f"leave-one-document-out mean within-head Spearman with FI: {own} {fmt[f'spearman_{own}']}, "
        f"snapkv {fmt['spearman_snapkv']}, infokv {fmt['spearman_infokv']}"
    )
    err.print(f"wrote {out_file}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``fit-data`` and ``fit`` to ``app``."""
    app.command("fit-data")(fit_data)
    app.command()(fit)
