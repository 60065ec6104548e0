"""Speed of the Forward Influence probe, ratios side by side in one run (this machine is noisy).

Per eviction, on SmolLM2 with a 2,048-token prefix and chunk 2048:4096 (defaults):
  plain     one plain model forward over [p, r_c) with the full prefix cache (the floor: an exact FI needs that pass)
  masked    fi_toolkit's probe: evictions masked over a shared prefix cache, batch 1 (the CPU default)
            and 4, reference pass amortised or excluded
  naive     deep-copy the cache, delete the entries, forward, KL against the reference
and the model load time, first (GGUF dequantisation + conversion) and cached.

    .venv/bin/python benchmarks/bench_probe.py [--prefix 2048] [--end 4096] [--evictions 8] [--batch-size 1]
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

import torch

from fi_toolkit.documents import load_document
from fi_toolkit.eviction import TokenSet
from fi_toolkit.model.compat import cache_kwargs
from fi_toolkit.model.loading import load_model
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.forward_influence import _continuation_mask, forward_influence
from fi_toolkit.signals.trace import SignalConfig, trace_prefix


def timed(fn):
    """Wall seconds and process CPU seconds (the latter is robust to other jobs on a shared machine)."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - w0, time.process_time() - c0), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--end", type=int, default=4096)
    ap.add_argument("--evictions", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1, help="the CPU default; a GPU run would use 8")
    ap.add_argument("--naive", type=int, default=2, help="evictions timed the naive way")
    ap.add_argument("--skip-first-load", action="store_true")
    args = ap.parse_args()
    p, end = args.prefix, args.end
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, SmolLM2-135M float32 CPU, p={p}, chunk "
        f"{p}:{end}"
    )

    if not args.skip_first_load:
        with tempfile.TemporaryDirectory() as tmp:
            old = os.environ.get("FI_TOOLKIT_CACHE")
            os.environ["FI_TOOLKIT_CACHE"] = tmp
            (first, _), _ = timed(load_model)
            os.environ.pop("FI_TOOLKIT_CACHE") if old is None else os.environ.__setitem__("FI_TOOLKIT_CACHE", old)
    load_model()  # make sure the user cache holds the converted copy
    (cached, _), lm = timed(load_model)
    model = lm.model
    doc = load_document("alice", lm.tokenizer, max_tokens=end)
    t_trace, trace = timed(lambda: trace_prefix(model, doc.ids, p, SignalConfig()))

    gen = torch.Generator().manual_seed(0)
    n_remove = round(0.1 * (p - 32))
    sets = [TokenSet(f"r{i}", 4 + torch.randperm(p - 36, generator=gen)[:n_remove]) for i in range(args.evictions)]
    cont = doc.ids[p:end]
    chunk = Chunk(p, end)

    def plain():
        from transformers import DynamicCache

        cache = DynamicCache(
            ddp_cache_data=[(k.clone(), v.clone()) for k, v in zip(trace.keys, trace.values)], config=model.config
        )
        with torch.no_grad():
            return model(
                input_ids=cont[None], position_ids=torch.arange(p, end)[None], **cache_kwargs(model, cache)
            ).logits

    def naive(ref_logp, removed):
        from transformers import DynamicCache

        full = DynamicCache(ddp_cache_data=list(zip(trace.keys, trace.values)), config=model.config)
        cache = copy.deepcopy(full)
        keep = torch.ones(p, dtype=torch.bool)
        keep[removed] = False
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, keep], layer.values[:, :, keep]
        mask = _continuation_mask(torch.ones(1, int(keep.sum()), dtype=torch.bool), 0, end - p, torch.float32)
        with torch.no_grad():
            logits = model(
                input_ids=cont[None],
                position_ids=torch.arange(p, end)[None],
                attention_mask=mask,
                **cache_kwargs(model, cache),
            ).logits[0]
        logp = torch.log_softmax(logits.float(), -1)
        return (ref_logp.exp() * (ref_logp - logp)).sum(-1).mean()

    t_plain, logits = timed(plain)
    ref_logp = torch.log_softmax(logits[0].float(), -1)
    del logits
    t_ref, _ = timed(lambda: forward_influence(model, trace, doc.ids, [], [chunk]))  # the reference pass alone
    t_batched, _ = timed(lambda: forward_influence(model, trace, doc.ids, sets, [chunk], batch_size=args.batch_size))
    t_batched4, _ = timed(lambda: forward_influence(model, trace, doc.ids, sets[:4], [chunk], batch_size=4))
    t_naive, _ = timed(lambda: [naive(ref_logp, s.removed) for s in sets[: args.naive]])
    t_plain2, _ = timed(plain)
    floor = [(a + b) / 2 for a, b in zip(t_plain, t_plain2)]
    e = args.evictions

    per = {
        "plain forward over [p, r_c) (the floor)": floor,
        f"masked probe, batch {args.batch_size}, {e} evictions, reference pass amortised": [t / e for t in t_batched],
        f"masked probe, batch {args.batch_size}, steady state (reference pass excluded)": [
            (t - r) / e for t, r in zip(t_batched, t_ref)
        ],
        "masked probe, batch 4, steady state": [(t - r) / 4 for t, r in zip(t_batched4, t_ref)],
        f"naive: deep-copy the cache, delete, forward, KL ({args.naive} evictions)": [t / args.naive for t in t_naive],
    }
    print(
        f"\nmodel load: first (GGUF -> converted copy) {first if not args.skip_first_load else float('nan'):.1f} s, "
        f"cached {cached:.2f} s"
    )
    print(
        f"trace of the {p}-token prefix (cache + all signals): {t_trace[0]:.1f} s wall ({t_trace[1] / floor[1]:.2f}x a "
        f"plain forward in CPU time)"
    )
    print(f"\n{'per eviction':<80} {'wall s':>7} {'x plain':>8} {'CPU s':>7} {'x plain':>8}")
    for name, (wall, cpu) in per.items():
        print(f"{name:<80} {wall:7.2f} {wall / floor[0]:8.2f} {cpu:7.2f} {cpu / floor[1]:8.2f}")


if __name__ == "__main__":
    main()
