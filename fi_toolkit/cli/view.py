"""``fi view``: a page that shows why policies evict what they evict (a thin shell over
:func:`fi_toolkit.report.token_page.view_data` and :func:`fi_toolkit.report.token_page.write_view`).

Every option is checked before the model loads (one line, exit 2); the chunk is checked against the
document's length once it is tokenised (before any estimate runs); the page is written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fi_toolkit.cli.options import _progress, check_prefix, err, settings_options
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.policies.registry import policy_help
from fi_toolkit.signals.config import SignalConfig

SPECIAL_TOKENS = 2  # a tokenizer may add BOS/EOS; every other token covers at least one byte of the text


def make_policies(names: str, budget: str, config: SignalConfig, prefix: int) -> list:
    """``--policy a,b`` with one ``--budget`` -> policies on the trace's window; each budget is checked
    against the prefix now (it must fit the compressible tokens and exceed the window)."""
    from fi_toolkit.budget import Budget
    from fi_toolkit.policies.registry import is_oracle, resolve, split_policies

    parsed = Budget.parse(budget, "--budget")
    for name in split_policies(names, "--policy"):
        if is_oracle(name):
            raise FIError(
                f"--policy {name}: fi view marks what compression-time policies evict; the FI oracle sees the "
                "future chunk that the page's FI shading is measured on (probe it: fi probe --select "
                f"policy:{name.partition(':')[0]}@BUDGET)"
            )
    policies = [
        resolve(
            name,
            parsed,
            config.window,
            shared=("window", "top_k"),
            alpha=config.alpha,
            tau=config.tau,
            top_k=config.top_k,
        )
        for name in split_policies(names, "--policy")
    ]
    for policy in policies:
        try:
            kept = policy.tokens(prefix)
        except FIError as exc:
            raise FIError(f"--policy {policy.name} with --budget {parsed.label}: {exc}") from None
        if kept >= prefix:
            raise FIError(
                f"--policy {policy.name} with --budget {parsed.label} keeps all {prefix:,} prefix tokens: "
                "nothing is evicted"
            )
    return policies


@settings_options()
def view(
    document: str = typer.Argument(..., help="Text/JSONL file or bundled name (a JSONL file: its first document)."),
    policy: str = typer.Option(
        "infokv,snapkv",
        "--policy",
        "-p",
        help="Comma-separated policies, each "
        + policy_help(oracles=False)
        + ". The page marks, per token, the share of layers x KV heads that evicted it.",
    ),
    budget: str = typer.Option(
        "keep=0.25",
        "--budget",
        "-b",
        help="One budget for every policy: keep=X or remove=X (a bare X is keep=X), a share of the prefix (0.25) or a "
        "count (512).",
    ),
    prefix: int = typer.Option(1024, help="Compression point p: the page shows the prefix tokens [0, p)."),
    chunk: Optional[str] = typer.Option(
        None, "--chunk", "-c", help="Future chunk START:END that the estimated FI is measured on (default p:p+256)."
    ),
    samples: int = typer.Option(16, help="Label draws of the Fisher estimate (fi scores --estimator fisher)."),
    seed: int = typer.Option(0, help="Seed of the label draws."),
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    out_file: Path = typer.Option(Path("view.html"), "--out", "-o", help="The page (.html)."),
    overwrite: bool = typer.Option(False, help="Replace --out if it exists."),
):
    """Write one standalone HTML page: every prefix token shaded by its estimated FI (or H, A, D, S), each
    policy's evictions marked, a token's numbers on hover (docs/guides/view.md)."""
    from fi_toolkit.documents import read_texts
    from fi_toolkit.probe.chunks import check_chunks, parse_chunk
    from fi_toolkit.probe.estimator_options import check_samples
    from fi_toolkit.runs import results

    model.check()
    config = signals.check()
    check_prefix(prefix, config.window)
    c = parse_chunk(chunk) if chunk is not None else parse_chunk(f"{prefix}:{prefix + 256}")
    check_chunks([c], prefix, float("inf"), None)
    check_samples(samples)
    if seed < 0:
        raise FIError(f"--seed must be >= 0, got {seed}")
    policies = make_policies(policy, budget, config, prefix)
    if out_file.suffix.lower() not in (".html", ".htm"):
        raise FIError(f"--out must end in .html, got '{out_file}'")
    results.check_out_path(out_file, want_dir=False)
    if out_file.exists() and not overwrite:
        raise FIError(f"--out '{out_file}' exists; choose another file or pass --overwrite")
    name, text, source = read_texts(document)[0]
    most = len(text.encode("utf-8")) + SPECIAL_TOKENS  # no tokenizer makes more tokens than this
    if c.end > most:
        raise FIError(f"chunk {c.label} ends past the end of document '{name}' (at most {most:,} tokens)")
    # every check above imports nothing heavy (usage errors answer at once); the work below does
    from fi_toolkit.documents import tokenize_texts
    from fi_toolkit.probe.experiment import max_context, trace_document
    from fi_toolkit.report.token_page import view_data, write_view

    lm = model.load()
    doc = tokenize_texts([(name, text, source)], lm.tokenizer, max_tokens=c.end)[0]
    check_chunks([c], prefix, len(doc), max_context(lm))
    with _progress() as bar:
        bar.add_task(f"trace and estimate FI on {c.label}: {doc.name}", total=None)
        trace = trace_document(lm, doc, prefix, config)
        data = view_data(lm, doc, trace, policies, c, samples, seed)
    write_view(out_file, data)
    err.print(
        f"wrote {out_file} ({out_file.stat().st_size / 1024:,.0f} KiB, {prefix:,} tokens, "
        f"{len(policies)} polic{'y' if len(policies) == 1 else 'ies'})",
        markup=False,
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("view")(view)
