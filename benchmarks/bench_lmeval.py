"""Tokens per second of the lm-eval backend (``--model fi``) against lm-eval's own ``hf`` backend on the
same generate_until requests (issue 22; target ratio >= 0.9 at full budget), and with InfoKV at 25 %.

Run in .venv-lmeval (``make test-lmeval`` builds it): ``python benchmarks/bench_lmeval.py [--device cuda]``.
Requests: ``--requests`` passkey prompts of ``--context`` tokens (fi_toolkit.evaluation.tasks), greedy,
no stop string, ``--new`` tokens each (both backends batch size 1). Writes benchmarks/results/bench_lmeval.txt.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from fi_toolkit.evaluation.lmeval.backend import CompressedLM
from fi_toolkit.evaluation.tasks import make_sample
from fi_toolkit.model.loading import load_model


def timed(lm, requests, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    lm.generate_until(requests, disable_tqdm=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_lmeval.txt"))
    a = ap.parse_args()
    lm = load_model(a.model, device=a.device, dtype=a.dtype)
    gen = {"until": [], "max_gen_toks": a.new, "do_sample": False}
    prompts = [
        make_sample("passkey", lm.tokenizer, a.context, seed, lm.config, chat=False) for seed in range(a.requests)
    ]
    requests = [Instance("generate_until", {}, (s.context + s.asked, dict(gen)), i) for i, s in enumerate(prompts)]
    hf = HFLM(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=1)
    backends = {
        "hf (lm-eval)": hf,
        "fi, policy=none": CompressedLM(lm=lm, policy="none"),
        "fi, infokv keep=0.25, interval=16": CompressedLM(lm=lm, policy="infokv", budget="keep=0.25", interval=16),
    }
    timed(backends["fi, policy=none"], requests[:1], lm.device)  # warm-up
    timed(hf, requests[:1], lm.device)
    tokens = a.requests * a.new
    rates = {}
    for name, backend in backends.items():
        seconds = min(timed(backend, requests, lm.device) for _ in range(2))
        rates[name] = tokens / seconds
    fi_none = backends["fi, policy=none"]
    new = [r["new_tokens"] for recs in fi_none.records.values() for r in recs]
    lines = [
        f"bench_lmeval: {a.model} on {lm.device} ({a.dtype}), {a.requests} generate_until requests of "
        f"{a.context} prompt tokens, greedy, {a.new} new tokens each (fi generated {min(new)}..{max(new)}), "
        "batch size 1, best of 2 runs after a warm-up",
        f"torch threads: {torch.get_num_threads()}",
    ]
    base = rates["hf (lm-eval)"]
    for name, rate in rates.items():
        lines.append(f"{name:38s} {rate:8.1f} tokens/s   ratio to hf {rate / base:.2f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
