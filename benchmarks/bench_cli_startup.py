"""How fast the ``fi`` command line answers: ``fi --help`` and a usage error against a bare
``python -c pass``, as ratios, side by side in one run (interleaved, so a busy machine slows all alike).

  python         python -c pass: the interpreter's own start-up, the floor
  fi --help      python -m fi_toolkit --help (the console script's path: fi_toolkit.cli.entry)
  usage error    python -m fi_toolkit probe --no-such-option (exit 2, one line)
  value error    python -m fi_toolkit probe --chunk 9:3 (exit 2, one line): an error in an option's value,
                 found by the command's own checks, which import nothing heavy
  heavy imports  python -c "import torch, transformers, pandas, scipy, seaborn": what every ``fi``
                 invocation paid before the package root became lazy

Wall time and CPU time (user + sys of the child) per command, the median over ``--repeats`` runs;
the ratios are to ``python``.

    .venv/bin/python benchmarks/bench_cli_startup.py [--repeats 7] [--out benchmarks/results/bench_cli_startup.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "python": ["-c", "pass"],
    "fi --help": ["-m", "fi_toolkit", "--help"],
    "usage error": ["-m", "fi_toolkit", "probe", "--no-such-option"],
    "value error": ["-m", "fi_toolkit", "probe", "--chunk", "9:3"],
    "heavy imports": ["-c", "import torch, transformers, pandas, scipy, seaborn"],
}
EXPECTED_STATUS = {"usage error": 2, "value error": 2}


def timed(args: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s of the child, exit status) of ``python ARGS``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_cli_startup.txt")
    args = ap.parse_args()
    for name, argv in COMMANDS.items():  # warm the file cache; each must answer as expected
        _, _, code = timed(argv)
        if code != EXPECTED_STATUS.get(name, 0):
            raise SystemExit(f"{name}: exit status {code}")
    runs = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, argv in COMMANDS.items():
            runs[name].append(timed(argv)[:2])
    wall = {n: statistics.median(w for w, _ in r) for n, r in runs.items()}
    cpu = {n: statistics.median(c for _, c in r) for n, r in runs.items()}
    lines = [
        f"bench_cli_startup: median of {args.repeats} interleaved runs; {platform.python_version()} on "
        f"{platform.machine()}, {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f})",
        f"{'command':<14} {'wall s':>8} {'x python':>9} {'CPU s':>8} {'x python':>9}",
    ]
    for name in COMMANDS:
        lines.append(
            f"{name:<14} {wall[name]:>8.3f} {wall[name] / wall['python']:>9.1f} "
            f"{cpu[name]:>8.3f} {cpu[name] / cpu['python']:>9.1f}"
        )
    lines.append(
        f"fi --help above python: {wall['fi --help'] - wall['python']:.3f} s wall, "
        f"{cpu['fi --help'] - cpu['python']:.3f} s CPU; the heavy imports it no longer pays: "
        f"{wall['heavy imports'] - wall['python']:.3f} s wall, {cpu['heavy imports'] - cpu['python']:.3f} s CPU"
    )
    lines.append(
        f"fi probe --chunk 9:3 above python: {wall['value error'] - wall['python']:.3f} s wall, "
        f"{cpu['value error'] - cpu['python']:.3f} s CPU ({wall['value error'] / wall['python']:.1f} x python -c pass)"
    )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
