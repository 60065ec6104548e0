"""Per-token FI of every prefix position: the Fisher estimator against exact leave-one-out.

On SmolLM2 (embedded), 'alice', for each prefix p (default 1024 and 2048) with the 256-token chunk
[p, p + 256): the estimate of every position of [4, p - 32) with ``--samples`` draws, timed whole, and
exact leave-one-out FI of ``--candidates`` uniformly sampled positions (batch 1, the CPU default),
timed in the same process right after; exact FI for all positions is extrapolated from that sample
(per-candidate time x number of positions). Writes benchmarks/results/bench_estimator.txt.

    .venv/bin/python benchmarks/bench_estimator.py [--prefixes 1024,2048] [--samples 16] [--candidates 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from scipy import stats

from fi_toolkit.documents import load_document
from fi_toolkit.model.loading import load_model
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.runs.results import atomic_write_text
from fi_toolkit.signals.trace import trace_prefix
from fi_toolkit.studies import candidate_positions, per_token_fi

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefixes", default="1024,2048")
    ap.add_argument("--chunk-len", type=int, default=256)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--candidates", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_estimator.txt")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m")
    lines = [
        f"Fisher estimator vs exact leave-one-out FI: SmolLM2-135M, {lm.device}, torch threads "
        f"{torch.get_num_threads()}, alice, chunk [p, p + {args.chunk_len}), {args.samples} samples; exact FI "
        f"for all positions extrapolated from {args.candidates} uniformly sampled candidates",
        f"{'p':>6} {'positions':>9} {'fisher s':>9} {'exact s/cand':>12} {'exact all s (extrap.)':>21} "
        f"{'speed-up':>9} {'spearman (sample)':>17}",
    ]
    for p in (int(x) for x in args.prefixes.split(",")):
        chunk = Chunk(p, p + args.chunk_len)
        doc = load_document("alice", lm.tokenizer, max_tokens=chunk.end)
        trace = trace_prefix(lm.model, doc.ids, p)
        positions, _ = candidate_positions(trace, f"sample:{args.candidates}")
        n_all = trace.scored - 4
        t0 = time.perf_counter()
        est = fisher_fi(lm.model, trace, doc.ids, [chunk], args.samples)
        fisher_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        exact = per_token_fi(lm.model, trace, doc.ids, positions, [chunk], batch_size=1).fi()[2:, 0]
        per_candidate = (time.perf_counter() - t0) / (positions.numel() + 2)  # the two noise controls ran too
        rho = stats.spearmanr(exact.numpy(), est.fi[positions, 0].numpy()).statistic
        lines.append(
            f"{p:>6} {n_all:>9} {fisher_s:>9.1f} {per_candidate:>12.2f} {per_candidate * n_all:>21.0f} "
            f"{per_candidate * n_all / fisher_s:>8.1f}x {rho:>17.3f}"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    atomic_write_text(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
