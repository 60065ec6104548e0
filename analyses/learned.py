"""The learned policy judged on documents it never saw.

Trains ``fi fit --learner lambdarank`` on the bundled documents (``fi fit-data``: Fisher FI, target the mean
over a near and a far chunk), then probes unseen public-domain texts from ``../shared/corpus/`` (none of
them bundled: As You Like It, Paradise Lost, Macbeth, The Tempest, Julius Caesar) at p = 256, keep 25 % and
50 %, near chunk 256:384 and far chunk 512:640: the learned policy against H2O, SnapKV, InfoKV,
ExpectedAttention, TOVA (the in-house policies, equal to kvpress's presses' scores) and the FI oracle fitted on
the chunk measured; three random sets per budget. Writes to analyses/results/learned/ (``--tiny``: a CI-sized
run, p = 128, keep 50 %, two documents each side, to --results given):

- ``model.json``: the trained model (``learned:path=...``);
- ``fi.csv``: the probe's table;
- ``headroom.csv``: :func:`fi_toolkit.probe.headroom.headroom_table`, oracle fitted on the chunk measured;
- ``wins.csv``: per document x budget x chunk, the learned FI against H2O's, the best rival's (of the five)
  and the best of H2O, SnapKV and InfoKV (the rivals of the earlier runs);
- ``importance.png``: LightGBM gain per feature.

    python analyses/learned.py                  # the study (about 25 min on one shared CPU core)
    python analyses/learned.py --tiny --work /tmp/w --results /tmp/r
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from fi_toolkit.probe.headroom import ORACLE, RANDOM, headroom_table  # noqa: E402
from fi_toolkit.probe.noise_floor import CONTROL  # noqa: E402

TRAIN = ["alice", "hamlet", "lcet10", "botchan", "paradise_regained"]
CORPUS = next((c for c in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")) if c.is_dir()), None)
UNSEEN = ["asyoulik.txt", "plrabn12.txt", "macbeth_gut.txt", "tempest_gut.txt", "julius_caesar_gut.txt"]
FULL = {"prefix": 256, "chunks": ["256:384", "512:640"], "budgets": ["0.25", "0.5"], "samples": 16, "oracle": ""}
# CI-sized; the oracle's 4 Fisher draws (16 by default) halve the test's time: the tests check tables, not quality
TINY = {"prefix": 128, "chunks": ["128:160", "192:224"], "budgets": ["0.5"], "samples": 2, "oracle": ",samples=4"}
HEURISTICS = ("h2o", "snapkv", "infokv", "expected_attention", "tova")
PREVIOUS = ("h2o", "snapkv", "infokv")  # the rivals of the runs before ExpectedAttention and TOVA joined


def fi(*args: str) -> None:
    """Run ``fi ARGS`` with this checkout first on the path; stop on failure."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    print("+ fi", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "fi_toolkit", *args], check=True, env=env, cwd=ROOT)


