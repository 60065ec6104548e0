"""``fi probe`` beside an FI oracle and random sets writes the headroom table, and ``fi report`` shows a
probe run with its headroom figure. The expected headroom is recomputed here from
``fi.csv`` with plain pandas: per document the mean of the random seeds, then ratios of means."""

from __future__ import annotations

import pandas as pd
import pytest
from cli_runner import run_cli

pytestmark = pytest.mark.smollm

ORACLE = "policy:fi-oracle@keep=0.25"
SELECT = [ORACLE, "random:keep=0.25@0-1", "policy:snapkv@keep=0.25", "policy:h2o@keep=0.25"]


@pytest.fixture
def probe_run(tmp_path):
    out = tmp_path / "run"
    args = [
        "probe",
        "alice",
        "hamlet",
        "--prefix",
        "128",
        "--window",
        "16",
        "--chunk",
        "128:160",
        "--chunk",
        "192:224",
        "--out",
        str(out),
    ] + [a for s in SELECT for a in ("--select", s)]
    return out, args


def _expected(fi: pd.DataFrame, selection: str, chunk: str, oracle: str = ORACLE) -> float:
    part = fi[fi.chunk == chunk]
    rand = part[part.selector == "random"].groupby("document")["fi"].mean()
    mean = part.groupby(["selection", "document"])["fi"].mean()
    r, s, o = rand.mean(), mean[selection].mean(), mean[oracle].mean()
    return (r - s) / (r - o)


def test_probe_writes_the_headroom_table_and_report_draws_it(probe_run, capsys, tmp_path):
    out, args = probe_run
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    assert "Headroom" in stdout and "headroom.csv" in err
    fi = pd.read_csv(out / "fi.csv")
    hr = pd.read_csv(out / "headroom.csv")
    for chunk in ("128:160", "192:224"):
        for sel in ("policy:snapkv@keep=0.25", "policy:h2o@keep=0.25"):
            row = hr[(hr.oracle == ORACLE) & (hr.chunk == chunk) & (hr.selection == sel)]
            assert len(row) == 1 and row.n_documents.iloc[0] == 2
            assert row.headroom.iloc[0] == pytest.approx(_expected(fi, sel, chunk), rel=1e-9)
            # the oracle's own noise: the headroom with the label-seed-1 oracle as the reference, by hand
            other = _expected(fi, sel, chunk, f"{ORACLE}:seed=1")
            assert row.oracle_seeds.iloc[0] == 2
            # a difference of two near-equal headrooms: the CSV's rounding of each (~1e-12) is not relative to it
            sd = abs(row.headroom.iloc[0] - other) / 2**0.5
            assert row.headroom_seed_sd.iloc[0] == pytest.approx(sd, rel=1e-9, abs=1e-10)
            assert row[["ci_low", "ci_high"]].isna().all(axis=None)  # two documents: no bootstrap interval
    assert set(hr.fit_chunk) == {"128:160"}  # the oracle scored the first chunk; on the second it is a transfer
    assert f"{ORACLE}:seed=1" in set(fi.selection)  # measured beside it, no reference or row of its own
    assert f"{ORACLE}:seed=1" not in set(hr.selection) | set(hr.oracle)
    assert (hr[(hr.selection == ORACLE) & (hr.chunk == "128:160")].headroom == 1.0).all()
    # the oracle saw 128:160: there it removes less FI than each heuristic in each document
    near = fi[fi.chunk == "128:160"].groupby(["document", "selection"])["fi"].mean().unstack()
    assert (near[ORACLE] <= near[["policy:snapkv@keep=0.25", "policy:h2o@keep=0.25"]].min(axis=1)).all()

    report = tmp_path / "report"
    code, _, err = run_cli(["report", str(out), "--out", str(report)], capsys)
    assert code == 0, err
    md = (report / "report.md").read_text()
    assert "headroom" in md and "FI oracle" in md
    assert list((report / "figures").glob("*headroom*.png"))
    assert (report / "tables").is_dir() and list((report / "tables").glob("*headroom*.csv"))


def test_probe_without_an_oracle_writes_no_headroom(capsys, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        [
            "probe",
            "alice",
            "--prefix",
            "128",
            "--window",
            "16",
            "--chunk",
            "128:160",
            "--select",
            "random:keep=0.25@0",
            "--select",
            "policy:snapkv@keep=0.25",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    assert (out / "fi.csv").exists() and not (out / "headroom.csv").exists() and "Headroom" not in stdout
