"""benchmarks/gpu_check.py in its reduced form on the CPU (tiny random Llama), so the GPU check cannot rot
between the sessions that have a GPU: every section runs, its numbers are finite and its checks hold."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SECTIONS = ["environment", "precision", "probe_cost", "prefill", "decoding", "cuda_tests"]
NULL_ON_CPU = {"cuda", "cudnn", "device_memory_bytes", "peak_memory_bytes", "commit"}


def _numbers(obj, path=""):
    """(path, value) of every number and null in the results, keys joined by '.'."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{path}[{i}]")
    elif obj is None or (isinstance(obj, (int, float)) and not isinstance(obj, bool)):
        yield path, obj


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "check.json"
    # One thread: the tiny model gains nothing from more, and a busy shared CPU makes spinning threads crawl.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "gpu_check.py"),
            "--device",
            "cpu",
            "--reduced",
            "--model",
            "tiny",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout
    return json.loads(out.read_text())


def test_every_section_ran_and_every_number_is_finite(reduced):
    assert reduced["failures"] == []
    for name in SECTIONS:
        assert "error" not in reduced[name], reduced[name]
        assert all(reduced[name].get("checks", {}).values())
    for path, value in _numbers(reduced):
        if value is None:
            assert path.rsplit(".", 1)[-1] in NULL_ON_CPU, path
        else:
            assert math.isfinite(value), path


def test_precision_upcast_agrees_with_float32_and_floors_are_ordered(reduced):
    runs = reduced["precision"]["runs"]
    assert set(runs) == {"float32", "bfloat16_upcast", "bfloat16_no_upcast"}
    up, raw = runs["bfloat16_upcast"], runs["bfloat16_no_upcast"]
    assert len(up["single_fi"]) == reduced["sizes"]["singles"] and min(up["single_fi"]) > 0
    assert up["spearman_vs_float32"] >= 0.9 and abs(up["set_ratio_vs_float32"] - 1) <= 0.05
    assert all(r["control_null"] == 0 and r["noise_floor"] == abs(r["control_reorder"]) for r in runs.values())
    assert 0 < up["noise_floor"] < 1e-8 and raw["noise_floor"] > 100 * up["noise_floor"]
    assert runs["float32"]["spearman_vs_float32"] == pytest.approx(1) and runs["float32"]["set_ratio_vs_float32"] == 1


def test_cost_prefill_and_decoding_sections(reduced):
    s = reduced["sizes"]
    for dtype in ("float32", "bfloat16_upcast"):
        cost = reduced["probe_cost"][dtype]
        assert cost["plain_forward_s"] > 0 and cost["per_eviction_batch8_s"] > 0 and cost["per_eviction_batch1_s"] > 0
    pre = reduced["prefill"]
    assert pre["tokens"] == s["prefill"] and pre["kept_per_layer"] == s["budget"] and pre["infokv_s"] > 0
    dec = reduced["decoding"]
    full, info = dec["full"], dec["infokv"]
    assert full["max_cache_length"] == s["prompt"] + s["new"] - 1 and full["compressions"] == 0
    assert info["max_cache_length"] <= s["budget"] + s["interval"] and info["compressions"] >= 1
    assert full["tokens_per_second"] > 0 and info["tokens_per_second"] > 0
    assert full["peak_memory_bytes"] is None  # CPU: not measured (RSS is not the device's memory)
    tests = reduced["cuda_tests"]
    assert tests["tests"] >= 1 and tests["skipped"] == tests["tests"] and tests["failures"] == tests["errors"] == 0


def test_a_failed_section_or_check_is_recorded_and_fails_the_run(tmp_path, monkeypatch):
    """A section that raises becomes an error string, the others still run, and a check that does not
    hold fails the run as well: exit code 1 either way."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_check

    def broken(args, s):
        raise RuntimeError("CUDA out of memory")

    sections = {
        "environment": gpu_check.environment,
        "precision": broken,
        "decoding": lambda args, s: {"checks": {"cache_within_budget": False}},
    }
    monkeypatch.setattr(gpu_check, "SECTIONS", sections)
    out = tmp_path / "check.json"
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--reduced", "--out", str(out)])
    assert gpu_check.main() == 1
    results = json.loads(out.read_text())
    assert results["precision"]["error"] == "RuntimeError: CUDA out of memory"
    assert results["environment"]["device_name"] == "cpu" and "seconds" in results["decoding"]
    assert results["failures"] == ["precision: RuntimeError: CUDA out of memory", "decoding: cache_within_budget"]
