"""The ``fi`` command line (typer). Each command is a thin shell over one library call.

``fi probe``: options -> :class:`~fi_toolkit.studies.probe_settings.ProbeSettings` ->
:func:`fi_toolkit.studies.probe_run.run_probe` -> :func:`fi_toolkit.probe.experiment.probe_document` ->
:func:`fi_toolkit.probe.forward_influence.forward_influence`
-> :func:`fi_toolkit.probe.kl.kl_from_reference` (the map: :mod:`fi_toolkit.probe`).

Every user error is one line on stderr (``error: ...``) and exit status 2; Ctrl-C is one line
(``interrupted: ...``) and exit 130. Options shared by the commands live in :mod:`fi_toolkit.cli.options`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import typer
from rich.table import Table

from fi_toolkit.cli import INTERRUPTED, INTERRUPTED_LINE
from fi_toolkit.cli.options import (
    FlagsTakeNoValue,
    _progress,
    check_document_lengths,
    chunk_ending,
    distinct_texts,
    err,
    out,
    settings_options,
)
from fi_toolkit.errors import FIError
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.probe_settings import ProbeSettings, probe_dir
from fi_toolkit.studies.scores_settings import ScoresSettings, scores_file

app = typer.Typer(
    cls=FlagsTakeNoValue,  # no <bool> after a flag in the help
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Forward Influence analysis for KV-cache compression (InfoKV and attention baselines).",
)

try:  # typer >= 0.20 vendors click; older typer uses the click package
    from typer._click import exceptions as click_exceptions
    from typer.exceptions import Abort
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions
    from click.exceptions import Abort

# INTERRUPTED (130): typer turns KeyboardInterrupt into this exit code under standalone_mode=False


@app.command()
@settings_options(
    run={
        "out": "Results directory (default: runs/probe-<time>-<random>).",
        "resume": None,  # a probe is one pass
        "overwrite": "Replace results already in --out.",
    }
)
def probe(
    documents: List[str] = typer.Argument(None, help="Text/JSONL files or bundled names (default: alice)."),
    *,
    settings: ProbeSettings,
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    run: RunSettings = RunSettings(out=None),
):
    """Remove token sets from the KV cache at p and measure Forward Influence on future chunks.

    Everything that can be checked without the model is checked first; the results directory is
    created only when the results are written, so a failed or interrupted run leaves none behind."""
    # settings is built from its options, and so checked, before this body runs; without --out (run.out None)
    # the results go to a fresh runs/probe-<time>-<random>
    from fi_toolkit.documents import read_texts, tokenize_texts
    from fi_toolkit.runs import results

    model.check()
    texts = distinct_texts([t for spec in (documents or [None]) for t in read_texts(spec)])
    if run.out is not None:
        probe_dir(run)
    else:  # runs/probe-<time>-<random> is made when the results are written: prove runs/ writable now
        results.check_out_path(Path("runs"), option="the default results directory")
    needed = settings.document_tokens()
    reads = (
        f"the prompt p = {needed:,} of --future {settings.future.label}"
        if settings.future.generated
        else chunk_ending(settings.chunks, needed, f"the FI oracle's chunk (to token {needed:,})")
    )
    check_document_lengths(model, texts, needed, reads)
    # every check above imports nothing heavy (usage errors answer at once); the work below does
    from fi_toolkit.cli.console import print_warning
    from fi_toolkit.report.noise import noise_warning
    from fi_toolkit.studies.probe_run import run_probe

    lm = model.load()
    docs = tokenize_texts(texts, lm.tokenizer, max_tokens=settings.document_tokens())
    with _progress() as bar:
        fresh = run.out is None  # a fresh runs/probe-<time>-<random>
        measured = run_probe(
            lm,
            docs,
            settings,
            None if fresh else run,
            new_dir_in=Path("runs") if fresh else None,
            progress=_probe_progress(bar),
        )
    if measured is None:  # a rank other than 0: its tables went to rank 0, which writes and reports
        return
    table, p = measured.fi, settings.prefix
    written = [measured.out / "fi.csv"] + ([measured.out / "headroom.csv"] if measured.headroom is not None else [])
    _print_fi_table(table, f"Forward Influence (nats), {model.model}, p={p}, {len(docs)} document(s)")
    if measured.headroom is not None:
        _print_headroom(measured.headroom)
    print_warning(noise_warning(table))
    err.print(f"results: {', '.join(map(str, written))}, {measured.out}/manifest.json", markup=False, highlight=False)


def _probe_progress(bar):
    """``run_probe``'s progress as one bar per document (and one while futures are generated)."""
    tasks: dict = {}

    def progress(name: str, stage: str, done: int, total: int | None) -> None:
        key = "generate" if stage == "generate" else name
        if key not in tasks:
            tasks[key] = bar.add_task(f"{stage} {name}", total=total)
        bar.update(tasks[key], description=f"{stage} {name}", completed=done, total=total)

    return progress


