"""At which context lengths does the model solve each task with its full cache?

Runs the full cache only (no policy) on every task at 1,024, 2,048 and 4,096 tokens, greedy, and
writes ``analyses/results/eval/task_lengths.csv`` (accuracy with a bootstrap 95 % CI per task and
length). ``fi eval --task``'s default context lengths are the ones measured here.

    .venv/bin/python analyses/task_lengths.py            # resumes a stopped run in runs/analyses/task-lengths
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import ROOT

from fi_toolkit.compress.decoder import signal_config_for
from fi_toolkit.evaluation import make_units, run_eval_tasks
from fi_toolkit.evaluation.tasks import TASKS
from fi_toolkit.model.loading import load_model
from fi_toolkit.runs.results import atomic_copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1024,2048,4096")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "analyses" / "task-lengths")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "eval")
    args = ap.parse_args()
    lm = load_model("smollm2-135m")
    contexts = [int(c) for c in args.contexts.split(",")]
    units = make_units(list(TASKS), contexts, args.samples, lm.tokenizer, lm.model.config)
    resume = (args.out / "settings.json").exists()
    tables = run_eval_tasks(
        lm,
        units,
        args.out,
        [],
        ["question-aware"],
        signal_config_for(None),
        max_new=16,
        resume=resume,
        progress=lambda name, done, total: print(f"{name} {done}/{total}", flush=True) if done == total else None,
    )
    summary = tables["task_summary"][["task", "context", "samples", "accuracy", "accuracy_low", "accuracy_high"]]
    print(summary.to_string(index=False))
    summary.to_csv(args.out / "task_lengths.csv", index=False)
    atomic_copy(args.out / "task_lengths.csv", args.results / "task_lengths.csv")


if __name__ == "__main__":
    main()
