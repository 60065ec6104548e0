"""``fi eval`` as resumable runs: one unit per document (text) or per generated
task sample (tasks), saved as it finishes (:class:`~fi_toolkit.runs.resumable.ResumableRun`); the
summaries are recomputed from the saved units at the end, so a resumed run equals an uninterrupted one.

Text runs write ``positions``, ``segments``, ``replays`` (per document) and ``replay_summary``,
``segment_summary``; task runs write ``answers`` (per sample) and ``task_summary``, ``kl_accuracy``.
The manifest records ``kind`` (text or tasks) and, for text, the noise floor: the full-cache replay's
mean KL per document and future (:func:`fi_toolkit.probe.noise_floor.text_noise_floor`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from fi_toolkit.documents import Document
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.replay_runs import FULL, evaluate_text, text_context
from fi_toolkit.evaluation.settings import TaskEvalSettings, TaskSettings, TextEvalSettings
from fi_toolkit.evaluation.summaries import (
    kl_accuracy_table,
    summarise_answers,
    summarise_replays,
    summarise_segments,
)
from fi_toolkit.evaluation.task_runs import SampleUnit, evaluate_sample
from fi_toolkit.evaluation.text_setting import TextSetting
from fi_toolkit.model.loading import dtype_name
from fi_toolkit.policies import Policy
from fi_toolkit.probe.experiment import max_context
from fi_toolkit.probe.noise_floor import text_noise_floor
from fi_toolkit.runs.execute import execute_run
from fi_toolkit.runs.resumable import ResumableRun, check_unit_size, last_document, part_slice, split_units
from fi_toolkit.runs.settings import RunSettings, check_type, run_settings
from fi_toolkit.signals.config import SignalConfig

Progress = Callable[[str, int, int], None]


def _model_settings(lm, config: SignalConfig, policies: list[Policy]) -> dict:
    return {
        "model": lm.name,
        "dtype": dtype_name(lm.dtype),
        "compute_dtype": dtype_name(lm.compute_dtype),
        "signals": asdict(config),
        "policies": [p.label for p in policies],
    }


def run_eval(
    lm,
    docs: Sequence[Document] | None,
    settings: TextEvalSettings | TaskEvalSettings,
    run: RunSettings | Path | str,
    *,
    progress: Progress | None = None,
) -> dict[str, pd.DataFrame] | None:
    """``fi eval``: every policy of ``settings`` at every budget, beside the full cache -> the tables.

    Args:
        lm: the model, from :func:`~fi_toolkit.model.loading.load_model`.
        docs: the documents of a text run, each of at least ``settings.document_tokens()`` tokens (read them
            with that ``max_tokens``); None for a task run, whose samples ``settings.tasks`` generates.
        settings: a :class:`~fi_toolkit.evaluation.settings.TextEvalSettings` (replays: ``positions``,
            ``segments``, ``replays``, ``replay_summary``, ``segment_summary``) or a
            :class:`~fi_toolkit.evaluation.settings.TaskEvalSettings` (``answers``, ``task_summary``,
            ``kl_accuracy``).
        run: the results directory, or a :class:`~fi_toolkit.runs.settings.RunSettings` (resume, overwrite).
        progress: ``progress(unit, done, total)`` as each unit advances.

    Returns:
        The tables (also written under ``run``); under torchrun rank 0 returns them, the others None.
    """
    check_type("settings", settings, TextEvalSettings, TaskEvalSettings)
    where = run if isinstance(run, RunSettings) else RunSettings(Path(run))
    if isinstance(settings, TaskEvalSettings):
        if docs:
            raise FIError("give documents or a task run's settings, not both", parameter="docs")
        return run_eval_tasks(
            lm,
            settings.tasks,
            where,
            settings.policy_runs(),
            config=settings.signals,
            interval=settings.interval,
            progress=progress,
            n_resamples=settings.resamples,
        )
    if not docs:
        raise FIError("a text run needs documents", parameter="docs")
    return run_eval_text(
        lm,
        list(docs),
        where,
        settings.policy_runs(),
        settings.text_setting(),
        settings.signals,
        progress=progress,
        n_resamples=settings.resamples,
        unit_policies=settings.unit_policies,
    )


def run_eval_text(
    lm,
    docs,
    out_dir: Path | RunSettings,
    policies: list[Policy],
    setting: TextSetting,
    config: SignalConfig,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    n_resamples: int = 1000,
    unit_policies: int = 0,
) -> dict[str, pd.DataFrame]:
    """Replays and free generations of every document -> per-document and summary tables (module docstring):
    what :func:`run_eval` runs for a text run, for callers that build their own policies and signals.

    ``out_dir``: the results directory, or a :class:`~fi_toolkit.runs.settings.RunSettings` (what
    ``fi eval`` passes; then not ``resume``/``overwrite``); ``setting``: the prompt, length, future...

    ``unit_policies = n > 0`` splits every document into parts of ``n`` replays of ``[full cache,
    *policies]``, each a unit of its own; consecutive parts on a rank share the prefill,
    the reference and the full cache's free generation, and the tables are the same as unsplit."""
    setting.check()
    config.check()
    where = run_settings(out_dir, resume, overwrite).check()
    check_unit_size(unit_policies, "unit_policies")
    limit = max_context(lm)
    for doc in docs:
        if not setting.future.generated:
            doc.require(setting.length, f"the length of {setting.length}")
        else:
            doc.require(setting.prompt, f"the prompt of {setting.prompt}")
    if limit is not None and setting.total() > limit:
        raise FIError(
            f"prompt + future ({setting.total():,} tokens) exceeds the model's context of {limit:,}", parameter="prompt"
        )
    if limit is not None and setting.prompt + setting.free_tokens > limit:
        raise FIError(
            f"prompt + free_tokens ({setting.prompt + setting.free_tokens:,} tokens) exceeds the "
            f"model's context of {limit:,}",
            parameter=("prompt", "free_tokens"),
        )
    settings = {
        "kind": "text",
        **_model_settings(lm, config, policies),
        "documents": [{"name": d.name, "sha256": d.sha256, "tokens": len(d)} for d in docs],
        "prompt": setting.prompt,
        "length": setting.total(),
        "interval": setting.interval,
        "future": setting.future.label,
        "free_tokens": setting.free_tokens,
    }
    if unit_policies:  # unsplit runs keep the settings they always had, so their --resume still matches
        settings["unit_policies"] = unit_policies
    units, costs = split_units(docs, 1 + len(policies), unit_policies, setup=1)
    run = ResumableRun(where.out, "eval", settings, where.resume, where.overwrite)
    # a document's consecutive parts on this rank share its TextContext (prefill, reference, free generation)
    setup = last_document(lambda doc: text_context(lm.model, doc.ids, doc.name, policies, setting, config))

    def compute(unit):
        tick = (lambda done, total: progress(unit.name, done, total)) if progress else None
        if not unit_policies:
            return evaluate_text(lm.model, unit.ids, unit.name, policies, setting, config, progress=tick)
        doc, context = setup(unit)
        return evaluate_text(
            lm.model,
            doc.ids,
            doc.name,
            policies,
            setting,
            config,
            progress=tick,
            runs=part_slice(unit, unit_policies),
            context=context,
        )

    def summaries(tables):
        return {
            "replay_summary": summarise_replays(tables["replays"], n_resamples),
            "segment_summary": summarise_segments(tables["segments"]),
        }

    return execute_run(
        lm,
        run,
        units,
        compute,
        summaries,
        lambda t: {"kind": "text", "noise_floor": text_noise_floor(t["replays"], FULL)},
        costs,
    )