def _print_headroom(hr) -> None:
    """Each selection's share of the random-to-oracle gap, on the chunk each oracle saw (other rows: headroom.csv)."""
    from fi_toolkit.report.numbers import count_text, headroom_text, sd_text

    own = hr[(hr["fit_chunk"] == hr["chunk"]) & (hr["selection"] != hr["oracle"])]  # its own row: 1
    oracles = list(dict.fromkeys(own["oracle"]))
    t = Table(
        title="Headroom: (FI_random - FI) / (FI_random - FI_oracle); 0 = random, 1 = the FI ORACLE "
        f"{oracles[0] if len(oracles) == 1 else ''}, which saw the chunk [95 % CI over documents]"
    )
    names = (["oracle"] if len(oracles) > 1 else []) + ["chunk", "removed", "selection", "headroom", "oracle's sd"]
    for name in names:
        right = name in ("removed", "headroom", "oracle's sd")
        t.add_column(name, justify="right" if right else "left", no_wrap=name == "headroom")
    for r in own.itertuples():
        t.add_row(
            *([r.oracle] if len(oracles) > 1 else []),
            r.chunk,
            count_text(r.n_removed),
            r.selection,
            headroom_text(r.headroom, r.ci_low, r.ci_high),
            sd_text(getattr(r, "headroom_seed_sd", float("nan"))),
        )
    out.print(t)
    out.print("oracle's sd: the headroom's spread over the oracle's label seeds (its own estimate noise; headroom.csv)")


def _print_fi_table(table, title: str) -> None:
    """Mean FI per selection and chunk; a mean whose every row is below the noise floor (the controls' always
    are) carries the report's mark, explained under the table. The random seeds of a size are one baseline row,
    as in the report: their pooled mean, and under the table the range of the seeds' means."""
    from fi_toolkit.report.display import pooled_fi
    from fi_toolkit.report.noise import BELOW_FLOOR_MARK, below_floor_note
    from fi_toolkit.report.numbers import console_fi, count_text

    pivot = table.pivot_table(index="selection", columns="chunk", values="fi", aggfunc="mean", sort=False)
    sizes = table.groupby("selection", sort=False)[["n_removed", "n_kept"]].mean()
    below = set()  # (selection, chunk) whose every row is below the floor
    if "below_noise_floor" in table:
        every = table["below_noise_floor"].astype(bool).groupby([table["selection"], table["chunk"]]).all()
        below = set(every[every].index)
    t = Table(title=title)
    t.add_column("selection")
    t.add_column("removed", justify="right")
    t.add_column("kept", justify="right")
    for c in pivot.columns:
        t.add_column(f"FI {c}", justify="right")
    pooled = pooled_fi(table)
    baselines = pooled[pooled["baseline"]].assign(size=pooled["n_removed"].round(3))
    random = set(table.loc[table["selector"] == "random", "selection"])
    shown, spreads = set(), []
    for sel, row in pivot.iterrows():  # per layer and head; the mean over layers where budgets differ
        removed, kept = count_text(sizes.loc[sel, "n_removed"]), count_text(sizes.loc[sel, "n_kept"])
        if sel in random:  # the first seed of a size stands for all of them
            size = round(float(sizes.loc[sel, "n_removed"]), 3)
            if size in shown:
                continue
            shown.add(size)
            base = baselines[baselines["size"] == size].set_index("chunk")
            label = base["selection"].iloc[0]
            t.add_row(label, removed, kept, *[console_fi(base.at[c, "fi"]) for c in pivot.columns])
            spreads.append(
                f"{label}: the seeds' means span "
                + ", ".join(
                    f"{console_fi(base.at[c, 'seed_min'])}..{console_fi(base.at[c, 'seed_max'])} on {c}"
                    for c in pivot.columns
                )
            )
            continue
        cells = [console_fi(v) + (f" {BELOW_FLOOR_MARK}" if (sel, c) in below else "") for c, v in row.items()]
        t.add_row(sel, removed, kept, *cells)
    out.print(t)
    for line in spreads:  # random positions: one baseline per size, its seeds' spread under the table
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    if below:
        out.print(below_floor_note(table), markup=False, highlight=False, soft_wrap=True)


