"""Nothing measured changes when the code is restructured: every command's tables, byte for byte.

Runs ``fi probe``, ``fi correlate`` (exact and Fisher), ``fi nearfar``, ``fi eval`` (a text replay and a
task), ``fi field`` (two documents, three methods, two budgets, with the replay), ``fi scores --estimator
fisher`` and, where lm-eval is installed, ``fi lm-eval`` on the bundled documents at small sizes with the
embedded SmolLM2, and compares every CSV they write (and lm-eval's per-sample log) with the tables in
``--golden``, which were written by the code before the change:

    .venv/bin/python benchmarks/pipeline_identity.py --write benchmarks/results/pipeline-golden   # before
    .venv/bin/python benchmarks/pipeline_identity.py --check benchmarks/results/pipeline-golden   # after

Manifests are not compared (they hold times and argv), nor columns of wall time (``seconds``, ``fi field``'s
``compress_seconds``); every other byte of every table is. ``--only NAME`` runs and compares one command's
tables (repeatable). Exit status 1 when a table differs; the first differing line of each is printed. A few
minutes on two CPU cores; run it with OMP_NUM_THREADS set the
same both times (float reductions may depend on the thread count).
"""

from __future__ import annotations

import argparse
import csv
import difflib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

P = "128"
RUNS: dict[str, list[str]] = {  # each command's arguments (the results directory is added)
    "probe": (
        "probe alice --chunk 128:192 --chunk 192:256 --select entropy:remove=0.1 --select attention:remove=0.1 "
        "--select infokv:remove=0.1 --select random:remove=0.1@0-1 --select policy:h2o@keep=0.5 "
        "--select policy:fi-oracle@keep=0.5"
    ).split(),
    "correlate": "correlate alice --chunk 128:160 --candidates sample:12 --resamples 50".split(),
    "correlate-fisher": (
        "correlate alice --chunk 128:160 --estimator fisher --samples 4 --validate 6 --resamples 50"
    ).split(),
    "nearfar": f"nearfar alice --prefix {P} --distances 0,32 --chunk-len 32 --seeds 2".split(),
    "eval-text": (
        f"eval alice --prompt {P} --length 224 --interval 32 --budget 0.5 "
        "--policy snapkv,infokv,h2o,streaming,fi-oracle --free-tokens 8 --resamples 50"
    ).split(),
    "eval-task": (
        "eval --task passkey --context 256 --samples 2 --budget 0.5 --policy snapkv,infokv --interval 8 --resamples 50"
    ).split(),
    "field": (
        f"field alice botchan --prefix {P} --distances 0,32 --chunk-len 32 --seeds 2 --budget keep=0.5 "
        "--budget remove=0.25 --policy snapkv --policy infokv --policy adaptive(h2o) --resamples 50 --replay "
        "--interval 32"
    ).split(),
}
SCORES = f"scores alice --prefix {P} --fi-chunk 128:160 --estimator fisher --samples 4".split()


