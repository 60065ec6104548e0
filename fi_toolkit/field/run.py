"""``fi field``: every named method (policy or press) placed on the given documents at the given budgets, as a
resumable run with one unit per (document, method) cell.

A cell measures, for each budget:

- **prefill FI** on each chunk: the method's probe selection (:mod:`fi_toolkit.field.spec`) removed at
  ``p``, measured by :func:`~fi_toolkit.probe.forward_influence.forward_influence` against the document's one
  trace and full-cache reference (shared by its cells), exactly what ``fi probe --select`` measures;
- **cost**: the seconds the method took to choose its keep map at ``p`` (``compress_seconds``; the trace's
  signals are shared and not counted; a press runs its own prefill, counted);
- **replay KL** in decoding (``replay``): the method as ``fi eval --policy NAME --budget B`` replays it, one
  teacher-forced replay of the document from the prompt ``p``, compressing every ``interval`` tokens
  (:func:`~fi_toolkit.evaluation.replay_runs.evaluate_text` with the document's shared prefill).

The two anchors (random positions with sinks kept; the FI oracle, one per chunk, measured again at label seed 1 for
its own noise: ``headroom_seed_sd``) are cells of their own, in prefill only. A method that cannot run (a press
that needs a download, a press that rewrites keys, a budget its policy cannot meet on this document) is a row of
``refused`` with the reason; the other cells go on. Presses the providers list but that take no budget (their own
arguments set what they keep) are refused before any work, with that reason.

Tables: ``fi`` (per document x method x budget x selection x chunk), ``replays`` (per document x method x
budget), ``refused``; the summaries (:mod:`fi_toolkit.field.summary`): ``headroom``, ``leaderboard``
(also JSON), ``tests``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
import torch

from fi_toolkit.budget import Budget
from fi_toolkit.compress.future import DOCUMENT
from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.replay_runs import evaluate_text, text_context
from fi_toolkit.evaluation.task_runs import SampleUnit
from fi_toolkit.evaluation.text_setting import TextSetting
from fi_toolkit.field.settings import FieldSettings
from fi_toolkit.field.spec import anchors, method_selections, replay_policy
from fi_toolkit.field.summary import field_summaries
from fi_toolkit.field.tasks import accuracy_columns, task_cell, task_entries, task_summary
from fi_toolkit.model.loading import dtype_name
from fi_toolkit.policies import registry
from fi_toolkit.policies.method import ANCHOR, PRESS, Method
from fi_toolkit.probe.chunks import Chunk, check_chunks
from fi_toolkit.probe.experiment import fi_table, max_context, trace_document
from fi_toolkit.probe.forward_influence import chunk_reference, forward_influence
from fi_toolkit.probe.selections import parse_selections, trace_scorer
from fi_toolkit.runs import results
from fi_toolkit.runs.execute import execute_run
from fi_toolkit.runs.resumable import ResumableRun, last_document, split_units
from fi_toolkit.runs.settings import RunSettings, check_type, run_settings
from fi_toolkit.signals.config import SignalConfig

Progress = Callable[[str, int, int], None]
REFUSED_COLUMNS = ["document", "method", "kind", "budget", "stage", "reason"]
FI_COLUMNS = [
    "document",
    "method",
    "kind",
    "budget",
    "selection",
    "selector",
    "seed",
    "n_removed",
    "n_kept",
    "chunk",
    "distance_from_p",
    "fi",
    "compress_seconds",
]
NO_REPLAY = ["document", "method", "kind", "budget", "mean_kl", "top1_agreement", "delta_nll", "seconds"]


def press_methods(ratio: float, layers: int) -> tuple[list[Method], list[dict]]:
    """The providers' presses that take the run's budget (``ratio``: a share removed, used to spell them):
    ``(methods, refusals)``. A press with no spec, without a compression ratio (its own arguments set its
    budget) or with one ratio per layer is refused with the reason: it cannot be placed at the run's budgets."""
    methods, refused = [], []
    for name, spec, reason in registry.catalog(ratio, layers):
        if spec is None:
            refused.append(_refusal("", name, PRESS, "", "catalog", reason))
            continue
        head, at, tail = spec.partition("@")
        options = tail.partition(":")[2] if at else head.split(":", 2)[2] if head.count(":") > 1 else ""
        if not at:
            refused.append(
                _refusal(
                    "",
                    name,
                    PRESS,
                    "",
                    "catalog",
                    f"takes no compression ratio: its own arguments "
                    f"({options or 'its defaults'}) set what it keeps, so it has no place at a budget",
                )
            )
        elif "compression_ratios=" in options:
            refused.append(
                _refusal("", name, PRESS, "", "catalog", "sets one compression ratio per layer, not the run's budget")
            )
        else:
            methods.append(Method(PRESS, head, options=options))
    return methods, refused