@app.command()
@settings_options(run={"out": "Output .csv or .parquet.", "resume": None, "overwrite": "Replace --out if it exists."})
def scores(
    document: str = typer.Argument(None, help="Text/JSONL file or bundled name (default: alice)."),
    *,
    model: ModelSettings = ModelSettings(),
    signals: SignalConfig = SignalConfig(),
    settings: ScoresSettings,
    run: RunSettings = RunSettings(out=Path("scores.csv")),
):
    """Write per-token signals (H, A, D, E, S; per layer too) with the token text; with --fi-chunk, per-token FI too."""
    # settings is built from its options, and so checked, before this body runs
    from fi_toolkit.documents import read_texts, tokenize_texts

    model.check()
    run = scores_file(run)
    texts = read_texts(document)[:1]
    needed = settings.document_tokens()
    check_document_lengths(model, texts, needed, chunk_ending(settings.fi_chunks, needed, f"--prefix {needed:,}"))
    from fi_toolkit.studies.scores_run import idle_rank, run_scores  # the checks above import nothing heavy

    idle = idle_rank(settings)
    if idle is not None:
        err.print(
            f"note: rank {idle.rank} of {idle.size} has no unit to compute (fi scores reads one document; "
            "rank 0 computes it)",
            markup=False,
            highlight=False,
        )
        return
    lm = model.load()
    doc = tokenize_texts(texts, lm.tokenizer, max_tokens=settings.document_tokens())[0]
    with _progress() as bar:
        table = run_scores(lm, doc, settings, run, progress=_scores_progress(bar))
    if table is None:  # a rank other than 0: its block of positions went to rank 0, which writes the file
        return
    err.print(f"wrote {len(table):,} tokens x {table.shape[1]} columns to {run.out}", markup=False, highlight=False)
    _print_signal_summary(table, int((~table.in_window).sum()), doc.name)


def _scores_progress(bar):
    """``run_scores``' progress as one bar per document, its description the stage."""
    tasks: dict = {}

    def progress(name: str, stage: str) -> None:
        if name not in tasks:
            tasks[name] = bar.add_task(f"{stage} {name}", total=None)
        bar.update(tasks[name], description=f"{stage} {name}", total=None)

    return progress


def _print_signal_summary(table, scored: int, name: str) -> None:
    """Mean, std, min and max of H, A, D and S over the scored prefix ``[0, p - w)``."""
    from fi_toolkit.report.numbers import significant

    summary = (
        table[~table.in_window][["entropy", "attention", "distance", "infokv"]]
        .describe()
        .loc[["mean", "std", "min", "max"]]
    )
    t = Table(title=f"signals over the scored prefix [0, {scored}) of '{name}'")
    t.add_column("")
    for c in summary.columns:
        t.add_column(c, justify="right")
    for stat, row in summary.iterrows():
        t.add_row(stat, *[significant(v, 4) for v in row])
    out.print(t)


