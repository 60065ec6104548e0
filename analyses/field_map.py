"""The field map behind docs/results/field-map.md: ``fi field`` on the five bundled documents with every project
policy and every press of the installed kvpress (run it in the kvpress extra's venv, ``.venv-kvpress``), keep
10 / 25 / 50 %, near chunk ``p:p+128`` and far chunk ``p+256:p+384``; then ``fi report`` of the run. Copies the
run's tables to ``analyses/results/field-map/p{P}/`` and its headroom figure to ``docs/images/``.

    OMP_NUM_THREADS=1 .venv-kvpress/bin/python analyses/field_map.py --prefix 1024   # ~90 min, 2 shared cores
    python analyses/field_map.py --prefix 128 --tiny --work /tmp/fm --results /tmp/fmr   # CI-sized: 2 policies
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["alice", "botchan", "hamlet", "lcet10", "paradise_regained"]
BUDGETS = ["keep=0.1", "keep=0.25", "keep=0.5"]
TABLES = ["leaderboard.csv", "leaderboard.json", "headroom.csv", "tests.csv", "refused.csv", "fi.csv", "manifest.json"]


def fi(*args: str) -> None:
    """Run ``fi ARGS`` from the checkout with this interpreter; stop on failure."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    print("+ fi", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "fi_toolkit", *args], check=True, env=env, cwd=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--tiny", action="store_true", help="two documents, snapkv and h2o only, keep 50 %%")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "analyses" / "field-map")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "field-map")
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "images")
    args = ap.parse_args()
    docs = DOCUMENTS[:2] if args.tiny else DOCUMENTS
    budgets = ["keep=0.5"] if args.tiny else BUDGETS
    run, out = args.work / f"p{args.prefix}", args.results / f"p{args.prefix}"
    command = ["field", *docs, "--prefix", str(args.prefix), *[a for b in budgets for a in ("--budget", b)]]
    if args.tiny:
        command += ["--policy", "snapkv", "--policy", "h2o", "--distances", "0,64", "--chunk-len", "32"]
        command += ["--resamples", "200"]
    resume = ["--resume"] if (run / "settings.json").is_file() else []
    fi(*command, "--out", str(run), *resume)
    fi("report", str(run), "--out", str(args.work / f"report-p{args.prefix}"), "--overwrite")
    out.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        shutil.copy2(run / name, out / name)
    figure = next((args.work / f"report-p{args.prefix}" / "figures").glob("*field_headroom.png"))
    args.figure.mkdir(parents=True, exist_ok=True)
    shutil.copy2(figure, args.figure / f"field_map_p{args.prefix}.png")
    print(f"tables: {out}/, figure: {args.figure / f'field_map_p{args.prefix}.png'}")


if __name__ == "__main__":
    main()
