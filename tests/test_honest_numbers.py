"""Intervals that are what their labels say, and random positions as one baseline.

The interval rule is checked against an enumeration of every bootstrap resample (no scipy, no code under
test); the near/far report's intervals against the quantity's range and against its own figure; the probe
report's random baseline against the per-seed rows of its ``fi.csv``, recomputed here with pandas.
"""

from __future__ import annotations

import itertools
import math
import re

import matplotlib
import numpy as np
import pandas as pd
import pytest
from scipy import stats

matplotlib.use("Agg")
from matplotlib.collections import PolyCollection  # noqa: E402

from fi_toolkit.intervals import (  # noqa: E402
    FEW_PAIRS,
    MIN_BOOTSTRAP_UNITS,
    NO_DIFFERENCE,
    mean_interval,
    min_bootstrap_units,
    paired_wilcoxon,
)


def _exact_quantiles(values, confidence=0.95):
    """The 2.5 % and 97.5 % quantiles of the exact bootstrap distribution of the mean, by enumerating all
    n^n equally likely resamples (n small)."""
    n = len(values)
    means = np.sort([np.mean(c) for c in itertools.product(values, repeat=n)])
    tail = (1 - confidence) / 2
    return means[int(math.floor(tail * len(means)))], means[int(math.ceil((1 - tail) * len(means))) - 1]


def test_below_four_units_a_percentile_interval_is_the_range_of_the_data():
    """The reason for the rule: enumerated, the 95 % percentile interval of 2 or 3 values is their min and max;
    of 4 values it is narrower. So the rule's 4 is where an interval starts to estimate anything."""
    for values in ([0.1, 0.7], [0.1, 0.3, 0.9], [2.0, 5.0, 11.0]):
        assert _exact_quantiles(values) == pytest.approx((min(values), max(values)), rel=1e-12)
    low, high = _exact_quantiles([0.1, 0.3, 0.5, 0.9])
    assert low > 0.1 and high < 0.9
    assert min_bootstrap_units(0.95) == MIN_BOOTSTRAP_UNITS == 4
    assert min_bootstrap_units(0.99) == 5 and min_bootstrap_units(0.5) == 3  # 4^-3 > 0.005; 3^-2 < 0.25


def test_the_paired_test_is_the_exact_signed_rank_test_and_says_why_there_is_none():
    """Five positive differences: the signed-rank statistic is 1+2+3+4+5 = 15 and, of the 2^5 equally likely sign
    patterns, only all-positive reaches it, so the one-sided exact p is 1/32 and the two-sided 2/32."""
    x, y = np.array([1.0, 2.0, 3.0, 4.0, 5.0]) + 10, np.full(5, 10.0)
    assert paired_wilcoxon(x, y, "greater") == (15.0, 1 / 32, "")
    assert paired_wilcoxon(x, y)[1:] == (2 / 32, "")
    statistic, p, why = paired_wilcoxon([1.0], [0.0])
    assert math.isnan(statistic) and math.isnan(p) and why == FEW_PAIRS
    assert paired_wilcoxon([1.0, 2.0], [1.0, 2.0])[2] == NO_DIFFERENCE


