"""Prefill cost of InfoKVPress (it compresses at the end of the same forward) beside SnapKVPress and no press:
kvpress's own prefill call, SmolLM2, alice; 4 runs each, the middle two printed (run in .venv-kvpress)."""
import time, torch
from transformers import DynamicCache
from fi_toolkit.models import load_model
from fi_toolkit.documents import load_document
from fi_toolkit.kvpress import InfoKVPress
from fi_toolkit.kvpress_bridge import restore
import kvpress, contextlib
lm = load_model("smollm2-135m"); m = lm.model
doc = load_document("alice", lm.tokenizer, max_tokens=4096)
def run(press, n):
    cache = DynamicCache(config=m.config)
    ctx = press(m) if press is not None else contextlib.nullcontext()
    t = time.perf_counter()
    with torch.no_grad(), ctx:
        m.model(input_ids=doc.ids[:n][None], past_key_values=cache)
    dt = time.perf_counter() - t
    restore(m, [l.self_attn for l in m.model.layers])
    return dt, cache.get_seq_length()
for n in (1024, 2048):
    for name, mk in [("none", lambda: None), ("SnapKVPress(w=32,k=7)", lambda: kvpress.SnapKVPress(0.75, window_size=32, kernel_size=7)),
                     ("InfoKVPress", lambda: InfoKVPress(compression_ratio=0.75))]:
        times = []
        for rep in range(4):
            dt, kept = run(mk(), n); times.append(dt)
        print(f"n={n} {name:24s} median {sorted(times)[1:3]} s, kept {kept}")