def _refusal(document: str, method: str, kind: str, budget: str, stage: str, reason: str) -> dict:
    return {
        "document": document,
        "method": method,
        "kind": kind,
        "budget": budget,
        "stage": stage,
        "reason": " ".join(str(reason).split()),
    }


def _replay_setting(lm, docs, settings: FieldSettings) -> TextSetting | None:
    """The replay's setting (None without ``replay``), every document checked to hold the chunks and the replay."""
    for doc in docs:
        check_chunks(settings.chunks, settings.prefix, len(doc), max_context(lm))
    if not settings.replay:
        return None
    replay = TextSetting(settings.prefix, settings.replay_length(), settings.interval, DOCUMENT, 0)
    replay.check()
    for doc in docs:
        doc.require(replay.total(), f"the replay length of {replay.total():,}")
    return replay


def _manifest(lm, docs, settings: FieldSettings, cells, replay: TextSetting | None) -> dict:
    """What a resumed run must match: the model, the documents, the cells and every measured setting."""
    return {
        "model": lm.name,
        "dtype": dtype_name(lm.dtype),
        "compute_dtype": dtype_name(lm.compute_dtype),
        "documents": [{"name": d.name, "sha256": d.sha256, "tokens": len(d)} for d in docs],
        "prefix": settings.prefix,
        "chunks": [c.label for c in settings.chunks],
        "budgets": [b.label for b in settings.budgets],
        "methods": [{"name": m.name, "kind": m.kind, **_anchor_options(m)} for m in cells],
        "sinks": settings.sinks,
        "seeds": settings.seeds,
        "signals": dict(settings.signals.__dict__),
        "replay": None
        if replay is None
        else {"interval": replay.interval, "length": replay.total(), "future": replay.future.label},
    }


def _anchor_options(method) -> dict:
    """The oracle anchor's options where --oracle gave some (a manifest without them is one of fi-oracle's own)."""
    return {"options": method.options} if method.kind == ANCHOR and method.options else {}


def _task_refusal(method: str, kind: str, budget: str, reason: str) -> dict:
    return _refusal("(tasks)", method, kind, budget, "tasks", reason)


def _empty_cell() -> dict[str, pd.DataFrame]:
    """A task sample's unit holds no prefill FI, replay or refusal (the tables every unit saves)."""
    return {
        "fi": pd.DataFrame(columns=FI_COLUMNS),
        "replays": pd.DataFrame(columns=NO_REPLAY),
        "refused": pd.DataFrame(columns=REFUSED_COLUMNS),
    }


def _task_manifest(tasks) -> dict:
    return {
        "tasks": list(tasks.tasks),
        "contexts": list(tasks.contexts),
        "samples": tasks.samples,
        "protocols": list(tasks.protocols),
        "max_new": tasks.max_new,
    }


def _reason(exc: FIError, where: str) -> str:
    text = str(exc)
    return text[len(where) + 2 :] if text.startswith(f"{where}: ") else text


