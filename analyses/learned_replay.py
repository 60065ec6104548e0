"""The learned policy in decoding: replay KL on the texts it never saw, against every rival that compresses while
decoding.

When this study ran, the committed learned models could not compress while decoding: they read ``entropy_next``
(the entropy computed *at* a token), which the policy took from the next slot (they now read the tracker's
per-position entropies and decode too). This study trains the two variants on the compression-time features alone
(``fi fit --features decoding``: the 17 others, ``entropy_produced`` kept), on the same rows as
``analyses/learned.py`` (``fi fit-data`` of the five bundled documents, p = 256, chunks 256:384 and 512:640, 16
label draws): ``model-head.json`` (one LambdaRank group per document, layer and KV head) and ``model-layer.json``
(``--group layer``, scores comparable over a layer's KV heads). Then ``fi eval`` (teacher-forced replay, as
docs/results/eval.md measures it) of the five unseen texts of ``analyses/learned.py`` from p = 256 to 640 tokens
(the learned study's near and far chunks both inside), compressing back to the budget every 128 tokens, keep 25 %
and 50 %, no free generation:

- ``learned-head``: ``learned:path=model-head.json``, every head keeping k;
- ``learned-global``: ``learned:path=model-layer.json,heads=global``: each layer's budget shared over its KV heads
  by a global top-k (the decoder holds heads of different counts by masking each head's padded slots);
- the project's H2O, SnapKV, InfoKV, ExpectedAttention and TOVA, and the look-ahead FI oracle (``fi-oracle``: it
  sees the replayed text, a bound, not a rival);
- with ``--kvpress`` (run it with the kvpress venv's interpreter), kvpress's scorer presses that compress in the
  decode loop with their own ``score()`` at every compression (``--presses``).

Writes to analyses/results/learned-replay/: the two models, ``replays.csv`` (``fi eval``'s per document x policy x
budget table), ``replay_summary.csv``, ``wins.csv`` (per document x budget: each learned variant's replay KL
against the best rival's) and prints the counts and the share of the best rival's gap to the oracle each closes.

    OMP_NUM_THREADS=1 .venv-kvpress/bin/python analyses/learned_replay.py --kvpress --work /tmp/learned_replay
    python analyses/learned_replay.py --tiny --work /tmp/w --results /tmp/r     # two texts a side, keep 50 %
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "analyses"))

import learned as study  # noqa: E402  (analyses/learned.py: its unseen texts and helpers)
import pandas as pd  # noqa: E402

RIVALS = ("h2o", "snapkv", "infokv", "expected_attention", "tova")
PRESSES = (
    "ExpectedAttentionPress",
    "TOVAPress",
    "SnapKVPress",
    "KeyDiffPress",
    "KnormPress",
)  # scorer presses that decode
FULL = {"prompt": 256, "length": 640, "interval": 128, "budgets": "keep=0.25,keep=0.5"}
TINY = {"prompt": 128, "length": 320, "interval": 64, "budgets": "keep=0.5"}
LEARNED = ("learned-head", "learned-global")


def train(setting: dict, train_docs: list[str], work: Path, results: Path) -> dict[str, str]:
    """``fi fit-data`` (once) and the two ``fi fit --features decoding`` models (each once) -> ``fi eval`` policy
    spellings of the two learned variants, naming the models by their path in the checkout."""
    chunks = [a for c in setting["chunks"] for a in ("--chunk", c)]
    rows = work / "fitdata"
    if not (rows / "manifest.json").is_file():
        samples = ["--samples", str(setting["samples"])]
        study.fi("fit-data", *train_docs, *chunks, "--prefix", str(setting["prefix"]), *samples, "--out", str(rows))
    spelled = {}
    for variant, name, group in (
        ("learned-head", "model-head.json", []),
        ("learned-global", "model-layer.json", ["--group", "layer"]),
    ):
        model = results / name
        if not model.is_file():
            study.fi(
                "fit",
                str(rows),
                "--learner",
                "lambdarank",
                "--features",
                "decoding",
                *group,
                "--out",
                study.from_root(model),
            )
        spelled[variant] = f"learned:path={study.from_root(model)}" + (",heads=global" if group else "")
    return spelled


def policies(learned: dict[str, str], kvpress: bool, presses: list[str]) -> str:
    """``fi eval``'s ``--policy`` list: the two learned variants, the project's rivals, the oracle, the presses."""
    names = [*learned.values(), *RIVALS, "fi-oracle"]
    if kvpress:
        names += [f"kvpress:{p}" for p in presses]
    return ",".join(names)


def name_of(policy: str) -> str:
    """``fi eval``'s policy label -> the study's short name (learned-head, learned-global, oracle, or as is)."""
    if policy.startswith("learned"):
        return "learned-global" if "heads=global" in policy else "learned-head"
    return "oracle" if policy.startswith("fi-oracle") else policy


def wins(replays: pd.DataFrame) -> pd.DataFrame:
    """Per document x budget: each learned variant's replay KL, the best rival's (every policy and press but the
    learned ones and the oracle), whether it is lower, and the share of the best rival's gap to the oracle closed."""
    t = replays[replays["policy"] != "full"].assign(name=lambda d: d["policy"].map(name_of))
    rows = []
    for (doc, budget), g in t.groupby(["document", "budget"], sort=False):
        kl = g.set_index("name")["mean_kl"]
        rivals = kl.drop(["learned-head", "learned-global", "oracle"], errors="ignore")
        for variant in LEARNED:
            gap = rivals.min() - kl["oracle"]
            rows.append(
                {
                    "document": doc,
                    "budget": budget,
                    "variant": variant,
                    "replay_kl": kl[variant],
                    "best_rival": rivals.idxmin(),
                    "best_rival_kl": rivals.min(),
                    "oracle_kl": kl["oracle"],
                    "beats_best": bool(kl[variant] < rivals.min()),
                    "beats_h2o": bool(kl[variant] < kl["h2o"]),
                    "gap_share": (rivals.min() - kl[variant]) / gap if gap > 0 else float("nan"),
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="CI-sized: two texts, keep 50 %%, prompt 128, 320 tokens")
    ap.add_argument("--kvpress", action="store_true", help="also kvpress's presses (run with .venv-kvpress's python)")
    ap.add_argument("--presses", default=",".join(PRESSES), help="kvpress presses, comma-separated")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "analyses" / "learned-replay")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "learned-replay")
    ap.add_argument("--corpus", type=Path, default=study.CORPUS, help="the folder of the unseen texts")
    args = ap.parse_args()
    if args.corpus is None or not args.corpus.is_dir():
        ap.error("no corpus folder: give --corpus (../shared/corpus beside the project)")
    setting = TINY if args.tiny else FULL
    unseen = [str(args.corpus / n) for n in (study.UNSEEN[:2] if args.tiny else study.UNSEEN)]
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    learned = train(
        study.TINY if args.tiny else study.FULL, study.TRAIN[:2] if args.tiny else study.TRAIN, args.work, args.results
    )
    run = args.work / "eval"
    if not (run / "replays.csv").is_file():
        study.fi(
            "eval",
            *unseen,
            "--policy",
            policies(learned, args.kvpress, args.presses.split(",")),
            "--budget",
            setting["budgets"],
            "--prompt",
            str(setting["prompt"]),
            "--length",
            str(setting["length"]),
            "--interval",
            str(setting["interval"]),
            "--free-tokens",
            "0",
            "--resamples",
            "0",
            "--out",
            str(run),
            "--resume",
        )
    for name in ("replays.csv", "replay_summary.csv", "manifest.json"):
        shutil.copyfile(run / name, args.results / name)
    replays = pd.read_csv(run / "replays.csv")
    w = wins(replays)
    w.to_csv(args.results / "wins.csv", index=False)
    pd.set_option("display.width", 200)
    summary = replays.assign(name=lambda d: d["policy"].map(name_of)).pivot_table(
        index="name", columns="budget", values="mean_kl", aggfunc="mean"
    )
    print(summary.sort_values(summary.columns[0]).to_string(float_format="%.4f"))
    means = summary.drop(index="full", errors="ignore")
    for budget in (c for c in means.columns if means[c].notna().any()):
        col = means[budget]
        rivals = col.drop(["oracle", *LEARNED])
        gap = rivals.min() - col["oracle"]
        shares = ", ".join(f"{v} {(rivals.min() - col[v]) / gap:.2f}" for v in LEARNED)
        print(
            f"{budget}: best rival on the mean {rivals.idxmin()} {rivals.min():.4f}; share of its gap closed: {shares}"
        )
    for variant, g in w.groupby("variant", sort=False):
        print(
            f"{variant}: lower replay KL than the best rival in {int(g.beats_best.sum())} of {len(g)} document x "
            f"budget cells, than H2O in {int(g.beats_h2o.sum())}; share of the best rival's gap to the oracle "
            f"closed, per budget: "
            + ", ".join(f"{b} {s:.2f}" for b, s in g.groupby("budget", sort=False)["gap_share"].mean().items())
        )


if __name__ == "__main__":
    main()
