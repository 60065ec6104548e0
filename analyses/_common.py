"""Options and output handling shared by the analyses/ scripts."""

from __future__ import annotations

import argparse
from pathlib import Path

from fi_toolkit.runs.results import atomic_copy

ROOT = Path(__file__).resolve().parents[1]


def add_output_args(ap: argparse.ArgumentParser, name: str) -> None:
    """--batch-size, --out, --report, --results and --fresh, with defaults under runs/analyses/<name>."""
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "analyses" / name)
    ap.add_argument("--report", type=Path, default=ROOT / "runs" / "analyses" / f"{name}-report")
    ap.add_argument("--results", default=str(ROOT / "analyses" / "results" / name),
                    help="where the small summary tables are copied ('' to skip)")
    ap.add_argument("--fresh", action="store_true", help="discard a previous run in --out instead of resuming it")


def copy_results(args, names: list[str]) -> None:
    """Copy the small result files ``names`` from --out to --results (unless --results ''), each atomically."""
    if args.results:
        for name in names:
            atomic_copy(args.out / name, Path(args.results) / name)
