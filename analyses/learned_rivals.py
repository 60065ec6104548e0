"""The learned policy against kvpress's presses, on the texts it never saw.

``analyses/learned_heads.py`` judges the learned policy (``learned-global``: the per-layer model with
``heads=global``; ``learned-head``: the committed per-head model) against five in-house rivals (H2O, SnapKV, InfoKV,
ExpectedAttention, TOVA). This adds as rivals every kvpress press the field map measured (the ``kvpress:`` methods
of ``analyses/results/field-map/p1024/leaderboard.csv``, spelled as there: kvpress's own defaults, ratio = 1 − keep),
probed with the kvpress venv's interpreter on the same five unseen texts, prefix, chunks and budgets
(``analyses/learned.py``'s settings).

The learned rows, the in-house rivals, the FI oracle and the random sets are those of ``learned_heads.py``'s table
(``--heads-results``, by default the committed ``analyses/results/learned-heads/fi.csv``): the FI of a keep map is
a deterministic function of the keep map and the text, so the presses' rows are measured apart and joined. The
first press probe also measures H2O, whose FI must equal that table's (checked; the run stops otherwise).

Writes to analyses/results/learned-rivals/ (``--tiny``: p = 128, keep 50 %, two unseen texts, two presses, reading
a ``learned_heads.py --tiny`` results folder; to --results):

- ``fi.csv``: the presses' probe rows (the H2O check rows and the controls left out);
- ``headroom.csv``: every rival's and learned variant's headroom, oracle fitted on the chunk measured;
- ``wins.csv``: per document x budget x chunk: each learned variant's FI, every rival's, the best project policy,
  the best press and the best of all, and whether each learned variant beats each of them;
- ``rivals.csv``: per rival x budget x chunk: mean FI, headroom and in how many documents each learned variant
  has lower FI;
- ``gap.csv``: per budget x chunk: the share of the best rival's gap to the oracle each learned variant closes
  (mean FI over the documents, ``(best − learned) / (best − oracle)``, best = the rival with the lowest mean FI).

    # about 15 min on one shared core (the two press probes; KVgrad and KVzip take 3-5 s per compression):
    OMP_NUM_THREADS=1 python analyses/learned_rivals.py --kvpress-python .venv-kvpress/bin/python --work /tmp/lr
    python analyses/learned_rivals.py --tiny --heads-results /tmp/r --kvpress-python PY --work /tmp/w --results /tmp/o
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "analyses"))

import learned as study  # noqa: E402  (analyses/learned.py: settings, documents)
import learned_heads as heads  # noqa: E402  (analyses/learned_heads.py: names of its selections)
import pandas as pd  # noqa: E402

from fi_toolkit.probe.headroom import ORACLE, RANDOM, headroom_table  # noqa: E402
from fi_toolkit.probe.noise_floor import CONTROL  # noqa: E402

FIELD = ROOT / "analyses" / "results" / "field-map" / "p1024" / "leaderboard.csv"
LEARNED = ("learned-global", "learned-head")
PROJECT = heads.HEURISTICS  # H2O, SnapKV, InfoKV, ExpectedAttention, TOVA (in-house)
# Probed first (one probe each group, so that a cut-short run keeps the strongest presses of the field map):
FIRST = (
    "KVgradPress",
    "KVzipPress",
    "CompactorPress",
    "AdaKVPress/SnapKVPress",
    "ExpectedAttentionPress",
    "CriticalKVPress/SnapKVPress",
    "CriticalAdaKVPress/SnapKVPress",
    "KeyDiffPress",
)
TINY_PRESSES = ("ExpectedAttentionPress", "KnormPress")


def field_presses() -> list[str]:
    """The presses the field map measured (its leaderboard's ``kvpress:`` methods), first :data:`FIRST`."""
    board = pd.read_csv(FIELD)
    found = sorted({m.removeprefix("kvpress:") for m in board["method"] if m.startswith("kvpress:")})
    return [p for p in FIRST if p in found] + [p for p in found if p not in FIRST]


def name_of(selection: str) -> str:
    """``kvpress:NAME`` for a press at kvpress's defaults; else :func:`learned_heads.name_of` (learned variants,
    in-house policies, the allocation controls, oracle, random)."""
    if selection.startswith("kvpress:") and ":window_size=" not in selection:
        return selection.split("@")[0]
    return heads.name_of(selection)


def keep_of(budget: str) -> float:
    """The kept share of a probe row's ``budget`` (``keep=B``, ``remove=R``, or ``compression_ratio=R`` in runs made
    before presses spelled their budget so)."""
    key, value = str(budget).split("=")
    return round(float(value) if key == "keep" else 1 - float(value), 3)


def probe(python: Path, unseen: list[str], setting: dict, selections: list[str], out: Path) -> float:
    """``fi probe`` in the kvpress venv; returns its wall time in seconds."""
    chunks = [a for c in setting["chunks"] for a in ("--chunk", c)]
    sel = [a for s in selections for a in ("--select", s)]
    argv = [str(python), "-m", "fi_toolkit", "probe", *unseen, *chunks, "--prefix", str(setting["prefix"]), *sel]
    print("+ fi (kvpress venv)", " ".join([*argv[4:], "--out", str(out)]), flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    subprocess.run([*argv, "--out", str(out)], check=True, env=env, cwd=ROOT)
    return time.perf_counter() - start


def check_same_run(theirs: pd.DataFrame, ours: pd.DataFrame) -> float:
    """Largest relative difference of H2O's FI between the two probes (same document, budget, chunk)."""
    key = ["document", "selection", "chunk"]
    a = theirs[theirs["selection"].str.startswith("policy:h2o@") & ~theirs["selection"].str.contains("global")]
    b = ours[ours["selection"].str.startswith("policy:h2o@")]
    both = a[[*key, "fi"]].merge(b[[*key, "fi"]], on=key, suffixes=("_heads", "_here"))
    if len(both) != len(b) or both.empty:
        raise SystemExit(f"the H2O check rows do not match learned_heads.py's table ({len(both)} of {len(b)})")
    return float(((both["fi_here"] - both["fi_heads"]).abs() / both["fi_heads"].abs()).max())


def labelled(table: pd.DataFrame) -> pd.DataFrame:
    t = table[~table["selector"].isin([CONTROL])]
    return t.assign(name=t["selection"].map(name_of), keep=t["budget"].map(keep_of))


def wins(table: pd.DataFrame, presses: list[str]) -> pd.DataFrame:
    """Per document x budget x chunk: each learned variant against every rival, the best project policy, the best
    press and the best of all (lower FI is better; FI is the mean over a selection's rows, one here)."""
    t = labelled(table)
    t = t[~t["selector"].isin([RANDOM, ORACLE])]
    rivals = [*PROJECT, *presses]
    rows = []
    for (doc, keep, chunk), g in t.groupby(["document", "keep", "chunk"], sort=False):
        by = g.groupby("name")["fi"].mean()
        row = {"document": doc, "keep": keep, "chunk": chunk, **{v: by[v] for v in LEARNED}}
        row |= {r: by.get(r, float("nan")) for r in rivals}
        groups = {
            "project": by[list(PROJECT)],
            "press": by[[p for p in presses if p in by]],
            "all": by.reindex(rivals).dropna(),
        }
        for group, fi in groups.items():
            row |= {f"best_{group}": fi.idxmin(), f"best_{group}_fi": fi.min()}
        for v in LEARNED:
            row |= {f"{v}_beats_{r}": bool(by[v] < by[r]) for r in rivals if r in by}
            row |= {f"{v}_beats_best_{group}": bool(by[v] < fi.min()) for group, fi in groups.items()}
        rows.append(row)
    return pd.DataFrame(rows)


def rivals_table(hr: pd.DataFrame, w: pd.DataFrame, presses: list[str]) -> pd.DataFrame:
    """Per rival x budget x chunk: mean FI over the documents, headroom (95 % CI) and each learned variant's wins."""
    rows = []
    for r in [*PROJECT, *presses]:
        for (keep, chunk), g in w.groupby(["keep", "chunk"], sort=False):
            h = hr[(hr["name"] == r) & (hr["keep"] == keep) & (hr["chunk"] == chunk)]
            row = {"rival": r, "keep": keep, "chunk": chunk, "fi": g[r].mean(), "n_documents": int(g[r].notna().sum())}
            row |= h[["headroom", "ci_low", "ci_high"]].iloc[0].to_dict() if len(h) == 1 else {}
            row |= {f"{v}_wins": int(g[f"{v}_beats_{r}"].sum()) for v in LEARNED if f"{v}_beats_{r}" in g}
            rows.append(row)
    return pd.DataFrame(rows)


def gap_table(hr: pd.DataFrame, presses: list[str]) -> pd.DataFrame:
    """Per budget x chunk: the best rival by mean FI (of the project's, the presses, all) and the share of its gap
    to the oracle each learned variant closes, ``(best − learned) / (best − oracle)``."""
    rows = []
    for (keep, chunk), g in hr.groupby(["keep", "chunk"], sort=False):
        fi = g.set_index("name")["fi_policy"]
        oracle = float(g["fi_oracle"].iloc[0])
        row = {"keep": keep, "chunk": chunk, "fi_oracle": oracle, **{v: fi[v] for v in LEARNED}}
        for group, names in {"project": PROJECT, "press": presses, "all": (*PROJECT, *presses)}.items():
            best = fi[[n for n in names if n in fi]]
            row |= {f"best_{group}": best.idxmin(), f"best_{group}_fi": best.min()}
            row |= {f"{v}_gap_{group}": (best.min() - fi[v]) / (best.min() - oracle) for v in LEARNED}
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="CI-sized: p = 128, keep 50 %%, 2 unseen texts, 2 presses")
    ap.add_argument("--kvpress-python", type=Path, required=True, help="the kvpress venv's python")
    ap.add_argument("--heads-results", type=Path, default=ROOT / "analyses" / "results" / "learned-heads")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "analyses" / "learned_rivals")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "learned-rivals")
    ap.add_argument("--corpus", type=Path, default=study.CORPUS, help="the folder of the unseen texts")
    args = ap.parse_args()
    if args.corpus is None or not args.corpus.is_dir():
        ap.error("no corpus folder: give --corpus (../shared/corpus beside the project)")
    setting = study.TINY if args.tiny else study.FULL
    unseen = [str(args.corpus / n) for n in (study.UNSEEN[:2] if args.tiny else study.UNSEEN)]
    presses = list(TINY_PRESSES) if args.tiny else field_presses()
    first = [p for p in presses if p in FIRST or args.tiny]
    groups = {"probe_first": first, "probe_rest": [p for p in presses if p not in first]}
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    budgets = [f"keep={b}" for b in setting["budgets"]]
    for folder, group in groups.items():
        if group and not (args.work / folder / "fi.csv").is_file():
            sel = [f"kvpress:{p}@{b}" for b in budgets for p in group]
            sel += [f"policy:h2o@{b}" for b in setting["budgets"]] if folder == "probe_first" else []
            seconds = probe(args.kvpress_python, unseen, setting, sel, args.work / folder)
            print(f"{folder}: {len(sel)} selections x {len(unseen)} texts in {seconds:.0f} s", flush=True)
    theirs = pd.read_csv(args.heads_results / "fi.csv")
    ours = [pd.read_csv(args.work / f / "fi.csv") for f, g in groups.items() if g]
    drift = check_same_run(theirs, ours[0])
    print(f"H2O's FI here against learned_heads.py's table: largest relative difference {drift:.2g}")
    if drift > 1e-4:
        raise SystemExit("the press probe does not reproduce learned_heads.py's H2O rows: the tables cannot be joined")
    ours = [o[o["selection"].str.startswith("kvpress:")] for o in ours]
    pd.concat(ours, ignore_index=True).to_csv(args.results / "fi.csv", index=False)
    table = pd.concat([theirs, *ours], ignore_index=True)
    hr = headroom_table(table)
    keeps = labelled(table).drop_duplicates("selection").set_index("selection")["keep"]
    hr = hr[hr["fit_chunk"] == hr["chunk"]].assign(name=lambda d: d["selection"].map(name_of))
    hr = hr.assign(keep=hr["selection"].map(keeps))
    hr.to_csv(args.results / "headroom.csv", index=False)
    names = [f"kvpress:{p}" for p in presses]
    w = wins(table, names)
    w.to_csv(args.results / "wins.csv", index=False)
    riv = rivals_table(hr, w, names)
    riv.to_csv(args.results / "rivals.csv", index=False)
    gap = gap_table(hr, names)
    gap.to_csv(args.results / "gap.csv", index=False)
    removed = labelled(table).groupby(["keep", "name"])["n_removed"].agg(["min", "max"]).reset_index()
    asked = removed["keep"].map(removed[removed["name"].isin(PROJECT)].groupby("keep")["min"].first())
    uneven = removed[(removed["min"] != asked) | (removed["max"] != asked)]
    if uneven.empty:
        print("every selection of a budget removes as many entries as the in-house policies")
    else:
        print(f"removing another count than the in-house policies at the same budget:\n{uneven.to_string(index=False)}")
    pd.set_option("display.width", 250)
    print(riv.to_string(index=False, float_format="%.4g"))
    print(gap.set_index(["keep", "chunk"]).T.to_string(float_format=lambda x: f"{x:.4g}"))
    for v in LEARNED:
        each = {r: int(w[f"{v}_beats_{r}"].sum()) for r in [*PROJECT, *names] if f"{v}_beats_{r}" in w}
        print(f"{v}: lower FI than, of {len(w)} cells: " + ", ".join(f"{r} {n}" for r, n in each.items()))
        print(
            f"{v}: lower FI than the best project policy in {int(w[f'{v}_beats_best_project'].sum())} of {len(w)}, "
            f"the best press in {int(w[f'{v}_beats_best_press'].sum())}, every rival in "
            f"{int(w[f'{v}_beats_best_all'].sum())}"
        )


if __name__ == "__main__":
    main()
