"""Does the Fisher (gradient) estimate of per-token FI rank positions like exact leave-one-out?

For each compression point (default p = 512 with chunks 512:640, 768:896 and p = 1024 with chunks
1024:1280, 1536:1664: a near and a far chunk each; 1792:2048 would triple the exact cost at p = 1024) and each bundled
document: ``fi correlate
--estimator fisher --samples 16 --validate 64`` (the estimate at every position of [4, p - 32),
exact leave-one-out FI at 64 entropy-stratified positions, Spearman / Pearson / top-10 % overlap
with bootstrap 95 % CIs). Then the sinks and their neighbours, which no study candidate covers:
exact FI at positions 0-7 (``--sink-positions``) beside their estimates. Then where it misses
(``errors.csv``: the estimate's bias in the top 10 % by exact FI and the top positions it misses).
Finally, per-layer estimates: the mean share of each layer in the sum of per-layer estimates.

    .venv/bin/python analyses/estimator.py                 # 48 min on a shared 2-core CPU (1 thread, niced)
    .venv/bin/python analyses/estimator.py --configs 512:512:640,768:896 --documents alice

Each document at each compression point is its own resumable run (``--out/p<prefix>/<document>``,
continued where it stopped); after every document the tables of the finished ones are concatenated
into analyses/results/estimator/p<prefix>/ (under manifests/ each document's manifest from the session
that computed it) and its output.txt is rewritten, so a run cut off keeps what finished.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from _common import ROOT, per_document  # noqa: E402

from fi_toolkit import load_model
from fi_toolkit.runs import results  # noqa: E402
from fi_toolkit.runs.settings import RunSettings  # noqa: E402
from fi_toolkit.signals.trace import trace_prefix  # noqa: E402
from fi_toolkit.studies import CorrelateSettings, per_token_fi, read_table, run_correlate  # noqa: E402
from fi_toolkit.studies.agreement import summarize_agreement  # noqa: E402

TABLES = (
    "agreement",
    "validation",
    "estimator_time",
    "controls",
    "sink_estimates",
    "sinks",
)  # concatenated over documents


def sink_rows(lm, doc, prefix, chunks, n_positions, tables) -> pd.DataFrame:
    """Exact FI at positions ``[0, n_positions)`` (the sinks and their neighbours) beside the run's estimates."""
    positions = torch.arange(n_positions)
    trace = trace_prefix(lm.model, doc.ids, prefix)
    exact = per_token_fi(lm.model, trace, doc.ids, positions, chunks).fi()[2:].double()
    tokens = tables["tokens"][tables["tokens"]["document"] == doc.name]
    estimates = pd.concat(
        [
            tables["sink_estimates"][tables["sink_estimates"]["document"] == doc.name],
            tokens[["document", "position", "chunk", "fi", "fi_se"]].rename(columns={"fi": "fi_estimate"}),
        ]
    )
    rows = []
    for k, c in enumerate(chunks):
        part = estimates[estimates["chunk"] == c.label].set_index("position")
        median = float(tokens.loc[tokens["chunk"] == c.label, "fi"].median())
        for j in range(n_positions):
            rows.append(
                {
                    "document": doc.name,
                    "prefix": prefix,
                    "chunk": c.label,
                    "position": j,
                    "fi_exact": float(exact[j, k]),
                    "fi_estimate": float(part.loc[j, "fi_estimate"]),
                    "fi_se": float(part.loc[j, "fi_se"]),
                    "median_estimate_candidates": median,
                }
            )
    return pd.DataFrame(rows)


