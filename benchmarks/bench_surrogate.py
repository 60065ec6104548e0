"""The surrogate's cost per compression (``surrogate:path=DIR``, linear and MLP) beside the learned policy, SnapKV,
H2O and ExpectedAttention, as ratios to SnapKV, in the two places a policy compresses.

On SmolLM2 (embedded), 'alice', keep 25 % (the prompt) or a cache of ``--budget`` tokens (decoding), one thread by
default. The surrogates are random models of SmolLM2's shapes (576 -> 3 scores per layer; the MLP with
``--mlp-hidden`` units, KVzap's 64) written to a temporary directory: the scores do not change the cost.
``learned`` is the committed default model (``learned`` without ``path=``,
``fi_toolkit/policies/learned/lambdarank.py``).

(a) **Prompt compression as the probe does it**: ``policy.keep_map`` on a prefill trace of ``p`` tokens
(``--prefix``, 512 and 2,048); the trace is shared and not timed. The probe traces the prefix with the surrogate's
scorer (:func:`~fi_toolkit.probe.selections.trace_scorer`), so its keep map only ranks the scores the trace stored:
the benchmark traces the prefix so for each surrogate, and times apart what that scoring adds to the trace (the
scorer's ``score`` of every layer's attention inputs ``[p, d]``, the same calls the trace makes; column
``+scoring``). The ratio is of the keep map plus that scoring to SnapKV's keep map. ``own forward``: the surrogate
given signals without its scores (the model and the prompt's tokens, as ``_policy_keep_map`` gives a policy that
``needs_model``) runs one forward of the prompt with hooks on every layer's attention input, as the probe did before
it traced the scores (its memo ``_table`` cleared before every call, as on a new prompt).

(b) **Compression while decoding**: a :class:`~fi_toolkit.compress.decoder.CompressedDecoder` per policy prefills
``--decode-prompt`` tokens (compressing them to the budget), then is fed the next ``--new`` tokens of the document
one at a time (teacher-forced: every policy sees the same tokens), compressing back to ``--budget`` every
``--interval`` tokens. Reported: the decoder's own compression timer (``compression_seconds``: the policy's keep
map, the cache's gather, the tracker's compaction) for the prompt's compression and per decoding compression. The
surrogate's tracker scores each row as it is fed (:class:`~fi_toolkit.signals.tracker.SignalTracker`'s
``scorer``), outside that timer: its cost is measured apart (the scorer's ``score`` calls, all layers, timed) and
reported per fed token while decoding and per prompt; ``ms/token`` is the whole step (forward, tracker, scheduled
compressions) for context.

Repetitions are interleaved (every policy once per round, the order rotated each round) and each figure is the
median over rounds; the ratio is of medians. Writes benchmarks/results/bench_surrogate.txt (the table) and
bench_surrogate.json (settings, every sample, medians).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_surrogate.py [--prefix 512 2048] [--rounds 5 3]
        [--decode-prompt 512] [--new 48] [--interval 16] [--budget 256] [--decode-rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fi_toolkit.compress.decoder import CompressedDecoder
from fi_toolkit.documents import load_document
from fi_toolkit.model.attention import ragged_attention
from fi_toolkit.model.loading import load_model
from fi_toolkit.policies import parse_policy
from fi_toolkit.policies.base import as_signals
from fi_toolkit.policies.surrogate import SurrogateModel, attention_inputs, write_surrogate
from fi_toolkit.runs.results import atomic_write_text
from fi_toolkit.signals.trace import trace_prefix

ROOT = Path(__file__).resolve().parents[1]
BASE = "snapkv"


def random_surrogate(config, hidden: int | None, folder: Path, seed: int = 0) -> str:
    m = SurrogateModel(config.hidden_size, config.num_key_value_heads, config.num_hidden_layers, hidden, {})
    g = torch.Generator().manual_seed(seed)
    m.weights = {k: 0.05 * torch.randn(s, generator=g) for k, s in m.expected_shapes().items()}
    return str(write_surrogate(folder, m))


def policy_specs(config, folder: Path, mlp_hidden: int) -> dict[str, str]:
    return {
        "surrogate (linear)": f"surrogate:path={random_surrogate(config, None, folder / 'linear')}",
        "surrogate (mlp)": f"surrogate:path={random_surrogate(config, mlp_hidden, folder / 'mlp')}",
        "learned": "learned",
        "snapkv": "snapkv",
        "h2o": "h2o",
        "expected_attention": "expected_attention",
    }


def rotated(names: list[str], r: int) -> list[str]:
    return names[r % len(names) :] + names[: r % len(names)]


class ScoreTimer:
    """Wraps a surrogate's ``score`` (what the decoder's tracker calls for each fed row, per layer) with a timer."""

    def __init__(self, model: SurrogateModel):
        self.seconds, self.inner = 0.0, model.score
        model.score = self

    def __call__(self, layer, x):
        t0 = time.perf_counter()
        out = self.inner(layer, x)
        self.seconds += time.perf_counter() - t0
        return out


def prompt_setting(lm, doc, specs: dict[str, str], p: int, rounds: int, warm: bool) -> dict[str, list[float]]:
    """(a): seconds per ``policy.keep_map`` of a prefill trace of ``p`` tokens, per policy, one sample per round;
    for a surrogate also ``NAME +scoring`` (its scores of the prefix, as the trace computes them) and ``NAME own
    forward`` (its keep map without traced scores); ``warm``: one untimed call of each first."""
    plain = trace_prefix(lm.model, doc.ids, p)
    policies = {name: parse_policy(spec, budget="keep=0.25") for name, spec in specs.items()}
    inputs = attention_inputs(lm.model, doc.ids[:p])
    calls = {}  # name -> a callable timed once per round
    for name, policy in policies.items():
        scorer = getattr(policy, "input_scorer", None)
        if scorer is None:
            calls[name] = lambda policy=policy: policy.keep_map(plain)
            continue
        traced = trace_prefix(lm.model, doc.ids, p, scorer=scorer)  # as the probe traces it (trace_scorer)
        untraced = dataclasses.replace(as_signals(plain), model=lm.model, tokens=doc.ids[:p])
        calls[name] = lambda policy=policy, traced=traced: policy.keep_map(traced)
        calls[f"{name} +scoring"] = lambda scorer=scorer: [scorer.score(i, x) for i, x in enumerate(inputs)]

        def own_forward(policy=policy, signals=untraced):
            policy._table = None  # its forward of the prompt, as on a new prompt
            return policy.keep_map(signals)

        calls[f"{name} own forward"] = own_forward
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for name in calls if warm else ():  # one untimed call each (first-call allocations, lazy imports)
        calls[name]()
    for r in range(rounds):
        for name in rotated(list(calls), r):
            t0 = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - t0)
    return samples


def decode_once(lm, ids: torch.Tensor, spec: str, a: argparse.Namespace) -> dict[str, float]:
    """(b): one decoder of ``spec``: prefill, then ``a.new`` teacher-forced steps -> its timings (seconds)."""
    policy = parse_policy(spec, budget=str(a.budget))
    timer = ScoreTimer(policy.model) if hasattr(policy, "input_scorer") else None
    prompt = ids[: a.decode_prompt]
    decoder = CompressedDecoder(lm.model, policy, a.decode_prompt + a.new, interval=a.interval)
    try:
        with ragged_attention(lm.model):
            decoder.prefill(prompt)
            prompt_compression = decoder.compression_seconds
            prompt_scoring = timer.seconds if timer else float("nan")
            if timer:
                timer.seconds = 0.0
            n_prompt = len(decoder.compressions)
            t0 = time.perf_counter()
            for token in ids[a.decode_prompt : a.decode_prompt + a.new].tolist():
                decoder.step(token)
            step = (time.perf_counter() - t0) / a.new
    finally:
        decoder.close()
    n = len(decoder.compressions) - n_prompt
    if n_prompt != 1 or n != a.new // a.interval:
        raise SystemExit(
            f"{spec}: {n_prompt} prompt and {n} decoding compressions, expected 1 and {a.new // a.interval}"
        )
    return {
        "prompt_compression": prompt_compression,
        "compression": (decoder.compression_seconds - prompt_compression) / n,
        "scoring_per_token": timer.seconds / a.new if timer else float("nan"),
        "prompt_scoring": prompt_scoring,
        "step": step,
    }


def decode_setting(lm, doc, specs: dict[str, str], a: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    ids = doc.ids
    # one short untimed run (the decoder's, the tracker's and the scorer's first calls); each policy's own first
    # calls were made in setting (a), and a slow first round falls out of the median
    decode_once(lm, ids, next(iter(specs.values())), argparse.Namespace(**{**vars(a), "new": a.interval}))
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in specs}
    for r in range(a.decode_rounds):
        for name in rotated(list(specs), r):
            for key, value in decode_once(lm, ids, specs[name], a).items():
                samples[name].setdefault(key, []).append(value)
    return samples


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def ms(x: float) -> str:
    return "       -" if x != x else f"{1000 * x:8.1f}"


def table(a, prompt: dict[int, dict[str, list[float]]], decode: dict[str, dict[str, list[float]]]) -> str:
    names = [n for n in next(iter(prompt.values())) if not n.endswith((" +scoring", " own forward"))]
    lines = [
        f"SmolLM2-135M, alice, {torch.get_num_threads()} thread(s); medians of interleaved rounds; x = ratio to SnapKV",
        "",
        "(a) prompt compression as the probe does it: policy.keep_map on a prefill trace, keep 25 %",
        "    a surrogate: its keep map on a trace that scored the prefix (trace_scorer), + that scoring = its cost;",
        "    'own forward': its keep map from signals without its scores (one forward of the prompt)",
    ]
    head = "  " + f"{'policy':30s}" + "".join(f"{f'p={p} (ms)':>16s}{'x':>8s}" for p in prompt)
    lines += [head]

    def row(label: str, seconds) -> str:
        text = "  " + f"{label:30s}"
        for samples in prompt.values():
            t, base = seconds(samples), median(samples[BASE])
            text += f"{1000 * t:16.1f}{t / base:7.1f}x"
        return text

    for name in names:
        lines.append(row(name, lambda samples, name=name: median(samples[name])))
        if f"{name} +scoring" in next(iter(prompt.values())):
            lines.append(
                row("  + scoring in the trace", lambda samples, name=name: median(samples[f"{name} +scoring"]))
            )
            lines.append(
                row(
                    "  = keep map + scoring",
                    lambda samples, name=name: median(samples[name]) + median(samples[f"{name} +scoring"]),
                )
            )
            lines.append(
                row("  own forward (before)", lambda samples, name=name: median(samples[f"{name} own forward"]))
            )
    lines.append("  rounds: " + ", ".join(f"p={p}: {len(s[BASE])}" for p, s in prompt.items()))
    if decode:
        lines += [
            "",
            f"(b) compression while decoding: CompressedDecoder, prompt {a.decode_prompt}, budget {a.budget} tokens, "
            f"{a.new} tokens fed, compressing every {a.interval} ({a.new // a.interval} compressions per run)",
            "    compression: the decoder's own timer per compression (keep map + gather + tracker compaction);",
            "    scoring: the surrogate tracker's per-row scores (all layers), outside that timer",
            "  "
            + f"{'policy':20s}{'prompt cmp (ms)':>16s}{'x':>8s}{'decode cmp (ms)':>16s}{'x':>8s}"
            + f"{'scoring/token':>15s}{'prompt scoring':>16s}{'ms/token':>10s}",
        ]
        base = decode[BASE]
        for name, s in decode.items():
            pc, dc = median(s["prompt_compression"]), median(s["compression"])
            lines.append(
                "  "
                + f"{name:20s}{1000 * pc:16.1f}{pc / median(base['prompt_compression']):7.1f}x"
                + f"{1000 * dc:16.1f}{dc / median(base['compression']):7.1f}x"
                + f"{ms(median(s['scoring_per_token'])):>15s}{ms(median(s['prompt_scoring'])):>16s}"
                + f"{1000 * median(s['step']):10.1f}"
            )
        lines.append(f"  rounds: {len(base['compression'])}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, nargs="+", default=[512, 2048], help="prompt lengths of setting (a)")
    ap.add_argument("--rounds", type=int, nargs="+", default=[5, 3], help="rounds per prefix (the last repeats)")
    ap.add_argument("--decode-prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=48, help="tokens fed while decoding")
    ap.add_argument("--interval", type=int, default=16)
    ap.add_argument("--budget", type=int, default=256, help="tokens kept while decoding")
    ap.add_argument("--decode-rounds", type=int, default=3, help="0: skip setting (b)")
    ap.add_argument("--mlp-hidden", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_surrogate.txt")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    started = time.perf_counter()
    lm = load_model("smollm2-135m")
    need = max(*a.prefix, a.decode_prompt + a.new)
    doc = load_document("alice", lm.tokenizer, max_tokens=need)
    if doc.ids.numel() < need:
        raise SystemExit(f"'alice' has {doc.ids.numel()} tokens, {need} needed")
    with tempfile.TemporaryDirectory() as tmp:
        specs = policy_specs(lm.model.config, Path(tmp), a.mlp_hidden)
        prompt = {}
        for i, p in enumerate(a.prefix):
            prompt[p] = prompt_setting(lm, doc, specs, p, a.rounds[min(i, len(a.rounds) - 1)], warm=i == 0)
        decode = decode_setting(lm, doc, specs, a) if a.decode_rounds else {}
    text = table(a, prompt, decode)
    print(text, end="")
    print(f"({time.perf_counter() - started:.0f} s in all)")
    atomic_write_text(a.out, text)
    record = {
        "benchmark": "bench_surrogate",
        "model": "smollm2-135m",
        "document": "alice",
        "threads": a.threads,
        "settings": {k: v for k, v in vars(a).items() if k != "out"},
        "baseline": BASE,
        "prompt": {
            str(p): {
                name: {"seconds": s, "median": median(s), "ratio": median(s) / median(samples[BASE])}
                for name, s in samples.items()
            }
            for p, samples in prompt.items()
        },
        "decode": {
            name: {
                key: {"seconds": v, "median": median(v)}
                for key, v in s.items()
                if not all(x != x for x in v)  # NaN: not a surrogate (no per-row scoring)
            }
            | {
                "ratio": median(s["compression"]) / median(decode[BASE]["compression"]),
                "prompt_ratio": median(s["prompt_compression"]) / median(decode[BASE]["prompt_compression"]),
            }
            for name, s in decode.items()
        },
        "table": text,
    }
    atomic_write_text(a.out.with_suffix(".json"), json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
