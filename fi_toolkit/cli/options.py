"""Options, consoles and helpers shared by every ``fi`` command (cli.py, cli_study.py, cli_generate.py).

One module that imports nothing else of the CLI, so the command modules import it and never each other.
"""

from __future__ import annotations

import math

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fi_toolkit.errors import FIError

out = Console(emoji=False)
err = Console(stderr=True, emoji=False, soft_wrap=True)  # messages stay one line at any terminal width

ModelOpt = typer.Option("smollm2-135m", "--model", "-m", help="smollm2-135m (embedded), a local directory or a HF id.")
DeviceOpt = typer.Option(None, help="cpu (the default), cuda, cuda:N or auto; under torchrun, cuda is cuda:LOCAL_RANK.")
DeviceMapOpt = typer.Option(
    None, "--device-map",
    help="Place the layers of a model larger than one GPU across the visible GPUs (accelerate): auto, balanced, "
         "sequential, or a JSON object / JSON file {module: device}. Not with --device.",
)
DtypeOpt = typer.Option("float32", help="float32, bfloat16 or float16: how the weights are stored (signals and KL stay float32).")
UpcastOpt = typer.Option(
    True, "--upcast/--no-upcast",
    help="With --dtype bfloat16/float16, compute in float32 (the default: per-token FI then ranks like float32). "
         "--no-upcast computes in the weights' dtype: faster, but its rounding (the control:reorder row) swamps per-token FI.",
)
GenerateUpcastOpt = typer.Option(
    False, "--upcast/--no-upcast", help="With --dtype bfloat16/float16, compute in float32 (default: in the weights' dtype).",
)
WindowOpt = typer.Option(32, help="Observation window w (last w prefix positions).")
TopKOpt = typer.Option(256, "--top-k", help="Entropy over the k largest logits (k >= vocab: full entropy).")
AlphaOpt = typer.Option(0.9, help="InfoKV mix: alpha*attention + (1-alpha)*softmax(E).")
TauOpt = typer.Option(1.0, help="Bias in E = (D + tau) * H.")
PoolOpt = typer.Option(7, "--pool", help="Average-pool kernel for window attention (1 = off).")
EntropyOfOpt = typer.Option(
    "produced", "--entropy-of",
    help="Which entropy H_i is: 'produced' = the distribution that produced token i (logits at i-1, the default), "
         "'next' = the distribution computed at i (predicting token i+1).",
)
OverwriteOpt = typer.Option(False, help="Replace results already in --out.")


def check_placement(device, device_map):
    """``--device`` and ``--device-map`` both say where the model goes: refused together, before anything runs."""
    from fi_toolkit.model.loading import check_placement as check

    return check(device, device_map)


def check_entropy_of(entropy_of: str) -> str:
    from fi_toolkit.signals.trace import ENTROPY_OF

    if entropy_of not in ENTROPY_OF:
        raise FIError(f"--entropy-of must be one of {', '.join(ENTROPY_OF)}, got '{entropy_of}'")
    return entropy_of


def _signal_config(window, top_k, alpha, tau, pool, entropy_of="produced"):
    from fi_toolkit.signals.trace import SignalConfig

    config = SignalConfig(top_k=top_k, window=window, pool_kernel=pool, tau=tau, alpha=alpha,
                          entropy_of=check_entropy_of(entropy_of))
    config.validate()
    return config


def check_finite(name: str, value: float) -> float:
    """Typer parses 'nan' and 'inf' as floats; refuse them with one line."""
    if not math.isfinite(value):
        raise FIError(f"{name} must be a finite number, got {value}")
    return value


MAX_RESAMPLES = 100_000  # bootstrap resamples: more is a typo (each resample stores an index per observation)


def check_resamples(resamples: int) -> int:
    if not 0 <= resamples <= MAX_RESAMPLES:
        raise FIError(f"--resamples must lie in [0, {MAX_RESAMPLES:,}], got {resamples}")
    return resamples


def check_prefix(prefix: int, window: int) -> None:
    """The traced prefix must be longer than the window: only ``[0, p - w)`` is scored."""
    if prefix <= window:
        raise FIError(f"--prefix {prefix} leaves nothing to score: it must be larger than the window ({window})")


def check_sinks(sinks: int, prefix: int, window: int) -> int:
    """``[sinks, p - w)`` must hold at least one candidate; returns the number of scored positions."""
    scored = prefix - window
    if sinks < 0:
        raise FIError(f"--sinks must be >= 0, got {sinks}")
    if sinks >= scored:
        raise FIError(f"--sinks {sinks} leaves no candidates: the scored prefix [0, {scored}) has {scored} positions")
    return scored


def check_selections(selections, prefix: int, window: int, sinks: int) -> None:
    """Score-based and random selectors draw from ``[sinks, p - w)``: refuse sinks that leave none and
    sets that are empty or larger than their candidates, before the model is loaded."""
    if sinks < 0:
        raise FIError(f"--sinks must be >= 0, got {sinks}")
    if any(s.kind not in ("positions", "policy", "kvpress") for s in selections):
        check_sinks(sinks, prefix, window)
    for s in selections:
        if s.kind != "positions":
            s.check(prefix, window, sinks)


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal,
    )


def unit_progress(bar: Progress, label: str):
    """``progress(unit, done, total)`` for the studies and ``fi eval``: one bar per document or task sample."""
    tasks: dict = {}

    def progress(name: str, done: int, total: int):
        if name not in tasks:
            tasks[name] = bar.add_task(f"{label} {name}", total=total or None)
        bar.update(tasks[name], completed=done)

    return progress