def layer_shares(tokens: pd.DataFrame) -> pd.DataFrame:
    """Mean share of each layer in the sum of the per-layer estimates, per chunk (over positions and documents)."""
    cols = sorted((c for c in tokens.columns if c.startswith("fi_layer_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    layers = tokens[cols].to_numpy()
    shares = layers / layers.sum(axis=1, keepdims=True)
    frame = pd.DataFrame(shares, columns=[int(c.rsplit("_", 1)[1]) for c in cols])
    frame["chunk"] = tokens["chunk"].to_numpy()
    return (
        frame.groupby("chunk", sort=False)
        .mean()
        .reset_index()
        .melt(id_vars="chunk", var_name="layer", value_name="mean_share")
    )


def error_table(validation: pd.DataFrame) -> pd.DataFrame:
    """Where the estimate misses, per document and chunk: ``log10(estimate / exact)`` in the top 10 %
    by exact FI (``k`` positions, as the overlap metric) and in the rest, positions off by more than 3x,
    and each top-``k`` position the estimate's top ``k`` missed, with its rank by the estimate."""
    rows = []
    for (doc, chunk), part in validation.groupby(["document", "chunk"], sort=False):
        ratio = np.log10(part["fi_estimate"] / part["fi_exact"].clip(lower=1e-12))
        k = max(1, round(0.1 * len(part)))
        top = part["fi_exact"].rank(ascending=False, method="first") <= k
        rank = part["fi_estimate"].rank(ascending=False, method="first")
        missed = part[top & (rank > k)]
        rows.append(
            {
                "document": doc,
                "chunk": chunk,
                "n": len(part),
                "k": k,
                "log_ratio_top_median": ratio[top].median(),
                "log_ratio_rest_median": ratio[~top].median(),
                "off_3x": int((ratio.abs() > np.log10(3)).sum()),
                "max_abs_log_ratio": ratio.abs().max(),
                "missed_top": "; ".join(
                    f"{r.position} {r.token!r} (estimate rank {int(rank[i])})" for i, r in missed.iterrows()
                ),
            }
        )
    return pd.DataFrame(rows)


def run_document(lm, doc, prefix, chunks, args) -> dict:
    """One document at one compression point, in its own resumable run directory; the sink rows are
    kept there too (``sinks.csv``), so a finished document costs nothing when run again."""
    out = args.out / f"p{prefix}" / doc.name
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
    if str(prefix) in args.sink_prefixes.split(","):
        if not (out / "sinks.csv").exists():
            results.write_table(out / "sinks.csv", sink_rows(lm, doc, prefix, chunks, args.sink_positions, tables))
        tables["sinks"] = read_table(out / "sinks.csv")
    return tables


def write_results(target: Path, out: Path, done: dict[str, dict], latest: str) -> dict:
    """The tables of every finished document at one compression point, concatenated, with the
    cross-document agreement summary and layer shares; the manifest of the ``latest`` document."""
    merged = {
        name: pd.concat([t[name] for t in done.values() if name in t], ignore_index=True)
        for name in (*TABLES, "tokens")
        if any(name in t for t in done.values())
    }
    for name in TABLES:
        if name in merged:
            results.write_table(target / f"{name}.csv", merged[name])
    results.write_table(target / "agreement_summary.csv", summarize_agreement(merged["agreement"]))
    merged["errors"] = error_table(merged["validation"])
    results.write_table(target / "errors.csv", merged["errors"])
    results.write_table(target / "layer_shares.csv", layer_shares(merged["tokens"]))
    # the manifest of the session that computed the document (a resume rewrites an empty one)
    source, copy = out / latest / "manifest.json", target / "manifests" / f"{latest}.json"
    if not copy.exists() or json.loads(source.read_text())["computed_this_session"]:
        results.atomic_copy(source, copy)
    return merged


def summary_lines(prefix: int, chunks, tables: dict, args) -> list[str]:
    """The text summary of one compression point (analyses/results/estimator/output.txt)."""
    lines = []
    if "sinks" in tables:
        lines.append(f"\nsinks and neighbours, p={prefix} (exact FI, estimate, estimate / median estimate):")
        for r in tables["sinks"].itertuples():
            lines.append(
                f"  {r.document:>8} {r.chunk:>9} pos {r.position}: exact {r.fi_exact:.3g}, "
                f"estimate {r.fi_estimate:.3g} (se {r.fi_se:.2g}), x{r.fi_estimate / r.median_estimate_candidates:.0f}"
            )
    lines.append(
        f"\np={prefix}, chunks {', '.join(c.label for c in chunks)}, {args.validate} validated of "
        f"{prefix - 36} positions per document, {args.samples} samples"
    )
    for r in tables["agreement"].itertuples():
        lines.append(
            f"  {r.document:>8} {r.chunk:>9} {r.metric:>13}: {r.value:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
        )
    for (doc, chunk), part in tables["validation"].groupby(["document", "chunk"], sort=False):
        ratio = np.log10(part["fi_estimate"] / part["fi_exact"].clip(lower=1e-12))
        lines.append(
            f"  {doc:>8} {chunk}: log10(estimate / exact) median {ratio.median():+.2f}, IQR "
            f"[{ratio.quantile(0.25):+.2f}, {ratio.quantile(0.75):+.2f}]; exact FI below noise floor in "
            f"{int(part['below_noise_floor'].sum())} of {len(part)}"
        )
    for r in tables["errors"].itertuples():
        lines.append(
            f"  {r.document:>8} {r.chunk}: top {r.k} by exact FI log10(estimate / exact) median "
            f"{r.log_ratio_top_median:+.2f} (rest {r.log_ratio_rest_median:+.2f}); off by > 3x: {r.off_3x} of {r.n}; "
            f"top {r.k} missed: {r.missed_top or 'none'}"
        )
    t = tables["estimator_time"]
    lines.append(
        f"  estimator seconds per document: {', '.join(f'{r.document} {r.seconds:.0f}' for r in t.itertuples())}"
    )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", default="alice,hamlet,botchan")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["512:512:640,768:896", "1024:1024:1280,1536:1664"],
        help="PREFIX:CHUNK,CHUNK per compression point",
    )
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--validate", type=int, default=64)
    ap.add_argument("--sink-positions", type=int, default=8, help="exact and estimated FI at positions [0, N)")
    ap.add_argument("--sink-prefixes", default="512,1024", help="compression points of the sink comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "analyses" / "estimator")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "estimator")
    args = ap.parse_args(argv)

    lm = load_model("smollm2-135m")
    per_document(lm, args, run_document, write_results, summary_lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
