"""The learned policy's cost per compression beside SnapKV, InfoKV, H2O, ExpectedAttention and TOVA.

On SmolLM2 (embedded), 'alice', p = 256 (``--prefix``), keep 25 %: the wall time of ``policy.keep_map(trace)``
(every layer's scores and selection; the trace is shared and not timed) for ``learned:path=MODEL`` and the
heuristics, each the fastest of ``--repeats`` calls, and the ratio learned / each. One thread by default.
Writes benchmarks/results/bench_learned.txt.

    .venv/bin/python benchmarks/bench_learned.py [--model-file analyses/results/learned/model.json] [--prefix 256]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fi_toolkit.documents import load_document
from fi_toolkit.model.loading import load_model
from fi_toolkit.policies import parse_policy
from fi_toolkit.runs.results import atomic_write_text
from fi_toolkit.signals.trace import trace_prefix

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-file", type=Path, default=ROOT / "analyses" / "results" / "learned" / "model.json")
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_learned.txt")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m")
    doc = load_document("alice", lm.tokenizer, max_tokens=args.prefix)
    trace = trace_prefix(lm.model, doc.ids, args.prefix)
    specs = {
        "learned": f"learned:path={args.model_file}",
        "snapkv": "snapkv",
        "infokv": "infokv",
        "h2o": "h2o",
        "expected_attention": "expected_attention",
        "tova": "tova",
    }
    times = {}
    for name, spec in specs.items():
        policy = parse_policy(spec, budget="keep=0.25")
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            policy.keep_map(trace)
            best = min(best, time.perf_counter() - t0)
        times[name] = best
    lines = [
        f"SmolLM2-135M, alice, p = {args.prefix}, keep 25 %, {args.threads} thread(s), fastest of {args.repeats}:",
        *(f"  {name:18s} {1000 * t:8.1f} ms per compression (keep_map)" for name, t in times.items()),
        *(f"  learned / {name}: {times['learned'] / times[name]:.1f}x" for name in specs if name != "learned"),
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
