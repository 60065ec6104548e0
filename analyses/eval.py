"""The compressor on trial: the README's table of replay KL and task accuracy for every policy
at three budgets, on the bundled documents and the generated tasks, with the full-cache row and the
noise floor.

    OMP_NUM_THREADS=1 .venv/bin/python analyses/eval.py          # resumes a stopped run; --fresh starts over

Runs ``fi eval`` twice through the library (text: every bundled document, prompt 512, 1,536 tokens,
compression every 256; tasks: passkey, multi-key needle and variable tracking at 1,024 tokens,
both protocols), then ``fi report`` on both, and writes ``readme_table.md`` (the table quoted in the
README) beside the summary tables in ``analyses/results/eval/``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pandas as pd  # noqa: E402
from _common import ROOT, copy_results  # noqa: E402

from fi_toolkit import load_model  # noqa: E402
from fi_toolkit.compress.decoder import signal_config_for  # noqa: E402
from fi_toolkit.documents import BUNDLED, load_document  # noqa: E402
from fi_toolkit.evaluation import TextSetting, make_units, run_eval_tasks, run_eval_text  # noqa: E402
from fi_toolkit.evaluation.settings import make_policies  # noqa: E402
from fi_toolkit.evaluation.tasks import TASKS  # noqa: E402
from fi_toolkit.report import build_report  # noqa: E402
from fi_toolkit.runs.results import atomic_write_text, write_table  # noqa: E402

POLICIES = "infokv,snapkv,pyramidkv,streaming,h2o,knorm,random,rpc"


def _progress(label):
    def progress(unit, done, total):
        if done == total:
            print(f"  {label} {unit}: done", file=sys.stderr, flush=True)

    return progress


def readme_table(replay: pd.DataFrame, tasks: pd.DataFrame) -> str:
    """policy x budget: kept share, mean replay KL [CI], top-1, ΔNLL, free-generation first divergence,
    then per task the accuracy under each protocol ("agnostic / aware"); tasks the full cache never
    solves are named under the table instead."""
    acc = tasks.set_index(["task", "protocol", "policy", "budget"])["accuracy"]
    protocols = list(dict.fromkeys(tasks["protocol"]))
    full = tasks[tasks["policy"] == "full"].groupby("task")["accuracy"].max()
    solved = [t for t in dict.fromkeys(tasks["task"]) if full.get(t, 0) > 0]
    head = " / ".join(p.removeprefix("question-") for p in protocols)
    lines = [
        "| policy | keep | kept | replay KL (nats) [95% CI] | top-1 | ΔNLL | free 1st diff | "
        + " | ".join(f"{t} ({head})" for t in solved)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(solved),
    ]
    for r in replay[replay["future"] == "document"].itertuples():
        cells = [
            " / ".join(f"{acc.get((t, p, r.policy, r.budget), float('nan')):.2f}" for p in protocols) for t in solved
        ]
        lines.append(
            f"| {r.policy} | {r.budget.removeprefix('keep=')} | {r.kept_share:.2f} | {r.mean_kl:.3g} "
            f"[{r.mean_kl_low:.3g}, {r.mean_kl_high:.3g}] | {r.top1_agreement:.3f} | {r.delta_nll:+.3f} | "
            f"{r.free_first_divergence:.1f} | " + " | ".join(cells) + " |"
        )
    unsolved = [t for t in dict.fromkeys(tasks["task"]) if t not in solved]
    if unsolved:
        lines.append(f"\nNot shown: {', '.join(unsolved)}, which the full cache solves in none of the samples.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", default=",".join(BUNDLED))
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--budgets", default="0.1,0.25,0.5")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--length", type=int, default=1536)
    ap.add_argument("--interval", type=int, default=256)
    ap.add_argument("--free-tokens", type=int, default=32)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--protocols", default="question-agnostic,question-aware")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "analyses" / "eval")
    ap.add_argument("--report", type=Path, default=ROOT / "runs" / "analyses" / "eval-report")
    ap.add_argument("--results", default=str(ROOT / "analyses" / "results" / "eval"))
    ap.add_argument("--fresh", action="store_true", help="discard a previous run in --out instead of resuming it")
    ap.add_argument(
        "--part",
        choices=["text", "tasks", "all"],
        default="all",
        help="run only the text or the task half (two processes on two cores); 'all' (the default) "
        "runs or resumes both, then writes the report and the tables",
    )
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    lm = load_model("smollm2-135m")
    policies = make_policies(args.policies, args.budgets, 32, 0.9, 1.0, 256)
    config = signal_config_for(policies[0])
    text_dir, task_dir = args.out / "text", args.out / "tasks"
    resume = {
        d: ((d / "settings.json").exists() or (d / "per_document").is_dir()) and not args.fresh
        for d in (text_dir, task_dir)
    }

    docs = [load_document(name.strip(), lm.tokenizer, max_tokens=args.length) for name in args.documents.split(",")]
    setting = TextSetting(args.prompt, args.length, args.interval, free_tokens=args.free_tokens)
    if args.part in ("text", "all"):
        text = run_eval_text(
            lm,
            docs,
            text_dir,
            policies,
            setting,
            config,
            resume=resume[text_dir],
            overwrite=args.fresh,
            progress=_progress("text"),
        )
    if args.part in ("tasks", "all"):
        units = make_units(args.tasks.split(","), [args.context], args.samples, lm.tokenizer, lm.model.config)
        tasks = run_eval_tasks(
            lm,
            units,
            task_dir,
            policies,
            args.protocols.split(","),
            config,
            interval=args.interval,
            resume=resume[task_dir],
            overwrite=args.fresh,
            progress=_progress("tasks"),
        )
    if args.part != "all":
        return 0
    build_report([text_dir, task_dir], args.report, overwrite=True)

    table = readme_table(text["replay_summary"], tasks["task_summary"])
    atomic_write_text(args.out / "readme_table.md", table)
    for sub, names in (
        (text_dir, ["replay_summary.csv", "segment_summary.csv", "replays.csv", "manifest.json"]),
        (task_dir, ["task_summary.csv", "kl_accuracy.csv", "answers.csv", "manifest.json"]),
    ):
        copy_results(
            argparse.Namespace(out=sub, results=str(Path(args.results) / sub.name) if args.results else ""), names
        )
    copy_results(argparse.Namespace(out=args.out, results=args.results), ["readme_table.md"])
    cross = pd.read_csv(args.report / "tables" / "replay_kl_vs_task_accuracy.csv")
    if args.results:
        write_table(Path(args.results) / "replay_kl_vs_task_accuracy.csv", cross)
    print(table)
    print(cross.to_string(index=False))
    print(f"[{time.perf_counter() - t0:.0f} s] report: {args.report}/report.html", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
