"""Requests per second of the lm-eval backend (``--model fi``) against lm-eval's own ``hf`` backend on the same
requests, both request types, batch sizes 1 and 8, side by side in one run (target: ``fi`` at ``policy=none``
at least 0.9x ``hf`` at the same batch size), and what a compressing policy costs over ``policy=none``.

Run in .venv-lmeval (``make test-lmeval`` builds it)::

    python benchmarks/bench_lmeval.py [--device cuda] [--docs 8] [--context 300] [--mixed] [--new 32] [--batch 1,8]
        [--repeats 3]

Requests, built from the toolkit's passkey task (fi_toolkit.evaluation.tasks) at ``--context`` tokens:
``loglikelihood``: ``--docs`` prompts, each with 4 candidate answers (a multiple-choice question: 4 requests
sharing one context); ``generate_until``: the same ``--docs`` prompts, greedy, no stop string, ``--new``
tokens each (``--mixed``: contexts spread from half of ``--context`` to all of it). Each cell is the best of
``--repeats`` timed runs (the backends interleaved) after a warm-up; the last lines give each backend's speedup
from batching (requests/s at the largest batch over the smallest). Under a compressing policy both request
types are batched too (docs/guides/lm-eval.md, "Batching").
Writes benchmarks/results/bench_lmeval.txt.
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

KINDS = ("loglikelihood", "generate_until")


def timed(lm, kind: str, requests, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    getattr(lm, kind)(requests, disable_tqdm=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def build_requests(lm, docs: int, context: int, new: int, mixed: bool = False) -> dict[str, list]:
    """The two request lists: 4 answers per prompt (loglikelihood), one generation per prompt. ``mixed``: the
    prompts' contexts spread evenly from half of ``context`` to all of it (prompts of different lengths)."""
    sizes = [context // 2 + (context - context // 2) * i // max(1, docs - 1) if mixed else context for i in range(docs)]
    samples = [make_sample("passkey", lm.tokenizer, n, seed, lm.config, chat=False) for seed, n in enumerate(sizes)]
    gen = {"until": [], "max_gen_toks": new, "do_sample": False}
    scored, generated = [], []
    for i, s in enumerate(samples):
        prompt = s.context + s.asked
        answers = [s.answer] + [str((int(s.answer) * (k + 7) + 13) % 100000).zfill(len(s.answer)) for k in range(3)]
        scored += [Instance("loglikelihood", {}, (prompt, " " + a), j) for j, a in enumerate(answers)]
        generated.append(Instance("generate_until", {}, (prompt, dict(gen)), i))
    return {"loglikelihood": scored, "generate_until": generated}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--mixed", action="store_true", help="contexts from half of --context to all of it")
    ap.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell (the best is reported)")
    ap.add_argument("--policy", default="infokv", help="the compressing policy whose cost is reported")
    ap.add_argument("--budget", default="keep=0.25")
    ap.add_argument("--interval", type=int, default=16)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_lmeval.txt"))
    a = ap.parse_args()
    lm = load_model(a.model, device=a.device, dtype=a.dtype)
    requests = build_requests(lm, a.docs, a.context, a.new, a.mixed)
    sizes = [int(b) for b in a.batch.split(",")]
    compressing = f"fi {a.policy} {a.budget} interval={a.interval}"
    rows = []
    for size in sizes:
        backends = {
            "hf": HFLM(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=size),
            "fi none": CompressedLM(lm=lm, policy="none", batch_size=size),
            compressing: CompressedLM(lm=lm, policy=a.policy, budget=a.budget, interval=a.interval, batch_size=size),
        }
        for kind in KINDS:
            for backend in backends.values():
                timed(backend, kind, requests[kind][:2], lm.device)  # warm-up
            best = dict.fromkeys(backends, float("inf"))
            for _ in range(a.repeats):  # interleaved, so that a busy moment of the machine hits every backend alike
                for name, backend in backends.items():
                    best[name] = min(best[name], timed(backend, kind, requests[kind], lm.device))
            rows.append((kind, size, {name: len(requests[kind]) / seconds for name, seconds in best.items()}))
    lines = [
        f"bench_lmeval: {a.model} on {lm.device} ({a.dtype}), torch threads {torch.get_num_threads()}; "
        f"{a.docs} passkey prompts of {f'{a.context // 2} to ' if a.mixed else ''}{a.context} tokens: "
        f"loglikelihood = {4 * a.docs} requests (4 answers per "
        f"prompt), generate_until = {a.docs} requests (greedy, {a.new} new tokens, no stop string); "
        f"requests/s, best of {a.repeats} interleaved runs after a warm-up",
        f"{'request type':16s} {'batch':>5s} {'hf':>9s} {'fi none':>9s} {'fi/hf':>6s} "
        f"{'compressing':>11s} {'none/compr.':>11s}   (compressing: {compressing})",
    ]
    for kind, size, r in rows:
        none, comp = r["fi none"], r[compressing]
        lines.append(
            f"{kind:16s} {size:5d} {r['hf']:9.2f} {none:9.2f} {none / r['hf']:6.2f} {comp:11.2f} {none / comp:11.2f}"
        )
    if len(sizes) > 1:  # what batching gains under each backend: requests/s at the largest batch over the smallest
        for kind in KINDS:
            cells = {size: r for k, size, r in rows if k == kind}
            lo, hi = cells[min(sizes)], cells[max(sizes)]
            gains = "  ".join(f"{name} {hi[name] / lo[name]:.2f}x" for name in lo)
            lines.append(f"batch {max(sizes)} / batch {min(sizes)}, {kind}: {gains}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
