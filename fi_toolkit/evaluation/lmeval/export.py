"""``fi tasks export``: the toolkit's long-context tasks (:mod:`fi_toolkit.evaluation.tasks`: passkey,
multi-key needle, variable tracking) as JSONL files with lm-eval task YAMLs, so that any lm-eval
backend runs them offline (``lm-eval --include_path DIR --tasks fi_passkey``).

Each JSONL row holds the sample as the toolkit renders it without a chat template (``prompt``: the
context, the question and the answer prefix; ``answer``) and where its needles sit. The YAML reads the
file through the ``json`` dataset builder (an absolute path: no download) and scores with the
toolkit's own exact match (:func:`fi_toolkit.evaluation.tasks.score`, via the ``fi_scoring.py``
written beside it), so lm-eval's accuracy is ``fi eval``'s. Generation stops at a blank line or after
``max_gen_toks`` tokens (16 by default: a 5-digit key and some slack).
"""

from __future__ import annotations

import json
from pathlib import Path

from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.tasks import TASKS, make_sample

PREFIX = "fi_"

SCORING = '''"""Scoring of the fi_toolkit tasks for lm-eval: the toolkit's exact match
(fi_toolkit.evaluation.tasks.score)."""

from fi_toolkit.evaluation.tasks import score


def process_results(doc, results):
    return {"exact_match": float(score(results[0], doc["answer"]))}
'''

YAML = """# {task} from fi_toolkit (fi tasks export): {samples} samples of {context} tokens, seeds {first}..{last}.
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: {max_gen_toks}
  do_sample: false
process_results: !function fi_scoring.process_results
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def export_tasks(
    out: Path,
    tokenizer,
    tasks: list[str],
    context_tokens: int,
    samples: int,
    seed: int = 0,
    max_gen_toks: int = 16,
    config=None,
    staging: Path | None = None,
) -> list[Path]:
    """Write ``{PREFIX}{task}.jsonl`` and ``{PREFIX}{task}.yaml`` per task (and ``fi_scoring.py``) into
    ``out``; samples use seeds ``seed .. seed + samples - 1``, sized with ``tokenizer`` to at most
    ``context_tokens`` tokens. Returns the YAML paths. With ``staging``, the files are written there
    instead, while each YAML names its data file under ``out`` (the caller moves them into ``out``)."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise FIError(f"unknown task {', '.join(unknown)} (tasks: {', '.join(TASKS)})")
    if samples < 1 or max_gen_toks < 1 or seed < 0:
        raise FIError(f"need samples >= 1, max_gen_toks >= 1 and seed >= 0, got {samples}, {max_gen_toks}, {seed}")
    rows = {
        task: [make_sample(task, tokenizer, context_tokens, s, config, chat=False) for s in range(seed, seed + samples)]
        for task in tasks
    }
    out = Path(out).resolve()
    into = out if staging is None else Path(staging)
    into.mkdir(parents=True, exist_ok=True)
    (into / "fi_scoring.py").write_text(SCORING, encoding="utf-8")
    written = []
    for task, drawn in rows.items():
        data = out / f"{PREFIX}{task}.jsonl"
        with open(into / data.name, "w", encoding="utf-8") as f:
            for s in drawn:
                f.write(
                    json.dumps(
                        {
                            "prompt": s.context + s.asked,
                            "answer": s.answer,
                            "task": task,
                            "seed": s.seed,
                            "context_tokens": s.context_tokens,
                            "prompt_tokens": s.prompt_tokens,
                            "book": s.book,
                            "depths": s.depths,
                        }
                    )
                    + "\n"
                )
        yaml = into / f"{PREFIX}{task}.yaml"
        yaml.write_text(
            YAML.format(
                task=task,
                name=f"{PREFIX}{task}",
                samples=samples,
                context=context_tokens,
                first=seed,
                last=seed + samples - 1,
                data=json.dumps(str(data)),
                max_gen_toks=max_gen_toks,
            ),
            encoding="utf-8",
        )
        written.append(yaml)
    return written
