"""Budgets across heads: the learned policy ranking over all KV heads of a layer (``learned:heads=global``).

Same data and settings as ``analyses/learned.py`` (its training rows: ``fi fit-data`` of the five bundled
documents, p = 256, chunks 256:384 and 512:640, 16 label draws; its five unseen texts, keep 25 % and 50 %), with
``fi fit --learner lambdarank --group layer`` (one query group per document and layer: labels the FI rank over
the layer's three KV heads together). The probe compares, on the unseen texts:

- ``learned-head``: the per-head model committed by ``analyses/learned.py`` (``analyses/results/learned/model.json``),
  every head keeping k;
- ``learned-layer``: the per-layer model, every head keeping k (what the training group alone changes);
- ``learned-global``: the per-layer model with ``heads=global``: each layer keeps its 3k highest-scoring entries
  over its heads together (every head its window at least), the same total as the others;
- H2O, SnapKV, InfoKV, the FI oracle fitted on each chunk, three random sets per budget;
- controls for the allocation alone: ``h2o-global`` and ``snapkv-global``, H2O's and SnapKV's own scores with the
  same top-k over a layer's heads (:func:`fi_toolkit.policies.base.select_across_heads`, measured here with
  :func:`fi_toolkit.probe.forward_influence.forward_influence`); with ``--kvpress-python`` (the kvpress venv's
  interpreter) also kvpress's ``SnapKVPress`` and ``AdaKVPress/SnapKVPress`` at the project's window 32 and kernel 7
  (AdaKV itself, arXiv 2407.11550, with its safeguard: ``kvpress-snapkv``, ``kvpress-adakv-snapkv``).

The best heuristic of a cell is the best of H2O, SnapKV and InfoKV, as in ``analyses/learned.py``; the controls are
compared apart.

Writes to analyses/results/learned-heads/ (``--tiny``: p = 128, keep 50 %, two documents a side, to --results):

- ``model.json``: the per-layer model (``learned:path=...,heads=global``);
- ``fi.csv``: the probe's table, the controls' rows appended;
- ``headroom.csv``: oracle fitted on the chunk measured (``name`` column);
- ``wins.csv``: per document x budget x chunk, each learned variant's FI against H2O's and the best heuristic's;
- ``allocation.csv``: per budget, layer and KV head, the entries ``learned-global`` keeps on each unseen text.

    python analyses/learned_heads.py --work /tmp/learned_heads      # about 15 min on one shared core
    python analyses/learned_heads.py --tiny --work /tmp/w --results /tmp/r
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
sys.path.insert(0, str(ROOT / "analyses"))

import learned as study  # noqa: E402  (analyses/learned.py: its settings, documents and helpers)
import pandas as pd  # noqa: E402

from fi_toolkit.probe.headroom import ORACLE, RANDOM, headroom_table  # noqa: E402
from fi_toolkit.probe.noise_floor import CONTROL  # noqa: E402

PER_HEAD = ROOT / "analyses" / "results" / "learned" / "model.json"
VARIANTS = ("learned-head", "learned-layer", "learned-global")
HEURISTICS = study.HEURISTICS  # H2O, SnapKV, InfoKV, ExpectedAttention, TOVA
CONTROLS = ("h2o-global", "snapkv-global", "kvpress-snapkv", "kvpress-adakv-snapkv")
KVPRESS = ("SnapKVPress", "AdaKVPress/SnapKVPress")


def selects(setting: dict, model: Path) -> list[str]:
    out = []
    for b in setting["budgets"]:
        out += [f"policy:fi-oracle@{b}:chunk={c}{setting['oracle']}" for c in setting["chunks"]]
        out += [f"policy:learned@{b}:path={study.from_root(PER_HEAD)}"]
        out += [f"policy:learned@{b}:path={study.from_root(model)}"]
        out += [f"policy:learned@{b}:path={study.from_root(model)},heads=global"]
        out += [f"policy:{h}@{b}" for h in study.HEURISTICS]
        out += [f"random:keep={b}@0-2"]
    return out


def name_of(selection: str) -> str:
    """learned-head, learned-layer, learned-global, a control (:data:`CONTROLS`), h2o, snapkv, infokv, oracle or
    random."""
    if selection.startswith("kvpress:"):
        return "kvpress-adakv-snapkv" if "AdaKVPress" in selection else "kvpress-snapkv"
    if "heads=global" in selection and "learned" not in selection:
        return "h2o-global" if "h2o" in selection else "snapkv-global"
    if "learned" in selection:
        if "heads=global" in selection:
            return "learned-global"
        return "learned-head" if study.from_root(PER_HEAD) in selection else "learned-layer"
    return study.name_of(selection)


def wins(table: pd.DataFrame) -> pd.DataFrame:
    """Per document x removed count x chunk: each variant's FI, H2O's and the best heuristic's (lower is better)."""
    t = table[~table["selector"].isin([CONTROL, RANDOM, ORACLE])].assign(
        name=lambda d: d["selection"].map(name_of), n=lambda d: d["n_removed"].round(3)
    )
    rows = []
    for (doc, n, chunk), g in t.groupby(["document", "n", "chunk"], sort=False):
        by = g.groupby("name")["fi"].mean()
        heur = by[list(HEURISTICS)]
        controls = {c: by[c] for c in CONTROLS if c in by}
        row = {"document": doc, "n_removed": n, "chunk": chunk, **{v: by[v] for v in VARIANTS}, "h2o": by["h2o"]}
        row |= controls
        row |= {"best_heuristic": heur.idxmin(), "best_heuristic_fi": heur.min()}
        for v in VARIANTS:
            row[f"{v}_beats_h2o"] = bool(by[v] < by["h2o"])
            row[f"{v}_beats_best"] = bool(by[v] < heur.min())
            row[f"{v}_beats_best3"] = bool(by[v] < by[list(study.PREVIOUS)].min())  # H2O, SnapKV, InfoKV
        row["global_beats_head"] = bool(by["learned-global"] < by["learned-head"])
        row["global_beats_layer"] = bool(by["learned-global"] < by["learned-layer"])
        for c in controls:
            row[f"global_beats_{c}"] = bool(by["learned-global"] < by[c])
        rows.append(row)
    return pd.DataFrame(rows)


