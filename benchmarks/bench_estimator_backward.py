"""The Fisher estimator's forward and backward passes: the hand-written attention backward against autograd
through the model's own attention, side by side in one process.

On SmolLM2 (embedded), 'alice', p = 2048 (``--prefix``), the 256-token chunk after it: the forward with
gradients to the bias, then ``--draws`` backward passes (one per label draw) with the estimator's attention
(:class:`fi_toolkit.probe.bias_attention.BiasedAttention`) and with autograd through the model's sdpa attention
(the estimator's path before it), alternating ``--repeats`` times; the fastest of each, as wall time and as the
process's CPU time (with one thread it moves less when another process shares the core), and the largest
difference between the two gradients. Writes benchmarks/results/bench_estimator_backward.txt.

``--batch S`` adds what batching the draws could gain: the backward of ``S`` draws in one pass through a graph
of ``S`` rows (the continuation repeated, a cotangent per row; autograd through the model's attention, since
the hand-written one takes one row) against ``S`` passes through a graph of one row, per draw. A batched
backward does the same arithmetic in larger matrix products, so this bounds the gain of batching the draws.

    .venv/bin/python benchmarks/bench_estimator_backward.py [--prefix 2048] [--draws 4] [--repeats 3] [--threads 1]
        [--batch 8]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fi_toolkit.documents import load_document
from fi_toolkit.eviction import shared_cache
from fi_toolkit.model.loading import load_model
from fi_toolkit.probe import estimator
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.forward_influence import _continuation_hidden
from fi_toolkit.runs.results import atomic_write_text
from fi_toolkit.signals.trace import trace_prefix

ROOT = Path(__file__).resolve().parents[1]


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def one_run(model, trace, cont, capture, draws: int, by_hand: bool):
    """Forward, then ``draws`` backward passes -> (gradients, (forward wall, cpu), (per-draw wall, cpu))."""
    chooser = estimator._by_hand
    if not by_hand:
        estimator._by_hand = lambda *args: False
    try:
        bias = torch.zeros(trace.num_layers, trace.num_kv_heads, trace.prefix_len, requires_grad=True)
        gen = torch.Generator().manual_seed(0)
        with torch.enable_grad(), estimator.attention_bias(model, bias):
            hidden, fw, fc = timed(lambda: estimator._hidden(model, trace, cont, capture, 512))
            grads, bw, bc = [], 0.0, 0.0
            for _ in range(draws):
                cotangent = torch.randn(hidden.shape, generator=gen)
                (g,), w, c = timed(lambda u=cotangent: torch.autograd.grad(hidden, bias, u, retain_graph=True))
                grads.append(g)
                bw, bc = bw + w, bc + c
    finally:
        estimator._by_hand = chooser
    return torch.stack(grads), (fw, fc), (bw / draws, bc / draws)


def batched_draws(model, trace, cont, capture, draws: int) -> list[tuple[float, float]]:
    """Per-draw (wall, CPU) seconds of ``draws`` backward passes through a graph of one row, then of one
    backward pass through a graph of ``draws`` rows (one cotangent each); autograd through the model's attention."""
    chooser = estimator._by_hand
    estimator._by_hand = lambda *args: False
    per_draw = []
    try:
        for rows in (1, draws):
            bias = torch.zeros(trace.num_layers, trace.num_kv_heads, trace.prefix_len, requires_grad=True)
            cache = shared_cache(trace.keys, trace.values, rows, model.config)
            visible = torch.ones(rows, trace.prefix_len, dtype=torch.bool)
            with torch.enable_grad(), estimator.attention_bias(model, bias):
                hidden = _continuation_hidden(
                    model, cache, cont[None].expand(rows, -1), trace.prefix_len, visible, capture, 512
                )
                cotangent = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(0))
                passes = draws // rows
                _, w, c = timed(
                    lambda h=hidden, u=cotangent, k=passes, b=bias: [
                        torch.autograd.grad(h, b, u, retain_graph=True) for _ in range(k)
                    ]
                )
            per_draw.append((w / draws, c / draws))
    finally:
        estimator._by_hand = chooser
    return per_draw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--chunk-len", type=int, default=256)
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--batch", type=int, default=0, help="also time S draws in one batched backward (0: not)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_estimator_backward.txt")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m")
    p = args.prefix
    chunk = Chunk(p, p + args.chunk_len)
    doc = load_document("alice", lm.tokenizer, max_tokens=chunk.end)
    trace = trace_prefix(lm.model, doc.ids, p)
    _, _, cont, capture, _ = estimator._prepare(lm.model, trace, doc.ids, [chunk])
    best = {name: [float("inf")] * 4 for name in ("hand-written", "autograd")}
    grads = {}
    for _ in range(args.repeats):
        for name in best:
            grads[name], fwd, bwd = one_run(lm.model, trace, cont, capture, args.draws, name == "hand-written")
            best[name] = [min(a, b) for a, b in zip(best[name], (*fwd, *bwd))]
    diff = float((grads["hand-written"] - grads["autograd"]).abs().max() / grads["autograd"].abs().max())
    lines = [
        f"Fisher estimator passes: SmolLM2-135M, {lm.device}, torch threads {torch.get_num_threads()}, alice, p = {p}, "
        f"chunk {chunk.label}; the fastest of {args.repeats} rounds (wall s / CPU s); backward: per draw, "
        f"the mean of {args.draws}",
        f"{'attention backward':20} {'forward':>15} {'backward':>15}",
    ]
    for name, (fw, fc, bw, bc) in best.items():
        lines.append(f"{name:20} {fw:6.2f} / {fc:6.2f} {bw:6.2f} / {bc:6.2f}")
    hand, auto = best["hand-written"], best["autograd"]
    lines.append(
        f"autograd / hand-written: forward {auto[0] / hand[0]:.2f}x wall, {auto[1] / hand[1]:.2f}x CPU; "
        f"backward {auto[2] / hand[2]:.2f}x wall, {auto[3] / hand[3]:.2f}x CPU"
    )
    lines.append(f"largest gradient difference / largest gradient: {diff:.1e}")
    if args.batch > 1:
        one, many = [(float("inf"),) * 2] * 2
        for _ in range(args.repeats):
            a, b = batched_draws(lm.model, trace, cont, capture, args.batch)
            one, many = tuple(map(min, one, a)), tuple(map(min, many, b))
        lines.append(
            f"autograd backward per draw, {args.batch} draws: one at a time {one[0]:.2f} / {one[1]:.2f}, "
            f"batched in one pass {many[0]:.2f} / {many[1]:.2f} (wall s / CPU s; batched / one at a time "
            f"{many[1] / one[1]:.2f}x CPU)"
        )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