def from_root(path: Path) -> str:
    """``path`` relative to the checkout where it lies inside it (the committed tables name no machine's paths;
    :func:`fi` runs from the checkout), else absolute."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def selects(setting: dict, model: Path) -> list[str]:
    out = []
    for b in setting["budgets"]:
        out += [f"policy:fi-oracle@{b}:chunk={c}{setting['oracle']}" for c in setting["chunks"]]
        out += [f"policy:learned@{b}:path={from_root(model)}"]
        out += [f"policy:{h}@{b}" for h in HEURISTICS]
        out += [f"random:keep={b}@0-2"]
    return out


def name_of(selection: str) -> str:
    """A short name of a probe selection: learned, oracle, random or one of :data:`HEURISTICS`."""
    if "learned" in selection:
        return "learned"
    for key in ("fi-oracle", *HEURISTICS):
        if key in selection:
            return "oracle" if key == "fi-oracle" else key
    return "random"


def wins(table: pd.DataFrame) -> pd.DataFrame:
    """Per document x removed count x chunk: learned, H2O, best-rival and best-of-:data:`PREVIOUS` FI (lower is
    better)."""
    t = table[~table["selector"].isin([CONTROL, RANDOM, ORACLE])].assign(
        name=lambda d: d["selection"].map(name_of), n=lambda d: d["n_removed"].round(3)
    )
    rows = []
    for (doc, n, chunk), g in t.groupby(["document", "n", "chunk"], sort=False):
        by = g.groupby("name")["fi"].mean()
        heur = by.drop("learned")
        previous = heur[list(PREVIOUS)]
        rows.append(
            {
                "document": doc,
                "n_removed": n,
                "chunk": chunk,
                "learned": by["learned"],
                "h2o": by["h2o"],
                "best_heuristic": heur.idxmin(),
                "best_heuristic_fi": heur.min(),
                "beats_h2o": bool(by["learned"] < by["h2o"]),
                "beats_best": bool(by["learned"] < heur.min()),
                "best_previous": previous.idxmin(),
                "best_previous_fi": previous.min(),
                "beats_best_previous": bool(by["learned"] < previous.min()),
            }
        )
    return pd.DataFrame(rows)


def importance_figure(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gain = pd.Series(record["importance_gain"]).sort_values()
    fig, ax = plt.subplots(figsize=(6, 0.3 * len(gain) + 1))
    ax.barh(gain.index, gain.to_numpy() / gain.sum())
    ax.set_xlabel("share of total LightGBM gain")
    ax.set_title("learned policy: feature importance (gain)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="CI-sized: p = 128, keep 50 %%, 2 documents a side, 2 samples")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "analyses" / "learned")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "learned")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="the folder of the unseen texts")
    args = ap.parse_args()
    if args.corpus is None or not args.corpus.is_dir():
        ap.error("no corpus folder: give --corpus (../shared/corpus beside the project)")
    setting = TINY if args.tiny else FULL
    train = TRAIN[:2] if args.tiny else TRAIN
    unseen = [str(args.corpus / n) for n in (UNSEEN[:2] if args.tiny else UNSEEN)]
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    chunks = [a for c in setting["chunks"] for a in ("--chunk", c)]
    p = str(setting["prefix"])
    if not (args.work / "fitdata" / "manifest.json").is_file():
        fi(
            "fit-data",
            *train,
            *chunks,
            "--prefix",
            p,
            "--samples",
            str(setting["samples"]),
            "--out",
            str(args.work / "fitdata"),
        )
    model = args.results / "model.json"
    if not model.is_file():
        fi("fit", str(args.work / "fitdata"), "--learner", "lambdarank", "--out", from_root(model))
    if not (args.work / "probe" / "fi.csv").is_file():
        sel = [a for s in selects(setting, model) for a in ("--select", s)]
        fi("probe", *unseen, *chunks, "--prefix", p, *sel, "--out", str(args.work / "probe"))
    table = pd.read_csv(args.work / "probe" / "fi.csv")
    table.to_csv(args.results / "fi.csv", index=False)
    hr = headroom_table(table)
    hr = hr[hr["fit_chunk"] == hr["chunk"]].assign(name=lambda d: d["selection"].map(name_of))
    hr.to_csv(args.results / "headroom.csv", index=False)
    w = wins(table)
    w.to_csv(args.results / "wins.csv", index=False)
    record = json.loads(model.read_text())
    importance_figure(record, args.results / "importance.png")
    pd.set_option("display.width", 200)
    print(
        hr[
            ["chunk", "n_removed", "name", "fi_random", "fi_policy", "fi_oracle", "headroom", "ci_low", "ci_high"]
        ].to_string(index=False, float_format="%.4g")
    )
    print(
        f"learned beats H2O in {int(w.beats_h2o.sum())} of {len(w)} document x budget x chunk cells; "
        f"the best rival ({', '.join(HEURISTICS)}) in {int(w.beats_best.sum())} of {len(w)}; "
        f"the best of {', '.join(PREVIOUS)} in {int(w.beats_best_previous.sum())} of {len(w)}"
    )
    print("training cross-validation (mean within-head Spearman):", record["cross_validation"]["mean"])


if __name__ == "__main__":
    main()
