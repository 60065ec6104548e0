"""Correlation over every position: the headline correlation table.

For each compression point and each of the five bundled documents: ``fi correlate --estimator fisher
--samples 16 --validate 32`` (the Fisher estimate of leave-one-out FI at every position of
[4, p - 32), exact leave-one-out FI at 32 entropy-stratified positions beside it), correlated with
H under both entropy conventions (``H_produced``, ``H_next``; ``H`` is the run's convention,
``produced``), A, D, E, S (means; Spearman, Pearson, Kendall), per layer (A, D, E, S) and per
(layer, KV head) for window attention, each with a paired bootstrap 95 % CI over positions.

Compression points and chunks (a near and a far chunk each, 128 tokens):
    p = 1024: near 1024:1152, far 1536:1664
    p = 2048: near 2048:2176, far 2560:2688

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python analyses/correlation_all.py
    .venv/bin/python analyses/correlation_all.py --configs 1024:1024:1152,1536:1664 --documents alice
    .venv/bin/python analyses/correlation_all.py --figure docs/images   # heat maps from the committed tables
    .venv/bin/python analyses/correlation_all.py --tables               # the docs page's tables, from them too
    .venv/bin/python analyses/correlation_all.py --configs 2048:2048:2176,2560:2688 --documents hamlet \
        --results /tmp/r-hamlet &                                        # documents in parallel processes,
    .venv/bin/python analyses/correlation_all.py --merge /tmp/r-hamlet  # then joined (same tables as one run)

Wall time on the shared 2-core CPU (1 thread, niced, SmolLM2-135M float32): p = 1,024, 365-718 s per
document (166-370 s of it the Fisher estimate), 38 min for the five; p = 2,048 about twice that per
document (per document in analyses/results/correlation-all/p<prefix>/seconds.csv and output.txt).

Each document at each compression point is its own resumable run (``--out/p<prefix>/<document>``,
continued where it stopped); after every document the tables of the finished ones are concatenated
into analyses/results/correlation-all/p<prefix>/ (correlations, their summary over documents with a
bootstrap CI over documents, validation, agreement; under manifests/ each document's manifest from
the session that computed it) and its output.txt is rewritten, so a run cut off keeps what finished.
The per-token tables (tokens.csv, several MB) stay in --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from _common import ROOT, parse_config, per_document  # noqa: E402
from scipy import stats  # noqa: E402

from fi_toolkit import load_model  # noqa: E402
from fi_toolkit.runs import results  # noqa: E402
from fi_toolkit.runs.settings import RunSettings  # noqa: E402
from fi_toolkit.studies import CorrelateSettings, run_correlate  # noqa: E402
from fi_toolkit.studies.agreement import summarize_agreement  # noqa: E402
from fi_toolkit.studies.correlation import summarize_correlations  # noqa: E402

DOCUMENTS = "alice,botchan,hamlet,lcet10,paradise_regained"
CONFIGS = ["1024:1024:1152,1536:1664", "2048:2048:2176,2560:2688"]
TABLES = ("correlations", "agreement", "validation", "estimator_time", "controls")  # concatenated over documents
HEADLINE = ("H_produced", "H_next", "A", "D", "E", "S")


def document_ci(values: pd.Series, n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap 95 % CI of the mean over documents (NaN below 3 documents)."""
    v = values.dropna().to_numpy(dtype=np.float64)
    if v.size < 3 or np.ptp(v) == 0:
        return (float(v.mean()), float(v.mean())) if v.size >= 3 else (np.nan, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        ci = stats.bootstrap(
            (v,), np.mean, n_resamples=n_resamples, method="percentile", rng=np.random.default_rng(seed)
        ).confidence_interval
    return float(ci.low), float(ci.high)


def summary_with_ci(corr: pd.DataFrame) -> pd.DataFrame:
    """:func:`summarize_correlations` (mean, sd, min, max over documents) with a bootstrap CI of the mean."""
    summary = summarize_correlations(corr)
    keys = ["chunk", "signal", "scope", "layer", "head", "method"]
    cis = corr.groupby(keys, dropna=False, sort=False)["rho"].apply(
        lambda g: pd.Series(document_ci(g), index=["doc_ci_low", "doc_ci_high"])
    )
    cis = cis.unstack().reset_index()
    out = summary.merge(cis, on=keys, how="left", validate="one_to_one")
    assert len(out) == len(summary) and out["doc_ci_low"].notna().sum() >= 0
    return out


def run_document(lm, doc, prefix, chunks, args) -> dict:
    out = args.out / f"p{prefix}" / doc.name
    t0 = time.perf_counter()
    settings = CorrelateSettings(
        chunks, prefix, seed=args.seed, estimator="fisher", samples=args.samples, validate=args.validate
    )
    tables = run_correlate(
        lm,
        [doc],
        settings,
        RunSettings(out, resume=True),
        progress=lambda d, done, total: print(f"  p={prefix} {d}: {done}/{total}", file=sys.stderr, flush=True),
    )
    tables["seconds"] = pd.DataFrame(
        [{"document": doc.name, "prefix": prefix, "seconds_this_session": round(time.perf_counter() - t0, 1)}]
    )
    return tables


def write_results(target: Path, out: Path, done: dict[str, dict], latest: str) -> dict:
    merged = {
        name: pd.concat([t[name] for t in done.values() if name in t], ignore_index=True)
        for name in (*TABLES, "seconds")
        if any(name in t for t in done.values())
    }
    for name in TABLES:
        if name in merged:
            results.write_table(target / f"{name}.csv", merged[name])
    merged["correlation_summary"] = summary_with_ci(merged["correlations"])
    results.write_table(target / "correlation_summary.csv", merged["correlation_summary"])
    merged["agreement_summary"] = summarize_agreement(merged["agreement"])
    results.write_table(target / "agreement_summary.csv", merged["agreement_summary"])
    source, copy = out / latest / "manifest.json", target / "manifests" / f"{latest}.json"
    if not copy.exists() or json.loads(source.read_text())["computed_this_session"]:
        results.atomic_copy(source, copy)
    # wall seconds of each document from the manifest of the session that computed it
    merged["seconds"]["seconds"] = [
        json.loads((target / "manifests" / f"{d}.json").read_text())["seconds"]
        if (target / "manifests" / f"{d}.json").exists()
        else np.nan
        for d in merged["seconds"]["document"]
    ]
    results.write_table(target / "seconds.csv", merged["seconds"])
    return merged


def merge_results(args, sources: list[Path]) -> None:
    """Documents computed by separate processes (each with its own ``--results``, the same ``--out``) joined
    into ``--results``: their per-document tables are taken as written, the summaries over documents made
    once (:func:`write_results`), in ``--documents`` order."""
    order = [d.strip() for d in args.documents.split(",")]
    for config in args.configs:
        prefix, chunks = parse_config(config)
        done: dict[str, dict] = {}
        for source in [args.results, *sources]:
            folder = source / f"p{prefix}"
            if not (folder / "correlations.csv").exists():
                continue
            tables = {
                name: pd.read_csv(folder / f"{name}.csv")
                for name in (*TABLES, "seconds")
                if (folder / f"{name}.csv").exists()
            }
            for doc in dict.fromkeys(tables["correlations"]["document"]):
                done[doc] = {name: t[t["document"] == doc].reset_index(drop=True) for name, t in tables.items()}
        done = {d: done[d] for d in order if d in done}
        target = args.results / f"p{prefix}"
        for doc in done:  # each document's manifest from the session that computed it
            copy = target / "manifests" / f"{doc}.json"
            if not copy.exists():
                results.atomic_copy(args.out / f"p{prefix}" / doc / "manifest.json", copy)
        merged = write_results(target, args.out / f"p{prefix}", done, next(reversed(done)))
        text = "\n".join(summary_lines(prefix, chunks, merged, args)) + "\n"
        results.atomic_write_text(target / "output.txt", text)
        print(text, flush=True)


def summary_lines(prefix: int, chunks, tables: dict, args) -> list[str]:
    docs = list(dict.fromkeys(tables["correlations"]["document"]))
    lines = [
        f"p={prefix}, chunks {', '.join(c.label for c in chunks)}: Fisher estimate ({args.samples} samples) at "
        f"every position of [4, {prefix - 32}) ({prefix - 36} positions), {len(docs)} document(s): "
        f"{', '.join(docs)}; H = entropy of the distribution that produced the token (H_produced), "
        f"H_next = of the one computed at the token"
    ]
    s = tables["correlation_summary"]
    mean = s[(s["scope"] == "mean") & (s["method"] == "spearman") & s["signal"].isin(HEADLINE)]
    lines.append("\nmean Spearman rho over documents [bootstrap 95% CI over documents] (sd; min .. max):")
    for r in mean.itertuples():
        lines.append(
            f"  {r.chunk:>9} {r.signal:>10}: {r.rho_mean:+.3f} [{r.doc_ci_low:+.3f}, {r.doc_ci_high:+.3f}] "
            f"(sd {r.rho_std:.3f}; {r.rho_min:+.3f} .. {r.rho_max:+.3f}; positive in "
            f"{r.share_positive:.0%})"
        )
    corr = tables["correlations"]
    per_doc = corr[(corr["scope"] == "mean") & (corr["method"] == "spearman") & corr["signal"].isin(HEADLINE)]
    lines.append("\nSpearman rho per document [bootstrap 95% CI over positions]:")
    for r in per_doc.itertuples():
        lines.append(
            f"  {r.document:>18} {r.chunk:>9} {r.signal:>10}: {r.rho:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
        )
    layer = s[s["scope"] == "layer"]
    best = layer.loc[layer.groupby(["chunk", "signal"], sort=False)["rho_mean"].idxmax()]
    worst = layer.loc[layer.groupby(["chunk", "signal"], sort=False)["rho_mean"].idxmin()]
    lines.append("\nper-layer Spearman rho (mean over documents): best and worst layer per signal")
    for b, w in zip(best.itertuples(), worst.itertuples()):
        lines.append(
            f"  {b.chunk:>9} {b.signal}: best layer {int(b.layer)} {b.rho_mean:+.3f}, "
            f"worst layer {int(w.layer)} {w.rho_mean:+.3f}"
        )
    head = s[s["scope"] == "head"]
    if not head.empty:
        lines.append("\nper-(layer, KV head) Spearman rho of window attention (mean over documents):")
        for chunk, part in head.groupby("chunk", sort=False):
            top, low = part.nlargest(3, "rho_mean"), part.nsmallest(3, "rho_mean")
            spread = part.groupby("layer")["rho_mean"].agg(lambda v: v.max() - v.min())
            best = ", ".join(f"L{int(r.layer)}h{int(r.head)} {r.rho_mean:+.3f}" for r in top.itertuples())
            worst = ", ".join(f"L{int(r.layer)}h{int(r.head)} {r.rho_mean:+.3f}" for r in low.itertuples())
            lines.append(
                f"  {chunk}: best {best}; worst {worst}; "
                f"within-layer range of rho over heads: median {spread.median():.3f}, max {spread.max():.3f}"
            )
    a = tables["agreement"]
    lines.append(
        f"\nexact validation: Fisher estimate vs exact leave-one-out FI at {args.validate} entropy-stratified "
        "positions per document (weighted; bootstrap 95% CI over positions)"
    )
    for r in a.itertuples():
        lines.append(
            f"  {r.document:>18} {r.chunk:>9} {r.metric:>13}: {r.value:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
        )
    for r in tables["agreement_summary"].itertuples():
        lines.append(
            f"  mean over {r.n_documents} documents {r.chunk:>9} {r.metric:>13}: {r.value_mean:+.3f} "
            f"(sd {r.value_std:.3f}; {r.value_min:+.3f} .. {r.value_max:+.3f})"
        )
    t = tables["seconds"]
    lines.append(
        "\nwall seconds per document (the session that computed it; estimator: the Fisher estimate alone): "
        + ", ".join(f"{r.document} {r.seconds:.0f}" for r in t.itertuples())
        + "; estimator "
        + ", ".join(f"{r.document} {r.seconds:.0f}" for r in tables["estimator_time"].itertuples())
    )
    return lines


def figures(results_dir: Path, images: Path) -> list[Path]:
    """Heat maps of the mean Spearman rho over documents: per layer x signal (A, D, E, S) and per layer x
    KV head (window attention), one panel per compression point x chunk (near, far)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    summaries = [
        (int(d.name[1:]), pd.read_csv(d / "correlation_summary.csv"))
        for d in sorted(results_dir.glob("p*"), key=lambda d: int(d.name[1:]))
        if (d / "correlation_summary.csv").exists()
    ]
    panels = [(p, chunk, part) for p, s in summaries for chunk, part in s.groupby("chunk", sort=False)]
    written = []
    for scope, columns, name, title in (
        ("layer", "signal", "correlation_layers.png", "per-layer signal"),
        ("head", "head", "correlation_heads.png", "window attention of each KV head"),
    ):
        fig, axes = plt.subplots(1, len(panels), figsize=(2.2 * len(panels) + 1.5, 8), squeeze=False, sharey=True)
        for i, (p, chunk, part) in enumerate(panels):
            grid = part[part["scope"] == scope].pivot_table(index="layer", columns=columns, values="rho_mean")
            grid.index = grid.index.astype(int)
            if scope == "head":
                grid.columns = [f"h{int(c)}" for c in grid.columns]
            n = int(part["n_documents"].max())
            start = int(chunk.split(":")[0])
            sns.heatmap(
                grid,
                cmap="RdBu_r",
                vmin=-0.6,
                vmax=0.6,
                center=0,
                ax=axes[0][i],
                annot=True,
                fmt=".2f",
                annot_kws={"fontsize": 5.5},
                cbar=i == len(panels) - 1,
            )
            axes[0][i].set_title(f"p={p}, {chunk}\n({'near' if start == p else 'far'}, {n} docs)", fontsize=9)
            axes[0][i].set_xlabel("")
            if i:
                axes[0][i].set_ylabel("")
        fig.suptitle(
            f"Spearman rho of per-token FI (Fisher estimate, every position)\nwith the {title}, mean over documents",
            fontsize=10,
        )
        fig.tight_layout()
        images.mkdir(parents=True, exist_ok=True)
        fig.savefig(images / name, dpi=110)
        plt.close(fig)
        written.append(images / name)
    return written


def _cell(mean: float, low: float, high: float, sd: float) -> str:
    ci = "" if np.isnan(low) else f" [{low:+.2f}, {high:+.2f}]"
    return f"{mean:+.2f}{ci}" + ("" if np.isnan(sd) else f" (sd {sd:.2f})")


def markdown_tables(results_dir: Path) -> str:
    """The tables of docs/results/correlation.md from the committed summaries (every compression point found)."""
    parts = []
    for d in sorted(results_dir.glob("p*"), key=lambda d: int(d.name[1:])):
        if not (d / "correlation_summary.csv").exists():
            continue
        s = pd.read_csv(d / "correlation_summary.csv")
        docs = list(dict.fromkeys(pd.read_csv(d / "correlations.csv")["document"]))
        chunks = list(dict.fromkeys(s["chunk"]))
        parts.append(
            f"\n**p = {d.name[1:]}** ({len(docs)} documents: {', '.join(docs)}); mean Spearman rho over "
            "documents [bootstrap 95 % CI over documents] (sd over documents):\n"
        )
        parts.append("| signal | " + " | ".join(chunks) + " |")
        parts.append("|---" * (len(chunks) + 1) + "|")
        mean = s[(s["scope"] == "mean") & (s["method"] == "spearman")].set_index(["signal", "chunk"])
        for sig in HEADLINE:
            parts.append(
                f"| `{sig}` | "
                + " | ".join(
                    _cell(*mean.loc[(sig, c), ["rho_mean", "doc_ci_low", "doc_ci_high", "rho_std"]]) for c in chunks
                )
                + " |"
            )
        layer = s[s["scope"] == "layer"]
        parts.append("\nbest / worst layer per signal (mean rho over documents):\n")
        parts.append("| signal | " + " | ".join(chunks) + " |")
        parts.append("|---" * (len(chunks) + 1) + "|")
        for sig in ("A", "D", "E", "S"):
            cells = []
            for c in chunks:
                part = layer[(layer["signal"] == sig) & (layer["chunk"] == c)]
                b, w = part.loc[part["rho_mean"].idxmax()], part.loc[part["rho_mean"].idxmin()]
                cells.append(f"L{int(b.layer)} {b.rho_mean:+.2f} / L{int(w.layer)} {w.rho_mean:+.2f}")
            parts.append(f"| `{sig}` | " + " | ".join(cells) + " |")
        head = s[s["scope"] == "head"]
        parts.append("\nwindow attention per (layer, KV head), mean rho over documents:\n")
        parts.append("| chunk | best heads | worst heads | range over all heads | within-layer range (median, max) |")
        parts.append("|---|---|---|---|---|")
        for c in chunks:
            part = head[head["chunk"] == c]
            top, low = part.nlargest(3, "rho_mean"), part.nsmallest(3, "rho_mean")
            spread = part.groupby("layer")["rho_mean"].agg(lambda v: v.max() - v.min())
            name = lambda r: f"L{int(r.layer)}h{int(r.head)} {r.rho_mean:+.2f}"  # noqa: E731
            parts.append(
                f"| {c} | {', '.join(map(name, top.itertuples()))} | {', '.join(map(name, low.itertuples()))} "
                f"| {part.rho_mean.min():+.2f} .. {part.rho_mean.max():+.2f} | {spread.median():.2f}, "
                f"{spread.max():.2f} |"
            )
        a = pd.read_csv(d / "agreement.csv")
        parts.append(
            "\nexact validation: the estimate against exact leave-one-out FI at the validated positions "
            "(mean over documents [bootstrap 95 % CI over documents]; per document: min .. max of the "
            "value, and the widest per-document CI over positions):\n"
        )
        parts.append("| chunk | metric | mean [CI] | per document | widest CI |")
        parts.append("|---|---|---|---|---|")
        for (c, metric), part in a.groupby(["chunk", "metric"], sort=False):
            low, high = document_ci(part["value"])
            ci = "" if np.isnan(low) else f" [{low:+.2f}, {high:+.2f}]"
            width = (part["ci_high"] - part["ci_low"]).idxmax()
            parts.append(
                f"| {c} | {metric} | {part.value.mean():+.2f}{ci} | {part.value.min():+.2f} .. "
                f"{part.value.max():+.2f} | {part.document[width]} [{part.ci_low[width]:+.2f}, "
                f"{part.ci_high[width]:+.2f}] |"
            )
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", default=DOCUMENTS)
    ap.add_argument("--configs", nargs="+", default=CONFIGS, help="PREFIX:CHUNK,CHUNK per compression point")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--validate", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "analyses" / "correlation-all")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "correlation-all")
    ap.add_argument(
        "--figure",
        type=Path,
        metavar="DIR",
        help="only draw the heat maps from the tables in --results into DIR (docs/images)",
    )
    ap.add_argument("--tables", action="store_true", help="only print the markdown tables of the docs page")
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="RESULTS",
        help="only join the --results of processes that computed other documents into --results",
    )
    args = ap.parse_args(argv)
    if args.merge:
        merge_results(args, args.merge)
        return 0
    if args.tables:
        print(markdown_tables(args.results))
        return 0
    if args.figure:
        for path in figures(args.results, args.figure):
            print(path)
        return 0

    lm = load_model("smollm2-135m")
    per_document(lm, args, run_document, write_results, summary_lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
