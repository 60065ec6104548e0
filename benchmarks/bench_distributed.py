"""Sharded runs: ``fi nearfar`` on the 5 bundled documents, 2 ranks x 1 thread under
torchrun against 1 rank x 1 thread, side by side. Three variants, interleaved (and reversed every
other round) so load drift hits all of them: 1 rank; 2 ranks with one unit per document (5 equal
units split 3 + 2, so at most 5/3 = 1.67x); 2 ranks with ``--unit-sets 2`` (each document in 3 parts,
consecutive parts on one rank share the trace). The tables of every run are checked equal to the
first 1-rank run's, byte for byte.

Small setting: SmolLM2, prefix 512, chunks at distances 0 and 256 of 128 tokens, 1 random seed,
sink-protected sets only. Per run: the wall time of the whole command (process start, model load,
tokenisation, the study, the merge), the study's time (the manifest's ``seconds``: units, barrier,
merge, summaries) and rank 0's merge (checks of every unit after the barrier + combined tables) and
summaries. Throughput = documents / study seconds (and / wall seconds); ratios against the 1-rank runs. The load
average of the
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
ARGS = [
    "nearfar",
    *DOCS,
    "--prefix",
    "512",
    "--distances",
    "0,256",
    "--chunk-len",
    "128",
    "--seeds",
    "1",
    "--protected-only",
]


VARIANTS = {"1 rank": (1, []), "2 ranks, document units": (2, []), "2 ranks, --unit-sets 2": (2, ["--unit-sets", "2"])}


def run(ranks: int, extra: list[str], out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
        if ranks > 1
        else [sys.executable]
    )
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(
        [*launcher, "-m", "fi_toolkit", *ARGS, *extra, "--out", str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    m = json.loads((out / "manifest.json").read_text())
    return {
        "wall_s": wall,
        "study_s": m["seconds"],
        "merge_s": m["timing"]["merge_s"],
        "summaries_s": m["timing"]["summaries_s"],
        "units": len(m["units"]),
        "unit_s": sum(u["seconds"] for u in m["units"]),
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/bench_distributed.txt")
    args = ap.parse_args()
    names = list(VARIANTS)
    order = [n for i in range(args.repeats) for n in (names if i % 2 == 0 else names[::-1])]
    rows, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        first = None
        for i, name in enumerate(order):
            ranks, extra = VARIANTS[name]
            out = Path(tmp) / f"run{i}"
            row = {"variant": name, **run(ranks, extra, out)}
            rows.append(row)
            if ranks == 1 and first is None:
                first = out
            if first is not None and first != out:
                for f in sorted(first.glob("*.csv")):
                    assert f.read_bytes() == (out / f.name).read_bytes(), (name, f.name)
            line = (
                f"{name}: wall {row['wall_s']:.1f} s, study {row['study_s']:.1f} s ({row['units']} units, "
                f"{row['unit_s']:.1f} s summed over ranks; merge {row['merge_s'] * 1000:.0f} ms, summaries "
                f"{row['summaries_s'] * 1000:.0f} ms), load average {row['load_before']:.2f} -> {row['load_after']:.2f}"
            )
            print(line, flush=True)
            lines.append(line)

    def mean(name, key):
        vals = [r[key] for r in rows if r["variant"] == name]
        return sum(vals) / len(vals)

    n, base = len(DOCS), names[0]
    summary = []
    for name in names:
        summary.append(
            f"{name}: study {mean(name, 'study_s'):.1f} s = {n / mean(name, 'study_s'):.4f} docs/s, "
            f"ratio {mean(base, 'study_s') / mean(name, 'study_s'):.2f}x; whole command "
            f"{mean(name, 'wall_s'):.1f} s, ratio {mean(base, 'wall_s') / mean(name, 'wall_s'):.2f}x; "
            f"merge {mean(name, 'merge_s') * 1000:.0f} ms"
        )
    summary.append(f"cores: {os.cpu_count()}; tables of every run equal the first 1-rank run's byte for byte")
    for line in summary:
        print(line)
    Path(args.out).write_text("\n".join(["$ " + " ".join(["fi", *ARGS]), *lines, *summary]) + "\n")


if __name__ == "__main__":
    main()