def test_mean_interval_is_scipys_percentile_bootstrap_and_stays_in_range():
    rng = np.random.default_rng(3)
    x = rng.exponential(0.01, size=7)  # a KL: non-negative and skewed
    mean, low, high = mean_interval(x, 2000, seed=5)
    ref = stats.bootstrap((x,), np.mean, n_resamples=2000, method="percentile", rng=np.random.default_rng(5))
    assert mean == pytest.approx(x.mean(), rel=1e-12)
    assert (low, high) == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), rel=1e-12)
    assert x.min() <= low <= mean <= high <= x.max()
    for n in (1, 2, 3):
        assert np.isnan(mean_interval(x[:n])[1:]).all()
    assert mean_interval([0.5, 0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    assert np.isnan(mean_interval(x, 0)[1])


METRICS = ("fi", "fi_rel_random", "fi_share_near")  # FI and ratios of FI: never negative


def _bands(ax) -> set[tuple[float, float, float]]:
    """(x, low, high) of every fill_between band drawn on ``ax``, read from the polygons' vertices."""
    found = set()
    for coll in ax.collections:
        if not isinstance(coll, PolyCollection):
            continue
        for path in coll.get_paths():
            v = np.asarray(path.vertices)
            for x in np.unique(v[:, 0]):
                ys = v[v[:, 0] == x, 1]
                found.add((round(float(x), 6), round(float(ys.min()), 9), round(float(ys.max()), 9)))
    return found


@pytest.mark.smollm
@pytest.mark.parametrize(
    "names", [("alice", "botchan"), ("alice", "botchan", "hamlet", "lcet10")], ids=["2docs", "4docs"]
)
def test_nearfar_report_intervals_respect_the_range_and_equal_the_figure(smollm, tmp_path, names):
    """Every interval in the near/far report lies inside the per-document values (so never below 0 for FI and its
    ratios); with two documents there is none, and the cell says why; the figure's bands are the table's bounds."""
    from fi_toolkit.documents import load_document
    from fi_toolkit.report.export import _figures, build_report, load_run
    from fi_toolkit.studies import NearfarSettings, run_nearfar

    docs = [load_document(n, smollm.tokenizer, max_tokens=192) for n in names]
    run_nearfar(smollm, docs, NearfarSettings(128, [0, 32], 32, budget="remove=0.1", seeds=2), tmp_path / "nf")
    build_report([tmp_path / "nf"], tmp_path / "report", ["md", "csv"])
    shipped = pd.read_csv(tmp_path / "report" / "tables" / "nf__nearfar_summary.csv")
    raw = pd.read_csv(tmp_path / "nf" / "nearfar.csv")
    per_doc = (
        raw[raw["selector"] != "control"]
        .groupby(["document", "sinks", "selector", "distance_from_p"])[list(METRICS)]
        .mean()
        .reset_index()
    )
    bounds = 0
    for r in shipped.itertuples():
        values = per_doc[
            (per_doc["sinks"] == r.sinks)
            & (per_doc["selector"] == r.selector)
            & (per_doc["distance_from_p"] == r.distance_from_p)
        ]
        assert len(values) == len(names) == r.n_documents
        for m in METRICS:
            low, mean, high = getattr(r, f"{m}_ci_low"), getattr(r, f"{m}_mean"), getattr(r, f"{m}_ci_high")
            assert mean == pytest.approx(values[m].mean(), rel=1e-9)
            if len(names) < 4:
                assert np.isnan(low) and np.isnan(high)
                continue
            bounds += 1
            assert (
                0 <= values[m].min() - 1e-12 <= low <= mean + 1e-12 and mean <= high + 1e-12 <= values[m].max() + 2e-12
            )
    assert bounds == (0 if len(names) < 4 else 3 * len(shipped))
    page = (tmp_path / "report" / "report.md").read_text()
    assert not re.search(r"\[-\d", page)  # no negative bound anywhere on the page
    if len(names) < 4:
        assert "n/a (needs ≥ 4 documents for a bootstrap interval)" in page
    fig = dict(_figures(load_run(tmp_path / "nf")))["fi_vs_distance"]
    sinks = sorted(shipped["sinks"].unique(), reverse=True)
    axes = np.array(fig.axes[: 3 * len(sinks)]).reshape(3, len(sinks))
    for row, m in enumerate(METRICS):
        for col, s in enumerate(sinks):
            part = shipped[(shipped["sinks"] == s) & shipped[f"{m}_ci_low"].notna()]
            table = {
                (round(float(x), 6), round(float(lo), 9), round(float(hi), 9))
                for x, lo, hi in zip(part["distance_from_p"], part[f"{m}_ci_low"], part[f"{m}_ci_high"])
            }
            assert _bands(axes[row][col]) == table, (m, s)
    matplotlib.pyplot.close(fig)


@pytest.mark.smollm
def test_probe_report_has_one_random_baseline_per_budget(smollm, tmp_path):
    """Random seeds pooled: one row per budget in the lead table, one baseline line per chunk and budget in the
    headline, no seed named as a competitor; values and the paired test recomputed here from fi.csv."""
    from fi_toolkit.documents import load_document
    from fi_toolkit.report.export import _figures, build_report, load_run
    from fi_toolkit.report.kinds import kind_of
    from fi_toolkit.runs.settings import RunSettings
    from fi_toolkit.studies.probe_run import run_probe
    from fi_toolkit.studies.probe_settings import ProbeSettings

    doc = load_document("alice", smollm.tokenizer, max_tokens=192)
    selections = ["entropy:remove=0.1", "random:remove=0.1@0-2", "policy:h2o@keep=0.5", "random:keep=0.5@0-1"]
    settings = ProbeSettings(["128:160", "160:192"], selections, prefix=128)
    run_probe(smollm, [doc], settings, RunSettings(out=tmp_path / "probe"))
    build_report([tmp_path / "probe"], tmp_path / "report", ["md"])
    run = load_run(tmp_path / "probe")
    fi = pd.read_csv(tmp_path / "probe" / "fi.csv")

    lead = kind_of("probe").lead(run).table
    random_rows = lead[lead["selection"].str.startswith("random")]
    assert random_rows["selection"].tolist() == ["random:remove=0.1 (3 seeds)", "random:keep=0.5 (2 seeds)"]
    for label, prefix in (
        ("random:remove=0.1 (3 seeds)", "random:remove=0.1@"),
        ("random:keep=0.5 (2 seeds)", "random:keep=0.5@"),
    ):
        for chunk in ("128:160", "160:192"):
            seeds = fi[fi["selection"].str.startswith(prefix) & (fi["chunk"] == chunk)]["fi"]
            cell = random_rows.set_index("selection").loc[label, f"FI on {chunk}"]
            value, low, high = (float(v) for v in re.findall(r"[-+]?\d[\d.e+-]*", cell)[:3])
            assert value == pytest.approx(seeds.mean(), rel=1e-3)
            assert (low, high) == pytest.approx((seeds.min(), seeds.max()), rel=1e-3)

    lines = kind_of("probe").headline(run["tables"])
    assert not [line for line in lines if re.search(r"random:\S+@\d", line)]  # no seed named on its own
    baselines = [line for line in lines if "baseline random:" in line]
    assert len(baselines) == 4  # two chunks x two budgets

    versus = run["tables"]["versus_random"]
    entropy = versus[(versus["selection"] == "entropy:remove=0.1") & (versus["chunk"] == "128:160")].iloc[0]
    x = fi[(fi["selection"] == "entropy:remove=0.1") & (fi["chunk"] == "128:160")]["fi"].iloc[0]
    y = fi[fi["selection"].str.startswith("random:remove=0.1@") & (fi["chunk"] == "128:160")]["fi"].to_numpy()
    assert entropy["pairs"] == 3 and entropy["below_random"] == int((x < y).sum())
    assert entropy["wilcoxon_p"] == pytest.approx(stats.wilcoxon(np.full(3, x), y).pvalue)
    assert "versus_random" in dict(_figures(run))
    page = (tmp_path / "report" / "report.md").read_text()
    assert "figures/probe__versus_random.png" in page and "From `versus_random.csv`" in page
