"""A few plain sentences of what a run's tables say, for the top of its part of a report.

Numbers come from the tables, nothing new is computed. Sets are compared only with sets of the same
size (FI grows with what is removed), and a statistic a run cannot give (a test over one document, an
interval of too few cells) reads ``n/a`` with the reason, never ``nan``.
"""

from __future__ import annotations

import math

import pandas as pd

from fi_toolkit.report import lmeval
from fi_toolkit.report.display import NEEDS_TWO
from fi_toolkit.studies.random_baseline import pooled_sets


def _missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def num(v, spec: str = ".3g", why: str = "") -> str:
    """``v`` formatted by ``spec``; ``n/a`` (with ``why`` in brackets) where it is missing."""
    if _missing(v):
        return f"n/a ({why})" if why else "n/a"
    return format(float(v), spec)


def interval(low, high, spec: str = "+.2f", why: str = "") -> str:
    """``95% CI a .. b``, or ``95% CI n/a (why)`` where a bound is missing."""
    if _missing(low) or _missing(high):
        return f"95% CI n/a ({why})" if why else "95% CI n/a"
    return f"95% CI {format(float(low), spec)} .. {format(float(high), spec)}"


def probe_lines(t: dict) -> list[str]:
    """Per chunk and set size: the sets with the lowest and highest mean FI, the random seeds pooled into one
    baseline (:func:`~fi_toolkit.studies.random_baseline.pooled_sets`) with the sets inside its seed spread;
    beside an FI oracle, the headroom."""
    pooled = pooled_sets(t["fi"], n_resamples=0)
    lines = []
    for (chunk, removed), g in pooled.groupby(["chunk", "n_removed"], sort=False):
        means = g.set_index("selection")["fi"].sort_values()
        size = f"{removed:g} removed"
        if len(means) == 1:
            lines.append(f"chunk {chunk}, {size}: {means.index[0]} {num(means.iloc[0])} nats (the only set this size)")
            continue
        lines.append(
            f"chunk {chunk}, {size}: lowest mean FI {means.index[0]} ({num(means.iloc[0])} nats), highest "
            f"{means.index[-1]} ({num(means.iloc[-1])} nats)"
        )
        base = g[g["baseline"]]
        if len(base):
            b = base.iloc[0]
            others = g[~g["baseline"]]
            inside = others[(others["fi"] >= b["seed_min"]) & (others["fi"] <= b["seed_max"])]["selection"].tolist()
            spread = f"seeds {num(b['seed_min'])} .. {num(b['seed_max'])}"
            lines.append(
                f"chunk {chunk}, {size}: baseline {b['selection']} {num(b['fi'])} nats ({spread}); "
                + (f"inside its spread: {', '.join(inside)}" if inside else "no set lies inside its spread")
            )
    hr = t.get("headroom")
    if hr is not None:
        own = hr[(hr["fit_chunk"] == hr["chunk"]) & (hr["selection"] != hr["oracle"])]
        for r in own.sort_values("headroom", ascending=False).itertuples():
            lines.append(
                f"chunk {r.chunk}, {r.n_removed:g} removed: {r.selection} closes {num(r.headroom, '.2f')} of the gap "
                f"between random sets and the FI oracle (which saw the chunk)"
            )
    return lines


def nearfar_lines(t: dict) -> list[str]:
    """At the farthest chunk: how often entropy sets beat attention sets, and the paired test."""
    tests = t["nearfar_tests"]
    far = tests[
        tests["metric"].isin(["fi", "fi_share_near"]) & (tests["distance_from_p"] == tests["distance_from_p"].max())
    ]
    lines = []
    for r in far.itertuples():
        why = NEEDS_TWO if r.n_documents < 2 else ""
        sinks = "sinks protected" if r.sinks else "sinks not protected"
        metric = "FI" if r.metric == "fi" else "FI / FI on the nearest chunk"
        lines.append(
            f"{sinks}, farthest chunk (p + {int(r.distance_from_p)}), {metric}: entropy sets beat attention sets in "
            f"{r.a_wins} of {r.n_documents} documents; one-sided Wilcoxon p = {num(r.wilcoxon_p, '.3g', why)}"
        )
    return lines