def global_controls(setting: dict, unseen: list[str]) -> pd.DataFrame:
    """FI rows (the probe's columns) of H2O's and SnapKV's scores with a top-k over each layer's heads, at every
    budget, on every unseen text: what sharing a layer's budget by a heuristic's own scores gives."""
    from fi_toolkit.documents import load_document
    from fi_toolkit.eviction import KeepMap
    from fi_toolkit.model.loading import load_model
    from fi_toolkit.policies import parse_policy
    from fi_toolkit.policies.base import as_signals, select_across_heads
    from fi_toolkit.probe.chunks import parse_chunk
    from fi_toolkit.probe.experiment import fi_table, trace_document
    from fi_toolkit.probe.forward_influence import forward_influence

    p, chunks = int(setting["prefix"]), [parse_chunk(c) for c in setting["chunks"]]
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    tables = []
    for u in unseen:
        doc = load_document(u, lm.tokenizer, max_tokens=max(c.end for c in chunks))
        trace = trace_document(lm, doc, p)
        s = as_signals(trace)
        maps = []
        for b in setting["budgets"]:
            for name in ("h2o", "snapkv"):
                policy = parse_policy(name, budget=f"keep={b}")
                k = policy.tokens(s.seen)
                heads = [
                    select_across_heads(policy.scores(s, layer).double(), k, s.protected[layer], s.window)
                    for layer in range(s.num_layers)
                ]
                label = f"policy:{name}@{policy.budget.label}:heads=global"
                meta = {"selector": f"policy:{name}-global", "budget": policy.budget.label, "policy": name}
                maps.append(KeepMap.from_heads(label, heads, meta))
        tables.append(fi_table(doc, trace, forward_influence(lm.model, trace, doc.ids, maps, chunks)))
    return pd.concat(tables, ignore_index=True)


