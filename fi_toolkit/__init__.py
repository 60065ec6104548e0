"""fi_toolkit: Forward Influence analysis for KV-cache compression research.

Quick start (a doctest: ``tests/test_startup.py`` runs it with the embedded model). A budget is
``remove=X`` or ``keep=X``; a bare ``X`` keeps X, so removing 10 % of the prefix is ``remove=0.1``::

    >>> from fi_toolkit import load_model, load_document, probe_document, parse_chunk
    >>> lm = load_model()                                   # embedded SmolLM2-135M
    >>> doc = load_document(None, lm.tokenizer, max_tokens=192)   # bundled 'alice'
    >>> table = probe_document(lm, doc, chunks=[parse_chunk("160:192")],
    ...                        selections=["entropy:remove=0.1", "attention:remove=0.1", "random:remove=0.1@0-2"])
    >>> sets = table[table.selector != "control"]          # the noise controls' rows come first
    >>> len(sets), sets.n_removed.unique().tolist(), sets.n_kept.unique().tolist()   # p = 160: 16 removed
    (5, [16.0], [144.0])

Every name below is imported on first use (PEP 562), so ``import fi_toolkit`` and the ``fi`` command
line's help and argument errors never wait for torch, transformers or pandas.
"""

from __future__ import annotations

from fi_toolkit.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "GenerateSettings": "fi_toolkit.compress.generate_settings",
    "run_generate": "fi_toolkit.compress.generate_run",
    "Document": "fi_toolkit.documents",
    "load_document": "fi_toolkit.documents",
    "load_documents": "fi_toolkit.documents",
    "FIError": "fi_toolkit.errors",
    "FieldSettings": "fi_toolkit.field.settings",
    "run_field": "fi_toolkit.field.run",
    "TaskEvalSettings": "fi_toolkit.evaluation.settings",
    "TaskSettings": "fi_toolkit.evaluation.settings",
    "TextEvalSettings": "fi_toolkit.evaluation.settings",
    "run_eval": "fi_toolkit.evaluation.run",
    "TaskExportSettings": "fi_toolkit.evaluation.lmeval.export_settings",
    "run_task_export": "fi_toolkit.evaluation.lmeval.export_run",
    "KeepMap": "fi_toolkit.eviction",
    "TokenSet": "fi_toolkit.eviction",
    "DEFAULT_MODEL": "fi_toolkit.model.loading",
    "LoadedModel": "fi_toolkit.model.loading",
    "load_model": "fi_toolkit.model.loading",
    "tiny_model": "fi_toolkit.model.loading",
    "probe_document": "fi_toolkit.probe.experiment",
    "trace_document": "fi_toolkit.probe.experiment",
    "Chunk": "fi_toolkit.probe.chunks",
    "forward_influence": "fi_toolkit.probe.forward_influence",
    "forward_influence_by_deletion": "fi_toolkit.probe.forward_influence",
    "parse_chunk": "fi_toolkit.probe.chunks",
    "parse_selections": "fi_toolkit.probe.selections",
    "SignalConfig": "fi_toolkit.signals.trace",
    "ProbeSettings": "fi_toolkit.studies.probe_settings",
    "ProbeResults": "fi_toolkit.studies.probe_run",
    "run_probe": "fi_toolkit.studies.probe_run",
    "CorrelateSettings": "fi_toolkit.studies.correlate_settings",
    "run_correlate": "fi_toolkit.studies.study",
    "NearfarSettings": "fi_toolkit.studies.nearfar_settings",
    "run_nearfar": "fi_toolkit.studies.study",
    "ViewSettings": "fi_toolkit.report.view_settings",
    "run_view": "fi_toolkit.report.view_run",
    "FitDataSettings": "fi_toolkit.fit.settings",
    "FitSettings": "fi_toolkit.fit.settings",
    "run_fit_data": "fi_toolkit.fit.run",
    "run_fit": "fi_toolkit.fit.run",
    "LabelSettings": "fi_toolkit.surrogate.label_settings",
    "CorpusSettings": "fi_toolkit.surrogate.label_settings",
    "run_labels": "fi_toolkit.surrogate.labels",
    "read_labels": "fi_toolkit.surrogate.labels",
    "SurrogateFitSettings": "fi_toolkit.surrogate.train_settings",
    "run_fit_surrogate": "fi_toolkit.surrogate.train",
    "ScoresSettings": "fi_toolkit.studies.scores_settings",
    "run_scores": "fi_toolkit.studies.scores_run",
    "Trace": "fi_toolkit.signals.trace",
    "trace_prefix": "fi_toolkit.signals.trace",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
