"""Speed of task evaluation: samples per minute at 2,048 tokens of context on this CPU, full
cache against InfoKV, and what sharing one prefill across policies saves; ratios side by side in one run.

SmolLM2, passkey samples at 2,048 tokens, question-agnostic, greedy answers of at most 12 tokens:
  full only         evaluate_sample with no policy (the shared prefill, one answer and its teacher-forced pass)
  full + infokv     the same plus InfoKV at keep=0.25 (a fork: prefill compression, answer, teacher-forced pass)
  infokv, alone     generate() with InfoKV from scratch per sample (its own prefill), the answer only
  8 policies        full + 8 policies on one shared prefill, against 8 separate prefills (extrapolated from 'alone')

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_eval.py [--samples 3] [--context 2048]
"""

from __future__ import annotations

import argparse
import time

import torch

from fi_toolkit.compress.decoder import generate
from fi_toolkit.evaluation import evaluate_sample, make_units
from fi_toolkit.evaluation.tasks import encode_split
from fi_toolkit.model.loading import load_model
from fi_toolkit.policies import make_policy

POLICIES = ["infokv", "snapkv", "pyramidkv", "streaming", "h2o", "knorm", "random", "rpc"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--out", default="benchmarks/results/bench_eval.txt")
    args = ap.parse_args()
    lm = load_model()
    units = make_units(["passkey"], [args.context], args.samples, lm.tokenizer, lm.model.config)
    infokv = make_policy("infokv", budget="keep=0.25")
    every = [make_policy(n, budget="keep=0.25") for n in POLICIES]
    protocol = ["question-agnostic"]
    evaluate_sample(lm, units[0], [], protocol)  # warm-up

    def timed(fn):
        t0 = time.perf_counter()
        for u in units:
            fn(u)
        return (time.perf_counter() - t0) / len(units)

    full = timed(lambda u: evaluate_sample(lm, u, [], protocol))
    with_infokv = timed(lambda u: evaluate_sample(lm, u, [infokv], protocol))

    def alone(u):
        ids = torch.cat(encode_split(lm.tokenizer, u.sample, "question-aware"))
        generate(lm.model, lm.tokenizer, ids, infokv, max_new_tokens=12)

    separate = timed(alone)
    shared_all = timed(lambda u: evaluate_sample(lm, u, every, protocol))
    lines = [
        f"SmolLM2-135M, passkey at {args.context} tokens, {args.samples} samples, torch threads "
        f"{torch.get_num_threads()}",
        f"full only (shared prefill + answer + teacher-forced)  {full:7.2f} s/sample  {60 / full:6.1f} samples/min",
        f"full + infokv@keep=0.25                               {with_infokv:7.2f} s/sample  {60 / with_infokv:6.1f} "
        f"samples/min"
        f"  ({with_infokv / full:.2f}x full only)",
        f"infokv alone via generate() (own prefill, answer)     {separate:7.2f} s/sample",
        f"full + 8 policies on one shared prefill               {shared_all:7.2f} s/sample",
        f"8 policies with separate prefills (8 x generate)      {8 * separate:7.2f} s/sample (extrapolated)"
        f"  -> sharing: {8 * separate / shared_all:.2f}x faster",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    from pathlib import Path

    from fi_toolkit.runs.results import atomic_write_text

    atomic_write_text(Path(args.out), text)


if __name__ == "__main__":
    main()
