"""How far are the heuristics from the FI oracle?

Runs (or reads) one ``fi probe`` of the five bundled documents at p = 512, chunks 512:640 (near) and
768:896 (far), keep 25 % and 10 %, with the FI oracle fitted on the near chunk (the default: the first
probed) and on the far chunk (``chunk=768:896``), at keep 25 % also in three rounds (``rounds=3``),
six prefill policies and three random sets per budget (sized for a shared 2-core CPU); then writes to
analyses/results/headroom/:

- ``fi.csv``: the probe's table (controls included);
- ``headroom.csv``: :func:`fi_toolkit.probe.headroom.headroom_table` (share of the random-to-oracle gap
  closed, bootstrap 95 % CI over documents; every oracle as the reference on every chunk);
- ``oracle_vs_policies.csv``: per document, budget and chunk, the oracle fitted on that chunk against
  each heuristic (``oracle_fi <= policy_fi``?) and the rounds' effect;
- ``headroom.png``: :func:`fi_toolkit.report.kinds.probe.headroom_figure`.

    fi probe alice hamlet lcet10 botchan paradise_regained --chunk 512:640 --chunk 768:896 \\
        $(python analyses/headroom.py --print-selects) --out runs/analyses/headroom-p512
    .venv/bin/python analyses/headroom.py --run runs/analyses/headroom-p512
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pandas as pd  # noqa: E402
from _common import ROOT  # noqa: E402

from fi_toolkit.probe.headroom import ORACLE, RANDOM, fit_chunk, headroom_table  # noqa: E402
from fi_toolkit.probe.noise_floor import CONTROL  # noqa: E402
from fi_toolkit.report.kinds.probe import headroom_figure  # noqa: E402

POLICIES = ("snapkv", "infokv", "adaptive(infokv)", "h2o", "pyramidkv", "streaming")


def selects(budgets=("0.25", "0.1"), far="768:896") -> list[str]:
    out = []
    for b in budgets:
        out += [f"policy:fi-oracle@{b}", f"policy:fi-oracle@{b}:chunk={far}"]
        out += [f"policy:fi-oracle@{b}:rounds=3"] if b == budgets[0] else []
        out += [f"policy:{p}@{b}" for p in POLICIES] + [f"random:keep={b}@0-2"]
    return out


def oracle_vs_policies(fi: pd.DataFrame) -> pd.DataFrame:
    """Per document, removed count and chunk: the one-round oracle fitted on that chunk, its version in rounds,
    and each heuristic; ``oracle_wins`` says whether the oracle's FI is at most the heuristic's."""
    t = fi[fi["selector"] != CONTROL].assign(n=lambda d: d["n_removed"].round(3))
    first = t["chunk"].iloc[0]
    rows = []
    for (doc, n, chunk), g in t.groupby(["document", "n", "chunk"], sort=False):
        oracles = g[(g["selector"] == ORACLE)]
        fitted = oracles[oracles["selection"].map(lambda s: fit_chunk(s, first)) == chunk]
        one = fitted[~fitted["selection"].str.contains("rounds=")]
        four = fitted[fitted["selection"].str.contains("rounds=")]
        if one.empty:
            continue
        for _, r in g[~g["selector"].isin([ORACLE, RANDOM])].iterrows():
            rows.append(
                {
                    "document": doc,
                    "n_removed": n,
                    "chunk": chunk,
                    "policy": r["selection"],
                    "policy_fi": r["fi"],
                    "oracle_fi": one["fi"].iloc[0],
                    "oracle_rounds_fi": four["fi"].iloc[0] if len(four) else float("nan"),
                    "oracle_wins": bool(one["fi"].iloc[0] <= r["fi"]),
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=ROOT / "runs" / "analyses" / "headroom-p512")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "headroom")
    ap.add_argument("--print-selects", action="store_true", help="print the --select options of the probe and exit")
    args = ap.parse_args()
    if args.print_selects:
        print(" ".join(f"--select '{s}'" for s in selects()))
        return
    fi = pd.read_csv(args.run / "fi.csv")
    args.results.mkdir(parents=True, exist_ok=True)
    fi.to_csv(args.results / "fi.csv", index=False)
    hr = headroom_table(fi)
    hr.to_csv(args.results / "headroom.csv", index=False)
    vs = oracle_vs_policies(fi)
    vs.to_csv(args.results / "oracle_vs_policies.csv", index=False)
    fig = headroom_figure(
        hr,
        f"SmolLM2-135M, {fi['document'].nunique()} bundled documents, p = {fi['prefix'].iloc[0]}; "
        "reference: the FI oracle fitted on the chunk measured (it sees that chunk)",
    )
    fig.savefig(args.results / "headroom.png", dpi=120)
    pd.set_option("display.width", 200)
    own = hr[(hr.fit_chunk == hr.chunk) & ~hr.oracle.str.contains("rounds=")]
    print(
        own[
            ["chunk", "n_removed", "selection", "fi_random", "fi_policy", "fi_oracle", "headroom", "ci_low", "ci_high"]
        ].to_string(index=False, float_format="%.4g")
    )
    print(f"oracle <= heuristic in {int(vs.oracle_wins.sum())} of {len(vs)} document x budget x chunk x policy cells")
    print(vs[~vs.oracle_wins].to_string(index=False, float_format="%.4g"))
    print(
        "rounds=3 vs 1 (mean FI):",
        vs.groupby(["n_removed", "chunk"])[["oracle_fi", "oracle_rounds_fi"]].mean().to_string(float_format="%.4g"),
    )


if __name__ == "__main__":
    main()
