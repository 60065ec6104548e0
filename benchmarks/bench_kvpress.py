"""Prefill cost of InfoKVPress beside SnapKVPress and no press.

InfoKVPress compresses at the end of the same prefill forward (it needs the last layer for H and
D^(l)); this times kvpress's own prefill call (``model.model(input_ids, past_key_values=cache)`` under
``with press(model)``) on SmolLM2 and *Alice*, 4 runs each, and prints the middle two. Run it in
``.venv-kvpress`` (``make test-kvpress`` builds it):

    OMP_NUM_THREADS=1 .venv-kvpress/bin/python benchmarks/bench_kvpress.py
"""

from __future__ import annotations

import contextlib
import time

import kvpress
import torch
from transformers import DynamicCache

from fi_toolkit.documents import load_document
from fi_toolkit.integrations.kvpress.bridge import restore
from fi_toolkit.integrations.kvpress.press import InfoKVPress
from fi_toolkit.model.loading import load_model

PRESSES = {
    "none": lambda: None,
    "SnapKVPress(w=32,k=7)": lambda: kvpress.SnapKVPress(0.75, window_size=32, kernel_size=7),
    "InfoKVPress": lambda: InfoKVPress(compression_ratio=0.75),
}


def prefill_seconds(model, ids: torch.Tensor, press) -> tuple[float, int]:
    cache = DynamicCache(config=model.config)
    context = press(model) if press is not None else contextlib.nullcontext()
    start = time.perf_counter()
    with torch.no_grad(), context:
        model.model(input_ids=ids[None], past_key_values=cache)
    seconds = time.perf_counter() - start
    restore(model, [layer.self_attn for layer in model.model.layers])
    return seconds, cache.get_seq_length()


def main() -> None:
    lm = load_model("smollm2-135m")
    doc = load_document("alice", lm.tokenizer, max_tokens=4096)
    for n in (1024, 2048):
        for name, make in PRESSES.items():
            runs = sorted(prefill_seconds(lm.model, doc.ids[:n], make()) for _ in range(4))
            print(f"n={n} {name:24s} middle two: {runs[1][0]:.2f}, {runs[2][0]:.2f} s; kept {runs[0][1]}")


if __name__ == "__main__":
    main()
