"""The FI oracle's probe against a policy's probe: how much dearer is the ceiling?

On SmolLM2 (embedded), 'alice', p = 2048 (``--prefix``), chunk [p, p + 256), keep 25 %: the wall time
of ``probe_document`` with ``policy:fi-oracle@0.25`` (Fisher estimate per layer and KV head with
``--samples`` draws, the keep map, its FI) against ``policy:snapkv@0.25``, all on the same trace
(tracing is shared and not timed), in one process, one after the other; with several sample counts
(``--samples 16,8``) each oracle is timed and its FI reported beside the others, so the cost of the
default (16 draws) and of fewer draws read side by side. ``--repeats R`` runs the whole sequence R times
(the oracle's cached estimates cleared each time) and keeps each probe's fastest time, so a burst of load
on a shared machine does not decide the ratio; the process's CPU time is reported beside the wall time (with
one thread, it moves less when another process shares the core). ``--autograd`` adds the oracle with the
estimator's attention backward left to autograd (its path before ``fi_toolkit.probe.bias_attention``).
``--budgets 0.1,0.25,0.5`` probes every budget in one ``probe_document`` call, as a study of several budgets
does: the reference and the noise controls once, one forward per budget, and the oracle's estimate once (its
first round does not depend on the budget); the FI column lists the budgets' FI in order.
Target ratio: <= 3x. Writes benchmarks/results/bench_oracle.txt.

    .venv/bin/python benchmarks/bench_oracle.py [--prefix 2048] [--samples 16,8] [--threads 1] [--autograd]
        [--budgets 0.25]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fi_toolkit.documents import load_document
from fi_toolkit.model.loading import load_model
from fi_toolkit.probe import estimator, oracle
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import probe_document
from fi_toolkit.runs.results import atomic_write_text
from fi_toolkit.signals.trace import trace_prefix

ROOT = Path(__file__).resolve().parents[1]
AUTOGRAD = "fi-oracle (autograd)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--chunk-len", type=int, default=256)
    ap.add_argument("--samples", default="16", help="Fisher label draws, comma-separated (16: the oracle's default)")
    ap.add_argument("--budgets", default="0.25", help="keep shares probed together, comma-separated")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the whole sequence; the fastest time counts")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument(
        "--autograd", action="store_true", help="also time the oracle with autograd through the model's attention"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_oracle.txt")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m")
    p = args.prefix
    chunk = Chunk(p, p + args.chunk_len)
    doc = load_document("alice", lm.tokenizer, max_tokens=chunk.end)
    trace = trace_prefix(lm.model, doc.ids, p)
    samples = [int(x) for x in args.samples.split(",")]
    budgets = args.budgets.split(",")
    specs = [("policy:snapkv", [f"policy:snapkv@{b}" for b in budgets])] + [
        (f"fi-oracle, {n} draws", [f"policy:fi-oracle@{b}:samples={n}" for b in budgets]) for n in samples
    ]
    if args.autograd:  # the estimator's attention backward before it was written by hand, beside it
        specs.append(
            (f"{AUTOGRAD}, {samples[0]} draws", [f"policy:fi-oracle@{b}:samples={samples[0]}" for b in budgets])
        )
    times, cpu, fis = {name: float("inf") for name, _ in specs}, {name: float("inf") for name, _ in specs}, {}
    for _ in range(args.repeats):
        for name, spec in specs:
            oracle._FIRST_ROUNDS.clear()  # each oracle probe estimates afresh
            chooser = estimator._by_hand
            if name.startswith(AUTOGRAD):
                estimator._by_hand = lambda *a: False
            try:
                t0, c0 = time.perf_counter(), time.process_time()
                table = probe_document(lm, doc, [chunk], spec, prefix=p, trace=trace)
                times[name] = min(times[name], time.perf_counter() - t0)
                cpu[name] = min(cpu[name], time.process_time() - c0)
            finally:
                estimator._by_hand = chooser
            fis[name] = table[table["selection"].str.startswith("policy:")]["fi"].tolist()
    base, base_cpu = times["policy:snapkv"], cpu["policy:snapkv"]
    lines = [
        f"FI oracle vs policy probe: SmolLM2-135M, {lm.device}, torch threads {torch.get_num_threads()}, alice, "
        f"p = {p}, chunk {chunk.label}, keep {args.budgets} (probe_document on a shared trace, noise controls in all; "
        f"the fastest of {args.repeats} rounds; wall time, and the process's CPU time, which another process on "
        f"the machine disturbs less)"
    ]
    for name, _ in specs:
        ratio = times[name] / base
        verdict = "" if name == "policy:snapkv" else f"  (target <= 3x: {'met' if ratio <= 3 else 'NOT met'})"
        lines.append(
            f"{name:30} {times[name]:8.1f} s  {ratio:5.2f}x   CPU {cpu[name]:6.1f} s  {cpu[name] / base_cpu:5.2f}x   "
            f"FI {' / '.join(f'{x:.4g}' for x in fis[name])}{verdict}"
        )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
