"""``fi eval``: the compressor on trial while the model decodes.

- :mod:`.future`: what is measured after the prompt (the document, or the model's own continuation).
- :mod:`.replay_runs`: teacher-forced replays and free generation on text, per document.
- :mod:`.task_runs`: long-context task samples answered under each policy and protocol.
- :mod:`.summaries`: means with bootstrap intervals; does replay KL predict accuracy.
- :mod:`.run`: resumable runs writing the tables and the manifest.
- :mod:`.headroom`: the share of the replay-KL gap between random and the decoding FI oracle a policy closes.

The names below are imported on first use (PEP 562): importing a light submodule such as
:mod:`.settings` does not load torch, so the command line answers usage errors at once.
"""

from fi_toolkit.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        ["DOCUMENT", "Future", "continue_ids", "generated_document", "parse_future"], "fi_toolkit.compress.future"
    ),
    "replay_headroom": "fi_toolkit.evaluation.headroom",
    "TextSetting": "fi_toolkit.evaluation.text_setting",
    **dict.fromkeys(["FULL", "divergence", "evaluate_text", "free_generation"], "fi_toolkit.evaluation.replay_runs"),
    **dict.fromkeys(["run_eval", "run_eval_tasks", "run_eval_text"], "fi_toolkit.evaluation.run"),
    **dict.fromkeys(["TaskEvalSettings", "TaskSettings", "TextEvalSettings"], "fi_toolkit.evaluation.settings"),
    **dict.fromkeys(
        ["kl_accuracy_table", "mean_ci", "summarise_answers", "summarise_replays", "summarise_segments"],
        "fi_toolkit.evaluation.summaries",
    ),
    **dict.fromkeys(["SampleUnit", "evaluate_sample", "make_units", "task_name"], "fi_toolkit.evaluation.task_runs"),
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