def fi(args: list[str], fi_bin: str) -> None:
    done = subprocess.run([fi_bin, *args], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    if done.returncode != 0:
        raise SystemExit(f"fi {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def lmeval_tables(out: Path, fi_bin: str) -> None:
    """``fi lm-eval`` on a generative and a loglikelihood task built from a bundled book, under SnapKV."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        print("lm-eval is not installed here: fi lm-eval skipped (run with .venv-lmeval/bin/python)")
        return
    root = Path(__file__).resolve().parents[1]
    tasks, run = out / "lm-eval-tasks", out / "lm-eval-run"
    fi(["tasks", "export", "--task", "passkey", "--context", "300", "--samples", "2", "--out", str(tasks)], fi_bin)
    for name in ("fi_mc", "fi_rolling"):
        shutil.copy(root / "tests" / "data" / "lmeval" / f"{name}.yaml", tasks)
    here = os.getcwd()
    os.chdir(root)  # the task files name their data relative to the repository root
    try:
        args = (
            "lm-eval --model fi --model_args "
            "pretrained=smollm2-135m,policy=snapkv,budget=keep=96,interval=8,device=cpu "
            "--tasks fi_passkey,fi_mc,fi_rolling --limit 2 --log_samples --seed 0"
        ).split()
        fi([*args, "--include_path", str(tasks), "--output_path", str(run)], fi_bin)
    finally:
        os.chdir(here)
    for path in sorted(run.rglob("samples_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        keep = [{k: r.get(k) for k in ("doc_id", "resps", "filtered_resps", "fi_toolkit")} for r in rows]
        name = path.name.split("_20")[0]  # samples_TASK_<timestamp>.jsonl
        (out / "lm-eval").mkdir(exist_ok=True)
        (out / "lm-eval" / f"{name}.json").write_text(json.dumps(keep, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(run)
    shutil.rmtree(tasks)


def produce(out: Path, fi_bin: str, only: list[str] | None = None) -> None:
    for name, args in RUNS.items():
        if only and name not in only:
            continue
        print(f"fi {' '.join(args)}", flush=True)
        fi([*args, "--out", str(out / name)], fi_bin)
        (out / name / "manifest.json").unlink()
        for extra in (out / name).rglob("*"):
            if extra.is_file() and extra.suffix != ".csv":
                extra.unlink()
    if not only or "scores" in only:
        print(f"fi {' '.join(SCORES)}", flush=True)
        fi([*SCORES, "--out", str(out / "scores.csv")], fi_bin)
    if not only or "lm-eval" in only:
        lmeval_tables(out, fi_bin)


TIME_COLUMNS = {"seconds", "compress_seconds"}  # wall time: differs from run to run by nature


def _without_times(path: Path) -> bytes:
    """The file's bytes; a CSV's without its wall-time columns (the rest of each line kept byte for byte)."""
    data = path.read_bytes()
    if path.suffix != ".csv":
        return data
    rows = list(csv.reader(io.StringIO(data.decode(), newline="")))
    drop = {i for i, name in enumerate(rows[0] if rows else []) if name in TIME_COLUMNS}
    if not drop:
        return data
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([v for i, v in enumerate(row) if i not in drop] for row in rows)
    return out.getvalue().encode()


def compare(golden: Path, fresh: Path, only: list[str] | None = None) -> int:
    want = {p.relative_to(golden) for p in golden.rglob("*") if p.is_file()}
    if only:  # the tables of the commands run: a directory per command, scores.csv for fi scores
        want = {p for p in want if p.parts[0] in only or p.parts[0] == "scores.csv" and "scores" in only}
    got = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    if not (fresh / "lm-eval").exists():
        want = {p for p in want if p.parts[0] != "lm-eval"}
    bad = 0
    for rel in sorted(want | got):
        if rel not in got or rel not in want:
            print(f"DIFFERS {rel}: only in {'the golden tables' if rel in want else 'this run'}")
            bad += 1
            continue
        a, b = _without_times(golden / rel), _without_times(fresh / rel)
        if a != b:
            bad += 1
            diff = difflib.unified_diff(a.decode().splitlines(), b.decode().splitlines(), lineterm="", n=0)
            first = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")][:2]
            print(f"DIFFERS {rel}: " + " | ".join(first))
        else:
            print(f"identical {rel}")
    print(f"{len(want | got) - bad} of {len(want | got)} tables byte-identical")
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="Write the golden tables here (before the change).")
    group.add_argument("--check", type=Path, help="Compare a fresh run with the golden tables here.")
    parser.add_argument(
        "--only",
        action="append",
        choices=[*RUNS, "scores", "lm-eval"],
        help="Run and compare only this command's tables (repeatable; default: every command).",
    )
    parser.add_argument("--fi", default=str(Path(sys.executable).parent / "fi"), help="The fi script to run.")
    args = parser.parse_args()
    if args.write:
        if args.write.exists():
            raise SystemExit(f"{args.write} exists; remove it first")
        produce(args.write, args.fi, args.only)
        return
    with tempfile.TemporaryDirectory() as tmp:
        produce(Path(tmp), args.fi, args.only)
        sys.exit(compare(args.check, Path(tmp), args.only))


if __name__ == "__main__":
    main()
