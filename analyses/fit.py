"""Does a fitted score of compression-time signals beat InfoKV? (issue 21)

1. ``fi fit-data`` on the five bundled documents (p = 512, FI target: the Fisher estimate per layer and
   KV head on the near chunk 512:576, 8 label draws).
2. ``fi fit`` on all of them (every feature; and the decoding features), and once per document with that
   document left out (``--exclude``), so each document is probed with a policy not fitted on it.
3. ``fi probe`` of each held-out document at keep 25 %: the fitted policy beside InfoKV, SnapKV and H2O on
   a near (512:640) and a far (768:896) chunk.
4. ``fi eval`` (teacher-forced replay KL, prompt 512, 256 more tokens, compression every 128) of the
   held-out documents given by ``--eval-documents``.

    .venv/bin/python analyses/fit.py                          # OMP_NUM_THREADS=1 nice -n 10, on a shared CPU
    .venv/bin/python analyses/fit.py --probe-documents alice,hamlet --eval-documents ''

Small tables go to analyses/results/fit/ (policy.json, policy-decoding.json, cv.csv, probe.csv,
probe_summary.csv, eval_summary.csv, output.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["alice", "botchan", "hamlet", "lcet10", "paradise_regained"]
FI = [sys.executable, "-m", "fi_toolkit"]


def fi(*args: str) -> None:
    print("$ fi " + " ".join(args), flush=True)
    subprocess.run([*FI, *args], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "analyses" / "fit")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "fit")
    ap.add_argument("--probe-documents", default=",".join(DOCUMENTS))
    ap.add_argument("--eval-documents", default="alice")
    ap.add_argument("--data", type=Path, default=None, help="an existing fi fit-data run (default: made under --out)")
    args = ap.parse_args()
    out, res = args.out, args.results
    out.mkdir(parents=True, exist_ok=True)
    res.mkdir(parents=True, exist_ok=True)
    data = args.data or out / "data"
    if not (data / "fit_rows.parquet").exists():
        fi("fit-data", *DOCUMENTS, "--chunk", "512:576", "--samples", "8", "--out", str(data))
    fi("fit", str(data), "--out", str(res / "policy.json"), "--overwrite")
    fi("fit", str(data), "--features", "decoding", "--out", str(res / "policy-decoding.json"), "--overwrite")
    folds = json.loads((res / "policy.json").read_text())["cross_validation"]["folds"]
    pd.DataFrame(folds).to_csv(res / "cv.csv", index=False)
    probes = []
    for doc in filter(None, args.probe_documents.split(",")):
        policy = out / f"policy-without-{doc}.json"
        fi("fit", str(data), "--exclude", doc, "--out", str(policy), "--overwrite")
        run = out / f"probe-{doc}"
        fi("probe", doc, "--prefix", "512", "--chunk", "512:640", "--chunk", "768:896",
           "--select", f"policy:fitted@keep=0.25:path={policy}", "--select", "policy:infokv@keep=0.25",
           "--select", "policy:snapkv@keep=0.25", "--select", "policy:h2o@keep=0.25", "--out", str(run), "--overwrite")
        table = pd.read_csv(run / "fi.csv")
        table["selection"] = table["selection"].str.replace(r"path=[^@]*", "path=<without this document>", regex=True)
        probes.append(table)
    if probes:
        probe = pd.concat(probes, ignore_index=True)
        probe.to_csv(res / "probe.csv", index=False)
        summary = probe.pivot_table(index="selection", columns="chunk", values="fi", aggfunc="mean", sort=False)
        summary.to_csv(res / "probe_summary.csv")
        (res / "output.txt").write_text(f"FI at keep 25 %, p = 512, mean over {len(probes)} held-out document(s)\n"
                                        + summary.to_string(float_format=lambda v: f"{v:.5f}") + "\n")
        print((res / "output.txt").read_text())
    evals = []
    for doc in filter(None, args.eval_documents.split(",")):
        policy = out / f"policy-decoding-without-{doc}.json"
        fi("fit", str(data), "--exclude", doc, "--features", "decoding", "--out", str(policy), "--overwrite")
        run = out / f"eval-{doc}"
        fi("eval", doc, "--policy", f"fitted:path={policy},infokv,snapkv,h2o", "--budget", "0.25", "--prompt", "512",
           "--length", "768", "--interval", "128", "--free-tokens", "0", "--resamples", "0", "--out", str(run),
           "--overwrite")
        evals.extend(pd.read_csv(f).assign(held_out=doc) for f in run.glob("*summary*.csv"))
    if evals:
        pd.concat(evals, ignore_index=True).to_csv(res / "eval_summary.csv", index=False)


if __name__ == "__main__":
    main()