def allocation(setting: dict, unseen: list[str], model: Path) -> pd.DataFrame:
    """Entries ``learned-global`` keeps per layer and KV head at each budget, on each unseen text's prefix."""
    from fi_toolkit.documents import load_document
    from fi_toolkit.model.loading import load_model
    from fi_toolkit.policies import parse_policy
    from fi_toolkit.signals.config import SignalConfig
    from fi_toolkit.signals.trace import trace_prefix

    p = int(setting["prefix"])
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    docs = [load_document(u, lm.tokenizer, max_tokens=p) for u in unseen]
    rows = []
    for doc in docs:
        for b in setting["budgets"]:
            policy = parse_policy(f"learned:path={model},heads=global", budget=f"keep={b}")
            trace = trace_prefix(lm.model, doc.ids, p, SignalConfig(**policy.fit["signals"]))
            keep = policy.keep_map(trace)
            k = keep.meta["per_layer"]
            for layer, counts in enumerate(keep.head_counts or [None] * len(keep.keep)):
                for head in range(keep.keep[layer].shape[0]):
                    kept = k[layer] if counts is None else int(counts[head])
                    rows.append({"document": doc.name, "budget": b, "layer": layer, "head": head, "kept": kept})
    return pd.DataFrame(rows).assign(
        uniform=lambda d: d.groupby(["document", "budget", "layer"])["kept"].transform("mean")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="CI-sized: p = 128, keep 50 %%, 2 documents a side, 2 samples")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "analyses" / "learned_heads")
    ap.add_argument("--results", type=Path, default=ROOT / "analyses" / "results" / "learned-heads")
    ap.add_argument("--corpus", type=Path, default=study.CORPUS, help="the folder of the unseen texts")
    ap.add_argument("--kvpress-python", type=Path, help="the kvpress venv's python: also probe SnapKV and AdaKV/SnapKV")
    args = ap.parse_args()
    if args.corpus is None or not args.corpus.is_dir():
        ap.error("no corpus folder: give --corpus (../shared/corpus beside the project)")
    setting = study.TINY if args.tiny else study.FULL
    train = study.TRAIN[:2] if args.tiny else study.TRAIN
    unseen = [str(args.corpus / n) for n in (study.UNSEEN[:2] if args.tiny else study.UNSEEN)]
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    chunks = [a for c in setting["chunks"] for a in ("--chunk", c)]
    p = str(setting["prefix"])
    if not (args.work / "fitdata" / "manifest.json").is_file():
        samples = str(setting["samples"])
        study.fi("fit-data", *train, *chunks, "--prefix", p, "--samples", samples, "--out", str(args.work / "fitdata"))
    model = args.results / "model.json"
    if not model.is_file():
        fitdata = str(args.work / "fitdata")
        study.fi("fit", fitdata, "--learner", "lambdarank", "--group", "layer", "--out", study.from_root(model))
    if not (args.work / "probe" / "fi.csv").is_file():
        sel = [a for s in selects(setting, model) for a in ("--select", s)]
        study.fi("probe", *unseen, *chunks, "--prefix", p, *sel, "--out", str(args.work / "probe"))
    if not (args.work / "controls.csv").is_file():
        global_controls(setting, unseen).to_csv(args.work / "controls.csv", index=False)
    tables = [pd.read_csv(args.work / "probe" / "fi.csv"), pd.read_csv(args.work / "controls.csv")]
    if args.kvpress_python and not (args.work / "probe_kvpress" / "fi.csv").is_file():
        budgets = [f"keep={b}" for b in setting["budgets"]]
        sel = [f"kvpress:{press}@{b}:window_size=32,kernel_size=7" for b in budgets for press in KVPRESS]
        sel = [a for s in sel for a in ("--select", s)]
        out = str(args.work / "probe_kvpress")
        print("+ fi (kvpress venv) probe", " ".join([*unseen, *chunks, "--prefix", p, *sel, "--out", out]), flush=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        argv = [str(args.kvpress_python), "-m", "fi_toolkit", "probe", *unseen, *chunks, "--prefix", p, *sel]
        subprocess.run([*argv, "--out", out], check=True, env=env, cwd=ROOT)
    if (args.work / "probe_kvpress" / "fi.csv").is_file():
        kv = pd.read_csv(args.work / "probe_kvpress" / "fi.csv")
        tables.append(kv[kv["selector"] != CONTROL])
    table = pd.concat(tables, ignore_index=True)
    table.to_csv(args.results / "fi.csv", index=False)
    hr = headroom_table(table)
    hr = hr[hr["fit_chunk"] == hr["chunk"]].assign(name=lambda d: d["selection"].map(name_of))
    hr.to_csv(args.results / "headroom.csv", index=False)
    w = wins(table)
    w.to_csv(args.results / "wins.csv", index=False)
    alloc = allocation(setting, unseen, model)
    alloc.to_csv(args.results / "allocation.csv", index=False)
    record = json.loads(model.read_text())
    pd.set_option("display.width", 200)
    print(
        hr[["chunk", "n_removed", "name", "fi_random", "fi_policy", "fi_oracle", "headroom", "ci_low", "ci_high"]]
        .sort_values(["n_removed", "chunk", "name"])
        .to_string(index=False, float_format="%.4g")
    )
    for v in VARIANTS:
        print(
            f"{v}: beats H2O in {int(w[f'{v}_beats_h2o'].sum())} of {len(w)} document x budget x chunk cells; "
            f"the best of {', '.join(HEURISTICS)} in {int(w[f'{v}_beats_best'].sum())} of {len(w)} "
            f"(of {', '.join(study.PREVIOUS)}: {int(w[f'{v}_beats_best3'].sum())})"
        )
    print(f"learned-global beats learned-head in {int(w.global_beats_head.sum())} of {len(w)} cells, ", end="")
    print(f"learned-layer in {int(w.global_beats_layer.sum())} of {len(w)}", end="")
    print("".join(f", {c} in {int(w[f'global_beats_{c}'].sum())}" for c in CONTROLS if f"global_beats_{c}" in w))
    share = alloc.assign(share=alloc["kept"] / alloc["uniform"]).groupby("budget")["share"]
    for b, q in share.quantile([0, 0.1, 0.5, 0.9, 1]).unstack().iterrows():
        print(f"learned-global, keep {b}: kept / k per head, quantiles 0, .1, .5, .9, 1: {q.round(3).tolist()}")
    print("training cross-validation (means):", record["cross_validation"]["mean"])


if __name__ == "__main__":
    main()
