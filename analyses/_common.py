"""Options and output handling shared by the analyses/ scripts."""

from __future__ import annotations

import argparse
from pathlib import Path

from fi_toolkit.documents import load_document
from fi_toolkit.probe.chunks import parse_chunk
from fi_toolkit.runs.results import atomic_copy, atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def add_output_args(ap: argparse.ArgumentParser, name: str) -> None:
    """--batch-size, --out, --report, --results and --fresh, with defaults under runs/analyses/<name>."""
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "analyses" / name)
    ap.add_argument("--report", type=Path, default=ROOT / "runs" / "analyses" / f"{name}-report")
    ap.add_argument(
        "--results",
        default=str(ROOT / "analyses" / "results" / name),
        help="where the small summary tables are copied ('' to skip)",
    )
    ap.add_argument("--fresh", action="store_true", help="discard a previous run in --out instead of resuming it")


def copy_results(args, names: list[str]) -> None:
    """Copy the small result files ``names`` from --out to --results (unless --results ''), each atomically."""
    if args.results:
        for name in names:
            atomic_copy(args.out / name, Path(args.results) / name)


def parse_config(text: str):
    """``PREFIX:CHUNK,CHUNK`` (``1024:1024:1280,1536:1664``) -> (prefix, chunks)."""
    prefix, chunks = text.split(":", 1)
    return int(prefix), [parse_chunk(c) for c in chunks.split(",")]


def per_document(lm, args, run_document, write_results, summary_lines) -> None:
    """For each ``--configs`` compression point and each ``--documents`` name, one resumable run
    (``run_document(lm, doc, prefix, chunks, args) -> tables``); after every document the finished ones'
    tables are merged into ``--results/p<prefix>/`` (``write_results``) and its output.txt rewritten from
    ``summary_lines``, so a run cut off keeps what finished."""
    for config in args.configs:
        prefix, chunks = parse_config(config)
        done = {}
        for name in args.documents.split(","):
            doc = load_document(name.strip(), lm.tokenizer, max_tokens=max(c.end for c in chunks))
            done[doc.name] = run_document(lm, doc, prefix, chunks, args)
            merged = write_results(args.results / f"p{prefix}", args.out / f"p{prefix}", done, doc.name)
            text = "\n".join(summary_lines(prefix, chunks, merged, args)) + "\n"
            atomic_write_text(args.results / f"p{prefix}" / "output.txt", text)
            print(text, flush=True)
