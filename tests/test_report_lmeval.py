"""fi report on lm-eval output: accuracy against budget per policy from the files
``fi lm-eval`` writes, checked against pandas and scipy computed here (no model, no lm-eval needed)."""

from __future__ import annotations

import html
import json

import numpy as np
import pandas as pd
import pytest
from cli_runner import run_cli
from scipy import stats

from fi_toolkit.report import build_report, load_run
from fi_toolkit.report.export import CROSS_TITLE, cross_run_tables
from fi_toolkit.report.kinds.lmeval import accuracy_vs_budget

CELLS = [
    ("none", None),
    ("infokv", "keep=0.25"),
    ("infokv", "keep=0.5"),
    ("snapkv", "keep=0.25"),
    ("snapkv", "keep=0.5"),
]
DOCS = 12
MODEL = "smollm2-135m"


def _results(policy, budget, tasks: dict, date: str) -> dict:
    """lm-eval 0.4.x's results file (lm_eval/loggers/evaluation_tracker.py) with the fi backend's config."""
    label = "none" if policy == "none" else f"{policy}@{budget}"
    model_args = {"pretrained": MODEL, "policy": policy, **({"budget": budget} if budget else {}), "interval": 16}
    return {
        "results": {t: {"alias": t, **m} for t, m in tasks.items()},
        "group_subtasks": {t: [] for t in tasks},
        "configs": {t: {"task": t} for t in tasks},
        "versions": {t: 1.0 for t in tasks},
        "n-shot": {t: 0 for t in tasks},
        "higher_is_better": {
            t: {k.split(",")[0]: True for k in m if "stderr" not in k and "," in k} for t, m in tasks.items()
        },
        "n-samples": {t: {"original": DOCS, "effective": DOCS} for t in tasks},
        "config": {
            "model": "fi",
            "model_args": model_args,
            "batch_size": 1,
            "batch_sizes": [],
            "device": None,
            "use_cache": None,
            "limit": None,
            "bootstrap_iters": 100000,
            "gen_kwargs": None,
            "random_seed": 0,
            "numpy_seed": 1234,
            "torch_seed": 1234,
            "fewshot_seed": 1234,
            "fi_policy": label,
            "fi_interval": 16,
            "fi_model": {"name": MODEL},
        },
        "git_hash": None,
        "date": 1.7e9,
        "lm_eval_version": "0.4.13",
        "model_source": "fi",
        "model_name": MODEL,
        "model_name_sanitized": MODEL,
        "start_time": 1.0,
        "end_time": 2.0,
        "total_evaluation_time_seconds": "1.0",
    }


def _sample(task, doc_id, metric, value, filt, records) -> dict:
    return {
        "doc_id": doc_id,
        "doc": {"question": f"q{doc_id}"},
        "target": "0",
        "arguments": {"gen_args_0": {}},
        "resps": [["x"]],
        "filtered_resps": ["x"],
        "filter": filt,
        "metrics": [metric],
        "doc_hash": "h",
        "prompt_hash": "h",
        "target_hash": "h",
        metric: value,
        "fi_toolkit": records,
    }


@pytest.fixture()
def lmeval_dir(tmp_path):
    """Two policies x two budgets + the full cache, each an fi lm-eval run into one output path:
    fi_mc (acc, samples), fi_passkey (exact_match, samples), gsm8k (exact_match, no samples: stderr band)."""
    rng = np.random.default_rng(7)
    out = tmp_path / "lmeval" / MODEL
    out.mkdir(parents=True)
    for i, (policy, budget) in enumerate(CELLS):
        date = f"2026-01-0{i + 1}T00-00-00.000000"
        p = 0.9 if policy == "none" else (0.5 if budget == "keep=0.25" else 0.7)
        tasks = {}
        for task, metric in (("fi_mc", "acc"), ("fi_passkey", "exact_match")):
            values = (rng.random(DOCS) < p).astype(float)
            values[:2] = [0.0, 1.0]  # never constant
            lines = []
            for d, v in enumerate(values):
                full = 200 + 10 * d
                recs = [
                    {
                        "idx": k,
                        "request": "loglikelihood",
                        "context_tokens": full - 4,
                        "new_tokens": 4,
                        "cache_entries": full if policy == "none" else int(full * float(budget.split("=")[1])) + k,
                        "full_entries": full,
                        "compressions": 0 if policy == "none" else 1 + (d % 3),
                        "compression_steps": [0],
                        "policy": policy,
                    }
                    for k in range(2 if task == "fi_mc" else 1)
                ]
                lines.append(json.dumps(_sample(task, d, metric, float(v), "none", recs)))
            (out / f"samples_{task}_{date}.jsonl").write_text("\n".join(lines) + "\n")
            sd = float(values.std(ddof=1) / np.sqrt(DOCS))
            tasks[task] = {f"{metric},none": float(values.mean()), f"{metric}_stderr,none": sd}
        tasks["gsm8k"] = {
            "exact_match,strict-match": p - 0.1,
            "exact_match_stderr,strict-match": 0.05,
            "exact_match,flexible-extract": p,
            "exact_match_stderr,flexible-extract": 0.04,
        }
        (out / f"results_{date}.json").write_text(json.dumps(_results(policy, budget, tasks, date), indent=2))
    return tmp_path / "lmeval"


