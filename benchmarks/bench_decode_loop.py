"""The toolkit's decode loop against a plain transformers loop on the same prompt: ms per new token, side by side
in one run, and their ratio (the loop's own overhead: positions, records, hooks; target <= 1.1x).

Both decode greedily from one prefilled cache of ``--prompt`` tokens, ``--new`` tokens, no policy (the full cache):
``generate(model, None, ids, None)`` against ``model(input_ids=token, past_key_values=cache)`` one token at a time.
``--random-shapes`` uses a randomly initialised model of SmolLM2-135M's shapes (30 layers, 9 query and 3 KV heads,
hidden 576, vocabulary 49,152), which needs no model file: the timing depends on the shapes only. On an H200
(torch 2.11, 32 tokens) it gave 34.1 against 33.9 ms per token in bf16 at a 7,680-token cache and 19.0 against
19.7 in float32 at 2,048 (``results/bench_decode_loop-nvidia-h200.txt``): a 135M model's decoding there is bound
by kernel launches, not by the GPU's arithmetic.

    .venv/bin/python benchmarks/bench_decode_loop.py [--device cuda] [--prompt 2048] [--new 64] [--random-shapes]
        [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import DynamicCache

from fi_toolkit.compress.decoder import generate
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.model.loading import DTYPES, load_model, tiny_model
from fi_toolkit.runs.results import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def plain_loop(model, ids: torch.Tensor, new: int, device: torch.device) -> float:
    """Seconds per token of greedy decoding with transformers alone (prefill not timed)."""
    cache = DynamicCache(config=model.config)
    token = model(input_ids=ids[None].to(device), use_cache=True, **cache_kwargs(model, cache)).logits[0, -1].argmax()
    sync(device)
    start = time.perf_counter()
    for _ in range(new - 1):
        token = model(input_ids=token.view(1, 1), use_cache=True, **cache_kwargs(model, cache)).logits[0, -1].argmax()
        int(token)  # the host reads each token, as a sampler does
    sync(device)
    return (time.perf_counter() - start) / (new - 1)


def toolkit_loop(model, ids: torch.Tensor, new: int) -> float:
    """Seconds per token of :func:`generate` with no policy (its own decode timer, prefill excluded)."""
    stats = generate(model, None, ids, None, max_new_tokens=new, eos_token_id=[]).stats
    return stats.decode_seconds / (new - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the fastest of each counts")
    ap.add_argument("--dtype", default="float32", help="weights and arithmetic (no upcast), as gpu_check's decoding")
    ap.add_argument("--random-shapes", action="store_true", help="a random model of SmolLM2's shapes (no file)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_decode_loop.txt")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.random_shapes:
        lm = tiny_model(seed=0, layers=30, hidden=576, heads=9, kv_heads=3, vocab=49152)
        lm.model.config.max_position_embeddings = 8192  # SmolLM2's context (the random model's is 4,096)
        lm.model.to(device=device, dtype=DTYPES[args.dtype])
        lm = replace(lm, device=device)
    else:
        lm = load_model("smollm2-135m", args.device, args.dtype, upcast=False)
    ids = torch.randint(0, lm.model.config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1))
    toolkit_loop(lm.model, ids, 3), plain_loop(lm.model, ids, 3, device)  # warm-up
    best = {"toolkit": float("inf"), "transformers": float("inf")}
    for _ in range(args.repeats):
        best["toolkit"] = min(best["toolkit"], toolkit_loop(lm.model, ids, args.new))
        best["transformers"] = min(best["transformers"], plain_loop(lm.model, ids, args.new, device))
    model = "random model of SmolLM2's shapes" if args.random_shapes else "SmolLM2-135M"
    text = (
        f"decode loop: {model}, {device}, {args.dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"prompt {args.prompt}, {args.new} new tokens, greedy, full cache; ms per token, best of {args.repeats}\n"
        f"toolkit generate()   {best['toolkit'] * 1e3:8.1f} ms\n"
        f"transformers loop    {best['transformers'] * 1e3:8.1f} ms\n"
        f"ratio                {best['toolkit'] / best['transformers']:8.2f}x  (target <= 1.1x)\n"
    )
    print(text, end="")
    atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
