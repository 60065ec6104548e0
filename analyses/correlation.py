"""How well does each signal predict a token's own Forward Influence? (docs/method.md, "Correlation analysis")

Per-token (leave-one-out) FI of a uniform sample of prefix positions, on a near and a far chunk, correlated with H, A,
D, E, S (Spearman primary, Pearson, Kendall; bootstrap 95% CIs)
and per layer; the spread across documents.

    .venv/bin/python analyses/correlation.py                  # defaults below, ~5-10 min on 2 CPU cores
    .venv/bin/python analyses/correlation.py --prefix 1024 --chunks 1024:1280,1792:2048 --candidates sample:256
    .venv/bin/python analyses/correlation.py --entropy-of next --out runs/analyses/correlation-next \
        --report runs/analyses/correlation-next-report --results analyses/results/correlation-next

Resumable (re-running continues a stopped run); writes the report and copies the small summary
table to analyses/results/correlation/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_output_args, copy_results  # noqa: E402

from fi_toolkit import SignalConfig, load_model  # noqa: E402
from fi_toolkit.documents import load_document  # noqa: E402
from fi_toolkit.probe.chunks import parse_chunk  # noqa: E402
from fi_toolkit.report import build_report  # noqa: E402
from fi_toolkit.runs.settings import RunSettings  # noqa: E402
from fi_toolkit.studies import CorrelateSettings, run_correlate  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", default="alice,hamlet,botchan", help="bundled names or paths, comma-separated")
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--chunks", default="512:640,768:896")
    ap.add_argument("--candidates", default="sample:48")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--entropy-of", default="produced", choices=["produced", "next"])
    add_output_args(ap, "correlation")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    chunks = [parse_chunk(c) for c in args.chunks.split(",")]
    lm = load_model("smollm2-135m")
    docs = [
        load_document(n.strip(), lm.tokenizer, max_tokens=max(c.end for c in chunks)) for n in args.documents.split(",")
    ]
    settings = CorrelateSettings(
        chunks,
        args.prefix,
        args.candidates,
        resamples=args.resamples,
        signals=SignalConfig(entropy_of=args.entropy_of),
        batch_size=args.batch_size,
    )
    tables = run_correlate(
        lm,
        docs,
        settings,
        RunSettings(args.out, resume=not args.fresh, overwrite=args.fresh),
        progress=lambda d, done, total: print(f"  {d}: {done}/{total}", file=sys.stderr, flush=True),
    )
    build_report([args.out], args.report, overwrite=True)  # the script's own report, rebuilt every run
    wall = time.perf_counter() - t0
    copy_results(args, ["correlation_summary.csv", "manifest.json"])

    corr = tables["correlations"]
    mean = corr[(corr["scope"] == "mean") & (corr["method"] == "spearman")]
    print(
        f"per-token FI vs signals on {len(docs)} documents, p={args.prefix}, chunks {args.chunks}, "
        f"candidates {args.candidates}, H = entropy of the distribution {args.entropy_of}; wall time {wall:.0f} s"
    )
    print("\nSpearman rho [bootstrap 95% CI] per document:")
    for r in mean.itertuples():
        print(f"  {r.document:>18} {r.chunk:>9} {r.signal}: {r.rho:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]")
    s = tables["correlation_summary"]
    s = s[(s["scope"] == "mean")]
    print("\nmean rho over documents (sd):")
    print(
        s.assign(v=s.rho_mean.map("{:+.3f}".format) + " (" + s.rho_std.map("{:.3f}".format) + ")")
        .pivot_table(index=["signal"], columns=["method", "chunk"], values="v", aggfunc="first", sort=False)
        .to_string()
    )
    layer = tables["correlation_summary"]
    layer = layer[(layer["scope"] == "layer")]
    best = layer.loc[layer.groupby(["chunk", "signal"])["rho_mean"].idxmax()].astype({"layer": int})
    print("\nbest layer per signal (mean Spearman rho):")
    print(best[["chunk", "signal", "layer", "rho_mean"]].to_string(index=False, float_format=lambda v: f"{v:+.3f}"))
    print(f"\nreport: {args.report}/report.html; tables: {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