def _all_samples(root) -> pd.DataFrame:
    """Every sample line with its run's policy and budget, read here straight from the files."""
    rows = []
    for f in sorted(root.rglob("results_*.json")):
        cfg = json.loads(f.read_text())["config"]
        date = f.stem.removeprefix("results_")
        for s in sorted(f.parent.glob(f"samples_*_{date}.jsonl")):
            task = s.name.removeprefix("samples_").removesuffix(f"_{date}.jsonl")
            for line in s.read_text().splitlines():
                row = json.loads(line)
                metric = row["metrics"][0]
                rows.append(
                    {
                        "policy": cfg["model_args"]["policy"],
                        "budget": cfg["model_args"].get("budget", "keep=1"),
                        "task": task,
                        "metric": metric,
                        "value": row[metric],
                        "records": row["fi_toolkit"],
                    }
                )
    return pd.DataFrame(rows)


def test_accuracy_is_the_mean_over_samples_with_scipys_bootstrap_band(lmeval_dir):
    run = load_run(lmeval_dir)
    acc = run["tables"]["lmeval_accuracy"]
    samples = _all_samples(lmeval_dir)
    expected = samples.groupby(["task", "metric", "policy", "budget"])["value"].agg(["mean", "size"])
    got = acc[acc["band"] == "bootstrap"].set_index(["task", "metric", "policy", "budget"])
    assert len(got) == len(expected) == 2 * len(CELLS)
    for key, row in expected.iterrows():
        assert got.loc[key, "value"] == pytest.approx(row["mean"], abs=1e-12)
        assert got.loc[key, "samples"] == row["size"]
        values = samples.set_index(["task", "metric", "policy", "budget"]).loc[[key], "value"].to_numpy()
        ci = stats.bootstrap(
            (values,),
            np.mean,
            n_resamples=1000,
            confidence_level=0.95,
            method="percentile",
            rng=np.random.default_rng(0),
        ).confidence_interval
        assert (got.loc[key, "value_low"], got.loc[key, "value_high"]) == pytest.approx((ci.low, ci.high), abs=1e-12)
        full = expected.loc[(key[0], key[1], "none", "keep=1"), "mean"]
        assert got.loc[key, "full_value"] == pytest.approx(full, abs=1e-12)


def test_without_samples_the_band_is_lm_evals_stderr(lmeval_dir):
    acc = load_run(lmeval_dir)["tables"]["lmeval_accuracy"]
    gsm = acc[acc["task"] == "gsm8k"]
    assert set(gsm["band"]) == {"stderr"} and set(gsm["filter"]) == {"strict-match", "flexible-extract"}
    assert len(gsm) == 2 * len(CELLS)
    for f in lmeval_dir.rglob("results_*.json"):
        data = json.loads(f.read_text())
        policy = data["config"]["model_args"]["policy"]
        budget = data["config"]["model_args"].get("budget", "keep=1")
        for filt in ("strict-match", "flexible-extract"):
            v, se = (
                data["results"]["gsm8k"][f"exact_match,{filt}"],
                data["results"]["gsm8k"][f"exact_match_stderr,{filt}"],
            )
            row = gsm[(gsm["policy"] == policy) & (gsm["budget"] == budget) & (gsm["filter"] == filt)].iloc[0]
            assert (row["value"], row["value_low"], row["value_high"]) == pytest.approx(
                (v, v - 1.96 * se, v + 1.96 * se), abs=1e-4
            )


def test_cache_table_summarises_the_fi_toolkit_records(lmeval_dir):
    cache = load_run(lmeval_dir)["tables"]["lmeval_cache"].set_index(["task", "policy", "budget"])
    recs = _all_samples(lmeval_dir).explode("records")
    recs = recs.assign(
        **{k: [r[k] for r in recs["records"]] for k in ("cache_entries", "full_entries", "compressions")}
    )
    expected = recs.groupby(["task", "policy", "budget"]).agg(
        requests=("cache_entries", "size"),
        cache_entries=("cache_entries", "mean"),
        compressions=("compressions", "mean"),
        compressions_max=("compressions", "max"),
    )
    assert len(cache) == len(expected) == 2 * len(CELLS)
    for key, row in expected.iterrows():
        for col in expected.columns:
            assert cache.loc[key, col] == pytest.approx(row[col])
    assert cache.loc[("fi_mc", "none", "keep=1"), "cache_share"] == 1.0
    assert cache.loc[("fi_mc", "infokv", "keep=0.25"), "cache_share"] < 0.3


