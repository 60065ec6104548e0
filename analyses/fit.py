"""Does a fitted score of compression-time signals beat InfoKV?

1. ``fi fit-data`` on the five bundled documents (p = 512, FI target: the Fisher estimate per layer and
   KV head on the near chunk 512:576, 8 label draws).
2. ``fi fit`` on all of them (every feature; and the decoding features), and once per document with that
   document left out (``--exclude``), so each document is probed with a policy not fitted on it.
3. ``fi probe`` of each held-out document at keep 25 %: the fitted policy beside InfoKV, SnapKV and H2O on
   a near (512:640) and a far (768:896) chunk.
4. Headroom: the probe's settings are those of analyses/headroom.py's run (p = 512, the same
   chunks, keep 25 %), whose random sets and FI oracles are deterministic; their rows are taken from
   analyses/results/headroom/fi.csv (after checking that the policies both runs measured agree to 1e-6) and
   the fitted policy is placed between random and the oracle: ``fitted_headroom.csv``.
5. ``fi eval`` (teacher-forced replay KL, prompt 512, 256 more tokens, compression every 128) of the
   held-out documents given by ``--eval-documents``, placed between the random replays and the decoding
   FI oracle of docs/results/headroom.md's run at the same settings (``fitted_replay_headroom.csv``).
6. ``fi eval --task`` (``--tasks``, question-agnostic and -aware, ``--task-samples`` seeds, keep 50 %): task
   accuracy of the decoding-feature fit on all five documents (the tasks' generated texts are not among them)
   beside InfoKV, SnapKV, H2O and the full cache.

    .venv/bin/python analyses/fit.py                          # OMP_NUM_THREADS=1 nice -n 10, on a shared CPU
    .venv/bin/python analyses/fit.py --probe-documents alice,hamlet --eval-documents ''

Small tables go to analyses/results/fit/ (policy.json, policy-decoding.json, cv.csv, probe.csv,
probe_summary.csv, fitted_headroom.csv, eval_replays.csv, fitted_replay_headroom.csv, task_summary.csv,
output.txt). A finished probe is not
repeated and ``fi eval`` runs resume where a stopped one ended; ``--fresh`` starts them all again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["alice", "botchan", "hamlet", "lcet10", "paradise_regained"]
FI = [sys.executable, "-m", "fi_toolkit"]
HEADROOM_FI = ROOT / "analyses" / "results" / "headroom" / "fi.csv"
REPLAY_KL = ROOT / "analyses" / "results" / "headroom" / "replay_kl.csv"
HIDE_PATH = (r"path=[^@]*", "path=<without this document>")


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
    ap.add_argument("--tasks", default="passkey,multikey_needle", help="fi eval --task names ('' for none)")
    ap.add_argument("--task-samples", type=int, default=5)
    ap.add_argument("--fresh", action="store_true", help="rerun every fi run instead of resuming it")
    args = ap.parse_args()
    again = "--overwrite" if args.fresh else "--resume"
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
        if args.fresh or not (run / "fi.csv").exists():  # fi probe writes fi.csv last, atomically
            fi(
                "probe",
                doc,
                "--prefix",
                "512",
                "--chunk",
                "512:640",
                "--chunk",
                "768:896",
                "--select",
                f"policy:fitted@keep=0.25:path={policy}",
                "--select",
                "policy:infokv@keep=0.25",
                "--select",
                "policy:snapkv@keep=0.25",
                "--select",
                "policy:h2o@keep=0.25",
                "--out",
                str(run),
                "--overwrite",
            )
        table = pd.read_csv(run / "fi.csv")
        for column in ("selection", "selector"):
            table[column] = table[column].str.replace(*HIDE_PATH, regex=True)
        probes.append(table)
    if probes:
        probe = pd.concat(probes, ignore_index=True)
        probe.to_csv(res / "probe.csv", index=False)
        summary = probe.pivot_table(index="selection", columns="chunk", values="fi", aggfunc="mean", sort=False)
        summary.to_csv(res / "probe_summary.csv")
        (res / "output.txt").write_text(
            f"FI at keep 25 %, p = 512, mean over {len(probes)} held-out document(s)\n"
            + summary.to_string(float_format=lambda v: f"{v:.5f}")
            + "\n"
        )
        print((res / "output.txt").read_text())
        headroom = fitted_headroom(probe)
        headroom.to_csv(res / "fitted_headroom.csv", index=False)
        print(headroom.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    evals = []
    for doc in filter(None, args.eval_documents.split(",")):
        policy = out / f"policy-decoding-without-{doc}.json"
        fi("fit", str(data), "--exclude", doc, "--features", "decoding", "--out", str(policy), "--overwrite")
        run = out / f"eval-{doc}"
        fi(
            "eval",
            doc,
            "--policy",
            f"fitted:path={policy},infokv,snapkv,h2o",
            "--budget",
            "0.25",
            "--prompt",
            "512",
            "--length",
            "768",
            "--interval",
            "128",
            "--free-tokens",
            "0",
            "--resamples",
            "0",
            "--out",
            str(run),
            again,
        )
        evals.append(pd.read_csv(run / "replays.csv"))
    if evals:
        replays = pd.concat(evals, ignore_index=True)
        replays["policy"] = replays["policy"].str.replace(r"path=[^,@]*", "path=<without this document>", regex=True)
        replays[
            [
                "document",
                "future",
                "policy",
                "budget",
                "compressions",
                "mean_kl",
                "top1_agreement",
                "delta_nll",
                "seconds",
            ]
        ].to_csv(res / "eval_replays.csv", index=False)
        headroom = fitted_replay_headroom(replays)
        headroom.to_csv(res / "fitted_replay_headroom.csv", index=False)
        print(
            replays.pivot_table(index="policy", columns="document", values="mean_kl", sort=False)
            .assign(mean=lambda t: t.mean(axis=1))
            .to_string(float_format=lambda v: f"{v:.4g}")
        )
        print(headroom.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.tasks:
        run = out / "tasks"
        fi(
            "eval",
            "--task",
            args.tasks,
            "--policy",
            f"fitted:path={res / 'policy-decoding.json'},infokv,snapkv,h2o",
            "--budget",
            "0.5",
            "--samples",
            str(args.task_samples),
            "--protocol",
            "question-agnostic,question-aware",
            "--resamples",
            "1000",
            "--out",
            str(run),
            again,
        )
        tasks = pd.read_csv(run / "task_summary.csv")
        tasks["policy"] = tasks["policy"].str.replace(r"path=[^,@]*", "path=policy-decoding.json", regex=True)
        tasks.to_csv(res / "task_summary.csv", index=False)
        print(tasks.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


def fitted_replay_headroom(replays: pd.DataFrame) -> pd.DataFrame:
    """The fitted policy's share of the random-to-oracle gap in replay KL (fi_toolkit.evaluation.replay_headroom),
    with the random replays and the decoding oracle of docs/results/headroom.md's run at the same settings
    (analyses/results/headroom/replay_kl.csv, six significant digits). Refuses to mix the runs unless every
    policy both replayed has the same mean KL there."""
    from fi_toolkit.evaluation import replay_headroom

    reference = pd.read_csv(REPLAY_KL).assign(future="document")
    both = replays.merge(reference, on=["document", "policy", "budget"], suffixes=("", "_headroom_run"))
    both = both[both["policy"] != "full"]
    if both.empty or not np.allclose(both["mean_kl"], both["mean_kl_headroom_run"], rtol=1e-5, atol=1e-9):
        raise SystemExit(f"{REPLAY_KL} was not replayed at these settings: the policies both runs replayed differ")
    names = reference["policy"].str.split(":").str[0]
    extra = reference[names.isin(["random", "fi-oracle"]) & reference["document"].isin(set(replays["document"]))]
    table = replay_headroom(pd.concat([replays, extra], ignore_index=True))
    return table[table["policy"] != table["oracle"]].reset_index(drop=True)


def fitted_headroom(probe: pd.DataFrame) -> pd.DataFrame:
    """The fitted policy's (and the heuristics') share of the random-to-oracle gap (fi_toolkit.probe.headroom),
    with the random sets and oracles of analyses/headroom.py's run at the same settings, on the held-out
    documents. Refuses to mix the runs unless every policy both measured has the same FI (to 1e-6 relative)."""
    from fi_toolkit.probe.headroom import ORACLE, RANDOM, headroom_table

    reference = pd.read_csv(HEADROOM_FI)
    keys = ["document", "selection", "chunk"]
    both = probe.merge(reference, on=keys, suffixes=("", "_headroom_run"))
    both = both[both["selector"] != "control"]
    if both.empty or not np.allclose(both["fi"], both["fi_headroom_run"], rtol=1e-6, atol=1e-9):
        raise SystemExit(f"{HEADROOM_FI} was not measured at these settings: the policies both runs measured differ")
    docs, n = set(probe["document"]), set(probe["n_removed"].round(3))
    extra = reference[
        reference["selector"].isin([ORACLE, RANDOM])
        & reference["document"].isin(docs)
        & reference["n_removed"].round(3).isin(n)
    ]
    table = headroom_table(pd.concat([probe, extra], ignore_index=True))
    own = table[(table["fit_chunk"] == table["chunk"]) & ~table["oracle"].str.contains("rounds=")]
    return own.drop(columns=["oracle"]).reset_index(drop=True)


if __name__ == "__main__":
    main()
