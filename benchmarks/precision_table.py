"""The README's precision table: noise floor and agreement with float32, per weight dtype and arithmetic.

SmolLM2 on a bundled document, p = 512, chunk 512:640, twelve seeded single-token evictions and a
60-token set, measured with the noise controls (docs/method.md, "Precision"):

    .venv/bin/python benchmarks/precision_table.py [--document alice] [--prefix 512] [--end 640]
"""

from __future__ import annotations

import argparse
import time

import scipy.stats
import torch

from fi_toolkit.documents import load_document
from fi_toolkit.eviction import TokenSet
from fi_toolkit.model.loading import load_model
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.forward_influence import forward_influence
from fi_toolkit.signals.trace import trace_prefix

SETTINGS = [("float32", True), ("bfloat16", True), ("bfloat16", False), ("float16", True), ("float16", False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--document", default="alice")
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--end", type=int, default=640)
    args = ap.parse_args()
    p = args.prefix
    gen = torch.Generator().manual_seed(0)
    picks = (torch.randperm(p - 4 - 32, generator=gen)[:12] + 4).tolist()
    sets = [TokenSet(f"positions:{j}", [j]) for j in picks] + [TokenSet("positions:100-159", torch.arange(100, 160))]
    rows = {}
    for dtype, upcast in SETTINGS:
        lm = load_model("smollm2-135m", "cpu", dtype, upcast=upcast)
        doc = load_document(args.document, lm.tokenizer, max_tokens=args.end)
        t0 = time.perf_counter()
        trace = trace_prefix(lm.model, doc.ids, p)
        result = forward_influence(lm.model, trace, doc.ids, sets, [Chunk(p, args.end)], controls=True)
        fi = result.fi()[2:, 0].double()
        rows[dtype, upcast] = (fi, float(result.noise_floor()[0]), time.perf_counter() - t0)
    base = rows["float32", True][0]
    print(
        f"SmolLM2, {args.document}, p={p}, chunk {p}:{args.end}, {len(picks)} single-token evictions + a 60-token set"
    )
    print(
        f"{'weights':<9} {'arithmetic':<10} {'floor':>9} {'single-token FI':>21} {'Spearman':>8} {'set/f32':>8} "
        f"{'seconds':>8}"
    )
    for (dtype, upcast), (fi, floor, seconds) in rows.items():
        single = fi[:12]
        rho = scipy.stats.spearmanr(base[:12].numpy(), single.numpy()).statistic
        arithmetic = "float32" if upcast or dtype == "float32" else dtype
        print(
            f"{dtype:<9} {arithmetic:<10} {floor:9.2g} {float(single.min()):9.2g} to {float(single.max()):9.2g} "
            f"{rho:8.2f} {float(fi[12] / base[12]):8.4f} {seconds:8.1f}"
        )


if __name__ == "__main__":
    main()