def test_figure_draws_a_line_per_policy_and_the_full_cache_dashed(lmeval_dir):
    acc = load_run(lmeval_dir)["tables"]["lmeval_accuracy"]
    fig = accuracy_vs_budget(acc, "caption")
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert len(axes) == 4  # fi_mc acc, fi_passkey exact_match, gsm8k x 2 filters
    ax = next(a for a in axes if a.get_title().startswith("fi_mc"))
    part = acc[acc["task"] == "fi_mc"]
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(dashed) == 1 and dashed[0].get_ydata()[0] == pytest.approx(
        part[part["policy"] == "none"]["value"].iloc[0]
    )
    solid = {ln.get_label(): ln for ln in ax.get_lines() if ln.get_linestyle() == "-"}
    assert set(solid) == {"infokv", "snapkv"}
    snap = part[part["policy"] == "snapkv"].sort_values("retention")
    assert list(solid["snapkv"].get_xdata()) == [0.25, 0.5]
    assert list(solid["snapkv"].get_ydata()) == pytest.approx(list(snap["value"]))
    assert len(ax.collections) == 2  # a band per policy
    from fi_toolkit.report.figures import plt

    plt.close(fig)


def test_replay_kl_against_benchmark_accuracy_is_spearman_over_cells(lmeval_dir):
    bench = load_run(lmeval_dir)
    kl = {
        ("infokv", "keep=0.25"): 0.4,
        ("infokv", "keep=0.5"): 0.1,
        ("snapkv", "keep=0.25"): 0.5,
        ("snapkv", "keep=0.5"): 0.2,
    }
    replay = pd.DataFrame(
        [{"future": "greedy", "policy": p, "budget": b, "mean_kl": v} for (p, b), v in kl.items()]
        + [{"future": "greedy", "policy": "full", "budget": "keep=1", "mean_kl": 0.0}]
    )
    text = {"kind": "eval-text", "tables": {"replay_summary": replay}}
    cross = cross_run_tables([text, bench])
    acc = bench["tables"]["lmeval_accuracy"]
    row = cross[cross["comparison"] == "replay KL (greedy) vs lm-eval fi_mc acc (none)"].iloc[0]
    mc = acc[(acc["task"] == "fi_mc") & (acc["policy"] != "none")].set_index(["policy", "budget"])["value"]
    keys = sorted(kl)
    rho = stats.spearmanr([kl[k] for k in keys], [mc[k] for k in keys]).statistic
    assert row["cells"] == 4 and row["rho"] == pytest.approx(rho)
    assert len(cross) == 4  # one row per task x filter x metric


def test_report_of_lmeval_output_writes_every_format(lmeval_dir, tmp_path, capsys):
    code, _out, err = run_cli(["report", str(lmeval_dir), "--out", str(tmp_path / "r")], capsys)
    assert code == 0, err
    r = tmp_path / "r"
    csv = pd.read_csv(r / "tables" / "lmeval__lmeval_accuracy.csv")
    assert csv["value"].tolist() == pytest.approx(load_run(lmeval_dir)["tables"]["lmeval_accuracy"]["value"].tolist())
    md = html.unescape((r / "report.md").read_text())
    assert "## lm-evaluation-harness under compression (fi lm-eval): lmeval" in md
    assert "figures/lmeval__accuracy_vs_budget.png" in md
    assert "bootstrap 95% over samples" in md and "lm-eval's ±1.96·stderr" in md
    assert CROSS_TITLE not in md  # no fi eval text run given
    data = json.loads((r / "report.json").read_text())
    assert data["runs"][0]["command"] == "lm-eval" and len(data["runs"][0]["tables"]["lmeval_cache"]) == 2 * len(CELLS)


def test_build_report_refuses_a_results_file_without_the_policy(lmeval_dir, tmp_path):
    from fi_toolkit.errors import FIError

    f = next(lmeval_dir.rglob("results_*.json"))
    data = json.loads(f.read_text())
    del data["config"]["fi_policy"]
    f.write_text(json.dumps(data))
    with pytest.raises(FIError, match="lacks 'config.fi_policy'"):
        build_report([lmeval_dir], tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_rerun_of_a_cell_replaces_the_earlier_one(lmeval_dir):
    before = load_run(lmeval_dir)["tables"]["lmeval_accuracy"]
    out = lmeval_dir / MODEL
    old = sorted(out.glob("results_*.json"))[1]  # infokv keep=0.25
    date = old.stem.removeprefix("results_")
    new_date = "2026-02-01T00-00-00.000000"
    (out / f"results_{new_date}.json").write_text(old.read_text())
    for s in out.glob(f"samples_*_{date}.jsonl"):
        lines = [json.loads(line) for line in s.read_text().splitlines()]
        for row in lines:
            row[row["metrics"][0]] = 1.0
        (out / s.name.replace(date, new_date)).write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    after = load_run(lmeval_dir)["tables"]["lmeval_accuracy"]
    assert len(after) == len(before)
    cell = after[(after["policy"] == "infokv") & (after["budget"] == "keep=0.25") & (after["band"] == "bootstrap")]
    assert list(cell["value"]) == [1.0, 1.0] and list(cell["samples"]) == [DOCS, DOCS]