def run_field(
    lm,
    docs: Sequence[Document],
    settings: FieldSettings,
    run: RunSettings | Path | str,
    *,
    block: int = 512,
    progress: Progress | None = None,
) -> dict[str, pd.DataFrame] | None:
    """The field map of ``settings.methods`` (and, with ``settings.presses``, every press the providers offer
    that takes a budget) on ``docs`` -> ``fi``, ``replays``, ``refused``, ``headroom``, ``leaderboard``,
    ``tests`` (module docstring).

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        docs: the documents; each must reach ``settings.document_tokens()`` tokens.
        settings: what to place where (:class:`~fi_toolkit.field.settings.FieldSettings`).
        run: the results directory, or a :class:`~fi_toolkit.runs.settings.RunSettings` (resume, overwrite).
        block: query positions per block of the continuation forward.
        progress: ``progress(unit, done, total)`` after each budget of a cell.

    Returns:
        The tables; under torchrun the cells are shared among the ranks, rank 0 returns the tables, the
        others None.
    """
    check_type("settings", settings, FieldSettings)
    config, prefix, chunks, budgets = settings.signals, settings.prefix, settings.chunks, settings.budgets
    replay = _replay_setting(lm, docs, settings)
    methods = list(settings.methods)
    catalog_refused: list[dict] = []
    if settings.presses:
        extra, catalog_refused = press_methods(0.75, lm.model.config.num_hidden_layers)
        methods += [m for m in extra if m.name not in {x.name for x in methods}]
    cells = [*anchors(settings.oracle), *methods]
    manifest = _manifest(lm, docs, settings, cells, replay)
    units, costs = split_units(docs, len(cells), 1)
    entries, samples = [], []
    if settings.tasks is not None:
        entries, task_refused = task_entries(methods, budgets, config, settings.tasks, _task_refusal)
        catalog_refused += task_refused
        samples = settings.tasks.units(lm.tokenizer, lm.model.config)
        units += samples
        costs += [len(u) * (len(entries) + 1) * 4 for u in samples]  # a generation per entry: ~4 forwards' worth
        manifest["tasks"] = {**_task_manifest(settings.tasks), "interval": settings.interval}
    where = run_settings(run).check()
    resumable = ResumableRun(where.out, "field", manifest, where.resume, where.overwrite)

    scorer = _trace_scorer(methods, budgets, chunks)

    def make(doc):
        trace = trace_document(lm, doc, prefix, config, scorer)
        return {"trace": trace, "reference": chunk_reference(lm.model, trace, doc.ids, chunks, block)}

    setup = last_document(make)

    def compute(unit):
        if isinstance(unit, SampleUnit):
            answers, refused = task_cell(lm, unit, entries, settings.tasks, settings.interval, config, _task_refusal)
            return {**_empty_cell(), "answers": answers, "refused": pd.DataFrame(refused, columns=REFUSED_COLUMNS)}
        doc, shared = setup(unit)
        method = cells[unit.index]
        tables = field_cell(
            lm,
            doc,
            shared,
            method,
            budgets,
            chunks,
            settings.sinks,
            settings.seeds,
            config,
            replay,
            settings.batch_size,
            block,
            progress,
            unit,
        )
        return tables if not samples else {**tables, "answers": pd.DataFrame(columns=["method", "kind"])}

    def summaries(tables):
        refused = pd.concat(
            [pd.DataFrame(catalog_refused, columns=REFUSED_COLUMNS), tables["refused"]], ignore_index=True
        ).drop_duplicates(ignore_index=True)  # a method failing on every task sample: one row
        found = {"refused": refused, **field_summaries(tables["fi"], tables["replays"], settings.resamples)}
        if samples and len(tables["answers"]) and "leaderboard" in found:
            found["task_summary"] = task_summary(tables["answers"], settings.resamples)
            found["leaderboard"] = accuracy_columns(found["leaderboard"], found["task_summary"])
        return found

    def extra(tables):
        return {"methods": [m.name for m in cells], "refused_methods": sorted(set(tables["refused"]["method"]))}

    tables = execute_run(lm, resumable, units, compute, summaries, extra, costs)
    if tables is not None and "leaderboard" in tables:
        board = tables["leaderboard"].astype(object).where(tables["leaderboard"].notna(), None)
        results.write_json(resumable.path / "leaderboard.json", board.to_dict(orient="records"))
    return tables


def _trace_scorer(methods: Sequence[Method], budgets: Sequence[Budget], chunks: Sequence[Chunk]):
    """What each document's trace scores its positions with (:func:`~fi_toolkit.probe.selections.trace_scorer`):
    the first method's that scores tokens by their attention inputs; a method that cannot be parsed is skipped
    here (its cells refuse it)."""
    selections = []
    for m in methods:
        try:
            at = next(b for b in budgets if m.runs_at(b))
            selections += parse_selections(method_selections(m, at, chunks, 1))
        except FIError:
            continue
    return trace_scorer(selections)