def run_eval_tasks(
    lm,
    units: list[SampleUnit] | TaskSettings,
    out_dir: Path | RunSettings,
    policies: list[Policy],
    protocols: list[str] | None = None,
    config: SignalConfig = SignalConfig(),
    max_new: int | None = None,
    interval: int = 1024,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    n_resamples: int = 1000,
) -> dict[str, pd.DataFrame]:
    """Every task sample under the full cache and every policy -> ``answers``, ``task_summary``, ``kl_accuracy``:
    what :func:`run_eval` runs for a task run, for callers that build their own samples and policies.

    ``units``: the samples, or a :class:`~fi_toolkit.evaluation.settings.TaskSettings` (what ``fi eval --task``
    passes), which also gives the protocols and ``max_new`` (then not given beside it). ``out_dir``: the results
    directory or a :class:`~fi_toolkit.runs.settings.RunSettings`."""
    if isinstance(units, TaskSettings):
        if protocols is not None or max_new is not None:
            raise FIError("give the protocols and max_new in the TaskSettings, not beside it")
        tasks = units.check()
        units, protocols, max_new = tasks.units(lm.tokenizer, lm.model.config), list(tasks.protocols), tasks.max_new
    elif protocols is None:
        raise FIError("run_eval_tasks needs the protocols (or a TaskSettings)")
    max_new = 12 if max_new is None else max_new
    config.check()
    where = run_settings(out_dir, resume, overwrite).check()
    limit = max_context(lm)
    longest = max((len(u) for u in units), default=0)
    if limit is not None and longest + max_new > limit:
        raise FIError(
            f"a {longest:,}-token task prompt + max_new {max_new:,} exceeds the model's context of {limit:,}",
            parameter="max_new",
        )
    settings = {
        "kind": "tasks",
        **_model_settings(lm, config, policies),
        "protocols": list(protocols),
        "max_new": max_new,
        "interval": interval,
        "documents": [{"name": u.name, "sha256": u.sha256, "tokens": len(u)} for u in units],
    }
    run = ResumableRun(where.out, "eval", settings, where.resume, where.overwrite)

    def compute(unit):
        tick = (lambda done, total: progress(unit.name, done, total)) if progress else None
        return {"answers": evaluate_sample(lm, unit, policies, protocols, max_new, interval, config, progress=tick)}

    def summaries(tables):
        summary = summarise_answers(tables["answers"], n_resamples)
        return {"task_summary": summary, "kl_accuracy": kl_accuracy_table(summary, None, n_resamples)}

    return execute_run(lm, run, units, compute, summaries, lambda t: {"kind": "tasks"})
