"""``fi generate``: text generation with a compressed KV cache (a thin shell over
:func:`fi_toolkit.compress.decoder.generate`).

Generated text streams to stdout; the statistics table goes to stderr at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from fi_toolkit.cli.options import check_entropy_of, check_finite, err, settings_options
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.policies.registry import policy_help
from fi_toolkit.signals.config import SignalConfig


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n):,} B"
        n /= 1024
    return str(n)  # pragma: no cover


def stats_table(stats, policy_label: str) -> Table:
    t = Table(title=f"generation ({policy_label})")
    t.add_column("")
    t.add_column("value", justify="right")
    full = stats.cache_bytes_full
    rows = [
        ("prompt tokens", f"{stats.prompt_tokens:,}"),
        ("new tokens", f"{stats.new_tokens:,} ({stats.stop_reason})"),
        ("prefill", f"{stats.prefill_seconds:.2f} s" + (" (compressed)" if stats.prefill_compressed else "")),
        ("decoding", f"{stats.decode_seconds:.2f} s, {stats.tokens_per_second:.1f} tokens/s"),
        (
            "compressions while decoding",
            f"{stats.compressions}"
            + (
                f" (at {stats.compression_steps[:6]}{'...' if len(stats.compression_steps) > 6 else ''})"
                if stats.compression_steps
                else ""
            ),
        ),
        ("compression time", f"{stats.compression_seconds:.3f} s"),
        ("cache, full", _human(full)),
        ("cache, kept", f"{_human(stats.cache_bytes_kept)} ({stats.cache_bytes_kept / full:.1%})" if full else "0 B"),
        ("cache, peak", _human(stats.peak_cache_bytes)),
        (f"peak memory ({stats.peak_memory_kind})", _human(stats.peak_memory_bytes)),
    ]
    if stats.note:
        rows.append(("note", stats.note))
    for row in rows:
        t.add_row(*row)
    return t


@settings_options(
    model={
        "device_map": None,
        "upcast": "With --dtype bfloat16/float16, compute in float32 (default: in the weights' dtype).",
    }
)
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The prompt (or use --file)."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the prompt from a text file."),
    policy: str = typer.Option(
        "infokv",
        "--policy",
        "-p",
        help=policy_help(oracles=False)
        + "; or none (full cache). infokv:alpha=0.5,top_k=64 overrides --alpha, --top-k, ... Not fi-oracle: "
        "an oracle that sees the future text (fi eval on documents).",
    ),
    budget: str = typer.Option(
        "keep=0.25",
        "--budget",
        "-b",
        help="Entries kept per layer and head, window included: keep=X or remove=X (a bare X is keep=X), X a share of "
        "the tokens it may compress at each compression (0.25) or a count (512).",
    ),
    interval: int = typer.Option(1024, help="Compress back to the budget every INTERVAL generated tokens."),
    max_new: int = typer.Option(256, "--max-new", help="Maximum number of new tokens."),
    compress_prompt: Optional[bool] = typer.Option(
        None,
        "--compress-prompt/--keep-prompt",
        help="Whether the prompt is compressible (default: the policy's; RPC keeps it).",
    ),
    temperature: float = typer.Option(0.0, help="0 = greedy; otherwise sampling temperature."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling threshold."),
    seed: int = typer.Option(0, help="Sampling seed."),
    chat: bool = typer.Option(
        True, "--chat/--raw", help="Wrap the prompt in the model's chat template (when it has one)."
    ),
    signals: SignalConfig = SignalConfig(),
    model: ModelSettings = ModelSettings(upcast=False),
    stream: bool = typer.Option(True, "--stream/--no-stream", help="Stream text as it is generated."),
):
    """Generate text with the KV cache compressed by a policy (prefill and every --interval tokens)."""
    if (prompt is None) == (file is None):
        raise FIError("give a prompt or --file (exactly one)")
    check_finite("--temperature", temperature)
    check_finite("--top-p", top_p)
    check_entropy_of(signals.entropy_of)
    if interval < 1:
        raise FIError(f"--interval must be >= 1, got {interval}")
    if max_new < 1:
        raise FIError(f"--max-new must be >= 1, got {max_new}")
    if file is not None:
        if file.is_dir():
            raise FIError(f"--file '{file}' is a directory, not a prompt file")
        if not file.is_file():
            raise FIError(f"prompt file not found: {file}")
        try:
            prompt = file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise FIError(f"cannot read --file '{file}': {exc.strerror}") from None
    chosen = None
    if policy.strip().lower() not in ("none", "full"):
        from fi_toolkit.policies.registry import resolve

        chosen = resolve(
            policy,
            budget,
            signals.window,
            where=f"--policy {policy}",
            alpha=signals.alpha,
            tau=signals.tau,
            top_k=signals.top_k,
        )
    # every check above imports nothing heavy but a kvpress policy (usage errors answer at once)
    from fi_toolkit.compress.decoder import generate as run_generate
    from fi_toolkit.compress.decoder import signal_config_for

    config = signal_config_for(chosen, pool_kernel=signals.pool_kernel, entropy_of=signals.entropy_of)
    lm = model.load()

    def emit(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = run_generate(
        lm.model,
        lm.tokenizer,
        prompt,
        chosen,
        max_new_tokens=max_new,
        interval=interval,
        compress_prompt=compress_prompt,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        chat=None if chat else False,
        on_text=emit if stream else None,
        config=config,
    )
    if not stream:
        emit(result.text)
    emit("\n")
    err.print(stats_table(result.stats, chosen.label if chosen else "full cache"))


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
