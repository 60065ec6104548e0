"""Per-token Forward Influence throughput: the batched path against one eviction per forward.

On SmolLM2 (embedded) with a 1,024-token prefix of 'alice' and one 256-token chunk 1024:1280
(defaults): leave-one-out FI of N candidate positions (a uniform sample, as ``fi correlate``
picks them) through :func:`fi_toolkit.studies.per_token_fi`, once with ``batch_size=1`` (one
eviction per forward) and once per larger batch size, in the same process, alternating order,
so the ratios are measured side by side on this noisy machine. Also prints the wall time of the
analyses/nearfar.py run recorded in analyses/results/nearfar/manifest.json, when present.

    .venv/bin/python benchmarks/bench_correlate.py [--prefix 1024] [--chunk 1024:1280] [--candidates 16] [--batch-sizes
    8,16] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from fi_toolkit.documents import load_document
from fi_toolkit.model.loading import load_model
from fi_toolkit.probe.chunks import parse_chunk
from fi_toolkit.signals.trace import trace_prefix
from fi_toolkit.studies import candidate_positions, per_token_fi

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--chunk", default="1024:1280")
    ap.add_argument("--candidates", type=int, default=16)
    ap.add_argument("--batch-sizes", default="8,16")
    ap.add_argument("--document", default="alice")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch's default); on a shared CPU 1 avoids oversubscription",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    chunk = parse_chunk(args.chunk)
    lm = load_model("smollm2-135m")
    doc = load_document(args.document, lm.tokenizer, max_tokens=chunk.end)
    trace = trace_prefix(lm.model, doc.ids, args.prefix)
    positions, _ = candidate_positions(trace, f"sample:{args.candidates}")
    sizes = [1] + [int(b) for b in args.batch_sizes.split(",")]
    print(
        f"per-token FI: SmolLM2-135M, {lm.device}, torch threads {torch.get_num_threads()}, prefix {args.prefix}, "
        f"chunk {chunk.label} ({len(chunk)} tokens), {positions.numel()} single-token evictions per run"
    )
    per_token_fi(lm.model, trace, doc.ids, positions[:2], [chunk], batch_size=2)  # warm-up
    seconds: dict[int, list[float]] = {b: [] for b in sizes}
    values: dict[int, np.ndarray] = {}
    for order in (sizes, sizes[::-1]):  # alternate the order to cancel drift in machine load
        for b in order:
            t0 = time.perf_counter()
            values[b] = per_token_fi(lm.model, trace, doc.ids, positions, [chunk], batch_size=b)
            seconds[b].append(time.perf_counter() - t0)
    base = np.median(seconds[1])
    print(f"{'batch size':>10} {'seconds':>9} {'evictions/s':>12} {'speed-up':>9} {'max |dFI| vs batch 1':>21}")
    for b in sizes:
        s = float(np.median(seconds[b]))
        diff = float(np.max(np.abs(values[b] - values[1])))
        print(f"{b:>10} {s:>9.2f} {positions.numel() / s:>12.2f} {base / s:>8.2f}x {diff:>21.2e}")
    manifest = ROOT / "analyses" / "results" / "nearfar" / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        s = m["settings"]
        print(
            f"analyses/nearfar.py: {m['seconds']:.0f} s of study time (model load and report excluded) for "
            f"{len(s['documents'])} documents "
            f"(p={s['prefix']}, distances {s['distances']}, chunk {s['chunk_len']}, "
            f"sets of {s.get('budget', s.get('ratio'))}, "
            f"{s['seeds']} random seeds, with and without sink protection)"
        )


if __name__ == "__main__":
    main()
