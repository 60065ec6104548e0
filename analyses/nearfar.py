"""Reproduce the paper's near/far Forward Influence finding on the bundled documents.

Claim under test (InfoKV paper; docs/method.md, "Set-level analysis"): tokens picked by window
attention matter mostly for near chunks; high-entropy tokens matter more for distant chunks.

    .venv/bin/python analyses/nearfar.py                      # p=512, the default entropy (produced)
    OMP_NUM_THREADS=1 .venv/bin/python analyses/nearfar.py --prefix 1024 --distances 0,256,512,1024 \
        --chunk-len 256 --out runs/analyses/nearfar-p1024 --report runs/analyses/nearfar-p1024-report \
        --results analyses/results/nearfar-p1024 --fresh       # about 7 min with one thread
    ... --entropy-of next --out runs/analyses/nearfar-p1024-next ... --results analyses/results/nearfar-p1024-next

On a CPU shared with other jobs, OMP_NUM_THREADS=1 avoids thread oversubscription (up to ~10x faster).

Runs ``fi nearfar`` (resumable: re-running continues where it stopped) on every bundled document,
writes the report (HTML/Markdown/CSV/JSON) and prints the key numbers. Small summary tables are
copied to ``analyses/results/nearfar/`` so that the numbers quoted in the README can be checked.
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
from fi_toolkit.documents import BUNDLED, load_document  # noqa: E402
from fi_toolkit.report import build_report  # noqa: E402
from fi_toolkit.runs.settings import RunSettings  # noqa: E402
from fi_toolkit.studies import NearfarSettings, run_nearfar  # noqa: E402
from fi_toolkit.studies.nearfar import parse_distances  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", default=",".join(BUNDLED), help="bundled names or paths, comma-separated")
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--distances", default="0,128,256,384")
    ap.add_argument("--chunk-len", type=int, default=128)
    ap.add_argument("--budget", default="remove=0.1", help="set size, e.g. remove=0.1 (of the prefix) or remove=100")
    ap.add_argument("--entropy-of", default="produced", choices=["produced", "next"])
    ap.add_argument("--seeds", type=int, default=3)
    add_output_args(ap, "nearfar")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    distances = parse_distances(args.distances)
    lm = load_model("smollm2-135m")
    need = args.prefix + max(distances) + args.chunk_len
    docs = [load_document(name.strip(), lm.tokenizer, max_tokens=need) for name in args.documents.split(",")]

    def progress(doc, done, _total):
        print(f"  {doc}: {done} sets measured", file=sys.stderr, flush=True)

    settings = NearfarSettings(
        args.prefix,
        distances,
        args.chunk_len,
        args.budget,
        args.seeds,
        sinks=4,
        with_unprotected=True,
        signals=SignalConfig(entropy_of=args.entropy_of),
        batch_size=args.batch_size,
    )
    run = RunSettings(args.out, resume=not args.fresh, overwrite=args.fresh)
    tables = run_nearfar(lm, docs, settings, run, progress=progress)
    build_report([args.out], args.report, overwrite=True)  # the script's own report, rebuilt every run
    wall = time.perf_counter() - t0
    copy_results(args, ["nearfar_summary.csv", "nearfar_tests.csv", "token_class_summary.csv", "manifest.json"])

    s, t = tables["nearfar_summary"], tables["nearfar_tests"]
    print(
        f"near/far on {len(docs)} documents, p={args.prefix}, chunks of {args.chunk_len} at +{distances}, "
        f"sets of {args.budget} of the prefix, H = entropy of the distribution {args.entropy_of} "
        f"({'that produced the token' if args.entropy_of == 'produced' else 'predicting the next token'}); "
        f"wall time {wall:.0f} s"
    )
    for metric, label in (
        ("fi_mean", "FI (nats)"),
        ("fi_rel_random_mean", "FI / random FI"),
        ("fi_share_near_mean", "FI / FI on the nearest chunk"),
    ):
        pivot = s.pivot_table(index=["sinks", "selector"], columns="distance_from_p", values=metric, sort=False)
        print(f"\n{label} (mean over documents); columns: chunk start - p")
        print(pivot.to_string(float_format=lambda v: f"{v:.4g}"))
    print("\nentropy > attention, one-sided Wilcoxon signed-rank across documents:")
    cols = ["sinks", "distance_from_p", "metric", "a_wins", "n_documents", "mean_log_ratio", "wilcoxon_p"]
    print(t[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"\nreport: {args.report}/report.html; tables: {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