@app.command()
def models():
    """Show the embedded default model and where its converted copy is cached."""
    from fi_toolkit.model.loading import DEFAULT_MODEL, EMBEDDED_INSTALL, cache_dir, embedded_gguf

    try:
        gguf = embedded_gguf()
        out.print(f"{DEFAULT_MODEL} (default): {gguf}")
    except FIError as exc:
        out.print(f"{DEFAULT_MODEL} (default): not installed ({exc})")
    out.print(f"converted-copy cache: {cache_dir() / 'models'}")
    out.print("any Hugging Face causal LM: --model <hf-id or local directory> (Llama, Qwen2/3, Mistral...)")
    out.print(f"install the embedded model: {EMBEDDED_INSTALL}")


# --- commands defined in other modules register here (one import line each) ---
from fi_toolkit.cli.eval import register as _register_eval  # noqa: E402
from fi_toolkit.cli.field import register as _register_field  # noqa: E402
from fi_toolkit.cli.fit import register as _register_fit  # noqa: E402
from fi_toolkit.cli.generate import register as _register_generate  # noqa: E402
from fi_toolkit.cli.labels import register as _register_labels  # noqa: E402
from fi_toolkit.cli.lmeval import register as _register_lmeval  # noqa: E402  (fi lm-eval, fi tasks export)
from fi_toolkit.cli.study import register as _register_study  # noqa: E402
from fi_toolkit.cli.surrogate import register as _register_surrogate  # noqa: E402
from fi_toolkit.cli.view import register as _register_view  # noqa: E402

_register_study(app)
_register_generate(app)
_register_eval(app)
_register_field(app)
_register_lmeval(app)
_register_fit(app)
_register_labels(app)
_register_surrogate(app)
_register_view(app)


def _line(message: str) -> str:
    return " ".join(str(message).split())  # one line, whatever the message holds


def _out_of_memory(exc: BaseException) -> bool:
    """A torch out-of-memory error; torch is not imported for it (a run that never imported torch has none)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.OutOfMemoryError)


def command_flags(argv: list[str]) -> dict[str, str]:
    """{python parameter name: its flag} of the ``fi`` command that ``argv`` runs, from its click options
    (a settings field ``model__device`` is ``device`` too): every option is a settings field named as the
    library's parameter, so the field's name finds its flag and no table of aliases exists to go stale."""
    import typer.main

    command = typer.main.get_command(app)
    for word in (a for a in argv if not a.startswith("-")):  # down the sub-apps: fi tasks export
        sub = getattr(command, "commands", {}).get(word)
        if sub is None:
            break
        command = sub
    flags: dict[str, str] = {}
    for param in getattr(command, "params", []):
        long = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        if param.param_type_name != "option" or not long:
            continue
        flags[param.name] = long[0]
        flags.setdefault(param.name.rpartition("__")[2], long[0])
    return flags


def error_line(exc: FIError, argv: list[str]) -> str:
    """``exc``'s one line as the command line says it: its parameters spelled as the flags the user typed."""
    if not exc.parameters:
        return _line(exc)
    flags = command_flags(argv)
    return _line(exc.naming(lambda name: flags.get(name) or flags.get(name.rpartition(".")[2])))


def main() -> None:
    """Console entry point: one line on stderr for any user error, never a traceback.

    Bare ``fi`` prints the help (typer prints it while raising NoArgsIsHelpError) and exits 0. Nothing
    heavy is imported here: ``fi --help`` and argument errors answer before torch would have loaded.
    """
    try:
        code = app(standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:
        text = exc.format_message()  # empty when rich already printed the help
        if text.strip():
            out.print(text, markup=False, highlight=False)
        sys.exit(0)
    except FIError as exc:
        err.print(f"error: {error_line(exc, sys.argv[1:])}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except click_exceptions.ClickException as exc:
        err.print(f"error: {_line(exc.format_message())}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, Abort):
        code = INTERRUPTED
    except Exception as exc:
        if not _out_of_memory(exc):
            raise
        err.print("error: out of memory; lower --batch-size, the chunk length or the prefix", markup=False)
        sys.exit(3)
    if code == INTERRUPTED:
        err.print(INTERRUPTED_LINE, markup=False, highlight=False)
        sys.exit(INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
