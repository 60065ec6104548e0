"""How well scorers rank cache entries by Forward Influence on labelled text they never saw (offline, from labels).

    python analyses/surrogate.py --test runs/labels-test --model fi=DIR [--model name=DIR ...] --out DIR
    python analyses/surrogate.py --test runs/labels-test --curve runs/labels-corpus --out DIR   # learning curve
    python analyses/surrogate.py --figure DIR/offline.csv --scorer fi-linear --out docs/images/surrogate_heads.png

The test run is ``fi labels`` on the bundled documents with ``--features`` (they are the corpus's test set). For
every (document, layer, KV head), each scorer ranks the candidates ``[0, p - w)``: the surrogates by their own
scores of the attention inputs, the baselines by their feature columns (SnapKV: window attention; H2O: the
accumulated attention; ExpectedAttention: its score), random by a seeded permutation and the labels themselves
(the within-label ceiling: it ranks by the very estimate it is judged on). Two numbers per scorer, averaged over
documents, layers and heads: the within-head Spearman with FI, and at keep 10/25/50 % the share of the head's
summed single-entry FI that eviction of the lowest-ranked candidates removes (``evicted``; lower is better).
The sum of single-entry FI is a proxy of the FI of the evicted set (the probe measures that: ``fi probe``).
Tables ``offline.csv`` (per document) and ``offline_summary.csv``. ``--curve RUN``: the linear surrogate (ridge
of log FI, the default settings) trained on the first 2, 4, 8, ... slices of the labels run ``RUN`` (and all of
them), each judged as above: ``curve.csv`` (target, slices, units, labels, and the scores); ``--curve-target
kvzip_plus`` adds the same surrogate trained on KVzip+ scores (KVzap's teacher, computed once per unit) on the
same slices, the like-for-like anchor; ``--curve-max N`` stops the curve at ``N`` slices; ``--save`` keeps the
curve's models. ``--sinks N``: the first ``N`` positions are kept by every scorer and left out of both numbers
(``fi probe`` protects 4 by default; a teacher whose context never opens the sequence, KVzip+'s inside its chat
turn, has no reason to score the sink high).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats

from fi_toolkit.model.loading import load_model
from fi_toolkit.policies.surrogate import attention_inputs, read_surrogate, write_surrogate
from fi_toolkit.surrogate.labels import finished_units, read_unit

BASELINES = {"snapkv": "attention", "h2o": "log_accumulated", "expected_attention": "expected_attention"}
KEEPS = (0.10, 0.25, 0.50)
WINDOW = 32


def evicted_share(score: np.ndarray, fi: np.ndarray, p: int, keep: float, sinks: int = 0) -> float:
    """The share of ``fi``'s sum over the candidates that a policy keeping ``keep`` of ``p`` evicts: it keeps the
    window, the ``sinks`` first positions (not among the candidates passed) and the ``round(keep * p) - w -
    sinks`` top-scored candidates."""
    picks = max(0, round(keep * p) - WINDOW - sinks)
    order = np.argsort(-score, kind="stable")
    return float(fi[order[picks:]].sum() / fi.sum())


def heads_figure(offline: Path, scorer: str, rival: str, out: Path) -> None:
    """Which layers and KV heads the scorer ranks well: its within-head Spearman with FI per (layer, head), mean
    over the test documents, beside its difference from ``rival``'s (seaborn heatmaps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    table = pd.read_csv(offline)
    mean = table.groupby(["scorer", "layer", "head"]).spearman.mean()
    mine, theirs = mean[scorer].unstack("layer"), mean[rival].unstack("layer")
    fig, axes = plt.subplots(2, 1, figsize=(12, 4.2), constrained_layout=True)
    sns.heatmap(mine, ax=axes[0], vmin=-1, vmax=1, cmap="vlag", cbar_kws={"label": "Spearman"})
    axes[0].set_title(f"{scorer}: within-head Spearman with FI (mean over the test documents)")
    sns.heatmap(mine - theirs, ax=axes[1], center=0, cmap="PiYG", cbar_kws={"label": "difference"})
    axes[1].set_title(f"{scorer} minus {rival}")
    for ax in axes:
        ax.set_ylabel("KV head")
    fig.savefig(out, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--test", type=Path)
    ap.add_argument("--figure", type=Path, help="an offline.csv: draw the per-(layer, head) figure into --out")
    ap.add_argument("--scorer", default="fi-linear")
    ap.add_argument("--rival", default="expected_attention")
    ap.add_argument("--model", action="append", default=[], help="NAME=DIR of a surrogate (repeatable)")
    ap.add_argument("--target", default="fi")
    ap.add_argument("--curve", type=Path, help="a fi labels run: the learning curve of the linear surrogate")
    ap.add_argument(
        "--curve-target",
        action="append",
        default=[],
        help="what the curve's surrogates learn: fi (default), kvzip_plus (KVzap's teacher); repeatable",
    )
    ap.add_argument("--curve-max", type=int, help="the curve's largest training set, in slices (default: all)")
    ap.add_argument("--sinks", type=int, default=0, help="first positions every scorer keeps (fi probe's default: 4)")
    ap.add_argument("--save", action="store_true", help="write each trained surrogate into OUT/models/NAME")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.figure is not None:
        heads_figure(args.figure, args.scorer, args.rival, args.out)
        return
    lm = load_model()
    models = {name: read_surrogate(d) for name, d in (m.split("=", 1) for m in args.model)}
    trained = {}
    if args.curve is not None:
        from fi_toolkit.surrogate.train import _slices, run_fit_surrogate
        from fi_toolkit.surrogate.train_settings import SurrogateFitSettings

        total = len(_slices([args.curve]))
        total = min(total, args.curve_max or total)
        sizes = sorted({*(2**k for k in range(1, total.bit_length()) if 2**k < total), total})
        cache: dict = {}  # the KVzip+ teacher's scores, computed once per unit over the curve
        for target in args.curve_target or ["fi"]:
            for n in sizes:
                settings = SurrogateFitSettings(target=target)
                m = run_fit_surrogate(lm, [args.curve], settings, max_slices=n, teacher_cache=cache)
                name = f"curve:{n}" if target == "fi" else f"curve:{target}:{n}"
                trained[name] = (target, n, m.about["units"], m.about["labels"])
                models[name] = m
                if args.save:
                    write_surrogate(args.out / "models" / name.replace(":", "-"), m)
    rows = []
    for unit in finished_units(args.test):
        labels = read_unit(args.test, unit)
        tokens = torch.tensor(read_unit(args.test, unit, "tokens").token.to_numpy())
        p = int(labels.point.iloc[0])
        inputs = attention_inputs(lm.model, tokens[:p])
        scored = {name: [m.score(layer, x).numpy() for layer, x in enumerate(inputs)] for name, m in models.items()}
        rng = np.random.default_rng(0)
        for (layer, head), part in labels.groupby(["layer", "head"], sort=True):
            part = part[part.position >= args.sinks]  # the sinks are kept by every scorer (the probe's default is 4)
            positions = part.position.to_numpy()
            fi = part[args.target].to_numpy()
            scores = {name: s[layer][positions, head] for name, s in scored.items()}
            scores.update({name: part[col].to_numpy() for name, col in BASELINES.items() if col in part})
            scores["random"] = rng.permutation(len(fi)).astype(float)
            scores["labels (ceiling)"] = fi
            for name, score in scores.items():
                row = {"document": unit, "layer": layer, "head": head, "scorer": name}
                row["spearman"] = stats.spearmanr(score, fi).statistic
                for keep in KEEPS:
                    row[f"evicted@{keep:g}"] = evicted_share(score, fi, p, keep, args.sinks)
                rows.append(row)
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "offline.csv", index=False)
    per_doc = table.groupby(["scorer", "document"]).mean(numeric_only=True).drop(columns=["layer", "head"])
    summary = per_doc.groupby("scorer").mean().sort_values("evicted@0.25")
    summary.to_csv(args.out / "offline_summary.csv")
    print(summary.round(4).to_string())
    if trained:
        curve = summary.loc[list(trained)].copy()
        curve.insert(0, "labels", [trained[k][3] for k in curve.index])
        curve.insert(0, "units", [trained[k][2] for k in curve.index])
        curve.insert(0, "slices", [trained[k][1] for k in curve.index])
        curve.insert(0, "target", [trained[k][0] for k in curve.index])
        curve = curve.sort_values(["target", "slices"])
        curve.to_csv(args.out / "curve.csv")
        print(curve.round(4).to_string())


if __name__ == "__main__":
    main()
