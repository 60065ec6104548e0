"""The FI oracle's estimate in bfloat16 against float32: would lower-precision matrix products buy the speed?

On SmolLM2 (embedded), 'alice', p = 512 (``--prefix``), chunk [p, p + 128), keep 25 %: the Fisher estimate of
the oracle (16 draws, seed 0) with the model and the trace's cache in float32 (the oracle's own) and in
bfloat16 (a copy of both; the CPU's bfloat16 matrix units where it has them), its CPU time, the rank agreement
of the two estimates (Spearman over every layer, KV head and position), the share of kept entries the two keep
maps share, and the float32 probe's FI of each keep map. Exploratory: the oracle stays in float32.
Writes benchmarks/results/bench_oracle_precision.txt.

    .venv/bin/python benchmarks/bench_oracle_precision.py [--prefix 512] [--chunk-len 128] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from scipy.stats import spearmanr

from fi_toolkit.documents import load_document
from fi_toolkit.model.loading import load_model
from fi_toolkit.policies import FIOracle
from fi_toolkit.policies.base import Signals
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.probe.forward_influence import forward_influence
from fi_toolkit.runs.results import atomic_write_text
from fi_toolkit.signals.trace import trace_prefix

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--chunk-len", type=int, default=128)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_oracle_precision.txt")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m")
    p = args.prefix
    chunk = Chunk(p, p + args.chunk_len)
    doc = load_document("alice", lm.tokenizer, max_tokens=chunk.end)
    trace = trace_prefix(lm.model, doc.ids, p)
    low = copy.copy(trace)
    low.keys = [k.to(torch.bfloat16) for k in trace.keys]
    low.values = [v.to(torch.bfloat16) for v in trace.values]
    runs = {"float32": (lm.model, trace), "bfloat16": (copy.deepcopy(lm.model).to(torch.bfloat16), low)}
    policy = FIOracle(budget="keep=0.25", samples=args.samples)
    cpu, scores, keeps = {}, {}, {}
    for name, (model, tr) in runs.items():
        c0 = time.process_time()
        scores[name] = fisher_fi(model, tr, doc.ids, [chunk], samples=args.samples, seed=0).head_fi[..., 0]
        cpu[name] = time.process_time() - c0
        signals = Signals.from_trace(trace)
        signals.fi_estimates = [s.float() for s in scores[name]]
        keeps[name] = policy.keep_map(signals)
        keeps[name].label = name
    shared = sum(
        len(set(a.tolist()) & set(b.tolist()))
        for layer_a, layer_b in zip(keeps["float32"].keep, keeps["bfloat16"].keep)
        for a, b in zip(layer_a, layer_b)
    ) / sum(k.numel() for k in keeps["float32"].keep)
    rho = spearmanr(scores["float32"].flatten().numpy(), scores["bfloat16"].flatten().numpy()).statistic
    fi = forward_influence(lm.model, trace, doc.ids, list(keeps.values()), [chunk]).fi()[:, 0].tolist()
    lines = [
        f"FI oracle's estimate, bfloat16 vs float32: SmolLM2-135M, {lm.device}, "
        f"torch threads {torch.get_num_threads()}, "
        f"alice, p = {p}, chunk {chunk.label}, {args.samples} draws, keep 0.25",
        *(
            f"{name:9} estimate {cpu[name]:6.2f} CPU s   FI of its keep map (float32 probe) {f:.4g}"
            for name, f in zip(runs, fi)
        ),
        f"bfloat16 / float32 time {cpu['bfloat16'] / cpu['float32']:.2f}x; Spearman {rho:.4f}; "
        f"kept entries shared {shared:.1%}",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
