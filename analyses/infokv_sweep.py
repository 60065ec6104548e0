"""Do InfoKV's paper settings (alpha = 0.9, tau = 1, top-k = 256) sit at an optimum?

Probe FI of ``policy:infokv@B:alpha=A,tau=T`` (signals traced with ``--top-k K``) at keep 25 % and 10 %
on the five bundled documents, p = 512, a near chunk 512:640 and a far chunk 768:896 (sized for about
15 minutes on one shared CPU core; the paper's settings use p in the thousands). The grid: alpha in
{0, 0.5, 0.8, 0.9, 0.95, 1} x tau in {0, 0.5, 1, 2} at top-k 256 (the heat map), and alpha in {0.5,
0.9, 0.95} x top-k in {16, 64, full vocabulary} at tau = 1; three random sets per budget as a scale.
alpha = 1 is SnapKV scoring whatever tau and top-k are (its four cells are one keep map).

Outputs (analyses/results/infokv-sweep/): ``sweep.csv`` (one row per document x setting x budget x
chunk), ``summary.csv`` (per setting, budget and chunk: mean FI over documents, the mean over
documents of FI / FI of the paper's setting, and on how many documents the setting is the best of
the grid), ``heatmap.png`` (alpha x tau at top-k 256: mean FI relative to the paper's setting).

    .venv/bin/python analyses/infokv_sweep.py                    # see docs/results/infokv-sweep.md for the wall time
    .venv/bin/python analyses/infokv_sweep.py --documents alice  # one document
    .venv/bin/python analyses/infokv_sweep.py --replay --documents alice,hamlet,botchan   # replay KL instead

``--replay``: the same grid (alpha = 1 once per top-k: it is SnapKV) as ``fi eval`` policies, teacher-forced
replay KL (prompt 512 compressed to keep 25 %, 256 more tokens of the document, back to the budget every
128), one ``fi eval`` run per document and top-k (resumable, under ``runs/analyses/infokv-sweep-replay/``);
``replay.csv`` and ``replay_summary.csv`` as ``sweep.csv`` and ``summary.csv`` (chunk: ``replay``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from _common import ROOT  # noqa: E402

from fi_toolkit import load_model  # noqa: E402
from fi_toolkit.documents import load_document  # noqa: E402
from fi_toolkit.probe.chunks import parse_chunk  # noqa: E402
from fi_toolkit.probe.experiment import probe_document  # noqa: E402
from fi_toolkit.probe.noise_floor import CONTROL  # noqa: E402
from fi_toolkit.signals.trace import SignalConfig  # noqa: E402

ALPHAS = (0.0, 0.5, 0.8, 0.9, 0.95, 1.0)
TAUS = (0.0, 0.5, 1.0, 2.0)
TOP_KS = (16, 64, 256, 0)  # 0: the full vocabulary
PAPER = (0.9, 1.0, 256)


def settings(top_k: int) -> list[tuple[float, float]]:
    if top_k == 256:
        return [(a, t) for a in ALPHAS for t in TAUS]
    return [(a, 1.0) for a in (0.5, 0.9, 0.95)]


def sweep_document(lm, name: str, prefix: int, chunks, budgets) -> pd.DataFrame:
    doc = load_document(name, lm.tokenizer, max_tokens=max(c.end for c in chunks))
    vocab = lm.model.config.vocab_size
    parts = []
    for top_k in TOP_KS:
        k = top_k or vocab
        cells = settings(top_k)
        selections = [f"policy:infokv@{b}:alpha={a},tau={t}" for b in budgets for a, t in cells]
        if top_k == 256:
            selections += [f"random:keep={b}@0-2" for b in budgets]
        table = probe_document(lm, doc, chunks, selections, prefix=prefix, config=SignalConfig(top_k=k))
        table = table[table["selector"] != CONTROL].copy()
        opts = table["selection"].str.extract(r"keep=(?P<keep>[\d.]+)(?::alpha=(?P<alpha>[\d.]+),tau=(?P<tau>[\d.]+))?")
        table["keep"] = opts["keep"].astype(float)
        table["alpha"] = opts["alpha"].astype(float)
        table["tau"] = opts["tau"].astype(float)
        table["top_k"] = top_k or "full"
        parts.append(table[["document", "selection", "selector", "keep", "alpha", "tau", "top_k", "chunk", "fi"]])
    return pd.concat(parts, ignore_index=True)


def summarize(sweep: pd.DataFrame) -> pd.DataFrame:
    grid = sweep[sweep["selector"] != "random"].copy()
    grid["top_k"] = grid["top_k"].astype(str)
    keys = ["keep", "chunk", "document"]
    paper = grid[(grid.alpha == PAPER[0]) & (grid.tau == PAPER[1]) & (grid.top_k == str(PAPER[2]))]
    grid = grid.join(paper.set_index(keys)["fi"].rename("fi_paper"), on=keys)
    grid["rel_paper"] = grid["fi"] / grid["fi_paper"]
    grid["best"] = grid.groupby(keys)["fi"].transform("min") == grid["fi"]
    rand = sweep[sweep["selector"] == "random"].groupby(["keep", "chunk"])["fi"].mean().rename("fi_random")
    out = (
        grid.groupby(["keep", "chunk", "alpha", "tau", "top_k"])
        .agg(
            fi_mean=("fi", "mean"),
            rel_paper_mean=("rel_paper", "mean"),
            best_on=("best", "sum"),
            n_documents=("document", "nunique"),
        )
        .reset_index()
    )
    return out.join(rand, on=["keep", "chunk"])


def heatmap(summary: pd.DataFrame, caption: str):
    s = summary[summary["top_k"] == "256"]
    panels = s.groupby(["keep", "chunk"], sort=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False)
    for ax, ((keep, chunk), g) in zip(axes[0], panels):
        grid = g.pivot(index="alpha", columns="tau", values="rel_paper_mean")
        sns.heatmap(
            grid,
            ax=ax,
            annot=True,
            fmt=".2f",
            cmap="RdBu_r",
            center=1.0,
            vmin=0.5,
            vmax=1.5,
            cbar=False,
            annot_kws={"fontsize": 7},
        )
        ax.set_title(f"keep {keep:g}, chunk {chunk}", fontsize=9)
    fig.suptitle("InfoKV FI relative to the paper's setting (alpha 0.9, tau 1, top-k 256); < 1 is better", fontsize=9)
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=7, color="#444")
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    return fig


def replay_document(name: str, vocab: int, out: Path, budget: str = "0.25") -> pd.DataFrame:
    """Replay KL of every grid setting on one document (``fi eval``, one run per top-k)."""
    parts = []
    for top_k in TOP_KS:
        cells = [(a, t) for a, t in settings(top_k) if a < 1 or t == 1.0]  # alpha = 1: SnapKV, whatever tau
        policies = ",".join(f"infokv:alpha={a},tau={t}" for a, t in cells)
        run = out / f"{name}-k{top_k or 'full'}"
        cmd = [
            sys.executable,
            "-m",
            "fi_toolkit",
            "eval",
            name,
            "--policy",
            policies,
            "--budget",
            budget,
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
            "--top-k",
            str(top_k or vocab),
            "--out",
            str(run),
            "--resume",
        ]
        print("$ fi " + " ".join(cmd[3:]), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
        table = pd.read_csv(run / "replays.csv")
        table = table[table["policy"] != "full"].copy()
        opts = table["policy"].map(lambda p: dict(re.findall(r"(alpha|tau)=([\d.]+)", p)))
        table["alpha"] = opts.map(lambda o: float(o.get("alpha", 0.9)))
        table["tau"] = opts.map(lambda o: float(o.get("tau", 1.0)))
        table["keep"] = float(budget)
        table["top_k"] = top_k or "full"
        table["chunk"] = "replay"
        table["selector"] = "policy:infokv"
        table = table.rename(columns={"mean_kl": "fi", "policy": "selection"})
        parts.append(
            table[
                ["document", "selection", "selector", "keep", "alpha", "tau", "top_k", "chunk", "fi", "top1_agreement"]
            ]
        )
    return pd.concat(parts, ignore_index=True)


def every_document(args, measure, table_name: str, summary_name: str) -> tuple[pd.DataFrame, float]:
    """``measure(name) -> table`` for each of ``--documents``, concatenated, summarised (:func:`summarize`) and
    written to ``--results`` as ``table_name`` and ``summary_name``; -> (summary, seconds since the start)."""
    t0, parts = time.perf_counter(), []
    for name in args.documents.split(","):
        parts.append(measure(name))
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    table = pd.concat(parts, ignore_index=True)
    summary = summarize(table)
    args.results.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.results / table_name, index=False)
    summary.to_csv(args.results / summary_name, index=False)
    print(summary.to_string(), flush=True)
    return summary, time.perf_counter() - t0


def replay_main(args, vocab: int) -> None:
    out = ROOT / "runs" / "analyses" / "infokv-sweep-replay"
    _, seconds = every_document(
        args, lambda name: replay_document(name, vocab, out), "replay.csv", "replay_summary.csv"
    )
    print(f"wall time {seconds:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", default="alice,hamlet,lcet10,botchan,paradise_regained")
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--chunks", default="512:640,768:896")
    ap.add_argument("--budgets", default="0.25,0.1")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "infokv-sweep")
    ap.add_argument("--summarize", action="store_true", help="only re-summarise --results/sweep.csv")
    ap.add_argument("--replay", action="store_true", help="replay KL of the grid (fi eval) instead of probe FI")
    args = ap.parse_args()
    if args.replay:
        return replay_main(args, vocab=49152 if args.model == "smollm2-135m" else 1 << 30)
    if args.summarize:
        summary = summarize(pd.read_csv(args.results / "sweep.csv"))
        summary.to_csv(args.results / "summary.csv", index=False)
        print(summary.to_string(), flush=True)
        return
    chunks = [parse_chunk(c) for c in args.chunks.split(",")]
    budgets = args.budgets.split(",")
    lm = load_model(args.model, device="cpu", dtype="float32")
    summary, seconds = every_document(
        args, lambda name: sweep_document(lm, name, args.prefix, chunks, budgets), "sweep.csv", "summary.csv"
    )
    caption = (
        f"SmolLM2-135M, {len(args.documents.split(','))} bundled documents, p = {args.prefix}, chunks "
        f"{args.chunks}; wall time {seconds:.0f} s on one CPU thread"
    )
    heatmap(summary, caption).savefig(args.results / "heatmap.png", dpi=120)
    print(f"wall time {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
