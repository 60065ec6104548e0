"""What ``fi probe`` measures: :class:`ProbeSettings`, the object the command line builds and
:func:`fi_toolkit.studies.probe_run.run_probe` takes. Imports nothing heavy (no torch, no pandas): the
command line builds it, and so refuses bad options, before the model loads.

The settings hold what is measured (chunks, selections, the compression point, sinks, the future, the
signal options, the batch size), not the documents: the model and the documents are the run function's
other arguments, so one settings object probes any set of documents.

Each field that is an option carries its flag and help (:func:`fi_toolkit.runs.settings.option`), from
which :func:`fi_toolkit.cli.options.settings_options` generates ``fi probe``'s options; ``signals`` is the
command's signal options, built first and handed in.

It lives beside the run function in ``studies/`` (not in ``probe/``) because a generated future
(``generated:N``) is the compressed decoder's continuation, and ``probe/`` sits below ``compress/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

from fi_toolkit.compress.future import Future, parse_future
from fi_toolkit.errors import FIError
from fi_toolkit.policies.registry import policy_help
from fi_toolkit.probe.chunks import Chunk, check_chunks, parse_chunks
from fi_toolkit.probe.selections import Selection, check_prefix, check_selections, parse_selections
from fi_toolkit.runs.settings import RunSettings, check_int, check_type, option
from fi_toolkit.signals.config import SignalConfig

DEFAULT_SELECTIONS = (
    "entropy:remove=0.1",
    "attention:remove=0.1",
    "distance:remove=0.1",
    "infokv:remove=0.1",
    "random:remove=0.1@0-2",
)  # budgets as fi_toolkit.budget spells them: a bare 0.1 would be keep=0.1


@dataclass(frozen=True)
class ProbeSettings:
    """``fi probe``'s options, checked on construction (one :class:`~fi_toolkit.errors.FIError` line naming
    the parameter; the command line names its flag).

    ``chunks``: future chunks ``START:END`` (strings or :class:`~fi_toolkit.probe.chunks.Chunk`);
    ``selections``: ``--select`` specs (strings or parsed :class:`~fi_toolkit.probe.selections.Selection`
    objects; a seed range becomes one selection per seed; None: :data:`DEFAULT_SELECTIONS`, a default the
    option's help need not spell out); ``prefix``: the compression point ``p`` (default
    the smallest chunk start); ``sinks``: the first positions no score-based or random selector picks;
    ``future``: ``document`` (the default) or ``generated:N[@SEED]`` (the chunks must then end by ``p + N``);
    ``signals``: the signal options; ``batch_size``: evictions per batched forward (None: 1 on CPU, 8 on
    CUDA). After construction ``chunks`` and ``selections`` are tuples of parsed objects, ``prefix`` an int
    and ``future`` a :class:`~fi_toolkit.compress.future.Future`.
    """

    chunks: Sequence[Chunk | str] = field(
        metadata=option("--chunk", "-c", help="Future chunk START:END (repeatable).", cli_type=List[str])
    )
    selections: Sequence[Selection | str] | None = field(
        default=None,
        metadata=option(
            "--select",
            "-s",
            help="A method, spelled NAME@B[:key=value,...] as --policy spells it (fi eval, fi field). A token set "
            "removes the same positions everywhere: set:entropy@B, set:attention@B, set:distance@B, set:infokv@B "
            "(the top positions by that signal), set:random@B:seeds=A-B, set:positions:at=A-B,C (also spelled "
            "entropy:B, random:B@SEED, positions:A-B,C). A policy evicts what it would: "
            + policy_help(selection=True)
            + ". E.g. infokv@0.25:alpha=0.5,tau=2 (also spelled policy:infokv@0.25:...). The FI ORACLE "
            "(estimator=fisher|exact, chunk=A:B) keeps per layer and KV head by estimated FI on a future chunk "
            "(default: the first --chunk), so it sees the future: a ceiling for the heuristics, not a policy. A "
            "kvpress press's B is keep=X or remove=X, X a share (kvpress:SnapKVPress@keep=0.25 is its "
            "compression_ratio 0.75, the share removed; a bare X or a count is refused); needs the kvpress extra: "
            "pip install 'fi_toolkit\\[kvpress]'. "
            "B is a budget: remove=X or keep=X (a bare X is keep=X), X a share of the prefix [0, p) (0.1) or a token "
            "count (100). Repeatable.",
            cli_type=List[str],
        ),
    )
    prefix: int | None = field(
        default=None, metadata=option("--prefix", help="Compression point p (default: smallest chunk start).")
    )
    sinks: int = field(
        default=4,
        metadata=option("--sinks", help="First N positions are never picked by score-based or random selectors."),
    )
    future: Future | str = field(
        default="document",
        metadata=option(
            "--future",
            help="What follows p: 'document' (its own tokens), 'generated:N' (the model's greedy continuation of the "
            "first p tokens with its full cache) or 'generated:N@SEED' (sampled from SEED; the chunks must end by "
            "p + N).",
            cli_type=str,
        ),
    )
    signals: SignalConfig = field(default_factory=SignalConfig)
    batch_size: int | None = field(
        default=None,
        metadata=option("--batch-size", help="Evictions per batched forward (default: 1 on CPU, 8 on CUDA)."),
    )

    def __post_init__(self):
        future = self.future if isinstance(self.future, Future) else parse_future(self.future)
        chunks = parse_chunks(self.chunks)
        given = DEFAULT_SELECTIONS if self.selections is None else self.selections
        if isinstance(given, (str, Selection)) or not isinstance(given, Sequence):
            raise FIError(f"selections must be a list of specs, got {given!r}", parameter="selections")
        specs = [s for s in given if not isinstance(s, Selection)]
        for s in specs:
            check_type("selections", s, str)
        try:
            parsed = parse_selections(specs)
        except FIError as exc:  # its messages spell each spec "selection SPEC": the command line names its flag
            raise exc.about({"selection": "selections"}) from None
        selections = tuple(s for s in given if isinstance(s, Selection)) + tuple(parsed)
        check_type("signals", self.signals, SignalConfig)
        config = self.signals.check()
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, 1)
        if not chunks:
            raise FIError("no chunk given: pass at least one START:END in chunks", parameter="chunks")
        p = min(c.start for c in chunks) if self.prefix is None else check_int("prefix", self.prefix)
        check_int("sinks", self.sinks)
        check_chunks(chunks, p, float("inf"), None)  # chunk starts vs p now; lengths once the documents are read
        check_prefix(p, config.window)
        try:
            check_selections(selections, p, config.window, self.sinks)
        except FIError as exc:
            raise exc.about({"selection": "selections"}) from None
        for c in chunks if future.generated else []:
            if c.end > p + future.tokens:
                raise FIError(
                    f"chunk {c.label} ends past p + N = {p + future.tokens:,}: future {future.label} generates "
                    f"{future.tokens:,} tokens after p={p}",
                    parameter="future",
                )
        for name, value in (("future", future), ("chunks", chunks), ("selections", selections), ("prefix", p)):
            object.__setattr__(self, name, value)

    def document_tokens(self) -> int:
        """The tokens each document needs: ``p`` with a generated future (the model continues it), else the
        end of the last chunk or of the last chunk an FI oracle selection scores."""
        if self.future.generated:
            return self.prefix
        ends = [c.end for c in self.chunks] + [e for s in self.selections if (e := s.reads_until()) is not None]
        return max(ends)


def probe_dir(run: RunSettings) -> RunSettings:
    """Where a probe writes its tables: ``run.out``, a directory a new run may write into (results already
    there only with ``overwrite``); ``resume`` is refused (a probe is one pass, its tables written at the end).
    Creates nothing. The messages about the directory name ``out``, the field that holds it."""
    from fi_toolkit.runs.results import check_results_dir

    check_type("run", run, RunSettings)
    if run.resume:
        raise FIError("a probe does not resume: run it again, or pass overwrite to replace it", parameter="resume")
    try:
        check_results_dir(run.out, run.overwrite)
    except FIError as exc:  # check_results_dir's parameter is out_dir: here it is the RunSettings' out
        raise exc.about({"out_dir": "out"}) from None
    return run
