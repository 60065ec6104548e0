"""``fi generate``: text generation with a compressed KV cache. Its options become a
:class:`~fi_toolkit.compress.generate_settings.GenerateSettings` (checked on construction, before the model
loads), :func:`fi_toolkit.compress.generate_run.run_generate` generates, and this module prints.

Generated text streams to stdout; the statistics table goes to stderr at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from fi_toolkit.cli.options import err, settings_options
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
    from fi_toolkit.compress.generate_settings import GenerateSettings

    model.check()
    if (prompt is None) == (file is None):
        raise FIError("give a prompt or --file (exactly one)")
    settings = GenerateSettings(
        policy=policy,
        budget=budget,
        interval=interval,
        max_new=max_new,
        compress_prompt=compress_prompt,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        chat=chat,
        signals=signals,
    )
    prompt = _read_prompt(file) if file is not None else prompt
    # every check above imports nothing heavy but a kvpress policy (usage errors answer at once)
    from fi_toolkit.compress.generate_run import run_generate

    lm = model.load()
    result = run_generate(lm, prompt, settings, _emit if stream else None)
    if not stream:
        _emit(result.text)
    _emit("\n")
    err.print(stats_table(result.stats, settings.label))


def _read_prompt(file: Path) -> str:
    """The prompt file's text (undecodable bytes replaced); a directory or a missing file refused in one line."""
    if file.is_dir():
        raise FIError(f"--file '{file}' is a directory, not a prompt file")
    if not file.is_file():
        raise FIError(f"prompt file not found: {file}")
    try:
        return file.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise FIError(f"cannot read --file '{file}': {exc.strerror}") from None


def _emit(text: str) -> None:
    """Generated text to stdout as it comes."""
    sys.stdout.write(text)
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
