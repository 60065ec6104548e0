"""The toolkit as an lm-evaluation-harness backend (docs/guides/lm-eval.md).

- :mod:`.arguments`: the model arguments, checked before a model loads.
- :mod:`.requests`: one request on a compressed cache (scoring, generation), without lm-eval.
- :mod:`.backend`: ``CompressedLM``, registered as ``--model fi`` (imports lm-eval: ``fi_toolkit[lmeval]``).
- :mod:`.export`: the toolkit's long-context tasks as lm-eval task YAMLs (``fi tasks export``).
"""

from fi_toolkit.evaluation.lmeval.arguments import BackendArgs, parse_backend_args
from fi_toolkit.evaluation.lmeval.export import export_tasks
from fi_toolkit.evaluation.lmeval.requests import CacheRecord, generate_tokens, score_continuation


def __getattr__(name):
    if name in ("CompressedLM", "annotate_samples", "samples_annotated"):  # lm-eval is an optional dependency
        from fi_toolkit.evaluation.lmeval import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BackendArgs",
    "CacheRecord",
    "CompressedLM",
    "annotate_samples",
    "export_tasks",
    "generate_tokens",
    "parse_backend_args",
    "samples_annotated",
    "score_continuation",
]
