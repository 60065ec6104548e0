"""The FI-trained surrogate placed by ``fi field`` beside KVgrad, KVzip, the KVzip+-trained surrogate and the cheap
methods, on the five bundled documents (none in its training corpus): prefill FI near (``p:p+128``) and far
(``p+256:p+384``) at keep 10, 25 and 50 %, headroom with bootstrap CIs over documents, paired tests, seconds per
compression (docs/results/surrogate.md, "Beside KVgrad and KVzip"). Run it in the kvpress extra's venv; the run is
resumable (``--resume`` is passed when its directory exists). Then copies the run's tables to ``--results``,
writes ``wins.csv`` (per rival, in how many (document, chunk, budget) cells the surrogate, ``heads=global``, has the
lower FI) and puts ``fi report``'s headroom figure in ``docs/images/surrogate_field_p{P}.png``.

    OMP_NUM_THREADS=1 .venv-kvpress/bin/python analyses/surrogate_field.py    # about 2 h of one core
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["alice", "botchan", "hamlet", "lcet10", "paradise_regained"]
BUDGETS = ["keep=0.1", "keep=0.25", "keep=0.5"]
MODELS = "analyses/results/surrogate/anchor-sinks4/models"  # the curve's 16-slice models, FI- and KVzip+-trained
SURROGATE = "surrogate:heads=global"
METHODS = [
    SURROGATE,
    "surrogate",
    f"surrogate:heads=global,path={MODELS}/curve-16",
    f"surrogate:heads=global,path={MODELS}/curve-kvzip_plus-16",
    "expected_attention",
    "h2o",
    "snapkv",
    "infokv",
    "learned:heads=global,path=analyses/results/learned-heads/model.json",
    "kvpress:KVzipPress",
    "kvpress:KVgradPress",
]
TABLES = ["leaderboard.csv", "headroom.csv", "tests.csv", "refused.csv", "fi.csv", "manifest.json"]


def cell_wins(fi: pd.DataFrame, method: str = SURROGATE) -> pd.DataFrame:
    """Per rival: the (document, chunk, budget) cells both measured, and in how many ``method`` has the lower FI."""
    cells = fi[fi["kind"] != "anchor"].groupby(["document", "chunk", "budget", "method"])["fi"].mean().unstack()
    rows = []
    for rival in cells.columns.drop(method):
        both = cells[[method, rival]].dropna()
        lower = int((both[method] < both[rival]).sum())
        rows.append(
            {"rival": rival, "cells": len(both), "lower": lower, "share": lower / len(both) if len(both) else None}
        )
    return pd.DataFrame(rows).sort_values("share", ascending=False, ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--run", type=Path, default=ROOT / "runs" / "analyses" / "surrogate-field")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "surrogate" / "field-p512")
    args = ap.parse_args()
    command = ["field", *DOCUMENTS, "--prefix", str(args.prefix), *[a for b in BUDGETS for a in ("--budget", b)]]
    command += [a for m in METHODS for a in ("--policy", m)]
    resume = ["--resume"] if (args.run / "settings.json").is_file() else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    print("+ fi", " ".join(command), flush=True)
    subprocess.run(
        [sys.executable, "-m", "fi_toolkit", *command, "--out", str(args.run), *resume], check=True, env=env, cwd=ROOT
    )
    args.results.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        shutil.copy2(args.run / name, args.results / name)
    report = args.run.parent / f"{args.run.name}-report"
    subprocess.run(
        [sys.executable, "-m", "fi_toolkit", "report", str(args.run), "--out", str(report), "--overwrite"],
        check=True,
        env=env,
        cwd=ROOT,
    )
    figure = next((report / "figures").glob("*field_headroom.png"))
    shutil.copy2(figure, ROOT / "docs" / "images" / f"surrogate_field_p{args.prefix}.png")
    wins = cell_wins(pd.read_csv(args.run / "fi.csv"))
    wins.to_csv(args.results / "wins.csv", index=False)
    print(wins.to_string(index=False))


if __name__ == "__main__":
    main()
