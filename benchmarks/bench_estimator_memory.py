"""Peak memory and time of the Fisher estimator with and without per-layer checkpointing.

On SmolLM2 (embedded), 'alice', prefix p with chunk [p, p + L) for each ``--chunks`` length L: each
path (kept graph / checkpointed) runs in a fresh subprocess. After the model, document and trace are
loaded, the process's peak RSS is reset (``/proc/self/clear_refs`` 5, Linux) and ``fisher_fi`` runs;
the reported peak is VmHWM afterwards (whole process, so it includes the model and trace), the
increase is that peak minus the RSS at the reset. The children run with glibc's
``MALLOC_MMAP_THRESHOLD_=65536`` (blocks over 64 KiB mmapped and returned on free), so RSS follows
live memory; with the default, freed tensors stay in the heap and the RSS of the checkpointed path
nearly doubled at 2,048 tokens. "kept graph" is what the forward saves for the
backward passes (``kept_graph_bytes``, measured after the timed run), beside ``graph_bytes``'s
estimate of the unchecked graph. Both paths use the same seed; the table gives the largest relative
difference of their estimates. Writes benchmarks/results/bench_estimator_memory.txt.

    .venv/bin/python benchmarks/bench_estimator_memory.py [--prefix 1024] [--chunks 256,1024] [--samples 8] [--threads
    1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _status(field: str) -> float:
    """A ``/proc/self/status`` field in MiB."""
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) / 1024


def child(prefix: int, chunk_len: int, samples: int, checkpoint: bool, threads: int, out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from fi_toolkit.documents import load_document
    from fi_toolkit.model.loading import load_model
    from fi_toolkit.probe.chunks import Chunk
    from fi_toolkit.probe.estimator import fisher_fi, graph_bytes, kept_graph_bytes
    from fi_toolkit.signals.trace import trace_prefix

    torch.set_num_threads(threads)
    lm = load_model("smollm2-135m")
    chunk = Chunk(prefix, prefix + chunk_len)
    doc = load_document("alice", lm.tokenizer, max_tokens=chunk.end)
    trace = trace_prefix(lm.model, doc.ids, prefix)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _status("VmRSS")
    t0 = time.perf_counter()
    est = fisher_fi(lm.model, trace, doc.ids, [chunk], samples, seed=0, checkpoint=checkpoint)
    seconds = time.perf_counter() - t0
    peak = _status("VmHWM")
    torch.save(est.fi, out.with_suffix(".pt"))
    graph = kept_graph_bytes(lm.model, trace, doc.ids, [chunk], checkpoint) / 2**20
    estimate = graph_bytes(lm.model.config, prefix, chunk_len, 512) / 2**20
    out.write_text(
        json.dumps(
            {"seconds": seconds, "base_mib": base, "peak_mib": peak, "graph_mib": graph, "estimate_mib": estimate}
        )
    )


def run(prefix, chunk_len, samples, checkpoint, threads, tmp: Path) -> dict:
    out = tmp / f"{prefix}-{chunk_len}-{int(checkpoint)}.json"
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # large blocks mmapped: RSS follows live memory
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            f"{prefix},{chunk_len},{samples},{int(checkpoint)},{threads}",
            "--child-out",
            str(out),
        ],
        check=True,
        env=env,
    )
    return {**json.loads(out.read_text()), "fi": torch.load(out.with_suffix(".pt"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--chunks", default="256,1024", help="chunk lengths L: chunk [p, p + L)")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_estimator_memory.txt")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        p, n, s, c, t = (int(x) for x in args.child.split(","))
        return child(p, n, s, bool(c), t, args.child_out)
    lines = [
        f"Fisher estimator, kept graph vs per-layer checkpointing: SmolLM2-135M, cpu, torch threads {args.threads}, "
        f"alice, p = {args.prefix}, chunk [p, p + L), {args.samples} samples, seed 0; peak = process VmHWM "
        f"during fisher_fi (model and trace included), increase = peak - RSS before it; kept graph = tensors saved "
        f"for the backward passes (estimate of the unchecked graph in brackets)",
        f"{'L':>5} {'path':>12} {'peak MiB':>9} {'increase MiB':>12} {'kept graph MiB':>20} {'seconds':>8} "
        f"{'max rel diff':>12}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.chunks.split(",")):
            kept, ckpt = (run(args.prefix, n, args.samples, c, args.threads, Path(tmp)) for c in (False, True))
            diff = float(((kept["fi"] - ckpt["fi"]).abs() / kept["fi"].abs().clamp_min(1e-30)).max())
            for name, r in (("kept graph", kept), ("checkpointed", ckpt)):
                graph = (
                    f"{r['graph_mib']:.0f} ({r['estimate_mib']:.0f})"
                    if name == "kept graph"
                    else f"{r['graph_mib']:.0f}"
                )
                lines.append(
                    f"{n:>5} {name:>12} {r['peak_mib']:>9.0f} {r['peak_mib'] - r['base_mib']:>12.0f} "
                    f"{graph:>20} {r['seconds']:>8.1f} {diff:>12.1e}"
                )
            inc = [r["peak_mib"] - r["base_mib"] for r in (kept, ckpt)]
            lines.append(
                f"{n:>5} {'ratio':>12} {ckpt['peak_mib'] / kept['peak_mib']:>9.2f} {inc[1] / inc[0]:>12.2f} "
                f"{ckpt['graph_mib'] / kept['graph_mib']:>20.3f} {ckpt['seconds'] / kept['seconds']:>8.2f}"
            )
            print("\n".join(lines[-3:]), flush=True)
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
