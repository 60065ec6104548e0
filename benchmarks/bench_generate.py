"""Compressor speed and memory, ratios side by side in one run.

Prefill: wall time of a plain prefill (the model's forward over the prompt, last-row logits), of
SnapKV (window queries -> window attention -> keep map -> gather) and of InfoKV (the same plus
per-token top-k entropy and D^(l)), at each --lengths on SmolLM2; the ratios InfoKV/plain and
InfoKV/SnapKV (target: InfoKV <= 1.3x plain). Median of --repeats interleaved runs after one warm-up.

Decoding: tokens/s, peak KV-cache bytes and peak memory of a --decode-new token greedy generation
from a --decode-prompt token prompt with InfoKV at --budget against the full cache. Each decoding
configuration runs in its own process so that the CPU's peak RSS (not resettable) is its own; on
CUDA it is torch.cuda.max_memory_allocated.

    .venv/bin/python benchmarks/bench_generate.py [--device cuda --dtype bfloat16] [--decode-new 4096]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from fi_toolkit.model.compat import cache_kwargs


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def document_ids(tokenizer, n: int) -> torch.Tensor:
    from fi_toolkit.documents import load_document

    for name in ("lcet10", "hamlet_gut", "alice"):
        doc = load_document(name, tokenizer, max_tokens=n)
        if len(doc) >= n:
            return doc.ids[:n]
    raise SystemExit(f"no bundled document has {n} tokens")


@torch.no_grad()
def plain_prefill(model, ids, chunk=2048):
    from transformers import DynamicCache

    from fi_toolkit.signals.trace import decoder_parts

    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    for a in range(0, ids.numel(), chunk):
        part = ids[a : a + chunk].to(device)[None]
        pos = torch.arange(a, a + part.shape[1], device=device)[None]
        hidden = model.base_model(
            input_ids=part, position_ids=pos, use_cache=True, **cache_kwargs(model.base_model, cache)
        ).last_hidden_state
    return decoder_parts(model)[2](hidden[:, -1]).float()


@torch.no_grad()
def compressed_prefill(model, ids, policy):
    from fi_toolkit.compress.decoder import CompressedDecoder

    decoder = CompressedDecoder(model, policy, ids.numel())
    try:
        return decoder.prefill(ids)
    finally:
        decoder.close()


def timed(fns, repeats, device):
    """Median seconds of each function; runs interleaved (a, b, c, a, b, c, ...) after one warm-up
    each, so that load from other processes on a shared machine falls on all of them alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def bench_prefill(lm, lengths, repeats, budget):
    from fi_toolkit.policies import InfoKV, SnapKV

    print(
        f"## Prefill ({lm.name}, {lm.device}, {str(lm.dtype).replace('torch.', '')}, median of {repeats}; "
        f"budget {budget})"
    )
    print("| tokens | plain (s) | SnapKV (s) | InfoKV (s) | InfoKV / plain | InfoKV / SnapKV | SnapKV / plain |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in lengths:
        ids = document_ids(lm.tokenizer, n)
        plain, snap, info = timed(
            [
                lambda ids=ids: plain_prefill(lm.model, ids),
                lambda ids=ids: compressed_prefill(lm.model, ids, SnapKV(budget=budget)),
                lambda ids=ids: compressed_prefill(lm.model, ids, InfoKV(budget=budget)),
            ],
            repeats,
            lm.device,
        )
        print(
            f"| {n:,} | {plain:.3f} | {snap:.3f} | {info:.3f} | {info / plain:.2f}x | {info / snap:.2f}x | "
            f"{snap / plain:.2f}x |",
            flush=True,
        )


def decode_one(args) -> dict:
    """One decoding configuration (run in a child process); prints its stats as JSON."""
    from fi_toolkit.compress.decoder import generate
    from fi_toolkit.model.loading import load_model
    from fi_toolkit.policies import InfoKV

    lm = load_model("smollm2-135m", args.device, args.dtype)
    ids = document_ids(lm.tokenizer, args.decode_prompt)
    policy = InfoKV(budget=args.budget) if args.only == "infokv" else None
    result = generate(
        lm.model, lm.tokenizer, ids, policy, max_new_tokens=args.decode_new, interval=args.interval, eos_token_id=[]
    )  # no early stop: the same length for both
    return result.stats.as_dict()


def bench_decode(args):
    print(
        f"\n## Decoding (greedy, {args.decode_prompt:,}-token prompt + {args.decode_new:,} new tokens, "
        f"{args.device}, {args.dtype}; InfoKV budget {args.budget}, interval {args.interval})"
    )
    rows = {}
    for name in ("full", "infokv"):
        cmd = [sys.executable, __file__, "--only", name, *sys.argv[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows[name] = json.loads(out.strip().splitlines()[-1])
    print("| cache | tokens/s | compressions | peak KV cache | final KV cache | peak memory |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, s in rows.items():
        print(
            f"| {name} | {s['tokens_per_second']:.1f} | {s['compressions']} | {s['peak_cache_bytes'] / 2**20:.1f} MiB "
            f"| "
            f"{s['cache_bytes_kept'] / 2**20:.1f} MiB | {s['peak_memory_bytes'] / 2**20:.0f} MiB "
            f"({s['peak_memory_kind']}) |"
        )
    f, i = rows["full"], rows["infokv"]
    print(
        f"\nInfoKV / full: tokens/s {i['tokens_per_second'] / f['tokens_per_second']:.2f}x, "
        f"peak KV cache {i['peak_cache_bytes'] / f['peak_cache_bytes']:.2f}x, "
        f"peak memory {i['peak_memory_bytes'] / f['peak_memory_bytes']:.2f}x"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--interval", type=int, default=256)
    ap.add_argument("--decode-prompt", type=int, default=1024)
    ap.add_argument("--decode-new", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--only", choices=["full", "infokv"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only:
        print(json.dumps(decode_one(args)))
        return
    from fi_toolkit.model.loading import load_model

    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    if not args.skip_prefill:
        bench_prefill(load_model("smollm2-135m", args.device, args.dtype), args.lengths, args.repeats, args.budget)
    if not args.skip_decode:
        bench_decode(args)


if __name__ == "__main__":
    main()
