"""Sharded runs (issue 11): ``fi nearfar`` on the 5 bundled documents, 2 ranks x 1 thread under
torchrun against 1 rank x 1 thread, side by side, alternating (1, 2, 2, 1, ...) so load drift hits
both; the tables of every run are checked equal to the first single-process run's.

Small setting: SmolLM2, prefix 512, chunks at distances 0 and 256 of 128 tokens, 1 random seed,
sink-protected sets only. Per run: the wall time of the whole command (process start, model load,
tokenisation, the study, the merge), the study's time (the manifest's ``seconds``: units, barrier,
merge, summaries) and rank 0's merge (checks of every unit after the barrier + combined tables) and
summaries. Throughput = documents / study seconds (and / wall seconds). The load average of the
machine is printed before and after each run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_distributed.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["alice", "hamlet", "lcet10", "botchan", "paradise_regained"]
ARGS = ["nearfar", *DOCS, "--prefix", "512", "--distances", "0,256", "--chunk-len", "128", "--seeds", "1",
        "--protected-only"]


def run(ranks: int, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] \
        if ranks > 1 else [sys.executable]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run([*launcher, "-m", "fi_toolkit", *ARGS, "--out", str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    m = json.loads((out / "manifest.json").read_text())
    return {"ranks": ranks, "wall_s": wall, "study_s": m["seconds"], "merge_s": m["timing"]["merge_s"],
            "summaries_s": m["timing"]["summaries_s"], "wait_s": m["timing"]["wait_s"],
            "unit_s": sum(u["seconds"] for u in m["units"]), "load_before": load, "load_after": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/bench_distributed.txt")
    args = ap.parse_args()
    order = [r for i in range(args.repeats) for r in ((1, 2) if i % 2 == 0 else (2, 1))]
    rows, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, ranks in enumerate(order):
            row = run(ranks, Path(tmp) / f"run{i}")
            rows.append(row)
            first = Path(tmp) / f"run{order.index(1)}"
            if (first / "manifest.json").exists() and first != Path(tmp) / f"run{i}":
                for f in sorted(first.glob("*.csv")):
                    assert f.read_bytes() == (Path(tmp) / f"run{i}" / f.name).read_bytes(), f.name
            line = (f"{ranks} rank(s): wall {row['wall_s']:.1f} s, study {row['study_s']:.1f} s "
                    f"(units {row['unit_s']:.1f} s summed over ranks, rank 0 waited {row['wait_s']:.1f} s, "
                    f"merge {row['merge_s'] * 1000:.0f} ms, summaries {row['summaries_s'] * 1000:.0f} ms), "
                    f"load average {row['load_before']:.2f} -> {row['load_after']:.2f}")
            print(line, flush=True)
            lines.append(line)

    def mean(ranks, key):
        vals = [r[key] for r in rows if r["ranks"] == ranks]
        return sum(vals) / len(vals)

    n = len(DOCS)
    summary = [
        f"throughput, study: 1 rank {n / mean(1, 'study_s'):.4f} docs/s, 2 ranks {n / mean(2, 'study_s'):.4f} docs/s, "
        f"ratio {mean(1, 'study_s') / mean(2, 'study_s'):.2f}x",
        f"throughput, whole command: ratio {mean(1, 'wall_s') / mean(2, 'wall_s'):.2f}x "
        f"({mean(1, 'wall_s'):.1f} s vs {mean(2, 'wall_s'):.1f} s)",
        f"merge (rank 0, after the barrier): {mean(2, 'merge_s') * 1000:.0f} ms with 2 ranks, "
        f"{mean(1, 'merge_s') * 1000:.0f} ms with 1; summaries {mean(2, 'summaries_s') * 1000:.0f} ms",
        f"cores: {os.cpu_count()}; tables of every run equal the first 1-rank run's byte for byte",
    ]
    for line in summary:
        print(line)
    Path(args.out).write_text("\n".join(["$ " + " ".join(["fi", *ARGS]), *lines, *summary]) + "\n")


if __name__ == "__main__":
    main()
