"""Does the Fisher (gradient) estimate of per-token FI rank positions like exact leave-one-out? (issue 10)

For each compression point (default p = 512 with chunks 512:640, 768:896 and p = 1024 with chunks
1024:1280, 1536:1664: a near and a far chunk each; 1792:2048 would triple the exact cost at p = 1024) and each bundled document: ``fi correlate
--estimator fisher --samples 16 --validate 64`` (the estimate at every position of [4, p - 32),
exact leave-one-out FI at 64 entropy-stratified positions, Spearman / Pearson / top-10 % overlap
with bootstrap 95 % CIs). Then the sinks and their neighbours, which no study candidate covers:
exact FI at positions 0-7 (``--sink-positions``) beside their estimates. Finally, per-layer estimates: the
mean share of each layer in the sum of per-layer estimates.

    .venv/bin/python analyses/estimator.py                 # about 40 min on 2 CPU cores
    .venv/bin/python analyses/estimator.py --configs 512:512:640,768:896 --documents alice

Resumable (each run directory under --out continues where it stopped); the small tables go to
analyses/results/estimator/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from _common import ROOT  # noqa: E402
from fi_toolkit import load_model, results  # noqa: E402
from fi_toolkit.analysis import per_token_fi, run_correlate  # noqa: E402
from fi_toolkit.documents import load_document  # noqa: E402
from fi_toolkit.probe import parse_chunk  # noqa: E402
from fi_toolkit.trace import trace_prefix  # noqa: E402

COPIED = ("agreement.csv", "agreement_summary.csv", "validation.csv", "estimator_time.csv", "controls.csv",
          "sink_estimates.csv", "manifest.json")


def parse_config(text: str):
    prefix, chunks = text.split(":", 1)
    return int(prefix), [parse_chunk(c) for c in chunks.split(",")]


def sink_rows(lm, doc, prefix, chunks, n_positions, tables) -> pd.DataFrame:
    """Exact FI at positions ``[0, n_positions)`` (the sinks and their neighbours) beside the run's estimates."""
    positions = torch.arange(n_positions)
    trace = trace_prefix(lm.model, doc.ids, prefix)
    exact = per_token_fi(lm.model, trace, doc.ids, positions, chunks).fi()[2:].double()
    tokens = tables["tokens"][tables["tokens"]["document"] == doc.name]
    estimates = pd.concat([tables["sink_estimates"][tables["sink_estimates"]["document"] == doc.name],
                           tokens[["document", "position", "chunk", "fi", "fi_se"]].rename(columns={"fi": "fi_estimate"})])
    rows = []
    for k, c in enumerate(chunks):
        part = estimates[estimates["chunk"] == c.label].set_index("position")
        median = float(tokens.loc[tokens["chunk"] == c.label, "fi"].median())
        for j in range(n_positions):
            rows.append({"document": doc.name, "prefix": prefix, "chunk": c.label, "position": j,
                         "fi_exact": float(exact[j, k]), "fi_estimate": float(part.loc[j, "fi_estimate"]),
                         "fi_se": float(part.loc[j, "fi_se"]), "median_estimate_candidates": median})
    return pd.DataFrame(rows)


def layer_shares(tokens: pd.DataFrame) -> pd.DataFrame:
    """Mean share of each layer in the sum of the per-layer estimates, per chunk (over positions and documents)."""
    cols = sorted((c for c in tokens.columns if c.startswith("fi_layer_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    layers = tokens[cols].to_numpy()
    shares = layers / layers.sum(axis=1, keepdims=True)
    frame = pd.DataFrame(shares, columns=[int(c.rsplit("_", 1)[1]) for c in cols])
    frame["chunk"] = tokens["chunk"].to_numpy()
    return frame.groupby("chunk", sort=False).mean().reset_index().melt(id_vars="chunk", var_name="layer",
                                                                       value_name="mean_share")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", default="alice,hamlet,botchan")
    ap.add_argument("--configs", nargs="+", default=["512:512:640,768:896", "1024:1024:1280,1536:1664"],
                    help="PREFIX:CHUNK,CHUNK per compression point")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--validate", type=int, default=64)
    ap.add_argument("--sink-positions", type=int, default=8, help="exact and estimated FI at positions [0, N)")
    ap.add_argument("--sink-prefixes", default="512,1024", help="compression points of the sink comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "analyses" / "estimator")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "estimator")
    args = ap.parse_args(argv)

    lm = load_model("smollm2-135m")
    lines = []
    for config in args.configs:
        t0 = time.perf_counter()
        prefix, chunks = parse_config(config)
        docs = [load_document(n.strip(), lm.tokenizer, max_tokens=max(c.end for c in chunks))
                for n in args.documents.split(",")]
        out = args.out / f"p{prefix}"
        tables = run_correlate(lm, docs, out, prefix, chunks, seed=args.seed, estimator="fisher", samples=args.samples,
                               validate=args.validate, resume=True,
                               progress=lambda d, done, total: print(f"  p={prefix} {d}: {done}/{total}",
                                                                     file=sys.stderr, flush=True))
        target = args.results / f"p{prefix}"
        for name in COPIED:
            results.atomic_copy(out / name, target / name)
        results.write_table(target / "layer_shares.csv", layer_shares(tables["tokens"]))
        if str(prefix) in args.sink_prefixes.split(","):
            sinks = pd.concat([sink_rows(lm, d, prefix, chunks, args.sink_positions, tables) for d in docs],
                              ignore_index=True)
            results.write_table(target / "sinks.csv", sinks)
            lines.append(f"\nsinks and neighbours, p={prefix} (exact FI, estimate, estimate / median estimate):")
            for r in sinks.itertuples():
                lines.append(f"  {r.document:>8} {r.chunk:>9} pos {r.position}: exact {r.fi_exact:.3g}, "
                             f"estimate {r.fi_estimate:.3g} (se {r.fi_se:.2g}), x{r.fi_estimate / r.median_estimate_candidates:.0f}")
        a = tables["agreement"]
        lines.append(f"\np={prefix}, chunks {', '.join(c.label for c in chunks)}, {args.validate} validated of "
                     f"{prefix - 36} positions per document, {args.samples} samples; {time.perf_counter() - t0:.0f} s")
        for r in a.itertuples():
            lines.append(f"  {r.document:>8} {r.chunk:>9} {r.metric:>13}: {r.value:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]")
        v = tables["validation"]
        for chunk, part in v.groupby("chunk", sort=False):
            ratio = np.log10(part["fi_estimate"] / part["fi_exact"].clip(lower=1e-12))
            lines.append(f"  {chunk}: log10(estimate / exact) median {ratio.median():+.2f}, IQR "
                         f"[{ratio.quantile(0.25):+.2f}, {ratio.quantile(0.75):+.2f}]; exact FI below noise floor in "
                         f"{int(part['below_noise_floor'].sum())} of {len(part)}")
        t = tables["estimator_time"]
        lines.append(f"  estimator seconds per document: {', '.join(f'{r.document} {r.seconds:.0f}' for r in t.itertuples())}")
        print("\n".join(lines[-(len(a) + 6):]), flush=True)
    text = "\n".join(lines) + "\n"
    results.atomic_write_text(args.results / "output.txt", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
