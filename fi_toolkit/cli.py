"""The ``fi`` command line (typer). Each command is a thin shell over one library call.

``fi probe`` -> :func:`fi_toolkit.experiment.probe_document` -> :func:`fi_toolkit.probe.forward_influence`
-> :func:`fi_toolkit.probe.kl_divergence_rows`.

Every user error is one line on stderr (``error: ...``) and exit status 2; Ctrl-C is exit 130.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import FIError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Forward Influence analysis for KV-cache compression (InfoKV and attention baselines).",
)
out = Console(emoji=False)
err = Console(stderr=True, emoji=False)

try:  # typer >= 0.20 vendors click; older typer uses the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions

DEFAULT_SELECTIONS = ["entropy:0.1", "attention:0.1", "distance:0.1", "infokv:0.1", "random:0.1@0-2"]

# Options shared by every command that runs a model.
ModelOpt = typer.Option("smollm2-135m", "--model", "-m", help="smollm2-135m (embedded), a local directory or a HF id.")
DeviceOpt = typer.Option("cpu", help="cpu, cuda, cuda:N or auto.")
DtypeOpt = typer.Option("float32", help="float32 or bfloat16 (signals and KL stay float32).")
WindowOpt = typer.Option(32, help="Observation window w (last w prefix positions).")
TopKOpt = typer.Option(256, "--top-k", help="Entropy over the k largest logits (k >= vocab: full entropy).")
AlphaOpt = typer.Option(0.9, help="InfoKV mix: alpha*attention + (1-alpha)*softmax(E).")
TauOpt = typer.Option(1.0, help="Bias in E = (D + tau) * H.")
PoolOpt = typer.Option(7, "--pool", help="Average-pool kernel for window attention (1 = off).")


def _signal_config(window, top_k, alpha, tau, pool):
    from .trace import SignalConfig

    config = SignalConfig(top_k=top_k, window=window, pool_kernel=pool, tau=tau, alpha=alpha)
    config.validate()
    return config


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal,
    )


@app.command()
def probe(
    documents: List[str] = typer.Argument(None, help="Text/JSONL files or bundled names (default: alice)."),
    chunk: List[str] = typer.Option(..., "--chunk", "-c", help="Future chunk START:END (repeatable)."),
    select: List[str] = typer.Option(None, "--select", "-s", help="entropy:R, attention:R, distance:R, infokv:R, random:R@SEED, positions:A-B,C remove a token set; policy:NAME@R evicts what a compression policy would (R = what it keeps). Repeatable."),
    prefix: Optional[int] = typer.Option(None, help="Compression point p (default: smallest chunk start)."),
    sinks: int = typer.Option(4, help="First N positions are never picked by score-based or random selectors."),
    model: str = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    window: int = WindowOpt, top_k: int = TopKOpt, alpha: float = AlphaOpt, tau: float = TauOpt, pool: int = PoolOpt,
    batch_size: Optional[int] = typer.Option(None, help="Evictions per batched forward (default: 1 on CPU, 8 on CUDA)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Results directory (default: runs/probe-<time>)."),
    overwrite: bool = typer.Option(False, help="Replace results already in --out."),
):
    """Remove token sets from the KV cache at p and measure Forward Influence on future chunks."""
    from . import results
    from .documents import read_texts, tokenize_texts
    from .experiment import probe_document, trace_document
    from .models import load_model
    from .probe import check_chunks, parse_chunk
    from .selections import parse_selections

    chunks = [parse_chunk(c) for c in chunk]
    selections = parse_selections(select or DEFAULT_SELECTIONS)
    config = _signal_config(window, top_k, alpha, tau, pool)
    if batch_size is not None and batch_size < 1:
        raise FIError(f"--batch-size must be >= 1, got {batch_size}")
    p = prefix if prefix is not None else min(c.start for c in chunks)
    texts = [t for spec in (documents or [None]) for t in read_texts(spec)]
    out_path = results.prepare_out_dir(out_dir or results.default_out_dir("probe"), overwrite)
    started, t0 = results.now(), time.perf_counter()
    lm = load_model(model, device, dtype)
    docs = tokenize_texts(texts, lm.tokenizer, max_tokens=max(c.end for c in chunks))
    for doc in docs:
        check_chunks(chunks, p, len(doc), getattr(lm.config, "max_position_embeddings", None))
    tables = []
    with _progress() as bar:
        for doc in docs:
            task = bar.add_task(f"trace {doc.name}", total=None)
            trace = trace_document(lm, doc, p, config)
            bar.update(task, description=f"probe {doc.name}", total=len(selections), completed=0)
            tables.append(probe_document(
                lm, doc, chunks, selections, prefix=p, sinks=sinks, config=config, batch_size=batch_size,
                trace=trace, on_progress=lambda n, task=task: bar.advance(task, n),
            ))
    import pandas as pd

    table = pd.concat(tables, ignore_index=True)
    results.write_table(out_path / "fi.csv", table)
    manifest = {
        "command": "probe", "argv": sys.argv, "started": started, "finished": results.now(),
        "seconds": round(time.perf_counter() - t0, 2),
        "model": {"name": model, "device": device, "dtype": dtype, "layers": lm.config.num_hidden_layers,
                  "kv_heads": lm.config.num_key_value_heads, "vocab": lm.config.vocab_size},
        "documents": [{"name": d.name, "source": d.source, "sha256": d.sha256, "tokens_used": len(d)} for d in docs],
        "prefix": p, "chunks": [c.label for c in chunks], "selections": [s.label for s in selections],
        "sinks": sinks, "batch_size": batch_size, "signals": config.__dict__, "versions": results.versions(),
    }
    results.write_json(out_path / "manifest.json", manifest)
    _print_fi_table(table, f"Forward Influence (nats), {model}, p={p}, {len(docs)} document(s)")
    err.print(f"results: {out_path}/fi.csv, {out_path}/manifest.json")


def _print_fi_table(table, title: str) -> None:
    pivot = table.pivot_table(index="selection", columns="chunk", values="fi", aggfunc="mean", sort=False)
    sizes = table.groupby("selection", sort=False)["n_removed"].mean()
    t = Table(title=title)
    t.add_column("selection")
    t.add_column("removed", justify="right")
    for c in pivot.columns:
        t.add_column(f"FI {c}", justify="right")
    for sel, row in pivot.iterrows():
        t.add_row(sel, f"{sizes[sel]:.0f}", *[f"{v:.5f}" for v in row])
    out.print(t)


@app.command()
def scores(
    document: str = typer.Argument(None, help="Text/JSONL file or bundled name (default: alice)."),
    prefix: int = typer.Option(2048, help="Trace the first PREFIX tokens."),
    model: str = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    window: int = WindowOpt, top_k: int = TopKOpt, alpha: float = AlphaOpt, tau: float = TauOpt, pool: int = PoolOpt,
    out_file: Path = typer.Option(Path("scores.csv"), "--out", "-o", help="Output .csv or .parquet."),
):
    """Write per-token signals (H, A, D, E, S; per layer too) with the token text."""
    from . import results
    from .documents import read_texts, tokenize_texts
    from .experiment import trace_document
    from .models import load_model

    config = _signal_config(window, top_k, alpha, tau, pool)
    if out_file.suffix not in (".csv", ".parquet"):
        raise FIError(f"--out must end in .csv or .parquet, got '{out_file}'")
    texts = read_texts(document)[:1]
    lm = load_model(model, device, dtype)
    doc = tokenize_texts(texts, lm.tokenizer, max_tokens=prefix)[0]
    with _progress() as bar:
        bar.add_task(f"trace {doc.name}", total=None)
        trace = trace_document(lm, doc, prefix, config)
    tokens = [lm.tokenizer.decode([int(i)]) for i in doc.ids[:prefix]]
    table = trace.token_table(tokens)
    table.insert(0, "document", doc.name)
    results.write_table(out_file, table)
    err.print(f"wrote {len(table):,} tokens x {table.shape[1]} columns to {out_file}")
    summary = table[~table.in_window][["entropy", "attention", "distance", "infokv"]].describe().loc[["mean", "std", "min", "max"]]
    t = Table(title=f"signals over the scored prefix [0, {trace.scored}) of '{doc.name}'")
    t.add_column("")
    for c in summary.columns:
        t.add_column(c, justify="right")
    for stat, row in summary.iterrows():
        t.add_row(stat, *[f"{v:.4g}" for v in row])
    out.print(t)


@app.command()
def models():
    """Show the embedded default model and where its converted copy is cached."""
    from .models import DEFAULT_MODEL, EMBEDDED_INSTALL, cache_dir, embedded_gguf

    try:
        gguf = embedded_gguf()
        out.print(f"{DEFAULT_MODEL} (default): {gguf}")
    except FIError as exc:
        out.print(f"{DEFAULT_MODEL} (default): not installed ({exc})")
    out.print(f"converted-copy cache: {cache_dir() / 'models'}")
    out.print("any Hugging Face causal LM: --model <hf-id or local directory> (Llama, Qwen2/3, Mistral...)")
    out.print(f"install the embedded model: {EMBEDDED_INSTALL}")


# --- commands defined in other modules register here (one import line each) ---
from .cli_study import register as _register_study; _register_study(app)  # noqa: E402,E702
from .cli_generate import register as _register_generate; _register_generate(app)  # noqa: E402,E702


def main() -> None:
    """Console entry point: one line on stderr for any user error, never a traceback."""
    import torch

    try:
        code = app(standalone_mode=False)
    except FIError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except click_exceptions.ClickException as exc:
        err.print(f"error: {exc.format_message()}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted: results already written are intact", markup=False)
        sys.exit(130)
    except torch.OutOfMemoryError:
        err.print("error: out of memory; lower --batch-size, the chunk length or the prefix", markup=False)
        sys.exit(3)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