def correlate_lines(t: dict) -> list[str]:
    lines = []
    for r in t.get("agreement_summary", pd.DataFrame()).itertuples():
        lines.append(
            f"chunk {r.chunk}: Fisher estimate vs exact FI, {r.metric} = {num(r.value_mean, '.3f')} "
            f"(range {num(r.value_min, '.3f')} .. {num(r.value_max, '.3f')} over {r.n_documents} document(s))"
        )
    s = t["correlation_summary"]
    m = s[(s["scope"] == "mean") & (s["method"] == "spearman")]
    for chunk, g in m.groupby("chunk", sort=False):
        best = g.sort_values("rho_mean", ascending=False).iloc[0]
        n = int(best["n_documents"])
        spread = (
            f"range {num(best['rho_min'], '+.3f')} .. {num(best['rho_max'], '+.3f')} over {n} documents"
            if n >= 2
            else "1 document"
        )
        lines.append(
            f"chunk {chunk}: the signal that ranks tokens most like FI is {best['signal']}, Spearman ρ = "
            f"{num(best['rho_mean'], '+.3f')} ({spread})"
        )
    return lines


def eval_text_lines(t: dict) -> list[str]:
    lines = []
    for future, part in t["replay_summary"].groupby("future", sort=False):
        best = part[part["policy"] != "full"].sort_values("mean_kl").groupby("budget", sort=False).head(1)
        for r in best.itertuples():
            lines.append(
                f"future {future}, {r.budget}: lowest mean replay KL {r.policy} ({num(r.mean_kl)} nats, top-1 "
                f"agreement {num(r.top1_agreement, '.3f')}); noise floor {num(r.noise_floor, '.1g')} nats"
            )
    return lines


def eval_tasks_lines(t: dict) -> list[str]:
    lines = []
    for r in t["kl_accuracy"].itertuples():
        lines.append(
            f"{r.comparison}: Spearman {num(r.rho, '+.2f', 'too few cells')} "
            f"({interval(r.ci_low, r.ci_high, '+.2f', 'too few cells')}, {r.cells} cells)"
        )
    full = t["task_summary"][t["task_summary"]["policy"] == "full"]
    for r in full.itertuples():
        lines.append(
            f"full cache, {r.task} at {r.context} tokens ({r.protocol}): accuracy {num(r.accuracy, '.2f')} "
            f"over {r.samples} samples"
        )
    return lines


def field_lines(t: dict) -> list[str]:
    """Per budget and chunk: the method that closes most of the headroom (anchors aside), with its CI, and how
    many methods the paired test cannot tell from the best."""
    board = t["leaderboard"]
    board = board[board["kind"] != "anchor"]
    tests = t.get("tests", pd.DataFrame())
    lines = []
    for budget, g in board.groupby("budget", sort=False):
        for chunk in [c.removeprefix("fi_") for c in g.columns if c.startswith("fi_")]:
            col = f"headroom_{chunk}"
            if col not in g or g[col].isna().all():
                continue
            best = g.sort_values(f"fi_{chunk}").iloc[0]
            ci = best.get(f"headroom_ci_{chunk}", "")
            text = (
                f"{budget}, {chunk} chunk: lowest FI {best['method']} ({num(best[f'fi_{chunk}'])} nats), closing "
                f"{num(best[col], '.2f')} of the random-to-oracle gap {ci}"
            )
            part = tests[(tests["budget"] == budget) & (tests["metric"] == f"fi_{chunk}")] if len(tests) else tests
            p = pd.to_numeric(part["wilcoxon_p"], errors="coerce") if len(part) else pd.Series(dtype=float)
            if len(part) and p.notna().any():
                text += f"; {int((p >= 0.05).sum())} of {len(part)} others not significantly worse (p >= 0.05)"
            lines.append(text)
    return lines


def headline(run: dict) -> list[str]:
    """The sentences for ``run`` (as :func:`fi_toolkit.report.export.load_run` returns it)."""
    kind, t = run["kind"], run["tables"]
    if kind == lmeval.KIND:
        return lmeval.headline(run)
    return {
        "eval-text": eval_text_lines,
        "eval-tasks": eval_tasks_lines,
        "probe": probe_lines,
        "nearfar": nearfar_lines,
        "correlate": correlate_lines,
        "field": field_lines,
    }[kind](t)