def field_cell(
    lm,
    doc,
    shared: dict,
    method: Method,
    budgets: Sequence[Budget],
    chunks: Sequence[Chunk],
    sinks: int,
    seeds: int,
    config: SignalConfig,
    replay: TextSetting | None,
    batch_size: int | None,
    block: int,
    progress: Progress | None = None,
    unit=None,
) -> dict[str, pd.DataFrame]:
    """One (document, method) cell at every budget -> ``fi``, ``replays`` and ``refused`` tables (module
    docstring). ``shared``: the document's ``trace`` and ``reference``, and its replay context once made."""
    trace, reference = shared["trace"], shared["reference"]
    refused, evictions, seconds = [], [], []
    name = getattr(unit, "name", doc.name)
    budgets = [b for b in budgets if method.runs_at(b)]  # a method spelled with a budget: that one alone
    total = len(budgets) * (2 if replay is not None and method.kind != ANCHOR else 1)
    for k, budget in enumerate(budgets):
        for spec in method_selections(method, budget, chunks, seeds):
            where = f"selection {spec}"
            try:
                for sel in parse_selections([spec]):
                    torch.manual_seed(0)  # a press that draws (RandomPress) draws the same on every run
                    t0 = time.perf_counter()
                    e = sel.resolve(trace, sinks=sinks, alpha=config.alpha, model=lm.model, ids=doc.ids, chunks=chunks)
                    seconds.append(time.perf_counter() - t0)
                    e.meta.update(field_method=method.name, field_budget=budget.label)
                    evictions.append(e)
            except FIError as exc:
                refused.append(
                    _refusal(doc.name, method.name, method.kind, budget.label, "prefill", _reason(exc, where))
                )
        if progress:
            progress(name, k + 1, total)
    fi = pd.DataFrame(columns=FI_COLUMNS)
    if evictions:
        result = forward_influence(
            lm.model, trace, doc.ids, evictions, chunks, batch_size=batch_size, block=block, reference=reference
        )
        table = fi_table(doc, trace, result)
        per_eviction = len(chunks)
        table["method"] = [e.meta["field_method"] for e in evictions for _ in range(per_eviction)]
        table["kind"] = method.kind
        table["budget"] = [e.meta["field_budget"] for e in evictions for _ in range(per_eviction)]
        table["compress_seconds"] = [round(s, 4) for s in seconds for _ in range(per_eviction)]
        fi = table[FI_COLUMNS]
    replays = pd.DataFrame(columns=NO_REPLAY)
    if replay is not None and method.kind != ANCHOR:
        replays = _replays(lm, doc, shared, method, budgets, config, replay, refused)
        if progress:
            progress(name, total, total)
    return {"fi": fi, "replays": replays, "refused": pd.DataFrame(refused, columns=REFUSED_COLUMNS)}


def _replays(lm, doc, shared, method, budgets, config, replay, refused) -> pd.DataFrame:
    """The method's replay at every budget it can run (``fi eval``'s ``replays`` rows, with ``method``/``kind``)."""
    policies = []
    for budget in budgets:
        where = f"--policy {method.name}"
        try:
            policy = replay_policy(method, budget, config)
            from fi_toolkit.compress.budget_check import check_budget

            check_budget(policy, replay.prompt, replay.total() - replay.prompt, policy.compress_prompt)
            policies.append((budget, policy))
        except FIError as exc:
            refused.append(_refusal(doc.name, method.name, method.kind, budget.label, "replay", _reason(exc, where)))
    if "text" not in shared:
        shared["text"] = text_context(lm.model, doc.ids, doc.name, [], replay, config)
    rows = []
    for budget, policy in policies:
        try:
            part = evaluate_text(
                lm.model, doc.ids, doc.name, [policy], replay, config, runs=slice(1, None), context=shared["text"]
            )["replays"]
        except FIError as exc:
            refused.append(_refusal(doc.name, method.name, method.kind, budget.label, "replay", str(exc)))
            continue
        part.insert(1, "method", method.name)
        part.insert(2, "kind", method.kind)
        rows.append(part)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=NO_REPLAY)


__all__ = ["FieldSettings", "field_cell", "press_methods", "replay_policy", "run_field"]
