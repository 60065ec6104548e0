"""``fi eval``: the compressor on trial while the model decodes.

- :mod:`.future`: what is measured after the prompt (the document, or the model's own continuation).
- :mod:`.replay_runs`: teacher-forced replays and free generation on text, per document.
- :mod:`.task_runs`: long-context task samples answered under each policy and protocol.
- :mod:`.summaries`: means with bootstrap intervals; does replay KL predict accuracy.
- :mod:`.run`: resumable runs writing the tables and the manifest.
- :mod:`.headroom`: the share of the replay-KL gap between random and the decoding FI oracle a policy closes.
"""

from fi_toolkit.compress.future import DOCUMENT, Future, continue_ids, generated_document, parse_future
from fi_toolkit.evaluation.headroom import replay_headroom
from fi_toolkit.evaluation.replay_runs import FULL, TextSetting, divergence, evaluate_text, free_generation
from fi_toolkit.evaluation.run import run_eval_tasks, run_eval_text
from fi_toolkit.evaluation.summaries import (
    kl_accuracy_table,
    mean_ci,
    summarise_answers,
    summarise_replays,
    summarise_segments,
)
from fi_toolkit.evaluation.task_runs import SampleUnit, evaluate_sample, make_units, task_name

__all__ = [
    "DOCUMENT",
    "FULL",
    "Future",
    "SampleUnit",
    "TextSetting",
    "continue_ids",
    "divergence",
    "evaluate_sample",
    "evaluate_text",
    "free_generation",
    "generated_document",
    "kl_accuracy_table",
    "make_units",
    "mean_ci",
    "parse_future",
    "replay_headroom",
    "run_eval_tasks",
    "run_eval_text",
    "summarise_answers",
    "summarise_replays",
    "summarise_segments",
    "task_name",
]
