"""``fi generate``: text generation with a compressed KV cache. Its options are generated from
:class:`~fi_toolkit.compress.generate_settings.GenerateSettings`'s fields (built, and so checked, from them
before the command runs and the model loads) and its small groups (the prompt file, streaming);
:func:`fi_toolkit.compress.generate_run.run_generate` generates, and this module prints.

Generated text streams to stdout; the statistics table goes to stderr at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from fi_toolkit.cli.options import err, settings_options
from fi_toolkit.compress.generate_settings import GenerateSettings, PromptFile, TextOutput
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.report.numbers import byte_size, percent, seconds_text, thousands, tokens_per_second
from fi_toolkit.signals.config import SignalConfig


def stats_table(stats, policy_label: str) -> Table:
    t = Table(title=f"generation ({policy_label})")
    t.add_column("")
    t.add_column("value", justify="right")
    full = stats.cache_bytes_full
    rows = [
        ("prompt tokens", thousands(stats.prompt_tokens)),
        ("new tokens", f"{thousands(stats.new_tokens)} ({stats.stop_reason})"),
        ("prefill", seconds_text(stats.prefill_seconds) + (" (compressed)" if stats.prefill_compressed else "")),
        ("decoding", f"{seconds_text(stats.decode_seconds)}, {tokens_per_second(stats.tokens_per_second)}"),
        (
            "compressions while decoding",
            f"{stats.compressions}"
            + (
                f" (at {stats.compression_steps[:6]}{'...' if len(stats.compression_steps) > 6 else ''})"
                if stats.compression_steps
                else ""
            ),
        ),
        ("compression time", seconds_text(stats.compression_seconds, 3)),
        ("cache, full", byte_size(full)),
        (
            "cache, kept",
            f"{byte_size(stats.cache_bytes_kept)} ({percent(stats.cache_bytes_kept / full)})" if full else "0 B",
        ),
        ("cache, peak", byte_size(stats.peak_cache_bytes)),
        (f"peak memory ({stats.peak_memory_kind})", byte_size(stats.peak_memory_bytes)),
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
    *,
    source: PromptFile = PromptFile(),
    settings: GenerateSettings,
    signals: SignalConfig = SignalConfig(),
    model: ModelSettings = ModelSettings(upcast=False),
    output: TextOutput = TextOutput(),
):
    """Generate text with the KV cache compressed by a policy (prefill and every --interval tokens)."""
    model.check()
    if (prompt is None) == (source.file is None):
        raise FIError("give a prompt or --file (exactly one)")
    prompt = _read_prompt(source.file) if source.file is not None else prompt
    # every check above imports nothing heavy but a kvpress policy (usage errors answer at once)
    from fi_toolkit.compress.generate_run import run_generate

    lm = model.load()
    result = run_generate(lm, prompt, settings, _emit if output.stream else None)
    if not output.stream:
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
